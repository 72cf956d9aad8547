//! The per-connection task set over a real socket: commands run concurrently (a later command
//! finishes before an earlier, blocked one), ABORT TASK and LUN RESET abort running tasks (no
//! response is ever sent for them), and non-immediate requests are delivered in CmdSN order.

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
    gate: Arc<Semaphore>,
}

#[async_trait]
impl BlockBackend for Gated {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, lba: u64, blocks: u32) -> Result<Vec<u8>, BackendError> {
        if lba == GATED_LBA {
            self.gate.acquire().await.unwrap().forget();
        }
        self.inner.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: &[u8]) -> Result<(), BackendError> {
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
        p.set_u32(24, 1);
        let keys = [("InitiatorName", "iqn.init"), ("TargetName", IQN)];
        let owned: Vec<(String, String)> = keys
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        p.data = text::encode(&owned);
        c.send(&p).await;
        let r = c.recv().await;
        assert_eq!((r.bhs[36], r.bhs[37]), (0, 0), "login refused");
        c
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
        loop {
            let p = self.recv().await;
            match p.opcode() {
                Opcode::DataIn => {}
                Opcode::ScsiResponse => return (p.itt(), p.bhs[3]),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

async fn start() -> (std::net::SocketAddr, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(0));
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
    tokio::time::sleep(Duration::from_millis(50)).await;
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
    tokio::time::sleep(Duration::from_millis(50)).await;
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
