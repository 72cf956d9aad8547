//! Entry points shared by the fuzz targets (fuzz/fuzz_targets) and the corpus-replay test.

use crate::format::{RecordHeader, Superblock};
use crate::scan::parse_segment;

/// Feeds arbitrary bytes to every decoder of log bytes. Must never panic.
pub fn fuzz_record(data: &[u8]) {
    let log_id = 0x006d_6172_696e_6572;
    if let Ok(h) = RecordHeader::decode(data, log_id, None) {
        let body = data.get(crate::RECORD_HEADER_LEN..).unwrap_or(&[]);
        let payload = body.get(..h.payload_len as usize).unwrap_or(body);
        let _ = h.verify_payload(payload);
    }
    let _ = RecordHeader::decode(data, log_id, Some(1));
    let _ = Superblock::decode(data);
    let _ = crate::format::GenFloor::decode(data);
    let scan = parse_segment(log_id, 0, 0, crate::DATA_OFFSET, data);
    let mut end = 0u64;
    for f in &scan.records {
        // Records parsed back lie inside the buffer, in order, without overlap.
        let start = f.addr.offset() - crate::DATA_OFFSET;
        assert!(start >= end && start + u64::from(f.header.span) <= data.len() as u64);
        end = start + u64::from(f.header.span);
    }
}
