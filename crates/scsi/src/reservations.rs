//! One logical unit's reservation state, shared by every session (and by other front ends of
//! the same volume), around the sans-I/O [`PrState`].
//!
//! Checks read the state under a short `std` mutex, skipped entirely (one atomic load) while
//! nothing is registered or reserved. Changes are serialised by an async mutex: a change is
//! computed on a copy, persisted when APTPL is or was set, and only then installed, so what
//! a command reports is what a restart would find.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use crate::nexus::Nexus;
use crate::pr::{image, Access, PrState, Refusal};
use crate::sense::{Asc, Sense, SenseKey};

/// Where a unit keeps its APTPL state.
#[async_trait]
pub trait PrPersist: Send + Sync {
    /// Replaces the stored image atomically and durably; `None` removes it.
    async fn save(&self, image: Option<Vec<u8>>) -> Result<(), String>;
}

/// A unit's reservations.
pub struct Reservations {
    state: Mutex<PrState>,
    /// `state.is_active()`, readable without the lock.
    active: AtomicBool,
    changes: tokio::sync::Mutex<()>,
    persist: Option<Arc<dyn PrPersist>>,
}

impl std::fmt::Debug for Reservations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservations")
            .field("state", &self.snapshot())
            .finish_non_exhaustive()
    }
}

impl Reservations {
    /// Reservations that cannot persist through power loss (APTPL is refused).
    pub fn in_memory() -> Self {
        Self::with(PrState::new(false), None)
    }

    /// Reservations kept by `persist` when APTPL is set, starting from `restored` (the state
    /// decoded from the stored image, if there was one).
    pub fn persistent(restored: Option<PrState>, persist: Arc<dyn PrPersist>) -> Self {
        Self::with(
            restored.unwrap_or_else(|| PrState::new(true)),
            Some(persist),
        )
    }

    fn with(state: PrState, persist: Option<Arc<dyn PrPersist>>) -> Self {
        Self {
            active: AtomicBool::new(state.is_active()),
            state: Mutex::new(state),
            changes: tokio::sync::Mutex::new(()),
            persist,
        }
    }

    fn lock(&self) -> MutexGuard<'_, PrState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of the current state.
    pub fn snapshot(&self) -> PrState {
        self.lock().clone()
    }

    /// Whether a command of class `access` from `nexus` may run now.
    pub fn check(&self, nexus: &Nexus, access: Access) -> Result<(), Refusal> {
        if !self.active.load(Ordering::Acquire) {
            return Ok(());
        }
        self.lock().check(nexus, access)
    }

    /// Writes from an initiator that is not registered (e.g. an NBD client) are refused.
    pub fn excludes_unregistered_writers(&self) -> bool {
        self.active.load(Ordering::Acquire) && self.lock().excludes_unregistered_writers()
    }

    /// Applies `f` to the state, persisting the result first when APTPL is or was set.
    pub async fn change<T>(
        &self,
        f: impl FnOnce(&mut PrState) -> Result<T, Refusal>,
    ) -> Result<T, Refusal> {
        let _serial = self.changes.lock().await;
        let before = self.snapshot();
        let mut next = before.clone();
        let out = f(&mut next)?;
        if persisted_differs(&before, &next) && (before.aptpl || next.aptpl) {
            self.save(&next).await?;
        }
        self.active.store(next.is_active(), Ordering::Release);
        *self.lock() = next;
        Ok(out)
    }

    async fn save(&self, next: &PrState) -> Result<(), Refusal> {
        let Some(persist) = &self.persist else {
            return Err(Sense::invalid_field_in_parameters(20).into());
        };
        let image = next.aptpl.then(|| image::encode(next));
        persist.save(image).await.map_err(|_| {
            Refusal::Check(Sense::new(
                SenseKey::HardwareError,
                Asc::INTERNAL_TARGET_FAILURE,
            ))
        })
    }

    /// The I_T nexus ended: an SPC-2 reservation it held is released.
    pub async fn nexus_lost(&self, nexus: &Nexus) {
        let _ = self
            .change(|s| {
                s.nexus_lost(nexus);
                Ok(())
            })
            .await;
    }

    /// LOGICAL UNIT RESET (or a target reset): the SPC-2 reservation is released, at once
    /// unless a change is under way, in which case right after it (on the current tokio
    /// runtime).
    pub fn reset(self: &Arc<Self>) {
        if let Ok(_serial) = self.changes.try_lock() {
            let mut state = self.lock();
            state.reset();
            self.active.store(state.is_active(), Ordering::Release);
            return;
        }
        let this = Arc::clone(self);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = this
                    .change(|s| {
                        s.reset();
                        Ok(())
                    })
                    .await;
            });
        }
    }
}

/// The parts an APTPL image holds changed.
fn persisted_differs(a: &PrState, b: &PrState) -> bool {
    a.generation != b.generation
        || a.registrations != b.registrations
        || a.reservation != b.reservation
        || a.aptpl != b.aptpl
}
