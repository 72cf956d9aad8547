//! Shared harness for end-to-end tests: start the real `mariner` binary on a temporary data
//! directory with port 0, find its ports in `ports.json`, run real clients against it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod cli;
pub mod fuse;
pub mod history;

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
    tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(base)
        .unwrap()
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
    assert!(
        found,
        "{tool} is not installed: run scripts/test.sh, which installs it"
    );
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
        Self::launch(Command::new(mariner_bin()), data, extra)
    }

    /// Like [`Server::start`], with the `serve` arguments appended to `cmd`: either the
    /// binary itself or a launcher that ends by running the binary (e.g. a shell that joins
    /// a cgroup, then `exec "$@"`).
    pub fn launch(cmd: Command, data: &Path, extra: &[&str]) -> Server {
        Self::spawn(cmd, data.to_path_buf(), data, &["127.0.0.1:0"], extra)
    }

    /// The one launcher behind every way of starting a server: runs `cmd serve --data
    /// <data_arg>` with a `--listen` for each of `listen`, iSCSI on a free port and `extra`,
    /// and waits until it serves. `data` is the data directory as the test sees it (where
    /// `ports.json` appears); it differs from `data_arg` only when `cmd` has its own working
    /// directory and `data_arg` is relative to it.
    fn spawn(
        mut cmd: Command,
        data: PathBuf,
        data_arg: &Path,
        listen: &[&str],
        extra: &[&str],
    ) -> Server {
        let log_path = data.with_extension("serve.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        let _ = std::fs::remove_file(data.join("ports.json"));
        cmd.arg("serve").arg("--data").arg(data_arg);
        for l in listen {
            cmd.args(["--listen", l]);
        }
        let child = cmd
            // iSCSI defaults to port 3260; tests in parallel each take a free port.
            .args(["--iscsi-listen", "127.0.0.1:0"])
            .args(extra)
            // MARINER_TEST_LOG (a RUST_LOG filter) turns a server's debug output on.
            .env(
                "RUST_LOG",
                std::env::var("MARINER_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut s = Server {
            child: Some(child),
            data,
            nbd: String::new(),
            log_path,
        };
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
            assert!(
                start.elapsed() < limit,
                "server not ready in {limit:?}: {}",
                self.log()
            );
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
        Command::new(mariner_bin())
            .args(args)
            .arg("--data")
            .arg(&self.data)
            .output()
            .unwrap()
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
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no exit after SIGTERM: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How long [`run`] lets a client run: far beyond the slowest (seconds), so a client that hangs
/// fails its test instead of hanging the suite.
pub const RUN_LIMIT: Duration = Duration::from_secs(300);

/// 64 KiB random writes at depth 8 through fio's nbd engine, `io_size` in all over the first
/// `size` of the export at `url`, with fio's `extra` options (e.g. `--rate=`); asserts fio
/// saw no error and returns its report.
pub fn fio_fill(url: &str, size: &str, io_size: &str, extra: &[&str]) -> String {
    let out = run(Command::new("fio").args(extra).args([
        "--name=fill",
        "--ioengine=nbd",
        &format!("--uri={url}"),
        "--rw=randwrite",
        "--bs=64k",
        "--iodepth=8",
        &format!("--size={size}"),
        &format!("--io_size={io_size}"),
        "--randrepeat=0",
    ]));
    assert!(out.contains("err= 0"), "{out}");
    out
}

/// Runs a command, asserting success within [`RUN_LIMIT`]; returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = output_within(cmd, RUN_LIMIT);
    assert_success(cmd, &out)
}

/// [`Command::output`] (stdin closed, both streams captured), killed and failed after `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    use std::io::Read;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = r.read_to_end(&mut b);
            b
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Asserts `out`, the output of `cmd`, is a success (with both streams in the message if not);
/// returns stdout.
pub fn assert_success(cmd: &Command, out: &Output) -> String {
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---- Added for clients.rs, admin.rs and hostile.rs (additions only). ----

/// Serve flags that keep a test's server small: a 64 MiB log and a 64 MiB default volume.
pub const SMALL: &[&str] = &["--log-size", "64MiB", "--default-volume-size", "64MiB"];

impl Server {
    /// Like [`Server::start`], but listening on `listen` (each a `--listen` value) instead of
    /// 127.0.0.1:0. `self.nbd` is the first bound address as written to `ports.json`.
    pub fn start_listening(data: &Path, listen: &[&str], extra: &[&str]) -> Server {
        let cmd = Command::new(mariner_bin());
        Self::spawn(cmd, data.to_path_buf(), data, listen, extra)
    }

    /// SIGTERM (asserting a clean exit), then start again on the same data directory.
    pub fn restart_after_sigterm(&mut self, extra: &[&str]) {
        let status = self.stop();
        assert!(status.success(), "SIGTERM exit {status}: {}", self.log());
        *self = Server::start(&self.data.clone(), extra);
    }

    /// kill -9, then start again on the same data directory.
    pub fn restart_after_kill9(&mut self, extra: &[&str]) {
        self.kill();
        *self = Server::start(&self.data.clone(), extra);
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server not running").id()
    }

    /// Asserts the server process is still running.
    pub fn assert_running(&mut self) {
        let status = self
            .child
            .as_mut()
            .expect("server not running")
            .try_wait()
            .unwrap();
        assert!(
            status.is_none(),
            "server exited with {status:?}: {}",
            self.log()
        );
    }

    /// `curl --unix-socket <data>/admin.sock http://mariner<path>`: the body of a 2xx answer.
    pub fn admin_get(&self, path: &str) -> String {
        let sock = self.data.join("admin.sock");
        run(Command::new("curl")
            .args(["-sS", "--fail", "--max-time", "30", "--unix-socket"])
            .arg(&sock)
            .arg(format!("http://mariner{path}")))
    }
}

/// Deterministic pseudo-random bytes (xorshift64*), so a failure reproduces.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Resident set size of a process in KiB (from /proc).
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// Opens an NBD connection to `addr` ("host:port") and negotiates `export` with the
/// fixed-newstyle handshake and `NBD_OPT_GO` (simple replies only). Panics unless the server
/// accepts. Returns the socket, now in the transmission phase, the export size and the
/// transmission flags. Written from the NBD protocol document, independently of mariner-nbd.
#[allow(clippy::big_endian_bytes)] // the NBD wire is big-endian
pub fn nbd_connect(addr: &str, export: &str) -> (std::net::TcpStream, u64, u16) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT", "server greeting");
    s.write_all(&3u32.to_be_bytes()).unwrap(); // FIXED_NEWSTYLE | NO_ZEROES
    let mut data = Vec::new();
    data.extend_from_slice(&(export.len() as u32).to_be_bytes());
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&7u32.to_be_bytes()); // NBD_OPT_GO
    opt.extend_from_slice(&(data.len() as u32).to_be_bytes());
    opt.extend_from_slice(&data);
    s.write_all(&opt).unwrap();
    let (mut size, mut flags) = (None, 0u16);
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        assert_eq!(
            u64::from_be_bytes(h[..8].try_into().unwrap()),
            0x0003_e889_0455_65a9
        );
        let reply = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        match reply {
            1 => break, // NBD_REP_ACK
            3 if body.len() >= 12 && body[..2] == [0, 0] => {
                size = Some(u64::from_be_bytes(body[2..10].try_into().unwrap()));
                flags = u16::from_be_bytes(body[10..12].try_into().unwrap());
            }
            3 => {}
            other => panic!(
                "NBD_OPT_GO {export:?} refused: reply {other:#x} {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }
    (
        s,
        size.expect("NBD_INFO_EXPORT in the NBD_OPT_GO replies"),
        flags,
    )
}

/// The value of an unlabelled sample (`name value`) or of the first sample whose name and
/// labels start with `name` (e.g. `mariner_volume_writes_total{volume="vol0"}`) in Prometheus
/// text.
pub fn metric_value(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let matches = key == name || (name.contains('{') && key.starts_with(name));
            matches.then(|| value.parse().ok()).flatten()
        })
}

impl Server {
    /// `/metrics` from the admin socket.
    pub fn metrics(&self) -> String {
        self.admin_get("/metrics")
    }

    /// One sample of `/metrics` (see [`metric_value`]); panics if absent.
    pub fn metric(&self, name: &str) -> f64 {
        let m = self.metrics();
        metric_value(&m, name).unwrap_or_else(|| panic!("no metric {name} in:\n{m}"))
    }
}

// ---- Added for iscsi.rs (additions only). ----

impl Server {
    /// The first iSCSI address ("host:port") from `ports.json`.
    pub fn iscsi(&self) -> String {
        let text = std::fs::read_to_string(self.data.join("ports.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["iscsi"][0]
            .as_str()
            .unwrap_or_else(|| panic!("no iSCSI address in ports.json: {text}"))
            .to_string()
    }
}

/// A file of pseudo-random bytes (SplitMix64), incompressible and free of zero blocks.
pub fn random_file(path: &Path, len: u64, seed: u64) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut state = seed;
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..len / buf.len() as u64 {
        for chunk in buf.chunks_mut(8) {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        f.write_all(&buf).unwrap();
    }
    f.flush().unwrap();
}

// ---- Added for startup.rs (additions only). ----

impl Server {
    /// Starts `mariner serve --data <data_arg> ...` (as [`Server::start`]) with `cwd` as the
    /// server's working directory, so a relative `data_arg` is relative to `cwd`. `self.data`
    /// is `cwd.join(data_arg)`, the directory as the test sees it.
    pub fn start_in(cwd: &Path, data_arg: &Path, extra: &[&str]) -> Server {
        let mut cmd = Command::new(mariner_bin());
        cmd.current_dir(cwd);
        Self::spawn(cmd, cwd.join(data_arg), data_arg, &["127.0.0.1:0"], extra)
    }
}

/// Runs `mariner serve --data <data_arg> <args...>` in `cwd`, which must exit by itself within
/// 60 s (it fails to start); returns its output.
pub fn serve_must_exit(cwd: &Path, data_arg: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(mariner_bin())
        .current_dir(cwd)
        .arg("serve")
        .arg("--data")
        .arg(data_arg)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "mariner serve {args:?} kept running: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

// ---- Added for limits.rs (additions only). ----

/// Fails (never skips) unless the tests run as root; `why` says what needs it.
pub fn require_root(why: &str) {
    let uid = run(Command::new("id").arg("-u"));
    assert_eq!(
        uid.trim(),
        "0",
        "{why} needs root: run the suite as root (CI does), e.g. `sudo -E cargo test --release \
         -p mariner --test <file>`"
    );
}

/// A memory cgroup (v2, or v1) limited to `limit` bytes, page cache included, made for one
/// test (memory.rs, limits.rs); its processes are killed and it is removed on drop.
pub struct MemCgroup {
    pub path: PathBuf,
    v2: bool,
    limit: u64,
}

impl MemCgroup {
    pub fn create(limit: u64) -> MemCgroup {
        let unique = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!("mariner-test.{}.{unique}", std::process::id());
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let root = if v2 {
            Path::new("/sys/fs/cgroup")
        } else {
            Path::new("/sys/fs/cgroup/memory")
        };
        assert!(
            root.is_dir(),
            "no memory cgroup controller (neither v2 nor v1)"
        );
        let path = root.join(name);
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        let cg = MemCgroup { path, v2, limit };
        let (file, value) = if v2 {
            // No swap on most test machines; where there is, keep it out of the picture.
            let _ = std::fs::write(cg.path.join("memory.swap.max"), "0");
            ("memory.max", limit.to_string())
        } else {
            ("memory.limit_in_bytes", limit.to_string())
        };
        std::fs::write(cg.path.join(file), value).unwrap();
        cg
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.path.join(file)).unwrap_or_default()
    }

    /// Processes the kernel OOM-killed in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        self.key(file, "oom_kill").unwrap_or(0)
    }

    /// Peak usage (process memory and page cache) since creation.
    pub fn peak(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        self.read(file).trim().parse().ok()
    }

    /// Starts `mariner serve` inside this cgroup (a shell joins it, then execs the server).
    pub fn start_server(&self, data: &Path, extra: &[&str]) -> Server {
        let mut launcher = Command::new("sh");
        launcher
            .arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(self.path.join("cgroup.procs"))
            .arg(mariner_bin());
        Server::launch(launcher, data, extra)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            for pid in self.read("cgroup.procs").split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
            if std::fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove cgroup {}", self.path.display());
    }
}

/// Peak resident set (VmHWM) of a process in KiB (from /proc).
pub fn hwm_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM")
}

// ---- Added for memory.rs and startup.rs (additions only). ----

impl MemCgroup {
    /// "v2" or "v1".
    pub fn version(&self) -> &'static str {
        if self.v2 {
            "v2"
        } else {
            "v1"
        }
    }

    /// A `key value` line of a flat-keyed file (memory.events, memory.oom_control).
    fn key(&self, file: &str, key: &str) -> Option<u64> {
        self.read(file)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.trim().parse().ok())
    }

    /// How often usage hit the limit (and page cache was reclaimed): informative only, hitting
    /// the limit is expected when the page cache counts.
    pub fn limit_hits(&self) -> Option<u64> {
        if self.v2 {
            self.key("memory.events", "max")
        } else {
            self.read("memory.failcnt").trim().parse().ok()
        }
    }
}

/// `qemu-io -f raw -c <cmd>... <url>`: asserts success and that no command printed "failed";
/// returns the output.
pub fn qemu_io<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(url: &str, cmds: &[S]) -> String {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]);
    for c in cmds {
        cmd.arg("-c").arg(c);
    }
    let out = run(cmd.arg(url));
    assert!(!out.contains("failed"), "qemu-io {cmds:?}:\n{out}");
    out
}

/// A `<key>: <n> kB` line of /proc/<pid>/status, in KiB.
fn status_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/<pid>/status"))
}

impl MemCgroup {
    /// Asserts the server `s` (started in this cgroup) still runs and the kernel OOM-killed
    /// nothing here; `when` says at which point of the test.
    pub fn assert_alive(&self, s: &mut Server, when: &str) {
        let status = s.child.as_mut().unwrap().try_wait().unwrap();
        assert!(
            status.is_none(),
            "{when}: the server died ({status:?}; cgroup oom_kill {}; peak {:?} of {}): {}",
            self.oom_kills(),
            self.peak(),
            self.limit,
            s.log()
        );
        assert_eq!(
            self.oom_kills(),
            0,
            "{when}: the kernel OOM-killed in the cgroup"
        );
    }
}

// ---- Added for failure.rs (additions only). ----

/// qemu-io with `args` (e.g. `-r`) and `cmds` (each a `-c` command) on `url`, killed after 120 s
/// so that a request the server never answers fails the test instead of hanging it.
pub fn qemu_io_output(args: &[&str], url: &str, cmds: &[&str]) -> Output {
    let mut c = Command::new("timeout");
    c.args(["-k", "10", "120", "qemu-io"])
        .args(args)
        .args(["-f", "raw"]);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    c.arg(url).output().unwrap()
}

/// `qemu-io -r -c "read -P <p> <off> <len>"` on `url` must succeed: the bytes are all `p`
/// (read-only, so it opens read-only exports too).
pub fn holds(url: &str, pattern: u8, off: &str, len: &str) {
    let cmd = format!("read -P {pattern} {off} {len}");
    let o = qemu_io_output(&["-r"], url, &[&cmd]);
    assert!(qemu_io_succeeded(&o), "{url}: {cmd}: {}", output_text(&o));
}

/// qemu-io's stdout then stderr.
pub fn output_text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Whether a qemu-io run did everything it was asked: exit 0 and no failed command. The text
/// alone proves nothing: qemu-io prints "read 4096/4096 bytes" right after "Pattern verification
/// failed", and the exit status is what tells the two apart.
pub fn qemu_io_succeeded(out: &Output) -> bool {
    out.status.success() && !output_text(out).contains("failed")
}
