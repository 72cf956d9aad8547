//! Bookmarks: names for instants of a volume (`mariner history mark VOL NAME`), used as
//! `mark:NAME` wherever a TIME is asked for. Kept in `volumes/<name>/marks.json`
//! (docs/FORMATS.md), replaced atomically; a mark whose instant left the window stays listed
//! and resolves to the usual "outside the window" error.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::datadir::{load_versioned, write_atomic};
use crate::NodeError;

const FILE_NAME: &str = "marks.json";
const FORMAT_VERSION: u32 = 1;

/// One bookmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// The volume after this write.
    pub volume_seq: u64,
    /// When that write was made.
    pub timestamp_ns: u64,
    /// When the mark was set.
    pub created_ns: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct MarksFile {
    format_version: u32,
    marks: BTreeMap<String, Mark>,
}

/// The volume's bookmarks (none when it has no file).
pub fn load(volume_dir: &Path) -> Result<BTreeMap<String, Mark>, NodeError> {
    let path = volume_dir.join(FILE_NAME);
    let f = load_versioned(&path, FORMAT_VERSION, |f: &MarksFile| f.format_version)?;
    Ok(f.map_or_else(BTreeMap::new, |f| f.marks))
}

/// Replaces the volume's bookmarks, durably.
pub fn save(volume_dir: &Path, marks: &BTreeMap<String, Mark>) -> Result<(), NodeError> {
    let f = MarksFile {
        format_version: FORMAT_VERSION,
        marks: marks.clone(),
    };
    let bytes = serde_json::to_vec_pretty(&f).map_err(|e| NodeError::Io(e.to_string()))?;
    write_atomic(&volume_dir.join(FILE_NAME), &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_survive_a_save_and_load() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_empty());
        let mut m = BTreeMap::new();
        m.insert(
            "before".to_string(),
            Mark {
                volume_seq: 7,
                timestamp_ns: 11,
                created_ns: 13,
            },
        );
        save(dir.path(), &m).unwrap();
        assert_eq!(load(dir.path()).unwrap(), m);
        std::fs::write(
            dir.path().join(FILE_NAME),
            b"{\"format_version\": 9, \"marks\": {}}",
        )
        .unwrap();
        assert!(matches!(load(dir.path()), Err(NodeError::Corrupt(_))));
    }
}
