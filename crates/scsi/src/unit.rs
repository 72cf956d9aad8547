//! What every I_T nexus of one logical unit shares besides its reservations (SAM-5): the task
//! set, so that a LOGICAL UNIT RESET from any nexus aborts the tasks of all of them, and the
//! unit attention conditions pending for each nexus.
//!
//! A transport runs each task under a [`TaskTicket`] taken when the task enters the task set:
//! [`TaskTicket::aborted`] completes when a reset aborts the task, and dropping the ticket
//! tells a waiting [`UnitState::reset`] that the task is gone. A command still collecting its
//! data-out remembers the [`UnitState::epoch`] it arrived in and is dropped if a reset ended
//! that epoch before it could run.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{watch, Notify};

use crate::nexus::Nexus;
use crate::sense::Asc;

/// Unit attention conditions kept per nexus; past this the newest are not queued (SPC-4
/// §5.14: a unit may report only the most important ones).
const MAX_ATTENTIONS: usize = 8;

/// The state one logical unit shares across its I_T nexuses.
pub struct UnitState {
    inner: Mutex<Inner>,
    /// Some nexus has a unit attention pending: commands skip the lock while it is clear.
    attention: AtomicBool,
    /// The task set's epoch; every reset starts a new one, aborting the tasks of the old.
    epoch: watch::Sender<u64>,
    /// Signalled whenever a task leaves the task set.
    left: Notify,
}

#[derive(Default)]
struct Inner {
    /// Tasks in the task set, counted by the epoch they entered in.
    tasks: BTreeMap<u64, usize>,
    /// The I_T nexuses that exist (a session is logged in) and their unit attentions.
    nexuses: HashMap<Nexus, Attached>,
}

#[derive(Default)]
struct Attached {
    /// Sessions holding the nexus (a reinstated session may overlap its predecessor).
    sessions: usize,
    attentions: VecDeque<Asc>,
}

impl std::fmt::Debug for UnitState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnitState")
            .field("epoch", &self.epoch())
            .finish_non_exhaustive()
    }
}

impl Default for UnitState {
    fn default() -> Self {
        Self::new()
    }
}

impl UnitState {
    /// An empty task set, no nexus attached.
    pub fn new() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            attention: AtomicBool::new(false),
            epoch: watch::Sender::new(0),
            left: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current epoch of the task set.
    pub fn epoch(&self) -> u64 {
        *self.epoch.borrow()
    }

    /// An I_T nexus came into existence (a session logged in); it exists, and can have unit
    /// attentions, until the returned guard is dropped.
    pub fn attach(self: &Arc<Self>, nexus: &Nexus) -> Attachment {
        self.lock()
            .nexuses
            .entry(nexus.clone())
            .or_default()
            .sessions += 1;
        Attachment {
            unit: Arc::clone(self),
            nexus: nexus.clone(),
        }
    }

    fn detach(&self, nexus: &Nexus) {
        let mut inner = self.lock();
        if let Some(a) = inner.nexuses.get_mut(nexus) {
            a.sessions = a.sessions.saturating_sub(1);
            if a.sessions == 0 {
                inner.nexuses.remove(nexus);
            }
        }
        self.refresh_flag(&inner);
    }

    /// A task enters the task set in the current epoch.
    pub fn enter(self: &Arc<Self>) -> TaskTicket {
        let mut inner = self.lock();
        let epoch = self.epoch();
        *inner.tasks.entry(epoch).or_default() += 1;
        TaskTicket {
            unit: Arc::clone(self),
            epoch,
            rx: self.epoch.subscribe(),
        }
    }

    fn leave(&self, epoch: u64) {
        let aborted = {
            let mut inner = self.lock();
            if let Some(n) = inner.tasks.get_mut(&epoch) {
                *n -= 1;
                if *n == 0 {
                    inner.tasks.remove(&epoch);
                }
            }
            // Only a reset waits, and only for tasks of epochs before its own: a task of the
            // current epoch leaving wakes nobody. Read under the lock a reset bumps the epoch
            // under, so a reset either sees this task gone or is woken.
            epoch < self.epoch()
        };
        if aborted {
            self.left.notify_waiters();
        }
    }

    /// Aborts every task in the task set, whatever nexus it came from, and returns once all
    /// of them are gone. With `attention`, first establishes that unit attention for every
    /// attached nexus (LOGICAL UNIT RESET: BUS DEVICE RESET FUNCTION OCCURRED).
    pub async fn reset(&self, attention: Option<Asc>) {
        let ended = {
            let mut inner = self.lock();
            self.epoch.send_modify(|e| *e += 1);
            if let Some(asc) = attention {
                queue_attention(&mut inner, asc);
                self.refresh_flag(&inner);
            }
            self.epoch()
        };
        loop {
            let left = self.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if self.lock().tasks.range(..ended).next().is_none() {
                return;
            }
            left.await;
        }
    }

    /// Establishes the unit attention `asc` for every attached nexus.
    pub fn establish(&self, asc: Asc) {
        let mut inner = self.lock();
        queue_attention(&mut inner, asc);
        self.refresh_flag(&inner);
    }

    /// Takes the oldest unit attention pending for `nexus` (it is reported once).
    pub fn take_attention(&self, nexus: &Nexus) -> Option<Asc> {
        if !self.attention.load(Ordering::Acquire) {
            return None;
        }
        let mut inner = self.lock();
        let asc = inner.nexuses.get_mut(nexus)?.attentions.pop_front();
        self.refresh_flag(&inner);
        asc
    }

    fn refresh_flag(&self, inner: &Inner) {
        let any = inner.nexuses.values().any(|a| !a.attentions.is_empty());
        self.attention.store(any, Ordering::Release);
    }
}

fn queue_attention(inner: &mut Inner, asc: Asc) {
    for a in inner.nexuses.values_mut() {
        if a.attentions.len() < MAX_ATTENTIONS && !a.attentions.contains(&asc) {
            a.attentions.push_back(asc);
        }
    }
}

/// An attached I_T nexus; dropping it ends the nexus and discards its unit attentions.
pub struct Attachment {
    unit: Arc<UnitState>,
    nexus: Nexus,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        self.unit.detach(&self.nexus);
    }
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment")
            .field("nexus", &self.nexus)
            .finish_non_exhaustive()
    }
}

/// A task's place in the task set; the task leaves the set when the ticket is dropped.
pub struct TaskTicket {
    unit: Arc<UnitState>,
    epoch: u64,
    rx: watch::Receiver<u64>,
}

impl TaskTicket {
    /// The epoch the task entered in.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Completes when a reset aborts the task (never, if none does). The task is gone, as
    /// far as the reset is concerned, only once the ticket is dropped.
    pub async fn aborted(&mut self) {
        let entered = self.epoch;
        if self.rx.wait_for(|now| *now != entered).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for TaskTicket {
    fn drop(&mut self) {
        self.unit.leave(self.epoch);
    }
}

impl std::fmt::Debug for TaskTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskTicket")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nexus(isid: u8) -> Nexus {
        Nexus::iscsi("iqn.test", [0x80, 0, 0, 0, 0, isid])
    }

    #[test]
    fn attentions_go_to_attached_nexuses_once_each() {
        let unit = Arc::new(UnitState::new());
        let a = unit.attach(&nexus(1));
        let _b = unit.attach(&nexus(2));
        unit.establish(Asc::BUS_DEVICE_RESET);
        unit.establish(Asc::BUS_DEVICE_RESET);
        assert_eq!(unit.take_attention(&nexus(1)), Some(Asc::BUS_DEVICE_RESET));
        assert_eq!(unit.take_attention(&nexus(1)), None);
        assert_eq!(unit.take_attention(&nexus(3)), None, "not attached");
        drop(a);
        let _a = unit.attach(&nexus(1));
        assert_eq!(
            unit.take_attention(&nexus(1)),
            None,
            "a new nexus starts clean"
        );
        assert_eq!(unit.take_attention(&nexus(2)), Some(Asc::BUS_DEVICE_RESET));
        assert!(!unit.attention.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn a_lun_reports_a_unit_attention_once_but_not_to_inquiry_or_report_luns() {
        use crate::{Lun, MemoryBackend, Reservations, SenseKey, Status};
        let unit = Arc::new(UnitState::new());
        let backend = Arc::new(MemoryBackend::new("u", 512, 64));
        let lun = Lun::shared(backend, Arc::new(Reservations::in_memory()), unit.clone());
        let me = nexus(1);
        let _attached = unit.attach(&me);
        let tur = [0u8; 6];
        let inquiry = [0x12, 0, 0, 0, 36, 0];
        let report_luns = [0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0];
        let request_sense = [0x03, 0, 0, 0, 18, 0];
        lun.reset().await;
        for cdb in [&inquiry[..], &report_luns[..]] {
            assert_eq!(lun.execute_as(&me, cdb, &[]).await.status, Status::Good);
        }
        let r = lun.execute_as(&me, &request_sense, &[]).await;
        assert_eq!(r.status, Status::Good);
        assert_eq!(
            (r.data[2] & 0x0f, r.data[12], r.data[13]),
            (0x6, 0x29, 0x03)
        );
        assert_eq!(lun.execute_as(&me, &tur, &[]).await.status, Status::Good);

        lun.reset().await;
        let r = lun.execute_as(&me, &tur, &[]).await;
        assert_eq!(r.status, Status::CheckCondition);
        let sense = r.sense.map(|s| (s.key, s.asc));
        assert_eq!(
            sense,
            Some((SenseKey::UnitAttention, Asc::BUS_DEVICE_RESET))
        );
        assert_eq!(lun.execute_as(&me, &tur, &[]).await.status, Status::Good);
        let r = lun.execute_as(&me, &request_sense, &[]).await;
        assert_eq!(r.data[2] & 0x0f, 0, "NO SENSE once reported");
    }

    #[tokio::test]
    async fn reset_aborts_the_tasks_of_the_old_epoch_and_waits_for_them() {
        let unit = Arc::new(UnitState::new());
        let mut old = unit.enter();
        let reset = {
            let unit = unit.clone();
            tokio::spawn(async move { unit.reset(None).await })
        };
        old.aborted().await;
        let fresh = unit.enter();
        assert_eq!(fresh.epoch(), 1);
        tokio::task::yield_now().await;
        assert!(!reset.is_finished(), "the aborted task has not left yet");
        drop(old);
        reset.await.unwrap();
        // A task of the new epoch is not aborted by the reset that began it.
        let mut fresh = fresh;
        let pending = tokio::time::timeout(std::time::Duration::from_millis(20), fresh.aborted());
        assert!(pending.await.is_err());
    }
}
