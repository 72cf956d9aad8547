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
