//! Shared harness for end-to-end tests: start the real `mariner` binary on a temporary data
//! directory with port 0, find its ports in `ports.json`, run real clients against it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `mariner` binary Cargo built for these tests.
pub fn mariner_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mariner"))
}

/// A scratch directory on a file system that supports O_DIRECT and sparse files (not tmpfs).
pub fn scratch(name: &str) -> tempfile::TempDir {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new().prefix(name).tempdir_in(base).unwrap()
}

/// Fails the test with a clear message when a client tool is missing. The test command
/// (scripts/test.sh) installs them; a missing tool is a broken environment, not a skip.
pub fn require(tool: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(found, "{tool} is not installed: run scripts/test.sh, which installs it");
}

/// A running server.
pub struct Server {
    pub child: Option<Child>,
    pub data: PathBuf,
    pub nbd: String,
    pub log_path: PathBuf,
}

impl Server {
    /// Starts `mariner serve --data <data> --listen 127.0.0.1:0 <extra...>` and waits until it
    /// serves.
    pub fn start(data: &Path, extra: &[&str]) -> Server {
        let log_path = data.with_extension("serve.log");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).unwrap();
        let _ = std::fs::remove_file(data.join("ports.json"));
        let child = Command::new(mariner_bin())
            .arg("serve")
            .arg("--data")
            .arg(data)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut s = Server { child: Some(child), data: data.to_path_buf(), nbd: String::new(), log_path };
        s.nbd = s.wait_ready(Duration::from_secs(60));
        s
    }

    fn wait_ready(&mut self, limit: Duration) -> String {
        let start = Instant::now();
        let ports = self.data.join("ports.json");
        loop {
            if let Ok(text) = std::fs::read_to_string(&ports) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                    if let Some(a) = v["nbd"][0].as_str() {
                        return a.to_string();
                    }
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("mariner serve exited with {status}: {}", self.log());
            }
            assert!(start.elapsed() < limit, "server not ready in {limit:?}: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `nbd://host:port/<export>`.
    pub fn url(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.nbd)
    }

    pub fn port(&self) -> u16 {
        self.nbd.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The server's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// `mariner <args> --data <data>`.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(mariner_bin()).args(args).arg("--data").arg(&self.data).output().unwrap()
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("server already stopped");
        let pid = c.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let start = Instant::now();
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return s;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "no exit after SIGTERM: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs a command, asserting success; returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
