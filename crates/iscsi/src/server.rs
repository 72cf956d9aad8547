//! The tokio server: accepts connections, runs the [`Login`] state machine, then the full
//! feature phase against the target's LUN 0.
//!
//! Per connection, PDUs are handled in arrival order; a SCSI command runs once all its
//! data-out has arrived (immediate, unsolicited, then solicited with R2T), and its response
//! goes out before the next PDU is handled. Non-immediate commands outside the CmdSN window
//! are dropped, as RFC 7143 §4.2.2.1 requires.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mariner_scsi::{data_out_len, Asc, Lun, Sense, SenseKey, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::login::{Established, Login, Next, SessionKind, CMD_WINDOW};
use crate::params::{SessionParams, TargetLimits};
use crate::pdu::{Decoder, Digests, Opcode, Pdu, PduError, RESERVED_TAG};
use crate::targets::Targets;
use crate::text;

/// ASC/ASCQ 4B/00: DATA PHASE ERROR.
const DATA_PHASE_ERROR: Asc = Asc(0x4b, 0x00);

/// Settings of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// Our negotiation limits.
    pub limits: TargetLimits,
    /// Time a client gets to finish logging in.
    pub login_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            limits: TargetLimits::default(),
            login_timeout: Duration::from_secs(30),
        }
    }
}

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// Socket error.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// Malformed PDU stream.
    #[error("PDU error: {0}")]
    Pdu(#[from] PduError),
    /// The initiator broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// Login took too long.
    #[error("login timed out")]
    LoginTimeout,
}

/// Serves iSCSI on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    targets: Arc<dyn Targets>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let tsih = Arc::new(AtomicU16::new(1));
    let portal = listener.local_addr()?;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = accepted?;
                let targets = targets.clone();
                let mut stop = stop_rx.clone();
                let handle = tsih.fetch_add(1, Ordering::Relaxed).max(1);
                tokio::spawn(async move {
                    tokio::select! {
                        r = serve_connection(stream, targets, config, portal, handle) => {
                            if let Err(e) = r {
                                tracing::debug!(%peer, error = %e, "iSCSI connection ended");
                            }
                        }
                        _ = stop.changed() => {}
                    }
                });
            }
        }
    }
    let _ = stop_tx.send(true);
    Ok(())
}

/// Serves one connection: login, then the full feature phase.
pub async fn serve_connection(
    mut stream: TcpStream,
    targets: Arc<dyn Targets>,
    config: ServerConfig,
    portal: SocketAddr,
    tsih: u16,
) -> Result<(), ConnectionError> {
    let _ = stream.set_nodelay(true);
    let mut io = PduStream {
        buf: Vec::new(),
        decoder: Decoder::new(64 * 1024),
        digests: Digests::default(),
    };
    let established = tokio::time::timeout(
        config.login_timeout,
        login(&mut stream, &mut io, targets.clone(), config.limits, tsih),
    )
    .await
    .map_err(|_| ConnectionError::LoginTimeout)??;
    let Some(est) = established else {
        return Ok(());
    };
    io.decoder.digests = Digests {
        header: est.params.header_digest,
        data: est.params.data_digest,
    };
    io.decoder.max_data_len = est.params.target_max_recv as usize;
    io.digests = io.decoder.digests;
    let mut session = Session::new(*est, targets, portal);
    session.run(&mut stream, &mut io).await
}

struct PduStream {
    buf: Vec<u8>,
    decoder: Decoder,
    digests: Digests,
}

impl PduStream {
    async fn read(&mut self, stream: &mut TcpStream) -> Result<Option<Pdu>, ConnectionError> {
        loop {
            if let Some(pdu) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(pdu));
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn write(&self, stream: &mut TcpStream, pdus: &[Pdu]) -> io::Result<()> {
        let mut out = Vec::new();
        for p in pdus {
            p.encode(self.digests, &mut out);
        }
        stream.write_all(&out).await
    }
}

async fn login(
    stream: &mut TcpStream,
    io: &mut PduStream,
    targets: Arc<dyn Targets>,
    limits: TargetLimits,
    tsih: u16,
) -> Result<Option<Box<Established>>, ConnectionError> {
    let mut machine = Login::new(targets, limits, tsih);
    loop {
        let Some(req) = io.read(stream).await? else {
            return Ok(None);
        };
        let (resp, next) = machine.handle(&req);
        io.write(stream, &[resp]).await?;
        match next {
            Next::Continue => {}
            Next::Close => return Ok(None),
            Next::FullFeature(est) => return Ok(Some(est)),
        }
    }
}

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
}

struct Session {
    kind: SessionKind,
    params: SessionParams,
    stat_sn: u32,
    exp_cmd_sn: u32,
    targets: Arc<dyn Targets>,
    portal: SocketAddr,
    pending: HashMap<u32, PendingWrite>,
    next_ttt: u32,
    text_buf: Vec<u8>,
}

/// Sense data length prefix + fixed sense.
fn sense_segment(sense: &Sense) -> Vec<u8> {
    let fixed = sense.to_fixed();
    let mut out = vec![0, fixed.len() as u8];
    out.extend_from_slice(&fixed);
    out
}

impl Session {
    fn new(est: Established, targets: Arc<dyn Targets>, portal: SocketAddr) -> Self {
        Self {
            kind: est.kind,
            params: est.params,
            stat_sn: est.stat_sn,
            exp_cmd_sn: est.exp_cmd_sn,
            targets,
            portal,
            pending: HashMap::new(),
            next_ttt: 1,
            text_buf: Vec::new(),
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

    /// Applies CmdSN ordering to a non-immediate request; false means drop it.
    fn accept_cmd_sn(&mut self, req: &Pdu) -> bool {
        if req.immediate() {
            return true;
        }
        let sn = req.u32_at(24);
        let ahead = sn.wrapping_sub(self.exp_cmd_sn);
        if ahead >= CMD_WINDOW {
            tracing::debug!(
                sn,
                exp = self.exp_cmd_sn,
                "CmdSN outside the window, dropped"
            );
            return false;
        }
        self.exp_cmd_sn = sn.wrapping_add(1);
        true
    }

    async fn run(
        &mut self,
        stream: &mut TcpStream,
        io: &mut PduStream,
    ) -> Result<(), ConnectionError> {
        while let Some(req) = io.read(stream).await? {
            let (out, close) = self.handle(req).await;
            io.write(stream, &out).await?;
            if close {
                stream.shutdown().await.ok();
                return Ok(());
            }
        }
        Ok(())
    }

    async fn handle(&mut self, req: Pdu) -> (Vec<Pdu>, bool) {
        match req.opcode() {
            Opcode::NopOut => (self.nop(&req), false),
            Opcode::ScsiCommand => (self.scsi_command(req).await, false),
            Opcode::DataOut => self.data_out(req).await,
            Opcode::TaskMgmtRequest => (self.task_mgmt(&req), false),
            Opcode::TextRequest => (self.text(&req), false),
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
        if !self.accept_cmd_sn(req) || req.itt() == RESERVED_TAG {
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

    async fn scsi_command(&mut self, req: Pdu) -> Vec<Pdu> {
        if !self.accept_cmd_sn(&req) {
            return Vec::new();
        }
        let Some(lun) = self.lun() else {
            return vec![self.reject(&req, 0x05)];
        };
        let mut cdb = [0u8; 16];
        cdb.copy_from_slice(&req.bhs[32..48]);
        let edtl = req.u32_at(20);
        let write = req.flags() & 0x20 != 0;
        if !write || edtl == 0 {
            return self
                .execute(&req, &lun, cdb, req.lun(), edtl, Vec::new())
                .await;
        }
        if req.data.len() > edtl as usize || (!req.data.is_empty() && !self.params.immediate_data) {
            return vec![self.reject(&req, 0x09)];
        }
        let mut task = PendingWrite {
            lun: req.lun(),
            cdb,
            edtl,
            data: vec![0u8; edtl as usize],
            received: req.data.len() as u32,
            ttt: RESERVED_TAG,
            r2t_sn: 0,
            r2t_end: None,
            data_sn: 0,
        };
        task.data[..req.data.len()].copy_from_slice(&req.data);
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
        if task.received >= edtl {
            return self
                .execute(&req, &lun, cdb, task.lun, edtl, task.data)
                .await;
        }
        let itt = req.itt();
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

    async fn data_out(&mut self, req: Pdu) -> (Vec<Pdu>, bool) {
        let itt = req.itt();
        let Some(mut task) = self.pending.remove(&itt) else {
            // Data for an aborted or unknown task is discarded (RFC 7143 §11.7.1).
            return (Vec::new(), false);
        };
        let offset = req.u32_at(40);
        let end = offset as u64 + req.data.len() as u64;
        let data_sn = req.u32_at(36);
        if offset != task.received || end > u64::from(task.edtl) || data_sn != task.data_sn {
            // ErrorRecoveryLevel 0 cannot recover a sequence error within the command: reject
            // the PDU and end the command with ABORTED COMMAND / DATA PHASE ERROR, nothing
            // written. The session stays up, so initiators see a failed command rather than a
            // reset connection (on which a client still writing gets SIGPIPE).
            let sense = Sense::new(SenseKey::AbortedCommand, DATA_PHASE_ERROR);
            let reject = self.reject(&req, 0x09);
            let resp = self.response(itt, Status::CheckCondition, Some(&sense), 0, 0);
            return (vec![reject, resp], false);
        }
        task.data[offset as usize..end as usize].copy_from_slice(&req.data);
        task.received = end as u32;
        task.data_sn = task.data_sn.wrapping_add(1);
        if !req.is_final() {
            self.pending.insert(itt, task);
            return (Vec::new(), false);
        }
        if task.received >= task.edtl {
            let Some(lun) = self.lun() else {
                return (Vec::new(), true);
            };
            let (cdb, l, edtl, data) = (
                task.cdb,
                task.lun,
                task.edtl,
                std::mem::take(&mut task.data),
            );
            return (self.execute(&req, &lun, cdb, l, edtl, data).await, false);
        }
        let r2t = self.r2t(itt, &mut task);
        self.pending.insert(itt, task);
        (vec![r2t], false)
    }

    async fn execute(
        &mut self,
        req: &Pdu,
        lun: &Lun,
        cdb: [u8; 16],
        lun_id: u64,
        edtl: u32,
        data: Vec<u8>,
    ) -> Vec<Pdu> {
        let itt = req.itt();
        if lun_id != 0 {
            let sense = Sense::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED);
            return vec![self.response(itt, Status::CheckCondition, Some(&sense), 0, 0)];
        }
        let block_size = lun.geometry().block_size;
        let expected_out = data_out_len(&cdb, block_size).unwrap_or(0);
        let parsed = mariner_scsi::Cdb::parse(&cdb);
        if expected_out != u64::from(edtl)
            && matches!(parsed, Ok(mariner_scsi::Cdb::CompareAndWrite { .. }))
        {
            // SBC-3 5.2: the data-out is exactly the verify and the write data; any other
            // length means the NUMBER OF LOGICAL BLOCKS field is wrong. Nothing is written.
            let sense = Sense::invalid_field_in_cdb(13);
            return vec![self.response(itt, Status::CheckCondition, Some(&sense), 0, 0)];
        }
        if expected_out > u64::from(edtl) {
            let resid = (expected_out - u64::from(edtl)) as u32;
            if matches!(
                parsed,
                Ok(mariner_scsi::Cdb::Write { .. } | mariner_scsi::Cdb::WriteAndVerify { .. })
            ) {
                // Process the write without transferring data beyond EDTL (whole blocks).
                let resp = lun.execute_truncated_write(&cdb, &data).await;
                return vec![self.response(itt, resp.status, resp.sense.as_ref(), 0x04, resid)];
            }
            // Other commands cannot be truncated meaningfully: refuse without writing.
            let sense = Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_COMMAND_IU);
            return vec![self.response(itt, Status::CheckCondition, Some(&sense), 0x04, resid)];
        }
        let resp = lun.execute(&cdb, &data).await;
        let is_write =
            req.opcode() == Opcode::ScsiCommand && req.flags() & 0x20 != 0 || !data.is_empty();
        let produced = if is_write {
            expected_out
        } else {
            resp.data.len() as u64
        };
        let (flag, resid) = if produced > u64::from(edtl) {
            (0x04, (produced - u64::from(edtl)) as u32)
        } else if produced < u64::from(edtl) {
            (0x02, (u64::from(edtl) - produced) as u32)
        } else {
            (0, 0)
        };
        let mut data_in = resp.data;
        data_in.truncate(edtl as usize);
        let mut out = self.data_in(itt, lun_id, &data_in);
        out.push(self.response(itt, resp.status, resp.sense.as_ref(), flag, resid));
        out
    }

    fn data_in(&mut self, itt: u32, lun: u64, data: &[u8]) -> Vec<Pdu> {
        let seg = (self.params.initiator_max_recv as usize).max(512);
        data.chunks(seg)
            .enumerate()
            .map(|(sn, chunk)| {
                let mut p = Pdu::new(Opcode::DataIn);
                let last = (sn + 1) * seg >= data.len();
                p.bhs[1] = if last { 0x80 } else { 0 };
                p.set_lun(lun);
                p.set_itt(itt);
                p.set_u32(20, RESERVED_TAG);
                self.stamp(&mut p, false);
                p.set_u32(24, 0);
                p.set_u32(36, sn as u32);
                p.set_u32(40, (sn * seg) as u32);
                p.data = chunk.to_vec();
                p
            })
            .collect()
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

    fn task_mgmt(&mut self, req: &Pdu) -> Vec<Pdu> {
        let ahead_ok = self.accept_cmd_sn(req);
        if !ahead_ok {
            return Vec::new();
        }
        let function = req.flags() & 0x7f;
        let response = match function {
            1 => self.abort_task(req.u32_at(20), req.u32_at(32)),
            2 | 4 | 5 => {
                if req.lun() != 0 && function != 6 {
                    2
                } else {
                    self.pending.clear();
                    0
                }
            }
            6 | 7 => {
                self.pending.clear();
                0
            }
            3 => 5,
            8 => 4,
            _ => 255,
        };
        let mut p = Pdu::new(Opcode::TaskMgmtResponse);
        p.bhs[2] = response;
        p.set_itt(req.itt());
        self.stamp(&mut p, true);
        vec![p]
    }

    /// ABORT TASK: 0 "function complete" when the task was waiting for data-out (it is
    /// dropped without a response) or was never received (RFC 7143 §11.5.1: its CmdSN is then
    /// considered received); 1 "task does not exist" when its command arrived and, commands
    /// running one at a time, has already been answered. §11.5.1 would answer "function
    /// complete" here too, but then an initiator cannot tell an aborted command from a
    /// completed one; Linux targets answer "task does not exist" and libiscsi's AbortTask test
    /// relies on it.
    fn abort_task(&mut self, referenced_itt: u32, ref_cmd_sn: u32) -> u8 {
        if self.pending.remove(&referenced_itt).is_some() {
            return 0;
        }
        let behind = self.exp_cmd_sn.wrapping_sub(ref_cmd_sn);
        let received = behind != 0 && behind <= CMD_WINDOW;
        if received {
            1
        } else {
            0
        }
    }

    fn text(&mut self, req: &Pdu) -> Vec<Pdu> {
        if !self.accept_cmd_sn(req) {
            return Vec::new();
        }
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
        self.accept_cmd_sn(req);
        let reason = req.flags() & 0x7f;
        let mut p = Pdu::new(Opcode::LogoutResponse);
        p.bhs[2] = if reason == 2 { 2 } else { 0 };
        p.set_itt(req.itt());
        self.stamp(&mut p, true);
        vec![p]
    }
}
