//! The per-connection task set over a real socket: commands run concurrently (a later command
//! finishes before an earlier, blocked one), ABORT TASK and LUN RESET abort running tasks (no
//! response is ever sent for them), and non-immediate requests are delivered in CmdSN order.
//! The unit's task set across sessions: a LUN RESET from one session aborts another's tasks
//! and leaves a unit attention for both. A Data-Out out of sequence fails its command once
//! the burst is over.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use mariner_iscsi::pdu::{Decoder, Digests, Opcode, Pdu};
use mariner_iscsi::{serve, text, MemoryTargets, ServerConfig, Target};
use mariner_scsi::{
    BackendError, BlockBackend, CompareOutcome, Geometry, Lun, MemoryBackend, Provisioning,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

const IQN: &str = "iqn.2026-11.dev.mariner:gated";
/// Reads of this LBA wait for a permit from the gate.
const GATED_LBA: u64 = 7;

/// A memory backend whose reads of [`GATED_LBA`] block until the test releases them.
struct Gated {
    inner: MemoryBackend,
    gate: Gate,
}

/// The test's side of the gate: it learns when a read has reached the gate and lets reads
/// through.
#[derive(Clone)]
struct Gate {
    /// One permit lets one gated read through.
    permits: Arc<Semaphore>,
    /// One permit for every gated read that has arrived at the gate.
    arrived: Arc<Semaphore>,
}

impl Gate {
    fn new() -> Self {
        Gate {
            permits: Arc::new(Semaphore::new(0)),
            arrived: Arc::new(Semaphore::new(0)),
        }
    }

    /// Lets `n` gated reads through.
    fn add_permits(&self, n: usize) {
        self.permits.add_permits(n);
    }

    /// Waits until `n` more gated reads are waiting at the gate (so the server is running
    /// them), or fails after 10 s.
    async fn reached(&self, n: u32) {
        tokio::time::timeout(Duration::from_secs(10), self.arrived.acquire_many(n))
            .await
            .expect("the gated reads did not reach the backend within 10 s")
            .unwrap()
            .forget();
    }
}

#[async_trait]
impl BlockBackend for Gated {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> Result<Vec<u8>, BackendError> {
        if lba == GATED_LBA {
            self.gate.arrived.add_permits(1);
            self.gate.permits.acquire().await.unwrap().forget();
        }
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: bytes::Bytes) -> Result<(), BackendError> {
        self.inner.write(lba, data).await
    }
    async fn flush(&self) -> Result<(), BackendError> {
        self.inner.flush().await
    }
    async fn unmap(&self, lba: u64, blocks: u64) -> Result<(), BackendError> {
        self.inner.unmap(lba, blocks).await
    }
    async fn compare_and_write(
        &self,
        lba: u64,
        expected: &[u8],
        data: &[u8],
    ) -> Result<CompareOutcome, BackendError> {
        self.inner.compare_and_write(lba, expected, data).await
    }
    async fn or_write(&self, lba: u64, data: &[u8]) -> Result<(), BackendError> {
        self.inner.or_write(lba, data).await
    }
    async fn lba_status(&self, lba: u64) -> Result<(Provisioning, u64), BackendError> {
        self.inner.lba_status(lba).await
    }
}

struct Client {
    s: TcpStream,
    buf: Vec<u8>,
    decoder: Decoder,
    cmd_sn: u32,
}

impl Client {
    async fn login(addr: std::net::SocketAddr) -> Self {
        Self::login_as(addr, 0).await
    }

    /// Logs in with the last ISID byte `isid`: another I_T nexus for each value.
    async fn login_as(addr: std::net::SocketAddr, isid: u8) -> Self {
        Self::login_offering(addr, isid, &[]).await.0
    }

    /// Logs in as [`Client::login_as`], offering `extra` keys too; returns the client and the
    /// target's login response.
    async fn login_offering(
        addr: std::net::SocketAddr,
        isid: u8,
        extra: &[(&str, &str)],
    ) -> (Self, Pdu) {
        let s = TcpStream::connect(addr).await.unwrap();
        let mut c = Client {
            s,
            buf: Vec::new(),
            decoder: Decoder::new(1 << 20),
            cmd_sn: 1,
        };
        let mut p = Pdu::new(Opcode::LoginRequest);
        p.bhs[0] |= 0x40;
        p.bhs[1] = 0x87; // transit, operational → full feature
        p.bhs[8] = 0x80;
        p.bhs[13] = isid;
        p.set_u32(24, 1);
        let keys = [("InitiatorName", "iqn.init"), ("TargetName", IQN)];
        let owned: Vec<(String, String)> = keys
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        p.data = text::encode(&owned);
        c.send(&p).await;
        let r = c.recv().await;
        assert_eq!((r.bhs[36], r.bhs[37]), (0, 0), "login refused");
        (c, r)
    }

    async fn send(&mut self, p: &Pdu) {
        let mut out = Vec::new();
        p.encode(Digests::default(), &mut out);
        self.s.write_all(&out).await.unwrap();
    }

    async fn recv(&mut self) -> Pdu {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(p) = self.decoder.decode(&mut self.buf).unwrap() {
                    return p;
                }
                let mut chunk = [0u8; 65536];
                let n = self.s.read(&mut chunk).await.unwrap();
                assert!(n > 0, "connection closed");
                self.buf.extend_from_slice(&chunk[..n]);
            }
        })
        .await
        .expect("no PDU within 10 s")
    }

    /// Nothing arrives within `ms`.
    async fn quiet(&mut self, ms: u64) {
        let got = tokio::time::timeout(Duration::from_millis(ms), self.recv()).await;
        assert!(got.is_err(), "unexpected PDU {:?}", got.map(|p| p.opcode()));
    }

    /// A READ(10) of one block with ITT `itt` and the next CmdSN; returns that CmdSN.
    #[allow(clippy::big_endian_bytes)] // CDB fields are big-endian
    fn read10(&mut self, itt: u32, lba: u32) -> (Pdu, u32) {
        let mut p = Pdu::new(Opcode::ScsiCommand);
        p.bhs[1] = 0x80 | 0x40 | 0x01;
        p.set_itt(itt);
        p.set_u32(20, 512);
        let sn = self.next_sn();
        p.set_u32(24, sn);
        p.bhs[32] = 0x28;
        p.bhs[34..38].copy_from_slice(&lba.to_be_bytes());
        p.bhs[40] = 1;
        (p, sn)
    }

    fn next_sn(&mut self) -> u32 {
        self.cmd_sn += 1;
        self.cmd_sn - 1
    }

    /// An immediate task management request.
    fn tmf(&self, function: u8, itt: u32, ref_itt: u32, ref_sn: u32) -> Pdu {
        let mut p = Pdu::new(Opcode::TaskMgmtRequest);
        p.bhs[0] |= 0x40;
        p.bhs[1] = 0x80 | function;
        p.set_itt(itt);
        p.set_u32(20, ref_itt);
        p.set_u32(24, self.cmd_sn);
        p.set_u32(32, ref_sn);
        p
    }

    fn nop(&mut self, itt: u32, sn: u32) -> Pdu {
        let mut p = Pdu::new(Opcode::NopOut);
        p.bhs[1] = 0x80;
        p.set_itt(itt);
        p.set_u32(20, 0xffff_ffff);
        p.set_u32(24, sn);
        p
    }

    /// Skips Data-In PDUs; returns the ITT and status of the next SCSI Response.
    async fn response(&mut self) -> (u32, u8) {
        let p = self.response_pdu().await;
        (p.itt(), p.bhs[3])
    }

    /// Skips Data-In PDUs; returns the next SCSI Response, or the final Data-In when it
    /// carries the status (S bit, phase collapse).
    async fn response_pdu(&mut self) -> Pdu {
        loop {
            let p = self.recv().await;
            match p.opcode() {
                Opcode::DataIn if p.bhs[1] & 0x01 != 0 => return p,
                Opcode::DataIn => {}
                Opcode::ScsiResponse => return p,
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Sends TEST UNIT READY; returns the status and, for CHECK CONDITION, the sense key and
    /// ASC/ASCQ.
    async fn test_unit_ready(&mut self, itt: u32) -> (u8, Option<(u8, u8, u8)>) {
        let mut p = Pdu::new(Opcode::ScsiCommand);
        p.bhs[1] = 0x80 | 0x01;
        p.set_itt(itt);
        let sn = self.next_sn();
        p.set_u32(24, sn);
        self.send(&p).await;
        let r = self.response_pdu().await;
        // The data segment is a 2-byte length, then fixed-format sense.
        let sense = (r.data.len() >= 16).then(|| (r.data[4] & 0x0f, r.data[14], r.data[15]));
        (r.bhs[3], sense)
    }

    /// A WRITE(10) of `blocks` blocks at LBA 0 whose data is all solicited.
    fn write10(&mut self, itt: u32, blocks: u8) -> Pdu {
        let mut p = Pdu::new(Opcode::ScsiCommand);
        p.bhs[1] = 0x80 | 0x20 | 0x01;
        p.set_itt(itt);
        p.set_u32(20, u32::from(blocks) * 512);
        let sn = self.next_sn();
        p.set_u32(24, sn);
        p.bhs[32] = 0x2a;
        p.bhs[40] = blocks;
        p
    }

    /// A Data-Out of one block for `itt` at `offset`, with DataSN `data_sn`.
    fn data_out(itt: u32, ttt: u32, data_sn: u32, offset: u32, last: bool) -> Pdu {
        let mut p = Pdu::new(Opcode::DataOut);
        p.bhs[1] = if last { 0x80 } else { 0 };
        p.set_itt(itt);
        p.set_u32(20, ttt);
        p.set_u32(36, data_sn);
        p.set_u32(40, offset);
        p.data = vec![0xa5; 512];
        p
    }
}

async fn start() -> (std::net::SocketAddr, Gate) {
    let gate = Gate::new();
    let backend = Gated {
        inner: MemoryBackend::new("g", 512, 64),
        gate: gate.clone(),
    };
    let targets = Arc::new(MemoryTargets::new());
    targets.add(Target {
        iqn: IQN.into(),
        lun: Arc::new(Lun::new(Arc::new(backend))),
        chap: None,
        allowed_initiators: Vec::new(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        targets,
        ServerConfig::default(),
        std::future::pending(),
    ));
    (addr, gate)
}

#[tokio::test]
async fn a_later_command_overtakes_a_blocked_one() {
    let (addr, gate) = start().await;
    let mut c = Client::login(addr).await;
    let (blocked, _) = c.read10(10, GATED_LBA as u32);
    let (quick, _) = c.read10(11, 0);
    c.send(&blocked).await;
    c.send(&quick).await;
    assert_eq!(
        c.response().await,
        (11, 0),
        "the unblocked read answers first"
    );
    gate.add_permits(1);
    assert_eq!(c.response().await, (10, 0));
}

#[tokio::test]
async fn abort_task_aborts_a_running_task_and_it_never_answers() {
    let (addr, gate) = start().await;
    let mut c = Client::login(addr).await;
    let (blocked, sn) = c.read10(20, GATED_LBA as u32);
    c.send(&blocked).await;
    gate.reached(1).await;
    let tmf = c.tmf(1, 21, 20, sn);
    c.send(&tmf).await;
    let r = c.recv().await;
    assert_eq!(
        (r.opcode(), r.itt(), r.bhs[2]),
        (Opcode::TaskMgmtResponse, 21, 0)
    );
    gate.add_permits(1);
    c.quiet(200).await;
    // The ITT is free again and the session goes on.
    let (again, _) = c.read10(20, 0);
    c.send(&again).await;
    assert_eq!(c.response().await, (20, 0));
}

#[tokio::test]
async fn lun_reset_aborts_every_running_task() {
    let (addr, gate) = start().await;
    let mut c = Client::login(addr).await;
    for itt in 30..33 {
        let (p, _) = c.read10(itt, GATED_LBA as u32);
        c.send(&p).await;
    }
    gate.reached(3).await;
    let tmf = c.tmf(5, 40, 0xffff_ffff, 0);
    c.send(&tmf).await;
    let r = c.recv().await;
    assert_eq!(
        (r.opcode(), r.itt(), r.bhs[2]),
        (Opcode::TaskMgmtResponse, 40, 0)
    );
    gate.add_permits(3);
    c.quiet(200).await;
}

#[tokio::test]
async fn requests_are_delivered_in_cmd_sn_order() {
    let (addr, _gate) = start().await;
    let mut c = Client::login(addr).await;
    let first = c.next_sn();
    let second = c.next_sn();
    // The second arrives first and waits for the gap to fill.
    let p = c.nop(51, second);
    c.send(&p).await;
    c.quiet(100).await;
    let p = c.nop(50, first);
    c.send(&p).await;
    let a = c.recv().await;
    let b = c.recv().await;
    assert_eq!((a.opcode(), a.itt()), (Opcode::NopIn, 50));
    assert_eq!((b.opcode(), b.itt()), (Opcode::NopIn, 51));
    assert_eq!(b.u32_at(28), second.wrapping_add(1), "ExpCmdSN past both");
}

#[tokio::test]
async fn lun_reset_aborts_another_sessions_task_and_leaves_a_unit_attention_for_both() {
    let (addr, gate) = start().await;
    let mut a = Client::login_as(addr, 1).await;
    let mut b = Client::login_as(addr, 2).await;
    let (blocked, _) = a.read10(60, GATED_LBA as u32);
    a.send(&blocked).await;
    gate.reached(1).await;
    let tmf = b.tmf(5, 70, 0xffff_ffff, 0);
    b.send(&tmf).await;
    let r = b.recv().await;
    assert_eq!(
        (r.opcode(), r.itt(), r.bhs[2]),
        (Opcode::TaskMgmtResponse, 70, 0)
    );
    gate.add_permits(1);
    a.quiet(200).await;
    // CHECK CONDITION, UNIT ATTENTION, BUS DEVICE RESET FUNCTION OCCURRED, reported once.
    let ua = (2, Some((0x6, 0x29, 0x03)));
    assert_eq!(a.test_unit_ready(61).await, ua);
    assert_eq!(a.test_unit_ready(62).await, (0, None));
    assert_eq!(b.test_unit_ready(71).await, ua, "the resetting nexus too");
    assert_eq!(b.test_unit_ready(72).await, (0, None));
    // A session logged in after the reset is a new nexus: nothing pending.
    let mut c = Client::login_as(addr, 3).await;
    assert_eq!(c.test_unit_ready(80).await, (0, None));
}

#[tokio::test]
async fn a_data_sn_out_of_sequence_fails_the_write_once_the_burst_is_over() {
    let (addr, _gate) = start().await;
    let mut c = Client::login(addr).await;
    let cmd = c.write10(90, 2);
    c.send(&cmd).await;
    let r2t = c.recv().await;
    assert_eq!((r2t.opcode(), r2t.u32_at(44)), (Opcode::R2t, 1024));
    let ttt = r2t.u32_at(20);
    // DataSN 1 first: the PDU carrying DataSN 0 was lost.
    c.send(&Client::data_out(90, ttt, 1, 0, false)).await;
    let reject = c.recv().await;
    assert_eq!((reject.opcode(), reject.bhs[2]), (Opcode::Reject, 0x09));
    c.quiet(100).await;
    c.send(&Client::data_out(90, ttt, 0, 512, true)).await;
    let r = c.response_pdu().await;
    assert_eq!((r.itt(), r.bhs[3]), (90, 2), "CHECK CONDITION");
    assert_eq!(
        (r.data[4] & 0x0f, r.data[14], r.data[15]),
        (0xb, 0x47, 0x05),
        "ABORTED COMMAND, PROTOCOL SERVICE CRC ERROR"
    );
    // Nothing was written.
    let (read, _) = c.read10(91, 0);
    c.send(&read).await;
    let data_in = c.recv().await;
    assert_eq!(data_in.opcode(), Opcode::DataIn);
    assert!(data_in.data.iter().all(|b| *b == 0));
}

#[tokio::test]
async fn a_logout_right_after_a_lun_reset_is_answered_after_the_reset() {
    let (addr, gate) = start().await;
    let mut c = Client::login(addr).await;
    let (blocked, _) = c.read10(100, GATED_LBA as u32);
    c.send(&blocked).await;
    gate.reached(1).await;
    let tmf = c.tmf(5, 101, 0xffff_ffff, 0);
    let mut logout = Pdu::new(Opcode::LogoutRequest);
    logout.bhs[1] = 0x80;
    logout.set_itt(102);
    let sn = c.next_sn();
    logout.set_u32(24, sn);
    let mut both = Vec::new();
    tmf.encode(Digests::default(), &mut both);
    logout.encode(Digests::default(), &mut both);
    c.s.write_all(&both).await.unwrap();
    let first = c.recv().await;
    assert_eq!(
        (first.opcode(), first.itt()),
        (Opcode::TaskMgmtResponse, 101)
    );
    let second = c.recv().await;
    assert_eq!(
        (second.opcode(), second.itt()),
        (Opcode::LogoutResponse, 102)
    );
}

/// A server whose node-wide caps are `limits` (plain memory LUN of 64 blocks).
async fn start_limited(limits: mariner_limits::Limits) -> std::net::SocketAddr {
    let targets = Arc::new(MemoryTargets::new());
    targets.add(Target {
        iqn: IQN.into(),
        lun: Arc::new(Lun::new(Arc::new(MemoryBackend::new("l", 512, 64)))),
        chap: None,
        allowed_initiators: Vec::new(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = ServerConfig {
        node_limits: limits,
        ..ServerConfig::default()
    };
    tokio::spawn(serve(listener, targets, config, std::future::pending()));
    addr
}

fn caps(max_connections: u32, bytes: u32, timeout_ms: u64) -> mariner_limits::Limits {
    mariner_limits::Limits::new(mariner_limits::LimitsConfig {
        max_connections,
        max_in_flight_bytes: bytes,
        payload_timeout: Duration::from_millis(timeout_ms),
    })
}

/// The server closes the connection (EOF or reset) within 10 s.
async fn assert_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 512];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
        match read.expect("the connection was not closed") {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Sends the Data-Out for an R2T of `blocks` blocks.
async fn answer_r2t(c: &mut Client, r2t: &Pdu, blocks: u32) {
    assert_eq!(r2t.opcode(), Opcode::R2t);
    for b in 0..blocks {
        let out = Client::data_out(r2t.itt(), r2t.u32_at(20), b, b * 512, b + 1 == blocks);
        c.send(&out).await;
    }
}

#[tokio::test]
async fn writes_of_two_sessions_never_hold_more_than_the_node_budget() {
    let limits = caps(16, 4 * 512, 60_000);
    let addr = start_limited(limits.clone()).await;
    let mut a = Client::login_as(addr, 1).await;
    let mut b = Client::login_as(addr, 2).await;
    // A's write takes the whole budget and waits for its data.
    let wa = a.write10(1, 4);
    a.send(&wa).await;
    let r2t_a = a.recv().await;
    assert_eq!(limits.in_flight_bytes(), 4 * 512);
    // B's write waits for budget: no R2T yet.
    let wb = b.write10(1, 1);
    b.send(&wb).await;
    b.quiet(300).await;
    // A's data: A completes, and B gets its R2T.
    answer_r2t(&mut a, &r2t_a, 4).await;
    assert_eq!(a.response().await, (1, 0));
    let r2t_b = b.recv().await;
    answer_r2t(&mut b, &r2t_b, 1).await;
    assert_eq!(b.response().await, (1, 0));
    tokio::time::timeout(Duration::from_secs(10), async {
        while limits.in_flight_bytes() != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("budget released");
}

#[tokio::test]
async fn a_write_whose_data_never_comes_loses_its_budget_after_the_timeout() {
    let limits = caps(16, 4 * 512, 300);
    let addr = start_limited(limits.clone()).await;
    let mut stalled = Client::login_as(addr, 1).await;
    let w = stalled.write10(1, 4);
    stalled.send(&w).await;
    assert_eq!(stalled.recv().await.opcode(), Opcode::R2t);
    let mut other = Client::login_as(addr, 2).await;
    let w = other.write10(1, 2);
    other.send(&w).await;
    let r2t = other.recv().await;
    answer_r2t(&mut other, &r2t, 2).await;
    assert_eq!(other.response().await, (1, 0));
    assert_closed(&mut stalled.s).await;
}

#[tokio::test]
async fn a_write_above_32_mib_is_refused_without_a_buffer() {
    let addr = start_limited(caps(16, 1 << 20, 60_000)).await;
    let mut c = Client::login(addr).await;
    let mut w = c.write10(1, 1);
    w.set_u32(20, 64 << 20);
    c.send(&w).await;
    let r = c.response_pdu().await;
    assert_eq!((r.itt(), r.bhs[3]), (1, 0x02), "CHECK CONDITION");
    assert_eq!(r.data[4] & 0x0f, 0x05, "ILLEGAL REQUEST");
    // The session goes on.
    assert_eq!(c.test_unit_ready(2).await.0, 0);
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed() {
    let limits = caps(1, 1 << 20, 60_000);
    let addr = start_limited(limits.clone()).await;
    let mut c = Client::login(addr).await;
    let mut refused = TcpStream::connect(addr).await.unwrap();
    assert_closed(&mut refused).await;
    assert_eq!(limits.refused_total(), 1);
    assert_eq!(c.test_unit_ready(1).await.0, 0);
}

/// Logs in like [`Client::login_as`], offering InitialR2T=No: writes may send an unsolicited
/// burst of Data-Out.
async fn login_unsolicited(addr: std::net::SocketAddr, isid: u8) -> Client {
    let (c, r) = Client::login_offering(addr, isid, &[("InitialR2T", "No")]).await;
    let answers = text::parse(&r.data).unwrap();
    assert!(
        answers.iter().any(|(k, v)| k == "InitialR2T" && v == "No"),
        "{answers:?}"
    );
    c
}

#[tokio::test]
async fn unsolicited_data_out_waits_behind_its_command_for_the_budget() {
    let limits = caps(16, 4 * 512, 60_000);
    let addr = start_limited(limits.clone()).await;
    let mut a = Client::login_as(addr, 1).await;
    let mut b = login_unsolicited(addr, 2).await;
    let wa = a.write10(1, 4);
    a.send(&wa).await;
    let r2t_a = a.recv().await;
    // B: a one-block write whose data follows unsolicited (F clear), while A holds the budget.
    let mut wb = b.write10(1, 1);
    wb.bhs[1] &= !0x80;
    b.send(&wb).await;
    let unsolicited = Client::data_out(1, 0xffff_ffff, 0, 0, true);
    b.send(&unsolicited).await;
    b.quiet(300).await;
    answer_r2t(&mut a, &r2t_a, 4).await;
    assert_eq!(a.response().await, (1, 0));
    assert_eq!(
        b.response().await,
        (1, 0),
        "B's write found its unsolicited data"
    );
}
