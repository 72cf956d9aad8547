//! FUSE mounts for end-to-end tests (small_requests.rs, history_clients.rs): nbdfuse (an
//! export as a file) and fuse2fs (an ext4 image as a directory), each served by a foreground
//! child process and unmounted by a guard even when a check fails; every external command
//! runs under `timeout`. FUSE needs root (CI runs the suite as root).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

use super::assert_success;

/// The most any one external command may take.
pub const COMMAND_SECONDS: u64 = 300;

/// `cmd` under `timeout` (SIGKILL 10 s after the SIGTERM), so a hung FUSE request cannot hang
/// the test; returns the output whatever the status.
pub fn bounded(cmd: &mut Command) -> Output {
    let mut t = Command::new("timeout");
    t.args(["--kill-after=10", &COMMAND_SECONDS.to_string()])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    t.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Like `run`, bounded in time.
pub fn run_bounded(cmd: &mut Command) -> String {
    let out = bounded(cmd);
    assert_success(cmd, &out)
}

pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn is_mounted(dir: &Path) -> bool {
    let dir = dir.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(dir))
}

/// A FUSE file system served by a foreground child process; unmounted (lazily if it must be)
/// and its process reaped on drop.
pub struct Mount {
    pub dir: PathBuf,
    child: Option<Child>,
    /// Where the process's stderr goes.
    stderr: PathBuf,
    /// `fusermount3` for libfuse 3 (nbdfuse), `fusermount` for libfuse 2 (fuse2fs).
    fusermount: &'static str,
    what: &'static str,
}

impl Mount {
    /// Starts `cmd` (which must stay in the foreground) and waits until `dir` is mounted.
    pub fn start(
        mut cmd: Command,
        dir: &Path,
        fusermount: &'static str,
        what: &'static str,
    ) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        let stderr = dir.with_extension("stderr");
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut m = Mount {
            dir,
            child: Some(child),
            stderr,
            fusermount,
            what,
        };
        let start = Instant::now();
        while !is_mounted(&m.dir) {
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                m.child = None;
                panic!(
                    "{what} exited with {status} before mounting: {}",
                    m.errors()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{what}: not mounted in 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    /// What the process wrote to stderr so far.
    pub fn errors(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Unmounts, waits for the process to finish its work and exit, and asserts it exited 0;
    /// returns the errors it reported (fuse2fs exits 0 after failing to write the superblock
    /// when it closes the file system).
    pub fn unmount(self) -> Vec<String> {
        let what = self.what;
        let stderr = self.stderr.clone();
        let status = self.unmount_status();
        let errors = std::fs::read_to_string(&stderr).unwrap_or_default();
        assert!(status.success(), "{what} exited with {status}: {errors}");
        // e2fsprogs reports a failure as "<error> while <doing>", libnbd as "<call>: <error>".
        errors
            .lines()
            .filter(|l| {
                [" while ", "Invalid argument", "nbd_"]
                    .iter()
                    .any(|b| l.contains(b))
            })
            .map(|l| format!("{what}: {l}"))
            .collect()
    }

    fn unmount_status(mut self) -> ExitStatus {
        run_bounded(Command::new(self.fusermount).arg("-u").arg(&self.dir));
        let mut child = self.child.take().unwrap();
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > Duration::from_secs(COMMAND_SECONDS) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{}: no exit {COMMAND_SECONDS} s after the unmount",
                    self.what
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if is_mounted(&self.dir) {
            let _ = bounded(
                Command::new(self.fusermount)
                    .arg("-u")
                    .arg("-z")
                    .arg(&self.dir),
            );
        }
        let start = Instant::now();
        while child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `nbdfuse <dir> <url>`: the export as the file `<dir>/nbd`.
pub fn nbdfuse(dir: &Path, url: &str) -> Mount {
    let mut cmd = Command::new("nbdfuse");
    cmd.arg(dir).arg(url);
    let m = Mount::start(cmd, dir, "fusermount3", "nbdfuse");
    let image = m.dir.join("nbd");
    wait_until("nbdfuse's file", Duration::from_secs(30), || image.exists());
    m
}

/// `fuse2fs -f <image> <dir>`, in the foreground so the unmount can wait for it to close the
/// file system.
pub fn fuse2fs(image: &Path, dir: &Path, options: &str) -> Mount {
    let mut cmd = Command::new("fuse2fs");
    cmd.arg(image).arg(dir).arg("-f").args(["-o", options]);
    Mount::start(cmd, dir, "fusermount", "fuse2fs")
}
