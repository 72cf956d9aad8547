//! The full feature phase of one connection (see the [`crate::server`] docs): CmdSN
//! ordering, the task set keyed by ITT, data-out with R2T, task management, text and logout.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::future::{AbortHandle, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use mariner_limits::{Limits, PayloadShare};
use mariner_scsi::{Asc, Lun, Nexus, Sense, SenseKey, Status};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::admission::{self, Admission};
use crate::login::{Established, SessionKind, CMD_WINDOW};
use crate::params::SessionParams;
use crate::pdu::{Opcode, Pdu, RESERVED_TAG};
use crate::server::{ConnectionError, PduStream};
use crate::targets::Targets;
use crate::task::{self, Command, Completion};
use crate::text;

mod task_mgmt;

/// ASC/ASCQ 47/05: PROTOCOL SERVICE CRC ERROR, the iSCSI condition for a command ended by a
/// data sequence error (RFC 7143 §7.8 and §11.4.7.2).
const PROTOCOL_SERVICE_CRC_ERROR: Asc = Asc(0x47, 0x05);

/// A write waiting for data-out.
struct PendingWrite {
    lun: u64,
    cdb: [u8; 16],
    edtl: u32,
    data: Vec<u8>,
    received: u32,
    ttt: u32,
    r2t_sn: u32,
    /// End offset of the outstanding R2T, if one is out.
    r2t_end: Option<u32>,
    /// DataSN expected on the next Data-Out of the current sequence.
    data_sn: u32,
    /// The task set's epoch when the command arrived: a reset since then aborted it.
    epoch: u64,
    /// A Data-Out broke the sequence: the command fails once the initiator has sent the
    /// rest of the outstanding burst.
    broken: bool,
    /// Its share of the node's payload budget, and when its data must be in by.
    share: Option<PayloadShare>,
    deadline: Instant,
}

/// A request that arrived ahead of ExpCmdSN, with the payload budget it already holds.
struct Held {
    pdu: Pdu,
    share: Option<PayloadShare>,
    since: Instant,
}

/// A task running on the LUN. `tag` tells its completion apart from that of an aborted
/// earlier task with the same ITT.
struct Running {
    tag: u64,
    abort: AbortHandle,
}

/// A task as the session loop polls it: its tag and completion, or `None` when it was
/// aborted.
type TaskFuture = Pin<Box<dyn Future<Output = Option<(u64, Completion)>> + Send>>;

/// What spawned work hands back to the session loop.
enum Event {
    /// A task management function that had to wait (a reset) is done: its ITT and response.
    TmfDone { itt: u32, response: u8 },
}

pub(crate) struct Session {
    kind: SessionKind,
    params: SessionParams,
    nexus: Arc<Nexus>,
    stat_sn: u32,
    exp_cmd_sn: u32,
    targets: Arc<dyn Targets>,
    portal: SocketAddr,
    /// Commands waiting for data-out, by ITT.
    pending: HashMap<u32, PendingWrite>,
    /// Tasks running, by ITT.
    running: HashMap<u32, Running>,
    /// Non-immediate requests that arrived ahead of ExpCmdSN, by CmdSN; `None` marks a CmdSN
    /// an ABORT TASK consumed before its command arrived.
    held: HashMap<u32, Option<Held>>,
    /// The node's caps: payload budget and the payload time-out.
    limits: Limits,
    next_tag: u64,
    /// Tasks started since the loop last collected them into the set it polls.
    started: Vec<TaskFuture>,
    done_tx: mpsc::UnboundedSender<Event>,
    done_rx: Option<mpsc::UnboundedReceiver<Event>>,
    next_ttt: u32,
    text_buf: Vec<u8>,
    /// Resets whose response waits for the aborted tasks to be gone.
    resets_waiting: usize,
    /// A logout that arrived while resets were waiting: answered after their responses.
    logout_waiting: Option<Pdu>,
}

/// Sense data length prefix + fixed sense.
fn sense_segment(sense: &Sense) -> Vec<u8> {
    let fixed = sense.to_fixed();
    let mut out = vec![0, fixed.len() as u8];
    out.extend_from_slice(&fixed);
    out
}

/// Whether the opcode carries a CmdSN that orders it.
fn ordered(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::NopOut
            | Opcode::ScsiCommand
            | Opcode::TaskMgmtRequest
            | Opcode::TextRequest
            | Opcode::LogoutRequest
    )
}

impl Drop for Session {
    fn drop(&mut self) {
        for task in self.running.values() {
            task.abort.abort();
        }
    }
}

impl Session {
    pub(crate) fn new(
        est: Established,
        targets: Arc<dyn Targets>,
        portal: SocketAddr,
        limits: Limits,
    ) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            kind: est.kind,
            params: est.params,
            nexus: Arc::new(Nexus::iscsi(&est.initiator, est.isid)),
            stat_sn: est.stat_sn,
            exp_cmd_sn: est.exp_cmd_sn,
            targets,
            portal,
            pending: HashMap::new(),
            running: HashMap::new(),
            held: HashMap::new(),
            limits,
            next_tag: 0,
            started: Vec::new(),
            done_tx,
            done_rx: Some(done_rx),
            next_ttt: 1,
            text_buf: Vec::new(),
            resets_waiting: 0,
            logout_waiting: None,
        }
    }

    fn max_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn.wrapping_add(CMD_WINDOW - 1)
    }

    /// Fills StatSN/ExpCmdSN/MaxCmdSN (bytes 24..36), advancing StatSN if `status`.
    fn stamp(&mut self, p: &mut Pdu, status: bool) {
        p.set_u32(24, self.stat_sn);
        if status {
            self.stat_sn = self.stat_sn.wrapping_add(1);
        }
        p.set_u32(28, self.exp_cmd_sn);
        p.set_u32(32, self.max_cmd_sn());
    }

    pub(crate) async fn run(
        &mut self,
        stream: &mut TcpStream,
        io: &mut PduStream,
    ) -> Result<(), ConnectionError> {
        // The session is the I_T nexus: it exists, and collects unit attentions, while the
        // session lasts.
        let attached = self.lun().map(|lun| lun.unit().attach(&self.nexus));
        let result = self.serve(stream, io).await;
        drop(attached);
        // The I_T nexus ends with the session (logout or connection loss): an SPC-2
        // reservation it held goes with it.
        if let Some(lun) = self.lun() {
            lun.reservations().nexus_lost(&self.nexus).await;
        }
        result
    }

    async fn serve(
        &mut self,
        stream: &mut TcpStream,
        io: &mut PduStream,
    ) -> Result<(), ConnectionError> {
        let (mut rd, mut wr) = stream.split();
        let Some(mut done_rx) = self.done_rx.take() else {
            return Err(ConnectionError::Protocol("session already ran"));
        };
        // The session's tasks run inside its own future rather than as tokio tasks of their
        // own: a log batch that completes many writes wakes this one task once, and their
        // responses leave in one segment, without a spawn, a channel send and a cross-thread
        // wakeup per command. Dropping the set (the connection ends) drops every task.
        let mut tasks: FuturesUnordered<TaskFuture> = FuturesUnordered::new();
        // The PDUs of one write to the connection, kept from write to write: at depth every
        // completed command adds to it, and a fresh vector per round and per completion were
        // a good part of the session's allocations.
        let mut out: Vec<Pdu> = Vec::new();
        let mut admission = Admission::new(self.limits.clone());
        loop {
            out.clear();
            let deadline = self.payload_deadline();
            let mut close = tokio::select! {
                Some(done) = tasks.next(), if !tasks.is_empty() => {
                    self.completed(done, &mut out);
                    false
                }
                Some(event) = done_rx.recv() => {
                    let (more, c) = self.event(event);
                    out.extend(more);
                    c
                }
                (req, share) = admission.next() => {
                    let (more, c) = self.handle(req, share);
                    out.extend(more);
                    c
                }
                req = io.read(&mut rd) => match req? {
                    Some(req) => self.arrive(&mut admission, req, &mut out)?,
                    None => return Ok(()),
                },
                () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)),
                    if deadline.is_some() =>
                {
                    return Err(ConnectionError::PayloadTimeout(self.limits.payload_timeout()));
                }
            };
            // Whatever else is ready now goes out in the same write: a log batch completes
            // many commands at once, and one segment carrying all their responses costs the
            // initiator one wakeup instead of one each.
            loop {
                tasks.extend(self.started.drain(..));
                if close {
                    break;
                }
                if let Some(Some(done)) = tasks.next().now_or_never() {
                    self.completed(done, &mut out);
                    continue;
                }
                if let Ok(event) = done_rx.try_recv() {
                    let (more, c) = self.event(event);
                    out.extend(more);
                    close = c;
                    continue;
                }
                if let Some((req, share)) = admission.next_now() {
                    let (more, c) = self.handle(req, share);
                    out.extend(more);
                    close = c;
                    continue;
                }
                let Some(req) = io.decoded()? else { break };
                close = self.arrive(&mut admission, req, &mut out)?;
            }
            // Replies hold payload budget (and the tasks behind them theirs): a client that
            // takes none must not keep it forever.
            let stall = self.limits.payload_timeout();
            tokio::time::timeout(stall, io.write(&mut wr, &out))
                .await
                .map_err(|_| ConnectionError::ReplyTimeout(stall))??;
            if close {
                wr.shutdown().await.ok();
                return Ok(());
            }
        }
    }

    /// Takes in a PDU read from the connection; a SCSI command that moves data first gets its
    /// share of the payload budget (or waits in `admission`). Returns whether to close.
    fn arrive(
        &mut self,
        admission: &mut Admission,
        req: Pdu,
        out: &mut Vec<Pdu>,
    ) -> Result<bool, ConnectionError> {
        match admission.offer(req).map_err(ConnectionError::Protocol)? {
            Some((req, share)) => {
                let (more, close) = self.handle(req, share);
                out.extend(more);
                Ok(close)
            }
            None => Ok(false),
        }
    }

    /// When the earliest request holding payload budget must have its data: a write waiting
    /// for Data-Out, or a command held for a CmdSN gap.
    fn payload_deadline(&self) -> Option<Instant> {
        let timeout = self.limits.payload_timeout();
        let pending = self.pending.values().map(|w| w.deadline);
        let held = self.held.values().flatten().filter(|h| h.share.is_some());
        pending.chain(held.map(|h| h.since + timeout)).min()
    }

    /// Adds the PDUs for a task that ended to `out`: none when it was aborted.
    fn completed(&mut self, done: Option<(u64, Completion)>, out: &mut Vec<Pdu>) {
        if let Some((tag, completion)) = done {
            self.complete(tag, completion, out);
        }
    }

    /// Delivers `req` in CmdSN order (immediate requests at once); returns the PDUs to send
    /// and whether to close.
    fn handle(&mut self, req: Pdu, share: Option<PayloadShare>) -> (Vec<Pdu>, bool) {
        if !ordered(req.opcode()) || req.immediate() {
            return self.dispatch(req, share);
        }
        let sn = req.u32_at(24);
        let ahead = sn.wrapping_sub(self.exp_cmd_sn);
        if ahead >= CMD_WINDOW {
            tracing::debug!(
                sn,
                exp = self.exp_cmd_sn,
                "CmdSN outside the window, dropped"
            );
            return (Vec::new(), false);
        }
        if ahead > 0 {
            let since = Instant::now();
            self.held.entry(sn).or_insert(Some(Held {
                pdu: req,
                share,
                since,
            }));
            return (Vec::new(), false);
        }
        self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
        let (mut out, close) = self.dispatch(req, share);
        if close {
            return (out, true);
        }
        let (more, close) = self.drain_held();
        out.extend(more);
        (out, close)
    }

    /// Delivers held requests whose turn has come.
    fn drain_held(&mut self) -> (Vec<Pdu>, bool) {
        let mut out = Vec::new();
        while let Some(next) = self.held.remove(&self.exp_cmd_sn) {
            self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
            let Some(held) = next else { continue };
            let (more, close) = self.dispatch(held.pdu, held.share);
            out.extend(more);
            if close {
                return (out, true);
            }
        }
        (out, false)
    }

    fn dispatch(&mut self, req: Pdu, share: Option<PayloadShare>) -> (Vec<Pdu>, bool) {
        match req.opcode() {
            Opcode::NopOut => (self.nop(&req), false),
            Opcode::ScsiCommand => (self.scsi_command(req, share), false),
            Opcode::DataOut => self.data_out(req),
            Opcode::TaskMgmtRequest => self.task_mgmt(&req),
            Opcode::TextRequest => (self.text(&req), false),
            Opcode::LogoutRequest if self.resets_waiting > 0 => {
                self.logout_waiting = Some(req);
                (Vec::new(), false)
            }
            Opcode::LogoutRequest => (self.logout(&req), true),
            Opcode::SnackRequest => (vec![self.reject(&req, 0x04)], false),
            _ => (vec![self.reject(&req, 0x05)], false),
        }
    }

    fn reject(&mut self, req: &Pdu, reason: u8) -> Pdu {
        let mut p = Pdu::new(Opcode::Reject);
        p.bhs[2] = reason;
        p.set_itt(RESERVED_TAG);
        self.stamp(&mut p, true);
        p.data = req.bhs.to_vec();
        p
    }

    fn nop(&mut self, req: &Pdu) -> Vec<Pdu> {
        if req.itt() == RESERVED_TAG {
            return Vec::new();
        }
        let mut p = Pdu::new(Opcode::NopIn);
        p.bhs[8..16].copy_from_slice(&req.bhs[8..16]);
        p.set_itt(req.itt());
        p.set_u32(20, RESERVED_TAG);
        self.stamp(&mut p, true);
        p.data = req.data.clone();
        p.data.truncate(self.params.initiator_max_recv as usize);
        vec![p]
    }

    fn lun(&self) -> Option<Arc<Lun>> {
        match &self.kind {
            SessionKind::Normal(t) => Some(t.lun.clone()),
            SessionKind::Discovery => None,
        }
    }

    /// An ITT already in use by a task of this session.
    fn busy(&self, itt: u32) -> bool {
        self.pending.contains_key(&itt) || self.running.contains_key(&itt)
    }

    fn scsi_command(&mut self, mut req: Pdu, share: Option<PayloadShare>) -> Vec<Pdu> {
        if self.lun().is_none() || self.busy(req.itt()) {
            return vec![self.reject(&req, if self.busy(req.itt()) { 0x09 } else { 0x05 })];
        }
        if admission::oversized_write(&req) {
            // No data-out buffer of whatever size the initiator names (unsolicited Data-Out
            // that may follow is discarded: the task is unknown).
            let sense = Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_COMMAND_IU);
            let status = Status::CheckCondition;
            return vec![self.response(req.itt(), status, Some(&sense), 0, 0)];
        }
        let mut cdb = [0u8; 16];
        cdb.copy_from_slice(&req.bhs[32..48]);
        let edtl = req.u32_at(20);
        let write = req.flags() & 0x20 != 0;
        if !write || edtl == 0 {
            self.start(
                Command {
                    itt: req.itt(),
                    lun_id: req.lun(),
                    cdb,
                    edtl,
                    data: Vec::new(),
                    write,
                },
                share,
            );
            return Vec::new();
        }
        if req.data.len() > edtl as usize || (!req.data.is_empty() && !self.params.immediate_data) {
            return vec![self.reject(&req, 0x09)];
        }
        // The immediate data becomes the start of the data-out buffer (all of it, for a small
        // write): moved, not copied.
        let received = req.data.len() as u32;
        let mut data = std::mem::take(&mut req.data);
        data.resize(edtl as usize, 0);
        let mut task = PendingWrite {
            lun: req.lun(),
            cdb,
            edtl,
            data,
            received,
            ttt: RESERVED_TAG,
            r2t_sn: 0,
            r2t_end: None,
            data_sn: 0,
            epoch: self.lun().map_or(0, |lun| lun.unit().epoch()),
            broken: false,
            share,
            deadline: Instant::now() + self.limits.payload_timeout(),
        };
        // Unsolicited Data-Out may follow up to FirstBurstLength unless InitialR2T=Yes.
        let unsolicited_end = if self.params.initial_r2t || !req.is_final() {
            if self.params.initial_r2t {
                task.received
            } else {
                self.params.first_burst.min(edtl)
            }
        } else {
            task.received
        };
        let itt = req.itt();
        if task.received >= edtl {
            self.start_write(itt, task);
            return Vec::new();
        }
        let mut out = Vec::new();
        if !req.is_final() && unsolicited_end > task.received {
            // Wait for the unsolicited burst before soliciting the rest.
            task.r2t_end = Some(unsolicited_end);
        } else {
            out.push(self.r2t(itt, &mut task));
        }
        self.pending.insert(itt, task);
        out
    }

    fn start_write(&mut self, itt: u32, mut task: PendingWrite) {
        if self
            .lun()
            .is_some_and(|lun| lun.unit().epoch() != task.epoch)
        {
            // A reset from another session aborted the command while its data arrived.
            return;
        }
        let share = task.share.take();
        self.start(
            Command {
                itt,
                lun_id: task.lun,
                cdb: task.cdb,
                edtl: task.edtl,
                data: std::mem::take(&mut task.data),
                write: true,
            },
            share,
        );
    }

    /// Runs `cmd` as a task of this session, in the unit's task set: an ABORT TASK or a
    /// reset of this session aborts it through its handle, a reset from another session
    /// through its ticket. The task holds `share` of the payload budget until it ends.
    fn start(&mut self, cmd: Command, share: Option<PayloadShare>) {
        let Some(lun) = self.lun() else { return };
        let tag = self.next_tag;
        self.next_tag += 1;
        let itt = cmd.itt;
        let nexus = self.nexus.clone();
        let mut ticket = lun.unit().enter();
        let (abort, registration) = AbortHandle::new_pair();
        let run = async move {
            let _share = share;
            let completion = tokio::select! {
                c = task::run(lun, nexus, cmd) => c,
                () = ticket.aborted() => return None,
            };
            drop(ticket);
            Some((tag, completion))
        };
        self.started.push(Box::pin(
            Abortable::new(run, registration).map(|r| r.ok().flatten()),
        ));
        self.running.insert(itt, Running { tag, abort });
    }

    /// Turns an event into the PDUs to send; returns whether to close.
    fn event(&mut self, event: Event) -> (Vec<Pdu>, bool) {
        match event {
            Event::TmfDone { itt, response } => {
                self.resets_waiting = self.resets_waiting.saturating_sub(1);
                let mut out = vec![self.tmf_response(itt, response)];
                // The task management request came first: its response goes before the
                // logout's.
                if self.resets_waiting > 0 {
                    return (out, false);
                }
                match self.logout_waiting.take() {
                    Some(logout) => {
                        out.extend(self.logout(&logout));
                        (out, true)
                    }
                    None => (out, false),
                }
            }
        }
    }

    /// Adds a completion's data-in and response PDUs to `out`, unless its task was aborted.
    fn complete(&mut self, tag: u64, c: Completion, out: &mut Vec<Pdu>) {
        match self.running.get(&c.itt) {
            Some(r) if r.tag == tag => {}
            _ => return,
        }
        self.running.remove(&c.itt);
        let data_in = self.data_in(c.itt, c.lun_id, c.data_in);
        let carries_data = !data_in.is_empty();
        out.extend(data_in);
        // Phase collapse (RFC 7143 §11.7.4): GOOD status without sense rides on the final
        // Data-In (S bit), saving a SCSI Response PDU per read.
        match out.last_mut() {
            Some(last) if carries_data && c.status == Status::Good && c.sense.is_none() => {
                last.bhs[1] |= 0x01 | c.flag;
                last.bhs[3] = c.status.code();
                self.stamp(last, true);
                last.set_u32(44, c.resid);
            }
            _ => out.push(self.response(c.itt, c.status, c.sense.as_ref(), c.flag, c.resid)),
        }
    }

    fn r2t(&mut self, itt: u32, task: &mut PendingWrite) -> Pdu {
        let offset = task.received;
        let len = (task.edtl - offset).min(self.params.max_burst);
        task.ttt = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1).max(1);
        let mut p = Pdu::new(Opcode::R2t);
        p.set_lun(task.lun);
        p.set_itt(itt);
        p.set_u32(20, task.ttt);
        self.stamp(&mut p, false);
        p.set_u32(36, task.r2t_sn);
        task.r2t_sn += 1;
        p.set_u32(40, offset);
        p.set_u32(44, len);
        task.r2t_end = Some(offset + len);
        task.data_sn = 0;
        p
    }

    fn data_out(&mut self, req: Pdu) -> (Vec<Pdu>, bool) {
        let itt = req.itt();
        let Some(mut task) = self.pending.remove(&itt) else {
            // Data for an aborted or unknown task is discarded (RFC 7143 §11.7.1).
            return (Vec::new(), false);
        };
        let offset = req.u32_at(40);
        let end = offset as u64 + req.data.len() as u64;
        let data_sn = req.u32_at(36);
        let mut out = Vec::new();
        if !task.broken
            && (offset != task.received || end > u64::from(task.edtl) || data_sn != task.data_sn)
        {
            // A DataSN or offset out of sequence means an earlier Data-Out was lost (RFC 7143
            // §7.9), which ErrorRecoveryLevel 0 cannot recover within the command (no recovery
            // R2T): reject the PDU and end the command with CHECK CONDITION, nothing written,
            // once the initiator has sent the rest of the burst (§7.8 option b). The session
            // stays up, so initiators see a failed command rather than a reset connection (on
            // which a client still writing gets SIGPIPE).
            task.broken = true;
            out.push(self.reject(&req, 0x09));
        }
        if task.broken {
            if !req.is_final() {
                self.pending.insert(itt, task);
                return (out, false);
            }
            let sense = Sense::new(SenseKey::AbortedCommand, PROTOCOL_SERVICE_CRC_ERROR);
            out.push(self.response(itt, Status::CheckCondition, Some(&sense), 0, 0));
            return (out, false);
        }
        task.data[offset as usize..end as usize].copy_from_slice(&req.data);
        task.received = end as u32;
        task.data_sn = task.data_sn.wrapping_add(1);
        if !req.is_final() {
            self.pending.insert(itt, task);
            return (Vec::new(), false);
        }
        if task.received >= task.edtl {
            self.start_write(itt, task);
            return (Vec::new(), false);
        }
        let r2t = self.r2t(itt, &mut task);
        self.pending.insert(itt, task);
        (vec![r2t], false)
    }

    /// The Data-In PDUs carrying `data`, split at the initiator's MaxRecvDataSegmentLength;
    /// data that fits one PDU moves into it without a copy.
    fn data_in(&mut self, itt: u32, lun: u64, data: Vec<u8>) -> Vec<Pdu> {
        let seg = (self.params.initiator_max_recv as usize).max(512);
        if data.is_empty() {
            return Vec::new();
        }
        if data.len() <= seg {
            return vec![self.data_in_pdu(itt, lun, 0, 0, true, data)];
        }
        let total = data.len();
        data.chunks(seg)
            .enumerate()
            .map(|(sn, chunk)| {
                let last = (sn + 1) * seg >= total;
                self.data_in_pdu(itt, lun, sn, sn * seg, last, chunk.to_vec())
            })
            .collect()
    }

    fn data_in_pdu(
        &mut self,
        itt: u32,
        lun: u64,
        sn: usize,
        offset: usize,
        last: bool,
        data: Vec<u8>,
    ) -> Pdu {
        let mut p = Pdu::new(Opcode::DataIn);
        p.bhs[1] = if last { 0x80 } else { 0 };
        p.set_lun(lun);
        p.set_itt(itt);
        p.set_u32(20, RESERVED_TAG);
        self.stamp(&mut p, false);
        p.set_u32(24, 0);
        p.set_u32(36, sn as u32);
        p.set_u32(40, offset as u32);
        p.data = data;
        p
    }

    fn response(
        &mut self,
        itt: u32,
        status: Status,
        sense: Option<&Sense>,
        flag: u8,
        resid: u32,
    ) -> Pdu {
        let mut p = Pdu::new(Opcode::ScsiResponse);
        p.bhs[1] = 0x80 | flag;
        p.bhs[3] = status.code();
        p.set_itt(itt);
        self.stamp(&mut p, true);
        p.set_u32(44, resid);
        if let Some(sense) = sense {
            p.data = sense_segment(sense);
        }
        p
    }

    fn text(&mut self, req: &Pdu) -> Vec<Pdu> {
        if self.text_buf.len() + req.data.len() > 64 * 1024 {
            self.text_buf.clear();
            return vec![self.reject(req, 0x09)];
        }
        self.text_buf.extend_from_slice(&req.data);
        let continued = req.flags() & 0x40 != 0;
        let mut p = Pdu::new(Opcode::TextResponse);
        p.bhs[8..16].copy_from_slice(&req.bhs[8..16]);
        p.set_itt(req.itt());
        if continued {
            p.bhs[1] = 0;
            p.set_u32(20, self.next_ttt);
            self.stamp(&mut p, true);
            return vec![p];
        }
        let pairs = text::parse(&std::mem::take(&mut self.text_buf)).unwrap_or_default();
        let mut answers = Vec::new();
        for (key, value) in pairs {
            if key == "SendTargets" {
                answers.extend(self.send_targets(&value));
            } else {
                answers.push((key, "NotUnderstood".into()));
            }
        }
        p.set_u32(20, RESERVED_TAG);
        self.stamp(&mut p, true);
        p.data = text::encode(&answers);
        vec![p]
    }

    fn send_targets(&self, value: &str) -> Vec<(String, String)> {
        let names = match (value, &self.kind) {
            ("All", SessionKind::Discovery) => self.targets.names(),
            ("", SessionKind::Normal(t)) => vec![t.iqn.clone()],
            (name, _) if self.targets.get(name).is_some() => vec![name.to_string()],
            _ => Vec::new(),
        };
        names
            .into_iter()
            .flat_map(|n| {
                [
                    ("TargetName".to_string(), n),
                    ("TargetAddress".to_string(), format!("{},1", self.portal)),
                ]
            })
            .collect()
    }

    fn logout(&mut self, req: &Pdu) -> Vec<Pdu> {
        let reason = req.flags() & 0x7f;
        let mut p = Pdu::new(Opcode::LogoutResponse);
        p.bhs[2] = if reason == 2 { 2 } else { 0 };
        p.set_itt(req.itt());
        self.stamp(&mut p, true);
        vec![p]
    }
}
