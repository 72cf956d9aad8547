//! What a new user meets on a first run: configuration mistakes get a clear message and exit
//! status 1 (never a panic or a backtrace), the log is plain text when stderr is not a terminal,
//! warnings are said once, and `volume list` stays readable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// `mariner <args>`, with its output; killed after 30 s (a start that should have been refused
/// but serves would otherwise never return).
fn mariner(args: &[&str]) -> Output {
    let dir = scratch("out");
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new(mariner_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("RUST_BACKTRACE")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: std::fs::read(&out).unwrap(),
        stderr: std::fs::read(&err).unwrap(),
    }
}

/// `mariner serve <args>` (as [`mariner`]) on free ports, so a start that should have been
/// refused but serves does not take the default ones.
fn serve(args: &[&str]) -> Output {
    let listen = ["--listen", "127.0.0.1:0", "--iscsi-listen", "127.0.0.1:0"];
    mariner(&[&["serve"][..], args, &listen].concat())
}

/// [`serve`] with `dir/mariner.toml` holding `toml` and `dir/data` as the data directory;
/// returns the output and the data directory.
fn serve_with_config(dir: &Path, toml: &str) -> (Output, PathBuf) {
    let cfg = dir.join("mariner.toml");
    std::fs::write(&cfg, toml).unwrap();
    let data = dir.join("data");
    let o = serve(&[
        "--config",
        cfg.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
    ]);
    (o, data)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A refused start: exit status 1, `expect` in the message, no panic, nothing served.
fn assert_refused(o: &Output, expect: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(expect), "expected {expect:?} in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("RUST_BACKTRACE"), "{err}");
}

#[test]
fn zero_worker_threads_is_refused_as_configuration() {
    let dir = scratch("workers");
    let (o, data) = serve_with_config(dir.path(), "worker_threads = 0\n");
    assert_refused(&o, "worker_threads");
    assert!(!data.exists(), "a refused configuration creates nothing");
}

#[test]
fn a_short_chap_secret_is_refused() {
    let dir = scratch("chap");
    let (o, _) = serve_with_config(
        dir.path(),
        "[iscsi.targets.vol0]\nchap_user = \"alice\"\nchap_secret = \"short\"\n",
    );
    assert_refused(&o, "at least 12 bytes");
}

#[test]
fn a_file_given_as_data_directory_is_named_as_such() {
    let dir = scratch("datafile");
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"precious").unwrap();
    let o = serve(&["--data", file.to_str().unwrap()]);
    assert_refused(&o, "is not a directory");
    assert!(!stderr(&o).contains("os error 17"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
}

#[test]
fn negative_and_malformed_sizes_get_a_message_of_their_own() {
    for args in [
        &["volume", "create", "x", "--size", "-5GiB"][..],
        &["volume", "grow", "x", "--size", "-1MiB"][..],
        &["serve", "--log-size", "-64MiB"][..],
        &["serve", "--default-volume-size", "-1GiB"][..],
    ] {
        let o = mariner(args);
        let err = stderr(&o);
        // clap's usage errors exit with 2.
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("a size cannot be negative"), "{args:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
    }
    let o = mariner(&["volume", "create", "x", "--size", "lots"]);
    assert!(stderr(&o).contains("is not a size"), "{}", stderr(&o));
}

#[test]
fn the_log_has_no_colour_codes_and_says_the_overcommit_warning_once() {
    let dir = scratch("plainlog");
    let data = dir.path().join("data");
    // A default volume far larger than the free space: thin, so it is overcommitted.
    let mut s = Server::start(
        &data,
        &["--log-size", "16MiB", "--default-volume-size", "8TiB"],
    );
    assert!(s.stop().success(), "{}", s.log());
    let log = s.log();
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escape codes in a log file: {log:?}"
    );
    assert_eq!(log.matches("overcommitted").count(), 1, "{log}");
    // A restart finds the same overcommit and says it once again.
    let mut s = Server::start(&data, &["--log-size", "16MiB"]);
    assert!(s.stop().success(), "{}", s.log());
    assert_eq!(s.log().matches("overcommitted").count(), 2, "{}", s.log());
}

#[test]
fn volume_list_stays_aligned_with_the_longest_names() {
    let dir = scratch("listwide");
    let data = dir.path().join("data");
    let s = Server::start(&data, SMALL);
    let long = "v".repeat(64);
    let o = s.cli(&["volume", "create", &long, "--size", "1MiB"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = s.cli(&["volume", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let state_at = |l: &str| l.rfind("  ").unwrap();
    assert!(
        lines.iter().all(|l| state_at(l) == state_at(lines[0])),
        "columns drift:\n{table}"
    );
}
