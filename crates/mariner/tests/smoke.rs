//! The smallest end-to-end check: the server starts, nbdinfo sees the default volume.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::process::Command;

#[test]
fn serves_the_default_volume() {
    require("nbdinfo");
    let dir = scratch("smoke");
    let data = dir.path().join("data");
    let mut s = Server::start(&data, &[]);
    let out = run(Command::new("nbdinfo").arg(s.url("")));
    assert!(out.contains("export-size: 1073741824"), "{out}");
    assert!(s.stop().success(), "{}", s.log());
}

/// The harness's bound on clients: one that hangs fails its test (here in 1 s, not 60).
#[test]
fn a_client_that_hangs_fails_instead_of_hanging_the_suite() {
    let start = std::time::Instant::now();
    let r = std::panic::catch_unwind(|| {
        output_within(
            Command::new("sleep").arg("60"),
            std::time::Duration::from_secs(1),
        )
    });
    assert!(r.is_err(), "a client past its limit must fail the test");
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
}
