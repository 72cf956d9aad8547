//! Replays the committed fuzz corpus of the log decoders as an ordinary test.

#[test]
fn log_record_corpus_replays_without_panics() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/log_record");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.map(|e| e.path()).unwrap_or_default();
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        mariner_log::fuzzing::fuzz_record(&data);
        n += 1;
    }
    assert!(n > 0, "the corpus is empty");
}
