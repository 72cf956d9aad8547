//! Entry points shared by the fuzz targets (fuzz/fuzz_targets) and the corpus-replay test.

use crate::Progress;

/// Feeds arbitrary bytes to the store progress decoder. Must never panic; what decodes must
/// encode back to the same bytes.
pub fn fuzz_progress(data: &[u8]) {
    if let Ok(p) = Progress::decode(data) {
        let again = p.encode();
        // A v1 file decodes to what v2 encodes differently; a v2 one round-trips exactly.
        if data.get(8..10) == Some(&2u16.to_le_bytes()[..]) {
            assert_eq!(
                again, data,
                "a decoded progress file encodes back to its bytes"
            );
        }
        assert_eq!(Progress::decode(&again).as_ref(), Ok(&p));
    }
}
