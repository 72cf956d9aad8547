use super::*;

fn a() -> Nexus {
    Nexus::iscsi("iqn.test:a", [0x40, 0, 0, 0, 0, 1])
}

fn b() -> Nexus {
    Nexus::iscsi("iqn.test:b", [0x40, 0, 0, 0, 0, 2])
}

fn c() -> Nexus {
    Nexus::iscsi("iqn.test:c", [0x40, 0, 0, 0, 0, 3])
}

fn req(action: OutAction, key: u64, sa_key: u64, kind: u8) -> OutRequest {
    OutRequest {
        action,
        type_code: kind,
        key,
        sa_key,
        aptpl: false,
    }
}

fn register(s: &mut PrState, n: &Nexus, key: u64) {
    s.out(n, &req(OutAction::Register, 0, key, 0)).unwrap();
}

fn reserve(s: &mut PrState, n: &Nexus, key: u64, kind: PrType) -> Result<(), Refusal> {
    s.out(n, &req(OutAction::Reserve, key, 0, kind.code()))
}

fn conflict<T: std::fmt::Debug>(r: Result<T, Refusal>) {
    assert_eq!(r.unwrap_err(), Refusal::Conflict);
}

/// a and b registered (keys 1 and 2), a holds a reservation of `kind`.
fn reserved(kind: PrType) -> PrState {
    let mut s = PrState::new(false);
    register(&mut s, &a(), 1);
    register(&mut s, &b(), 2);
    reserve(&mut s, &a(), 1, kind).unwrap();
    s
}

#[test]
fn register_changes_and_removes_keys_and_bumps_generation() {
    let mut s = PrState::new(false);
    register(&mut s, &a(), 0xaa);
    assert_eq!(s.generation, 1);
    conflict(s.out(&a(), &req(OutAction::Register, 0x99, 0xbb, 0)));
    s.out(&a(), &req(OutAction::Register, 0xaa, 0xbb, 0))
        .unwrap();
    assert_eq!(s.registrations[&a()], 0xbb);
    s.out(&a(), &req(OutAction::Register, 0xbb, 0, 0)).unwrap();
    assert!(s.registrations.is_empty());
    assert_eq!(s.generation, 3);
    // An unregistered port with a nonzero key conflicts; with a zero SA key nothing happens.
    conflict(s.out(&a(), &req(OutAction::Register, 5, 6, 0)));
    s.out(&a(), &req(OutAction::Register, 0, 0, 0)).unwrap();
    assert_eq!(s.generation, 3);
}

#[test]
fn register_and_ignore_existing_key() {
    let mut s = PrState::new(false);
    register(&mut s, &a(), 1);
    s.out(&a(), &req(OutAction::RegisterAndIgnore, 77, 9, 0))
        .unwrap();
    assert_eq!(s.registrations[&a()], 9);
    s.out(&b(), &req(OutAction::RegisterAndIgnore, 77, 3, 0))
        .unwrap();
    assert_eq!(s.registrations[&b()], 3);
}

#[test]
fn reserve_needs_registration_and_matching_key() {
    let mut s = PrState::new(false);
    conflict(reserve(&mut s, &a(), 0, PrType::WriteExclusive));
    register(&mut s, &a(), 1);
    conflict(reserve(&mut s, &a(), 2, PrType::WriteExclusive));
    reserve(&mut s, &a(), 1, PrType::WriteExclusive).unwrap();
    // Same type again: fine; another type or another port: conflict.
    reserve(&mut s, &a(), 1, PrType::WriteExclusive).unwrap();
    conflict(reserve(&mut s, &a(), 1, PrType::ExclusiveAccess));
    register(&mut s, &b(), 2);
    conflict(reserve(&mut s, &b(), 2, PrType::WriteExclusive));
    assert_eq!(s.generation, 2, "RESERVE does not bump the generation");
}

#[test]
fn reserve_rejects_bad_type() {
    let mut s = PrState::new(false);
    register(&mut s, &a(), 1);
    let r = s.out(&a(), &req(OutAction::Reserve, 1, 0, 2));
    assert!(matches!(r, Err(Refusal::Check(_))));
}

#[test]
fn release_by_holder_with_the_right_type() {
    let mut s = reserved(PrType::WriteExclusive);
    // Not the holder: nothing happens.
    s.out(&b(), &req(OutAction::Release, 2, 0, 1)).unwrap();
    assert!(s.reservation.is_some());
    let wrong = s.out(&a(), &req(OutAction::Release, 1, 0, 3)).unwrap_err();
    let Refusal::Check(sense) = wrong else {
        panic!()
    };
    assert_eq!(sense.asc, Asc::INVALID_RELEASE_OF_PR);
    s.out(&a(), &req(OutAction::Release, 1, 0, 1)).unwrap();
    assert!(s.reservation.is_none());
    assert_eq!(s.registrations.len(), 2);
}

#[test]
fn clear_removes_everything() {
    let mut s = reserved(PrType::ExclusiveAccess);
    conflict(s.out(&c(), &req(OutAction::Clear, 0, 0, 0)));
    s.out(&b(), &req(OutAction::Clear, 2, 0, 0)).unwrap();
    assert!(s.registrations.is_empty() && s.reservation.is_none());
    assert!(!s.is_active());
}

#[test]
fn preempt_takes_over_the_reservation() {
    let mut s = reserved(PrType::WriteExclusive);
    let g = s.generation;
    s.out(
        &b(),
        &req(OutAction::Preempt, 2, 1, PrType::ExclusiveAccess.code()),
    )
    .unwrap();
    assert_eq!(s.reservation.as_ref().unwrap().holder, b());
    assert_eq!(
        s.reservation.as_ref().unwrap().kind,
        PrType::ExclusiveAccess
    );
    assert!(!s.registrations.contains_key(&a()));
    assert_eq!(s.generation, g + 1);
}

#[test]
fn preempt_of_a_non_holder_only_removes_its_registration() {
    let mut s = reserved(PrType::WriteExclusive);
    register(&mut s, &c(), 3);
    s.out(&b(), &req(OutAction::PreemptAndAbort, 2, 3, 1))
        .unwrap();
    assert_eq!(s.reservation.as_ref().unwrap().holder, a());
    assert!(!s.registrations.contains_key(&c()));
    conflict(s.out(&b(), &req(OutAction::Preempt, 2, 99, 1)));
    assert!(matches!(
        s.out(&b(), &req(OutAction::Preempt, 2, 0, 1)),
        Err(Refusal::Check(_))
    ));
}

#[test]
fn preempt_all_registrants_with_zero_key() {
    let mut s = reserved(PrType::WriteExclusiveAllRegistrants);
    s.out(
        &b(),
        &req(OutAction::Preempt, 2, 0, PrType::WriteExclusive.code()),
    )
    .unwrap();
    assert_eq!(s.registrations.len(), 1);
    assert_eq!(s.reservation.as_ref().unwrap().holder, b());
}

#[test]
fn unregistering_holder_releases() {
    let mut s = reserved(PrType::WriteExclusive);
    s.out(&a(), &req(OutAction::Register, 1, 0, 0)).unwrap();
    assert!(s.reservation.is_none());
    // All registrants: the reservation lasts until the last registrant leaves.
    let mut s = reserved(PrType::ExclusiveAccessAllRegistrants);
    s.out(&a(), &req(OutAction::Register, 1, 0, 0)).unwrap();
    assert!(s.reservation.is_some());
    assert!(s.is_holder(&b()));
    s.out(&b(), &req(OutAction::Register, 2, 0, 0)).unwrap();
    assert!(s.reservation.is_none());
}

/// (type, unregistered read, unregistered write, registered read, registered write)
const RULES: [(PrType, bool, bool, bool, bool); 6] = [
    (PrType::WriteExclusive, true, false, true, false),
    (PrType::ExclusiveAccess, false, false, false, false),
    (
        PrType::WriteExclusiveRegistrantsOnly,
        true,
        false,
        true,
        true,
    ),
    (
        PrType::ExclusiveAccessRegistrantsOnly,
        false,
        false,
        true,
        true,
    ),
    (
        PrType::WriteExclusiveAllRegistrants,
        true,
        false,
        true,
        true,
    ),
    (
        PrType::ExclusiveAccessAllRegistrants,
        false,
        false,
        true,
        true,
    ),
];

#[test]
fn conflict_rules_per_type() {
    for (kind, ur, uw, rr, rw) in RULES {
        let s = reserved(kind);
        let ok = |n: &Nexus, acc| s.check(n, acc).is_ok();
        assert_eq!(ok(&c(), Access::Read), ur, "{kind:?} unregistered read");
        assert_eq!(ok(&c(), Access::Write), uw, "{kind:?} unregistered write");
        assert_eq!(ok(&b(), Access::Read), rr, "{kind:?} registered read");
        assert_eq!(ok(&b(), Access::Write), rw, "{kind:?} registered write");
        assert!(ok(&a(), Access::Write), "{kind:?} holder write");
        assert!(ok(&c(), Access::Always));
        assert!(ok(&c(), Access::PersistentReserveOut));
        assert!(s.excludes_unregistered_writers());
        assert_eq!(s.excludes_unregistered_readers(), !ur);
    }
}

#[test]
fn registrations_alone_conflict_only_with_legacy_commands() {
    let mut s = PrState::new(false);
    register(&mut s, &a(), 1);
    assert!(s.check(&b(), Access::Write).is_ok());
    assert!(!s.excludes_unregistered_writers());
    conflict(s.legacy_reserve(&b()));
    conflict(s.check(&b(), Access::Legacy));
}

#[test]
fn legacy_reserve_and_release() {
    let mut s = PrState::new(false);
    s.legacy_reserve(&a()).unwrap();
    s.legacy_reserve(&a()).unwrap();
    conflict(s.legacy_reserve(&b()));
    conflict(s.check(&b(), Access::Read));
    conflict(s.check(&b(), Access::PersistentReserveOut));
    conflict(s.out(&b(), &req(OutAction::Register, 0, 1, 0)));
    assert!(s.check(&b(), Access::Always).is_ok());
    // RELEASE by another port is a no-op.
    s.legacy_release(&b()).unwrap();
    assert_eq!(s.legacy, Some(a()));
    s.legacy_release(&a()).unwrap();
    s.legacy_reserve(&b()).unwrap();
    s.nexus_lost(&b());
    assert!(!s.is_active());
    s.legacy_reserve(&a()).unwrap();
    s.reset();
    assert!(s.legacy.is_none());
}

#[test]
fn aptpl_needs_capability() {
    let mut s = PrState::new(false);
    let mut r = req(OutAction::Register, 0, 1, 0);
    r.aptpl = true;
    assert!(matches!(s.out(&a(), &r), Err(Refusal::Check(_))));
    let mut s = PrState::new(true);
    s.out(&a(), &r).unwrap();
    assert!(s.aptpl);
    assert_eq!(s.read(InAction::ReportCapabilities)[3], 0x81);
}

#[test]
fn read_keys_and_reservation_layout() {
    let s = reserved(PrType::WriteExclusive);
    let keys = s.read(InAction::ReadKeys);
    assert_eq!(&keys[..8], &[0, 0, 0, 2, 0, 0, 0, 16]);
    assert_eq!(keys.len(), 24);
    let r = s.read(InAction::ReadReservation);
    assert_eq!(&r[4..8], &[0, 0, 0, 16]);
    assert_eq!(be64(&r[8..16]), 1);
    assert_eq!(r[21], 1);
    let empty = PrState::new(false).read(InAction::ReadReservation);
    assert_eq!(empty, vec![0; 8]);
    let all = reserved(PrType::WriteExclusiveAllRegistrants).read(InAction::ReadReservation);
    assert_eq!(
        be64(&all[8..16]),
        0,
        "all-registrants reservations report key 0"
    );
}

#[test]
fn report_capabilities_layout() {
    let caps = PrState::new(true).read(InAction::ReportCapabilities);
    assert_eq!(caps, vec![0, 8, 0x01, 0x80, 0xea, 0x01, 0, 0]);
}

#[test]
fn read_full_status_layout() {
    let s = reserved(PrType::WriteExclusive);
    let out = s.read(InAction::ReadFullStatus);
    let len = crate::wire::be32(&out[4..8]) as usize;
    assert_eq!(out.len(), 8 + len);
    // First descriptor: a (key 1), the holder.
    assert_eq!(be64(&out[8..16]), 1);
    assert_eq!(out[8 + 12], 1);
    assert_eq!(out[8 + 13], 1);
    let tid_len = crate::wire::be32(&out[8 + 20..8 + 24]) as usize;
    let tid = &out[8 + 24..8 + 24 + tid_len];
    assert_eq!(tid[0], 0x45);
    assert!(tid.len().is_multiple_of(4));
    let name = std::str::from_utf8(&tid[4..])
        .unwrap()
        .trim_end_matches('\0');
    assert_eq!(name, "iqn.test:a,i,0x400000000001");
}

#[test]
fn parse_out_parameters() {
    let mut p = [0u8; 24];
    p[7] = 5;
    p[15] = 6;
    p[20] = 1;
    let r = OutRequest::parse(0, 0, &p).unwrap();
    assert_eq!((r.key, r.sa_key, r.aptpl), (5, 6, true));
    assert!(
        OutRequest::parse(7, 0, &p).is_err(),
        "REGISTER AND MOVE is not supported"
    );
    assert!(OutRequest::parse(1, 0x11, &p).is_err(), "only LU scope");
    p[20] = 0x08;
    assert!(OutRequest::parse(0, 0, &p).is_err(), "SPEC_I_PT");
    assert!(OutRequest::parse(0, 0, &p[..23]).is_err());
}

#[test]
fn image_round_trip() {
    let mut s = reserved(PrType::ExclusiveAccessRegistrantsOnly);
    s.ptpl_capable = true;
    s.aptpl = true;
    let bytes = image::encode(&s);
    assert_eq!(image::decode(&bytes).unwrap(), s);
    let mut none = PrState::new(true);
    none.aptpl = true;
    register(&mut none, &c(), 7);
    none.aptpl = true;
    assert_eq!(image::decode(&image::encode(&none)).unwrap(), none);
}

#[test]
fn image_rejects_damage() {
    let s = reserved(PrType::WriteExclusive);
    let bytes = image::encode(&s);
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x01;
        assert!(image::decode(&bad).is_err(), "flip at {i} accepted");
    }
    for n in 0..bytes.len() {
        assert!(image::decode(&bytes[..n]).is_err());
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(image::decode(&long).is_err());
}

/// The layout of docs/FORMATS.md, "Persistent reservations", byte for byte.
#[test]
fn image_golden() {
    let mut s = PrState::new(true);
    s.aptpl = true;
    s.generation = 3;
    s.registrations
        .insert(Nexus::iscsi("iqn.x", [1, 2, 3, 4, 5, 6]), 0x1122);
    s.reservation = Some(Reservation {
        holder: Nexus::iscsi("iqn.x", [1, 2, 3, 4, 5, 6]),
        kind: PrType::WriteExclusive,
    });
    let bytes = image::encode(&s);
    let mut want = Vec::new();
    want.extend_from_slice(b"MRNPRSV\0");
    want.extend_from_slice(&[1, 0, 0, 0]); // version 1, flags 0
    want.extend_from_slice(&[3, 0, 0, 0]); // generation
    want.extend_from_slice(&[1, 0, 0, 0]); // one registration
    want.extend_from_slice(&[0, 0, 0, 0]); // holder index 0
    want.extend_from_slice(&[1, 0, 0, 0]); // type WE
    want.extend_from_slice(&[21, 0, 0, 0]); // body length
    want.extend_from_slice(&[0x22, 0x11, 0, 0, 0, 0, 0, 0]);
    want.extend_from_slice(&[1, 2, 3, 4, 5, 6]);
    want.extend_from_slice(&[5, 0]);
    want.extend_from_slice(b"iqn.x");
    let crc = crc32c::crc32c(&want);
    want.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(bytes, want);
    assert_eq!(crc, 0x8d9b_b125, "CRC32C of the golden image changed");
}
