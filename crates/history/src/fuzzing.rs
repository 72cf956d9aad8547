//! Entry points shared by the fuzz targets (fuzz/fuzz_targets) and the corpus-replay test.

use crate::digest::format;

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
