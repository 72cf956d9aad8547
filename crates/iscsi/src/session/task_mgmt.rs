//! Task management functions (RFC 7143 §11.5, §11.6; SAM-5): ABORT TASK, ABORT TASK SET,
//! CLEAR TASK SET, LOGICAL UNIT RESET and TARGET WARM/COLD RESET, on the session's task set.

use super::{Event, Session};
use crate::login::CMD_WINDOW;
use crate::pdu::{Opcode, Pdu};

/// TMF response codes (RFC 7143 §11.6.1).
mod tmf {
    pub const COMPLETE: u8 = 0;
    pub const NO_TASK: u8 = 1;
    pub const NO_LUN: u8 = 2;
    pub const REASSIGN_UNSUPPORTED: u8 = 4;
    pub const UNSUPPORTED: u8 = 5;
    pub const REJECTED: u8 = 255;
}

impl Session {
    pub(super) fn task_mgmt(&mut self, req: &Pdu) -> (Vec<Pdu>, bool) {
        let function = req.flags() & 0x7f;
        let mut after = (Vec::new(), false);
        let response = match function {
            1 => {
                let (code, drained) = self.abort_task(req.u32_at(20), req.u32_at(32));
                after = drained;
                code
            }
            2 | 4 | 5 if req.lun() != 0 => tmf::NO_LUN,
            2 | 4 => {
                self.abort_all();
                tmf::COMPLETE
            }
            5..=7 => match self.reset(req.itt(), function == 5) {
                Some(code) => code,
                // Answered once the aborted tasks are gone.
                None => return (Vec::new(), false),
            },
            3 => tmf::UNSUPPORTED,
            8 => tmf::REASSIGN_UNSUPPORTED,
            _ => tmf::REJECTED,
        };
        let mut out = vec![self.tmf_response(req.itt(), response)];
        out.extend(after.0);
        (out, after.1)
    }

    pub(super) fn tmf_response(&mut self, itt: u32, response: u8) -> Pdu {
        let mut p = Pdu::new(Opcode::TaskMgmtResponse);
        p.bhs[2] = response;
        p.set_itt(itt);
        self.stamp(&mut p, true);
        p
    }

    /// LOGICAL UNIT RESET (`lun_reset`) or TARGET WARM/COLD RESET: aborts every task of the
    /// unit, this session's and every other session's, and releases an SPC-2 reservation.
    /// The response goes out (as an [`Event::TmfDone`]) once the aborted tasks are gone
    /// (RFC 7143 "Task Management Actions on Task Sets"; SAM-5), so `None` is returned; a
    /// discovery session, which has no unit, gets its response at once.
    ///
    /// A LUN reset also establishes the unit attention BUS DEVICE RESET FUNCTION OCCURRED for
    /// every nexus, this one included. Target resets establish none: initiators that issue
    /// them (libiscsi's Reserve6 suite) carry on in the same session without clearing one.
    fn reset(&mut self, itt: u32, lun_reset: bool) -> Option<u8> {
        self.abort_all();
        let Some(lun) = self.lun() else {
            return Some(tmf::COMPLETE);
        };
        let tx = self.done_tx.clone();
        self.resets_waiting += 1;
        tokio::spawn(async move {
            if lun_reset {
                lun.reset().await;
            } else {
                lun.unit().reset(None).await;
                lun.reservations().reset();
            }
            let _ = tx.send(Event::TmfDone {
                itt,
                response: tmf::COMPLETE,
            });
        });
        None
    }

    /// Aborts every task of the session: waiting for data-out or running. None of them
    /// answers.
    fn abort_all(&mut self) {
        self.pending.clear();
        for (_, task) in self.running.drain() {
            task.abort.abort();
        }
    }

    /// ABORT TASK: "function complete" when the task was waiting for data-out or running
    /// (it is dropped without a response), or held back or never received (RFC 7143 §11.5.1:
    /// its CmdSN then counts as received, which may let held requests through; they are
    /// returned with the code). "Task does not exist" when its command arrived and has
    /// already been answered. §11.5.1 would answer "function complete" here too, but then an
    /// initiator cannot tell an aborted command from a completed one; Linux targets answer
    /// "task does not exist" and libiscsi's AbortTask test relies on it.
    fn abort_task(&mut self, referenced_itt: u32, ref_cmd_sn: u32) -> (u8, (Vec<Pdu>, bool)) {
        let none = (Vec::new(), false);
        if self.pending.remove(&referenced_itt).is_some() {
            return (tmf::COMPLETE, none);
        }
        if let Some(task) = self.running.remove(&referenced_itt) {
            task.abort.abort();
            return (tmf::COMPLETE, none);
        }
        let ahead = ref_cmd_sn.wrapping_sub(self.exp_cmd_sn);
        if ahead < CMD_WINDOW {
            self.held.insert(ref_cmd_sn, None);
            return (tmf::COMPLETE, self.drain_held());
        }
        let behind = self.exp_cmd_sn.wrapping_sub(ref_cmd_sn);
        if behind != 0 && behind <= CMD_WINDOW {
            (tmf::NO_TASK, none)
        } else {
            (tmf::COMPLETE, none)
        }
    }
}
