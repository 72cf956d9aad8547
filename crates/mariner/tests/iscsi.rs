//! End-to-end iSCSI tests against the real binary: libiscsi's iscsi-inq, iscsi-ls and
//! iscsi-readcapacity16, CHAP (one-way and mutual) success and refusal, the initiator ACL, data
//! crossing between iSCSI and NBD, and durability across a kill -9 restart. Reads and writes
//! over iSCSI use a minimal initiator written here from RFC 7143, independently of
//! mariner-iscsi.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

const IQN: &str = "iqn.2026-11.dev.mariner:vol0";
const INITIATOR: &str = "iqn.2026-11.dev.mariner.test:initiator";

fn iscsi_url(s: &Server, iqn: &str) -> String {
    format!("iscsi://{}/{iqn}/0", s.iscsi())
}

/// A server on a fresh data directory with a 64 MiB `vol0`, plus `config` (TOML) if given.
fn server(name: &str, config: Option<&str>) -> (tempfile::TempDir, Server) {
    let dir = scratch(name);
    let mut extra: Vec<String> = SMALL.iter().map(|s| s.to_string()).collect();
    if let Some(text) = config {
        let path = dir.path().join("mariner.toml");
        std::fs::write(&path, text).unwrap();
        extra.extend(["--config".into(), path.to_str().unwrap().into()]);
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let s = Server::start(&dir.path().join("data"), &extra);
    (dir, s)
}

/// Runs a libiscsi tool; returns (success, stdout + stderr).
fn libiscsi(tool: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    require(tool);
    let mut cmd = Command::new(tool);
    cmd.args(args).env("LIBISCSI_CHAP_USERNAME", "");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn inquiry_discovery_and_capacity() {
    let (_dir, s) = server("iscsi-inq", None);
    let ports = std::fs::read_to_string(s.data.join("ports.json")).unwrap();
    assert!(ports.contains("\"iscsi\""), "ports.json: {ports}");

    let (ok, out) = libiscsi("iscsi-ls", &[&format!("iscsi://{}", s.iscsi())], &[]);
    assert!(ok, "iscsi-ls: {out}");
    assert!(
        out.contains(&format!("Target:{IQN} Portal:{}", s.iscsi())),
        "iscsi-ls: {out}"
    );

    let (ok, out) = libiscsi("iscsi-inq", &[&iscsi_url(&s, IQN)], &[]);
    assert!(ok, "iscsi-inq: {out}");
    assert!(
        out.contains("Peripheral Device Type:DIRECT_ACCESS"),
        "{out}"
    );
    assert!(out.contains("Removable:0"), "{out}");

    let (ok, out) = libiscsi("iscsi-readcapacity16", &[&iscsi_url(&s, IQN)], &[]);
    assert!(ok, "iscsi-readcapacity16: {out}");
    assert!(out.contains("Total size:67108864"), "{out}");
    assert!(out.contains("LBPME:1"), "thin provisioning reported: {out}");

    let (ok, out) = libiscsi(
        "iscsi-inq",
        &[&iscsi_url(&s, "iqn.2026-11.dev.mariner:nosuch")],
        &[],
    );
    assert!(!ok, "a missing volume's target logged in: {out}");

    // A volume created at run time is a target at once.
    run(Command::new(mariner_bin())
        .args(["volume", "create", "extra", "--size", "8MiB", "--data"])
        .arg(&s.data));
    let (ok, out) = libiscsi("iscsi-ls", &[&format!("iscsi://{}", s.iscsi())], &[]);
    assert!(
        ok && out.contains("Target:iqn.2026-11.dev.mariner:extra "),
        "{out}"
    );
    let (ok, out) = libiscsi(
        "iscsi-readcapacity16",
        &[&iscsi_url(&s, "iqn.2026-11.dev.mariner:extra")],
        &[],
    );
    assert!(ok && out.contains("Total size:8388608"), "{out}");
}

const CHAP_CONFIG: &str = r#"
[iscsi.targets.vol0]
chap_user = "alice"
chap_secret = "alicesecret12"
[iscsi.targets.mutual]
chap_user = "bob"
chap_secret = "bobsecret1234"
mutual_user = "target"
mutual_secret = "targetsecret9"
[iscsi.targets.acl]
initiators = ["iqn.2026-11.dev.mariner.test:allowed"]
"#;

#[test]
fn chap_and_initiator_acls() {
    let (_dir, s) = server("iscsi-chap", Some(CHAP_CONFIG));
    for name in ["mutual", "acl"] {
        run(Command::new(mariner_bin())
            .args(["volume", "create", name, "--size", "8MiB", "--data"])
            .arg(&s.data));
    }
    let url = iscsi_url(&s, IQN);
    let (ok, out) = libiscsi("iscsi-inq", &[&url], &[]);
    assert!(
        !ok,
        "vol0 requires CHAP but let an anonymous login in: {out}"
    );
    let wrong = format!("iscsi://alice%wrongsecret12@{}/{IQN}/0", s.iscsi());
    let (ok, out) = libiscsi("iscsi-inq", &[&wrong], &[]);
    assert!(
        !ok && out.contains("Authentication failure"),
        "a wrong CHAP secret logged in: {out}"
    );
    let right = format!("iscsi://alice%alicesecret12@{}/{IQN}/0", s.iscsi());
    let (ok, out) = libiscsi("iscsi-inq", &[&right], &[]);
    assert!(ok, "CHAP login with the right secret failed: {out}");

    // Mutual CHAP: the target must prove the secret the initiator expects.
    let mutual_iqn = "iqn.2026-11.dev.mariner:mutual";
    let base = format!("iscsi://bob%bobsecret1234@{}/{mutual_iqn}/0", s.iscsi());
    let good = [
        ("LIBISCSI_CHAP_TARGET_USERNAME", "target"),
        ("LIBISCSI_CHAP_TARGET_PASSWORD", "targetsecret9"),
    ];
    let (ok, out) = libiscsi("iscsi-inq", &[&base], &good);
    assert!(ok, "mutual CHAP login failed: {out}");
    let bad = [
        ("LIBISCSI_CHAP_TARGET_USERNAME", "target"),
        ("LIBISCSI_CHAP_TARGET_PASSWORD", "notthesecret1"),
    ];
    let (ok, out) = libiscsi("iscsi-inq", &[&base], &bad);
    assert!(
        !ok && out.contains("CHAP_R"),
        "the initiator accepted a target that proved the wrong secret: {out}"
    );

    // Initiator ACL.
    let acl = iscsi_url(&s, "iqn.2026-11.dev.mariner:acl");
    let (ok, out) = libiscsi(
        "iscsi-inq",
        &["-i", "iqn.2026-11.dev.mariner.test:allowed", &acl],
        &[],
    );
    assert!(ok, "an allowed initiator was refused: {out}");
    let (ok, out) = libiscsi("iscsi-inq", &["-i", INITIATOR, &acl], &[]);
    assert!(!ok, "an initiator not in the ACL logged in: {out}");

    // Discovery lists every target; logging in is what is protected.
    let (ok, out) = libiscsi("iscsi-ls", &[&format!("iscsi://{}", s.iscsi())], &[]);
    assert!(ok && out.contains(&format!("Target:{IQN} ")), "{out}");
}

#[test]
fn data_crosses_between_iscsi_and_nbd_and_survives_kill9() {
    let (_dir, mut s) = server("iscsi-data", None);
    let a = random_bytes(1, 8192);
    let b = random_bytes(2, 4096);
    let mut ini = Initiator::login(&s.iscsi(), IQN);
    assert_eq!(ini.read_capacity(), (131_072, 512));
    ini.write(8, &a);
    assert_eq!(ini.read(8, 16), a, "iSCSI read back");
    let mut nbd = Nbd::connect(&s.nbd, "vol0");
    assert_eq!(nbd.read(8 * 512, 8192), a, "iSCSI write seen over NBD");
    nbd.write(1 << 20, &b);
    assert_eq!(ini.read(2048, 8), b, "NBD write seen over iSCSI");

    // COMPARE AND WRITE: a mismatch changes nothing, a match writes.
    let new = random_bytes(3, 512);
    let status = ini.compare_and_write(2048, &random_bytes(9, 512), &new);
    assert_eq!(
        status, 0x02,
        "mismatching COMPARE AND WRITE must CHECK CONDITION"
    );
    assert_eq!(nbd.read(1 << 20, 512), b[..512], "a failed compare wrote");
    assert_eq!(ini.compare_and_write(2048, &b[..512], &new), 0);
    assert_eq!(nbd.read(1 << 20, 512), new);

    drop((ini, nbd));
    s.restart_after_kill9(SMALL);
    let mut ini = Initiator::login(&s.iscsi(), IQN);
    assert_eq!(ini.read(8, 16), a, "iSCSI write lost by kill -9");
    assert_eq!(ini.read(2048, 1), new, "COMPARE AND WRITE lost by kill -9");
    assert_eq!(ini.read(2049, 7), b[512..], "NBD write lost by kill -9");
}

/// ORWRITE is atomic against every other writer of the volume. Two sessions OR bytes of their
/// own into the second of two blocks (the first block's data-out is zeros) while an NBD client
/// rewrites the first: an ORWRITE that read the first block before an NBD write and wrote it
/// back after would undo that write (NBD reads back what it wrote, or the test fails), and one
/// racing the other session would drop its bytes.
#[test]
fn orwrite_is_atomic_against_nbd_and_other_sessions() {
    const ROUNDS: usize = 48;
    const LBA: u64 = 4096;
    let (_dir, s) = server("iscsi-orwrite", None);
    let portal = s.iscsi();
    std::thread::scope(|scope| {
        for (session, name) in [INITIATOR_A, INITIATOR_B].into_iter().enumerate() {
            let portal = portal.as_str();
            scope.spawn(move || {
                let mut ini = Initiator::login_as(portal, IQN, name);
                for round in 0..ROUNDS {
                    let mut data = vec![0u8; 1024];
                    data[512 + session * ROUNDS + round] = 0xff;
                    assert_eq!(ini.or_write(LBA, &data), 0, "ORWRITE status");
                }
            });
        }
        let nbd_addr = s.nbd.as_str();
        scope.spawn(move || {
            let mut nbd = Nbd::connect(nbd_addr, "vol0");
            for round in 1..=ROUNDS {
                let block = vec![round as u8; 512];
                nbd.write(LBA * 512, &block);
                let back = nbd.read(LBA * 512, 512);
                assert!(back == block, "an ORWRITE undid NBD write {round}");
            }
        });
    });
    let mut ini = Initiator::login(&portal, IQN);
    let d = ini.read(LBA as u32, 2);
    assert!(
        d[..512] == [ROUNDS as u8; 512],
        "the last NBD write was undone"
    );
    let mut ored = vec![0u8; 512];
    ored[..2 * ROUNDS].fill(0xff);
    assert!(d[512..] == ored[..], "an ORWRITE's bytes were lost");
}

/// qemu-img over iscsi:// (qemu's libiscsi block driver, Debian qemu-block-extra from
/// bookworm-backports to match the machine's qemu-utils; scripts/test.sh installs it).
#[test]
fn qemu_img_convert_and_compare_over_iscsi() {
    require("qemu-img");
    let (dir, s) = server("iscsi-qemu", None);
    let url = iscsi_url(&s, IQN);
    let info = run(Command::new("qemu-img").args(["info", &url]));
    assert!(info.contains("67108864"), "{info}");
    let image = dir.path().join("src.raw");
    let mut data = random_bytes(7, 4 << 20);
    data.resize(64 << 20, 0);
    std::fs::write(&image, &data).unwrap();
    let img = image.to_str().unwrap();
    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw", img, &url]));
    run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", img, &url]));
    run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", img, &s.url("vol0")]));
    let out = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x5a 1M 64k",
        "-c",
        "read -P 0x5a 1M 64k",
        &url,
    ]));
    assert!(
        out.contains("read 65536/65536") && !out.contains("failed"),
        "{out}"
    );
}

const INITIATOR_A: &str = "iqn.2026-11.dev.mariner.test:node-a";
const INITIATOR_B: &str = "iqn.2026-11.dev.mariner.test:node-b";
const RESERVATION_CONFLICT: u8 = 0x18;
const NBD_EPERM: u32 = 1;
const PR_REGISTER: u8 = 0;
const PR_RESERVE: u8 = 1;
const PR_RELEASE: u8 = 2;
const PR_WRITE_EXCLUSIVE: u8 = 1;

/// Two initiators share one volume's reservations; NBD, which cannot register, is refused
/// writes while a reservation stands; an APTPL reservation survives kill -9, one without
/// APTPL does not.
#[test]
fn persistent_reservations_between_two_initiators_and_nbd() {
    let (_dir, mut s) = server("iscsi-pr", None);
    let mut a = Initiator::login_as(&s.iscsi(), IQN, INITIATOR_A);
    let mut b = Initiator::login_as(&s.iscsi(), IQN, INITIATOR_B);
    let mut nbd = Nbd::connect(&s.nbd, "vol0");
    assert_eq!(a.prout(PR_REGISTER, 0, 0, 0xaa, false), 0);
    assert_eq!(b.prout(PR_REGISTER, 0, 0, 0xbb, false), 0);
    let keys = a.prin(0);
    assert_eq!(
        &keys[..8],
        &[0, 0, 0, 2, 0, 0, 0, 16],
        "generation 2, two keys"
    );
    assert_eq!(a.prout(PR_RESERVE, PR_WRITE_EXCLUSIVE, 0xaa, 0, false), 0);
    assert_eq!(b.reservation(), Some((0xaa, PR_WRITE_EXCLUSIVE)));

    let data = random_bytes(11, 512);
    assert_eq!(b.write_status(100, &data), RESERVATION_CONFLICT);
    assert_eq!(
        b.read(100, 1),
        vec![0; 512],
        "a Write Exclusive reservation allows reads"
    );
    a.write(100, &data);
    assert_eq!(
        nbd.write_error(100 * 512, &data),
        NBD_EPERM,
        "NBD write while reserved"
    );
    assert_eq!(nbd.read(100 * 512, 512), data, "NBD reads stay allowed");

    assert_eq!(a.prout(PR_RELEASE, PR_WRITE_EXCLUSIVE, 0xaa, 0, false), 0);
    assert_eq!(b.reservation(), None);
    b.write(101, &data);
    nbd.write(102 * 512, &data);

    // APTPL: the registrations and the reservation survive kill -9.
    assert_eq!(a.prout(PR_REGISTER, 0, 0xaa, 0xaa, true), 0);
    assert_eq!(a.prout(PR_RESERVE, PR_WRITE_EXCLUSIVE, 0xaa, 0, false), 0);
    drop((a, b, nbd));
    s.restart_after_kill9(SMALL);
    let mut b = Initiator::login_as(&s.iscsi(), IQN, INITIATOR_B);
    assert_eq!(
        b.reservation(),
        Some((0xaa, PR_WRITE_EXCLUSIVE)),
        "APTPL lost"
    );
    assert_eq!(b.write_status(103, &data), RESERVATION_CONFLICT);
    let mut nbd = Nbd::connect(&s.nbd, "vol0");
    assert_eq!(nbd.write_error(103 * 512, &data), NBD_EPERM);
    drop(nbd);

    // Registering again without APTPL: the state is no longer kept through a restart.
    let mut a = Initiator::login_as(&s.iscsi(), IQN, INITIATOR_A);
    assert_eq!(a.prout(PR_REGISTER, 0, 0xaa, 0xaa, false), 0);
    assert_eq!(b.reservation(), Some((0xaa, PR_WRITE_EXCLUSIVE)));
    drop((a, b));
    s.restart_after_kill9(SMALL);
    let mut b = Initiator::login_as(&s.iscsi(), IQN, INITIATOR_B);
    assert_eq!(
        b.reservation(),
        None,
        "a reservation without APTPL survived a restart"
    );
    b.write(103, &data);
    Nbd::connect(&s.nbd, "vol0").write(104 * 512, &data);
}

// ---- A minimal iSCSI initiator (RFC 7143), enough for login and a few SCSI commands. ----

#[test]
fn an_iscsi_session_keeps_its_volume_from_being_deleted() {
    let (_dir, s) = server("iscsi-hold", None);
    let mut ini = Initiator::login(&s.iscsi(), IQN);
    assert_eq!(ini.read_capacity(), (131072, 512));
    let info = s.cli(&["volume", "info", "vol0", "--json"]);
    let info = String::from_utf8_lossy(&info.stdout).to_string();
    assert!(
        info.contains("\"connections\": 1") || info.contains("\"connections\":1"),
        "{info}"
    );
    let o = s.cli(&["volume", "delete", "vol0"]);
    assert!(
        !o.status.success(),
        "delete allowed during an iSCSI session"
    );
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(err.contains("connected"), "{err}");
    drop(ini); // the connection closes: the session ends
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let o = s.cli(&["volume", "delete", "vol0"]);
        if o.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "delete still refused after logout"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Initiator {
    s: TcpStream,
    cmd_sn: u32,
    exp_stat_sn: u32,
    itt: u32,
}

/// One received PDU: the 48-byte header and the data segment.
struct Pdu {
    bhs: [u8; 48],
    data: Vec<u8>,
}

#[allow(clippy::big_endian_bytes)] // the iSCSI wire is big-endian
impl Initiator {
    fn login(addr: &str, target: &str) -> Self {
        Self::login_as(addr, target, INITIATOR)
    }

    fn login_as(addr: &str, target: &str, initiator: &str) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut ini = Initiator {
            s,
            cmd_sn: 1,
            exp_stat_sn: 0,
            itt: 1,
        };
        let security = format!(
            "InitiatorName={initiator}\0TargetName={target}\0SessionType=Normal\0AuthMethod=None\0"
        );
        // Security stage (0) to operational (1), then operational to full feature (3).
        let r = ini.login_step(0x80 | 0x01, security.as_bytes());
        assert_eq!((r.bhs[36], r.bhs[37]), (0, 0), "security stage refused");
        let ops = "HeaderDigest=None\0DataDigest=None\0ImmediateData=Yes\0InitialR2T=Yes\0\
                   MaxRecvDataSegmentLength=262144\0";
        let r = ini.login_step(0x80 | 0x04 | 0x03, ops.as_bytes());
        assert_eq!((r.bhs[36], r.bhs[37]), (0, 0), "operational stage refused");
        assert_eq!(r.bhs[1] & 0x83, 0x83, "no transit to full feature phase");
        ini
    }

    fn login_step(&mut self, flags: u8, keys: &[u8]) -> Pdu {
        let mut bhs = [0u8; 48];
        bhs[0] = 0x43; // immediate Login Request
        bhs[1] = flags;
        bhs[8..14].copy_from_slice(&[0x80, 0, 0x12, 0x34, 0x56, 0x78]); // ISID (random type)
        bhs[16..20].copy_from_slice(&0u32.to_be_bytes());
        bhs[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        bhs[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
        self.send(bhs, keys);
        let r = self.recv();
        assert_eq!(r.bhs[0] & 0x3f, 0x23, "login response expected");
        self.exp_stat_sn = be32(&r.bhs[24..28]).wrapping_add(1);
        r
    }

    fn send(&mut self, mut bhs: [u8; 48], data: &[u8]) {
        let len = data.len() as u32;
        bhs[5..8].copy_from_slice(&len.to_be_bytes()[1..]);
        let mut out = bhs.to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(4), 0);
        self.s.write_all(&out).unwrap();
    }

    fn recv(&mut self) -> Pdu {
        let mut bhs = [0u8; 48];
        self.s.read_exact(&mut bhs).unwrap();
        let ahs = usize::from(bhs[4]) * 4;
        let len = (be32(&bhs[4..8]) & 0x00ff_ffff) as usize;
        let mut rest = vec![0u8; ahs + len.next_multiple_of(4)];
        self.s.read_exact(&mut rest).unwrap();
        Pdu {
            bhs,
            data: rest[ahs..ahs + len].to_vec(),
        }
    }

    /// Runs one command; returns (status, data-in). Write data goes as immediate data.
    fn command(&mut self, cdb: &[u8], data_out: &[u8], read_len: u32) -> (u8, Vec<u8>) {
        let mut bhs = [0u8; 48];
        bhs[0] = 0x01;
        let dir = if data_out.is_empty() { 0x40 } else { 0x20 };
        bhs[1] = 0x80 | dir | 0x01; // final, direction, SIMPLE
        let itt = self.itt;
        self.itt += 1;
        let edtl = if data_out.is_empty() {
            read_len
        } else {
            data_out.len() as u32
        };
        bhs[16..20].copy_from_slice(&itt.to_be_bytes());
        bhs[20..24].copy_from_slice(&edtl.to_be_bytes());
        bhs[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        bhs[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
        bhs[32..32 + cdb.len()].copy_from_slice(cdb);
        self.cmd_sn += 1;
        self.send(bhs, data_out);
        let mut data = Vec::new();
        loop {
            let p = self.recv();
            match p.bhs[0] & 0x3f {
                0x25 => {
                    let offset = be32(&p.bhs[40..44]) as usize;
                    data.resize(data.len().max(offset + p.data.len()), 0);
                    data[offset..offset + p.data.len()].copy_from_slice(&p.data);
                    if p.bhs[1] & 0x01 != 0 {
                        self.exp_stat_sn = be32(&p.bhs[24..28]).wrapping_add(1);
                        return (p.bhs[3], data);
                    }
                }
                0x21 => {
                    assert_eq!(be32(&p.bhs[16..20]), itt, "response for another task");
                    self.exp_stat_sn = be32(&p.bhs[24..28]).wrapping_add(1);
                    return (p.bhs[3], data);
                }
                0x20 => {} // NOP-In
                other => panic!("unexpected PDU opcode {other:#x}"),
            }
        }
    }

    fn read_capacity(&mut self) -> (u64, u32) {
        let (status, d) = self.command(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 8);
        assert_eq!(status, 0);
        (u64::from(be32(&d[0..4])) + 1, be32(&d[4..8]))
    }

    fn write(&mut self, lba: u32, data: &[u8]) {
        assert_eq!(self.write_status(lba, data), 0, "WRITE(10) status");
    }

    /// WRITE(10); returns the SCSI status.
    fn write_status(&mut self, lba: u32, data: &[u8]) -> u8 {
        let blocks = (data.len() / 512) as u16;
        let mut cdb = [0u8; 10];
        cdb[0] = 0x2a;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        self.command(&cdb, data, 0).0
    }

    /// PERSISTENT RESERVE OUT; returns the SCSI status.
    fn prout(&mut self, action: u8, kind: u8, key: u64, sa_key: u64, aptpl: bool) -> u8 {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x5f;
        cdb[1] = action;
        cdb[2] = kind;
        cdb[8] = 24;
        let mut params = [0u8; 24];
        params[0..8].copy_from_slice(&key.to_be_bytes());
        params[8..16].copy_from_slice(&sa_key.to_be_bytes());
        params[20] = u8::from(aptpl);
        self.command(&cdb, &params, 0).0
    }

    /// PERSISTENT RESERVE IN; the data (status must be GOOD).
    fn prin(&mut self, action: u8) -> Vec<u8> {
        let cdb = [0x5e, action, 0, 0, 0, 0, 0, 0x10, 0, 0];
        let (status, data) = self.command(&cdb, &[], 4096);
        assert_eq!(status, 0, "PERSISTENT RESERVE IN status");
        data
    }

    /// READ RESERVATION: (key, type) of the reservation, if any.
    fn reservation(&mut self) -> Option<(u64, u8)> {
        let d = self.prin(1);
        (be32(&d[4..8]) == 16).then(|| (u64::from_be_bytes(d[8..16].try_into().unwrap()), d[21]))
    }

    fn read(&mut self, lba: u32, blocks: u16) -> Vec<u8> {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x28;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let (status, data) = self.command(&cdb, &[], u32::from(blocks) * 512);
        assert_eq!(status, 0, "READ(10) status");
        data
    }

    /// COMPARE AND WRITE of one block; returns the SCSI status.
    fn compare_and_write(&mut self, lba: u64, expected: &[u8], new: &[u8]) -> u8 {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x89;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[13] = 1;
        let mut data = expected.to_vec();
        data.extend_from_slice(new);
        self.command(&cdb, &data, 0).0
    }

    /// ORWRITE(16) of whole blocks; returns the SCSI status.
    fn or_write(&mut self, lba: u64, data: &[u8]) -> u8 {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x8b;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&((data.len() / 512) as u32).to_be_bytes());
        self.command(&cdb, data, 0).0
    }
}

#[allow(clippy::big_endian_bytes)]
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

/// Simple-reply NBD reads and writes over [`nbd_connect`].
struct Nbd {
    s: TcpStream,
    handle: u64,
}

#[allow(clippy::big_endian_bytes)] // the NBD wire is big-endian
impl Nbd {
    fn connect(addr: &str, export: &str) -> Self {
        let (s, _, _) = nbd_connect(addr, export);
        Nbd { s, handle: 1 }
    }

    fn request(&mut self, kind: u16, offset: u64, len: u32, data: &[u8]) {
        let mut r = Vec::with_capacity(28 + data.len());
        r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(&kind.to_be_bytes());
        r.extend_from_slice(&self.handle.to_be_bytes());
        r.extend_from_slice(&offset.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r.extend_from_slice(data);
        self.s.write_all(&r).unwrap();
        let mut reply = [0u8; 16];
        self.s.read_exact(&mut reply).unwrap();
        assert_eq!(be32(&reply[0..4]), 0x6744_6698, "simple reply magic");
        assert_eq!(be32(&reply[4..8]), 0, "NBD error");
        self.handle += 1;
    }

    /// A write; returns the NBD error code of the reply.
    fn write_error(&mut self, offset: u64, data: &[u8]) -> u32 {
        let mut r = Vec::with_capacity(28 + data.len());
        r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(&1u16.to_be_bytes());
        r.extend_from_slice(&self.handle.to_be_bytes());
        r.extend_from_slice(&offset.to_be_bytes());
        r.extend_from_slice(&(data.len() as u32).to_be_bytes());
        r.extend_from_slice(data);
        self.s.write_all(&r).unwrap();
        let mut reply = [0u8; 16];
        self.s.read_exact(&mut reply).unwrap();
        self.handle += 1;
        be32(&reply[4..8])
    }

    fn read(&mut self, offset: u64, len: u32) -> Vec<u8> {
        self.request(0, offset, len, &[]);
        let mut out = vec![0u8; len as usize];
        self.s.read_exact(&mut out).unwrap();
        out
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.request(1, offset, data.len() as u32, data);
    }
}
