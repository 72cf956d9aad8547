#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Fuzz-style properties (arbitrary bytes never panic) and login state machine scenarios.

use std::sync::Arc;

use mariner_iscsi::chap;
use mariner_iscsi::fuzzing::{fuzz_cdb, fuzz_login_text, fuzz_pdu};
use mariner_iscsi::login::{Login, Next};
use mariner_iscsi::pdu::{Opcode, Pdu};
use mariner_iscsi::{text, Chap, MemoryTargets, Target, TargetLimits};
use mariner_scsi::{Lun, MemoryBackend};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn pdu_parser_never_panics(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        fuzz_pdu(&data);
    }

    #[test]
    fn login_text_never_panics(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        fuzz_login_text(&data);
    }

    #[test]
    fn cdb_never_panics(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        fuzz_cdb(&data);
    }
}

const IQN: &str = "iqn.2026-11.dev.mariner:t";

fn targets(chap: Option<Chap>) -> Arc<MemoryTargets> {
    let t = Arc::new(MemoryTargets::new());
    t.add(Target {
        iqn: IQN.into(),
        lun: Arc::new(Lun::new(Arc::new(MemoryBackend::new("s", 512, 64)))),
        chap,
        allowed_initiators: vec!["iqn.init".into()],
    });
    t
}

fn req(flags: u8, pairs: &[(&str, &str)]) -> Pdu {
    let mut p = Pdu::new(Opcode::LoginRequest);
    p.bhs[0] |= 0x40;
    p.bhs[1] = flags;
    let owned: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    p.data = text::encode(&owned);
    p
}

fn status(p: &Pdu) -> (u8, u8) {
    (p.bhs[36], p.bhs[37])
}

fn keys(p: &Pdu) -> Vec<(String, String)> {
    text::parse(&p.data).unwrap()
}

fn get(p: &Pdu, k: &str) -> String {
    keys(p).into_iter().find(|(key, _)| key == k).unwrap().1
}

#[test]
fn login_without_chap_reaches_full_feature() {
    let mut l = Login::new(targets(None), TargetLimits::default(), 7);
    let (resp, next) = l.handle(&req(
        0x87,
        &[
            ("InitiatorName", "iqn.init"),
            ("TargetName", IQN),
            ("HeaderDigest", "CRC32C,None"),
        ],
    ));
    assert_eq!(status(&resp), (0, 0));
    assert_eq!(get(&resp, "HeaderDigest"), "CRC32C");
    assert_eq!(get(&resp, "TargetPortalGroupTag"), "1");
    assert_eq!(resp.bhs[15], 7, "TSIH assigned");
    let Next::FullFeature(est) = next else {
        panic!("not established")
    };
    assert!(est.params.header_digest);
}

#[test]
fn acl_and_unknown_target_refused() {
    let mut l = Login::new(targets(None), TargetLimits::default(), 1);
    let (resp, _) = l.handle(&req(
        0x87,
        &[("InitiatorName", "iqn.other"), ("TargetName", IQN)],
    ));
    assert_eq!(status(&resp), (2, 2));
    let mut l = Login::new(targets(None), TargetLimits::default(), 1);
    let (resp, _) = l.handle(&req(
        0x87,
        &[("InitiatorName", "iqn.init"), ("TargetName", "x")],
    ));
    assert_eq!(status(&resp), (2, 3));
    let mut l = Login::new(targets(None), TargetLimits::default(), 1);
    let (resp, _) = l.handle(&req(0x87, &[("TargetName", IQN)]));
    assert_eq!(status(&resp), (2, 7));
}

fn chap_config() -> Chap {
    Chap {
        user: "alice".into(),
        secret: "0123456789ab".into(),
        mutual: Some(("target".into(), "ba9876543210".into())),
    }
}

#[test]
fn chap_required_refuses_unauthenticated() {
    let mut l = Login::new(targets(Some(chap_config())), TargetLimits::default(), 1);
    let (resp, next) = l.handle(&req(
        0x87,
        &[("InitiatorName", "iqn.init"), ("TargetName", IQN)],
    ));
    assert_eq!(status(&resp), (2, 1));
    assert!(matches!(next, Next::Close));
}

fn chap_login(secret: &str, mutual: bool) -> (Pdu, Next) {
    let mut l = Login::new(targets(Some(chap_config())), TargetLimits::default(), 1);
    let base = [
        ("InitiatorName", "iqn.init"),
        ("TargetName", IQN),
        ("AuthMethod", "CHAP,None"),
    ];
    let (resp, _) = l.handle(&req(0x01, &base));
    assert_eq!(get(&resp, "AuthMethod"), "CHAP");
    let (resp, _) = l.handle(&req(0x01, &[("CHAP_A", "5")]));
    let id: u8 = get(&resp, "CHAP_I").parse().unwrap();
    let challenge = chap::from_binary(&get(&resp, "CHAP_C")).unwrap();
    let r = chap::to_hex(&chap::response(id, secret.as_bytes(), &challenge));
    let my_challenge = chap::to_hex(&[9u8; 16]);
    let mut pairs = vec![("CHAP_N", "alice"), ("CHAP_R", r.as_str())];
    if mutual {
        pairs.push(("CHAP_I", "3"));
        pairs.push(("CHAP_C", my_challenge.as_str()));
    }
    l.handle(&req(0x81, &pairs))
}

#[test]
fn chap_one_way_and_mutual() {
    let (resp, _) = chap_login("0123456789ab", false);
    assert_eq!(status(&resp), (0, 0));
    assert_eq!(resp.bhs[1] & 0x80, 0x80, "transit to operational");
    let (resp, _) = chap_login("0123456789ab", true);
    assert_eq!(get(&resp, "CHAP_N"), "target");
    let expected = chap::response(3, b"ba9876543210", &[9u8; 16]);
    assert_eq!(chap::from_binary(&get(&resp, "CHAP_R")).unwrap(), expected);
    let (resp, next) = chap_login("wrong-secret", false);
    assert_eq!(status(&resp), (2, 1));
    assert!(matches!(next, Next::Close));
}
