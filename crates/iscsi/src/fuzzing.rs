//! Entry points for the fuzz targets (`fuzz/`) and the proptest tests. Each takes arbitrary
//! bytes and must never panic.

use std::sync::Arc;

use crate::login::Login;
use crate::params::TargetLimits;
use crate::pdu::{Decoder, Digests, Pdu};
use crate::targets::MemoryTargets;
use crate::text;

/// Decodes `data` as a PDU stream (with and without digests) and re-encodes what decodes.
pub fn fuzz_pdu(data: &[u8]) {
    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let mut decoder = Decoder::new(64 * 1024);
        decoder.digests = digests;
        let mut buf = data.to_vec();
        while let Ok(Some(pdu)) = decoder.decode(&mut buf) {
            let mut out = Vec::new();
            pdu.encode(digests, &mut out);
        }
    }
}

/// Parses `data` as login text, and feeds it as the data segment of login requests (with
/// the first byte as the stage flags) to a login state machine.
pub fn fuzz_login_text(data: &[u8]) {
    let _ = text::parse(data);
    let targets = Arc::new(MemoryTargets::new());
    let mut login = Login::new(targets, TargetLimits::default(), 1);
    let flags = data.first().copied().unwrap_or(0);
    for _ in 0..3 {
        let mut req = Pdu::new(crate::pdu::Opcode::LoginRequest);
        req.bhs[0] |= 0x40;
        req.bhs[1] = flags;
        req.data = data.to_vec();
        let _ = login.handle(&req);
    }
}

/// The SCSI CDB decoder and executor entry (re-exported from `mariner-scsi`).
pub fn fuzz_cdb(data: &[u8]) {
    mariner_scsi::fuzzing::fuzz_cdb(data);
}
