//! SCSI commands waiting for their share of the node's payload budget
//! ([`mariner_limits::Limits`]), in arrival order.
//!
//! A command that moves data takes its expected data transfer length (EDTL) of the budget
//! before the session takes it in: a write's data-out buffer is allocated then, a read's data
//! follows when it runs. While commands wait, the session keeps reading the connection, so the
//! Data-Out of writes already admitted still arrives and frees the budget they hold (stopping
//! to read would deadlock a session whose own writes hold the budget); the waiting commands
//! have not been counted into ExpCmdSN, so MaxCmdSN stops advancing and the initiator stops
//! sending commands: that is the back-pressure. Data-Out for a waiting command (an
//! unsolicited burst) waits behind it, so it still finds its task.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use futures_util::FutureExt;
use mariner_limits::{Limits, PayloadShare};

use crate::login::CMD_WINDOW;
use crate::pdu::{Opcode, Pdu};

/// Largest write accepted: the largest any volume takes in one command
/// (`Volume::max_io_bytes` is at most 32 MiB). A larger EDTL would make the data-out buffer
/// whatever the initiator names (up to 4 GiB), so such a write is refused without a buffer.
pub(crate) const MAX_DATA_OUT: u32 = 32 << 20;

/// Commands that may wait at once: the command window, and some immediate ones.
const MAX_WAITING: usize = CMD_WINDOW as usize + 16;

type Grant = Pin<Box<dyn Future<Output = Option<PayloadShare>> + Send>>;

/// The waiting commands of one session.
pub(crate) struct Admission {
    limits: Limits,
    queue: VecDeque<Pdu>,
    /// The head's reservation, kept across `select!` rounds so its place in line stays.
    grant: Option<Grant>,
}

/// A write command whose EDTL is above [`MAX_DATA_OUT`].
pub(crate) fn oversized_write(pdu: &Pdu) -> bool {
    pdu.opcode() == Opcode::ScsiCommand && pdu.flags() & 0x20 != 0 && pdu.u32_at(20) > MAX_DATA_OUT
}

/// The budget `pdu` needs before the session takes it in, if any.
fn cost(pdu: &Pdu) -> Option<usize> {
    let edtl = pdu.u32_at(20);
    if pdu.opcode() != Opcode::ScsiCommand || edtl == 0 || oversized_write(pdu) {
        return None;
    }
    usize::try_from(edtl.min(MAX_DATA_OUT)).ok()
}

impl Admission {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            queue: VecDeque::new(),
            grant: None,
        }
    }

    /// Offers a PDU read from the connection: back at once with its share when it needs none
    /// or the budget covers it and nothing waits before it; else it waits. `Err` when more
    /// commands wait than the command window allows.
    pub(crate) fn offer(
        &mut self,
        pdu: Pdu,
    ) -> Result<Option<(Pdu, Option<PayloadShare>)>, &'static str> {
        let Some(bytes) = cost(&pdu) else {
            if self.data_of_waiting_command(&pdu) {
                self.queue.push_back(pdu);
                return Ok(None);
            }
            return Ok(Some((pdu, None)));
        };
        if self.queue.is_empty() {
            if let Some(share) = self.limits.try_reserve(bytes) {
                return Ok(Some((pdu, Some(share))));
            }
        }
        if self.queue.len() >= MAX_WAITING {
            return Err("more commands waiting for payload budget than the command window");
        }
        self.queue.push_back(pdu);
        Ok(None)
    }

    /// A Data-Out whose command is still waiting.
    fn data_of_waiting_command(&self, pdu: &Pdu) -> bool {
        pdu.opcode() == Opcode::DataOut
            && self
                .queue
                .iter()
                .any(|q| q.opcode() == Opcode::ScsiCommand && q.itt() == pdu.itt())
    }

    /// The first waiting PDU once its share (if it needs one) is granted; never resolves while
    /// none waits. Cancel-safe: the reservation lives in `self`.
    pub(crate) async fn next(&mut self) -> (Pdu, Option<PayloadShare>) {
        if let Some(ready) = self.next_now() {
            return ready;
        }
        let Some(grant) = self.head_grant() else {
            return std::future::pending().await;
        };
        let share = grant.await;
        self.grant = None;
        match self.queue.pop_front() {
            Some(pdu) => (pdu, share),
            None => std::future::pending().await,
        }
    }

    /// Like [`Admission::next`], without waiting.
    pub(crate) fn next_now(&mut self) -> Option<(Pdu, Option<PayloadShare>)> {
        if cost(self.queue.front()?).is_none() {
            return self.queue.pop_front().map(|pdu| (pdu, None));
        }
        let share = self.head_grant()?.now_or_never()?;
        self.grant = None;
        self.queue.pop_front().map(|pdu| (pdu, share))
    }

    /// The head's reservation (made on first use), if the head needs a share.
    fn head_grant(&mut self) -> Option<&mut Grant> {
        let bytes = self.queue.front().and_then(cost)?;
        let limits = self.limits.clone();
        Some(
            self.grant
                .get_or_insert_with(|| Box::pin(async move { limits.reserve(bytes).await })),
        )
    }
}
