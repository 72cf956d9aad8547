//! Entry points shared by the fuzz targets (fuzz/fuzz_targets) and the corpus-replay test.

use crate::digest::format;
use crate::rollback_file::RollbackRecord;
use crate::state::State;

/// Feeds arbitrary bytes to the TL digest decoders, as a whole file image and as one frame.
/// Must never panic; what decodes must encode back to the same bytes (decoding is canonical).
pub fn fuzz_digest(data: &[u8]) {
    if let Ok((first_seq, frames)) = format::decode_file_image(data) {
        let again = format::encode_file_image(first_seq, &frames);
        assert_eq!(
            again, data,
            "a decoded digest file encodes back to its bytes"
        );
    }
    if let Ok(entries) = format::decode_frame(data) {
        let again = format::encode_frame(&entries);
        assert_eq!(
            again, data,
            "a decoded digest frame encodes back to its bytes"
        );
    }
    // The header and summaries alone, as open and the queries read them.
    if let Ok(h) = format::decode_frame_header(data) {
        let end = format::FRAME_HEADER_LEN as u64 + h.summaries_len();
        if let Some(b) = usize::try_from(end)
            .ok()
            .and_then(|end| data.get(format::FRAME_HEADER_LEN..end))
        {
            let _ = format::decode_summaries(&h, b);
        }
    }
}

/// Feeds arbitrary bytes to the history state's slot decoder. Must never panic; a slot that
/// decodes encodes back to its bytes (decoding is canonical), padded with the zeros decode
/// accepts after the last volume.
pub fn fuzz_state(data: &[u8]) {
    let Ok(Some(state)) = State::decode(data) else {
        return;
    };
    let mut again = match state.encode() {
        Ok(b) => b,
        Err(why) => panic!("a decoded history state does not encode: {why}"),
    };
    assert!(
        again.len() <= data.len(),
        "a decoded history state encodes longer than its slot"
    );
    again.resize(data.len(), 0);
    assert!(
        again == data,
        "a decoded history state encodes back to its bytes"
    );
}

/// Feeds arbitrary bytes to the pending-rollback decoders: as one slot image, and as a whole
/// file (both slots) through `load`. Must never panic; a slot that decodes encodes back to its
/// bytes, padded with the zeros decode accepts after the record.
pub fn fuzz_rollback(data: &[u8]) {
    if let Ok(Some(r)) = RollbackRecord::decode(data) {
        let mut again = r.encode();
        assert!(
            again.len() <= data.len(),
            "a decoded rollback encodes longer than its slot"
        );
        again.resize(data.len(), 0);
        assert!(
            again == data,
            "a decoded rollback encodes back to its bytes"
        );
    }
    let disk = mariner_disk::MemDisk::from_vec(data.to_vec());
    if let Ok(Some(r)) = RollbackRecord::load(&disk) {
        assert!(r.generation >= 1 && r.done_bytes <= r.total_bytes);
    }
}
