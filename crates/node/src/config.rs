//! The node's configuration: defaults that give a working node with no file at all, a TOML
//! file for the rest, command-line flags on top.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use crate::NodeError;

/// Everything `mariner serve` needs. Unknown keys in the file are errors.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The data directory (created if absent).
    pub data: PathBuf,
    /// Threads serving NBD and iSCSI connections. Unset: one per CPU but one, at least one —
    /// the log's device threads and the applier need the remaining core, and on two cores a
    /// second connection thread costs more in cross-thread wakeups than it adds.
    pub worker_threads: Option<usize>,
    pub nbd: NbdConfig,
    pub iscsi: IscsiConfig,
    pub log: LogSection,
    pub store: StoreSection,
    pub volume: VolumeDefaults,
    pub limits: LimitsSection,
    pub history: HistorySection,
    /// Test-only switches; not for production.
    pub test: TestSection,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NbdConfig {
    /// Addresses to serve NBD on (port 0 picks a free port; see `<data>/ports.json`).
    pub listen: Vec<SocketAddr>,
}

/// The iSCSI front end: one target per volume, `iqn.2026-11.dev.mariner:<volume>`, LUN 0.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IscsiConfig {
    /// Addresses to serve iSCSI on (port 0 picks a free port; see `<data>/ports.json`).
    /// Empty: no iSCSI.
    pub listen: Vec<SocketAddr>,
    /// Access control per volume name (`[iscsi.targets.<volume>]`); volumes not listed admit
    /// every initiator without authentication.
    pub targets: BTreeMap<String, IscsiTargetConfig>,
}

/// CHAP and the initiator ACL of one target.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IscsiTargetConfig {
    /// With `chap_secret`: logins must authenticate with CHAP as this user.
    pub chap_user: Option<String>,
    pub chap_secret: Option<String>,
    /// With `mutual_secret`: the target proves itself to the initiator under this name.
    pub mutual_user: Option<String>,
    pub mutual_secret: Option<String>,
    /// Initiator names (IQNs) allowed to log in; empty admits every initiator.
    pub initiators: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Log devices: files or block devices. Empty: one file `<data>/log/log0`.
    pub devices: Vec<PathBuf>,
    /// Size of log files created by Mariner (existing files and block devices keep theirs).
    pub file_size: ByteSize,
    /// Segment (track) size; bounds the largest single write. Unset: the smallest device's
    /// size / 32, a power of two between 1 MiB and 16 MiB (used when the log is formatted).
    pub segment_size: Option<ByteSize>,
    /// mariner-paper.md §4 T_wait in microseconds. See docs/benchmarks.md for the sweep.
    pub t_wait_us: u64,
    /// mariner-paper.md eq. 2 T_switch (0 disables early track switches).
    pub t_switch: f64,
    /// Send a gathering batch as soon as its device falls idle.
    pub dispatch_on_idle: bool,
    /// Open log devices with O_DIRECT|O_DSYNC instead of buffered write + fdatasync.
    pub direct_io: bool,
    /// Batches each log device may have in flight at once (1: the paper's single-head disk;
    /// solid-state and virtual disks write several in parallel at about the latency of one).
    pub device_depth: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    /// Sync the images and release log space at least this often.
    pub sync_interval_ms: u64,
    /// ... or after this much was applied.
    pub sync_size: ByteSize,
    /// Write payloads kept in memory for the applier (beyond: read back from the log). Unset:
    /// [`Config::payload_budget`] decides.
    pub payload_budget: Option<ByteSize>,
    /// Write-back: apply to the images once the writers have paused this long (0: at once).
    pub apply_idle_ms: u64,
    /// ... or once a record has waited this long (a log three quarters full also starts it).
    pub apply_max_delay_ms: u64,
    /// ... or once what is not yet written back holds this much of the log: a restart after
    /// a crash reads that much back before it serves the volumes.
    pub apply_max_held: ByteSize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VolumeDefaults {
    /// Name of the volume created in a new data directory ("" creates none).
    pub default_name: String,
    /// Its size.
    pub default_size: ByteSize,
    /// Logical block size of new volumes.
    pub block_size: u32,
}

/// Node-wide caps shared by the NBD and iSCSI front ends (docs/CONFIG.md `[limits]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Client connections open at once, NBD and iSCSI together; beyond it new connections
    /// are closed at once and the refusal logged.
    pub max_connections: u32,
    /// Request payload bytes buffered at once, all connections together (WRITE data as it
    /// arrives, READ data until sent); beyond it requests wait and their connections stop
    /// being read. One connection may hold a quarter of it (at most 16 MiB).
    pub max_in_flight_bytes: ByteSize,
    /// How long a request holding payload budget may take to receive its WRITE payload or to
    /// have its reply taken by the client; past it the connection is closed (logged).
    pub payload_timeout_ms: u64,
}

/// Continuous data protection (docs/CONFIG.md `[history]`): every write of the window kept.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistorySection {
    /// Keep history at all.
    pub enabled: bool,
    /// The protection window: every write this recent stays readable ("7d", "12h", "30m").
    #[serde(with = "humantime_serde")]
    pub window: std::time::Duration,
    /// The floor under which the window must not fall without notice: with `policy =
    /// "throttle"` writers wait rather than let it; with `"shrink"` an alert is logged.
    #[serde(with = "humantime_serde")]
    pub min_window: std::time::Duration,
    /// What happens when the log fills before the window ends: `"shrink"` (history gives way
    /// from its oldest end; writes never wait for it) or `"throttle"` (writers wait while the
    /// window is down to `min_window`).
    pub policy: HistoryPolicy,
    /// Memory for the index's queues.
    pub index_memory: ByteSize,
    /// Largest size of the index file (sparse: only what is used takes space).
    pub index_size: ByteSize,
    /// Most bytes one writable snapshot export (`mariner snapshot export --scratch`) keeps of
    /// its writes; beyond, its writes fail with ENOSPC.
    pub scratch_max: ByteSize,
    /// Per volume name (`[history.volumes.<name>]`): its own window, or no history.
    pub volumes: BTreeMap<String, HistoryVolume>,
}

/// `[history.volumes.<name>]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryVolume {
    /// Keep history of this volume.
    pub enabled: bool,
    /// Its window instead of `[history] window`.
    #[serde(with = "humantime_serde")]
    pub window: Option<std::time::Duration>,
}

impl Default for HistoryVolume {
    fn default() -> Self {
        Self {
            enabled: true,
            window: None,
        }
    }
}

/// `[history] policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HistoryPolicy {
    Shrink,
    Throttle,
}

impl Default for HistorySection {
    fn default() -> Self {
        Self {
            enabled: true,
            window: std::time::Duration::from_secs(7 * 24 * 3600),
            min_window: std::time::Duration::from_secs(3600),
            policy: HistoryPolicy::Shrink,
            index_memory: ByteSize::mib(64),
            index_size: ByteSize::gib(4),
            scratch_max: ByteSize::gib(1),
            volumes: BTreeMap::new(),
        }
    }
}

impl HistorySection {
    /// The window of the volume called `name`: its own, the configured one, or `None` when
    /// history is off for it.
    pub fn window_of(&self, name: &str) -> Option<std::time::Duration> {
        match self.volumes.get(name) {
            Some(v) if !v.enabled => None,
            Some(v) => Some(v.window.unwrap_or(self.window)),
            None => Some(self.window),
        }
    }

    fn validate(&self) -> Result<(), NodeError> {
        let bad = |m: &str| Err(NodeError::Config(format!("history.{m}")));
        if self.window.is_zero() {
            return bad("window: at least 1s (to keep no history, set enabled = false)");
        }
        if self.min_window > self.window {
            return bad("min_window: at most the window");
        }
        if self.index_memory.as_u64() < 1 << 20 {
            return bad("index_memory: at least 1 MiB");
        }
        if self.index_size.as_u64() < 64 << 20 {
            return bad("index_size: at least 64 MiB");
        }
        for (name, v) in &self.volumes {
            if v.window.is_some_and(|w| w.is_zero()) {
                return bad(&format!(
                    "volumes.{name}.window: at least 1s (to keep none, set enabled = false)"
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TestSection {
    /// Hold every write to log devices and images in memory until it is synced, so `kill -9`
    /// loses exactly what was not synced. For crash tests. With `log.direct_io` the log
    /// devices keep `O_DSYNC` (a write is durable when it returns) and only lose the page
    /// cache bypass.
    pub volatile: bool,
    /// Do not apply records to the images (recovery measurements).
    pub pause_apply: bool,
    /// Log devices fail with EIO after this many writes and syncs (failure-path tests).
    pub fail_log_after: Option<u64>,
    /// History does not roll forward until the log has cut it once, so writes past the
    /// log's size break it (tests of seeding again while serving).
    pub history_rolls_stalled_until_cut: bool,
}

impl Config {
    /// The store's payload budget: as configured, else none with a buffered log and 64 MiB
    /// with `direct_io`. A buffered log's records are read back from the page cache, a run of
    /// them per read, which costs less than holding payloads for seconds: they made the
    /// connection threads' heaps grow page by page through every burst (a page fault and an
    /// `mprotect` every few writes; docs/benchmarks.md). An `O_DIRECT` log has no page cache,
    /// so reading back would be device I/O.
    pub fn payload_budget(&self) -> ByteSize {
        self.store.payload_budget.unwrap_or(if self.log.direct_io {
            ByteSize::mib(64)
        } else {
            ByteSize::b(0)
        })
    }

    /// [`Config::worker_threads`], or its default for this machine.
    pub fn worker_threads(&self) -> usize {
        self.worker_threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .saturating_sub(1)
                .max(1)
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data: PathBuf::from("mariner-data"),
            worker_threads: None,
            nbd: NbdConfig::default(),
            iscsi: IscsiConfig::default(),
            log: LogSection::default(),
            store: StoreSection::default(),
            volume: VolumeDefaults::default(),
            limits: LimitsSection::default(),
            history: HistorySection::default(),
            test: TestSection::default(),
        }
    }
}

impl Default for NbdConfig {
    fn default() -> Self {
        Self {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 10809))],
        }
    }
}

impl Default for IscsiConfig {
    fn default() -> Self {
        Self {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 3260))],
            targets: BTreeMap::new(),
        }
    }
}

/// The shortest CHAP secret accepted, in bytes.
pub const MIN_CHAP_SECRET: usize = 12;

impl IscsiTargetConfig {
    fn validate(&self, volume: &str) -> Result<(), NodeError> {
        let bad = |m: &str| Err(NodeError::Config(format!("iscsi.targets.{volume}: {m}")));
        let empty = |v: &Option<String>| v.as_deref().is_some_and(str::is_empty);
        if self.chap_user.is_some() != self.chap_secret.is_some() {
            return bad("chap_user and chap_secret go together");
        }
        if self.mutual_user.is_some() != self.mutual_secret.is_some() {
            return bad("mutual_user and mutual_secret go together");
        }
        if self.mutual_user.is_some() && self.chap_user.is_none() {
            return bad("mutual CHAP needs chap_user and chap_secret too");
        }
        if [
            &self.chap_user,
            &self.chap_secret,
            &self.mutual_user,
            &self.mutual_secret,
        ]
        .into_iter()
        .any(empty)
        {
            return bad("CHAP names and secrets must not be empty");
        }
        // RFC 7143 §9.2.1: CHAP secrets of fewer than 96 bits must not be used (without
        // IPsec, which Mariner does not run): an eavesdropper can search them off-line.
        let short = |v: &Option<String>| v.as_deref().is_some_and(|s| s.len() < MIN_CHAP_SECRET);
        if short(&self.chap_secret) || short(&self.mutual_secret) {
            return bad(&format!(
                "CHAP secrets must be at least {MIN_CHAP_SECRET} bytes (96 bits, RFC 7143 §9.2.1)"
            ));
        }
        if self.chap_secret.is_some() && self.chap_secret == self.mutual_secret {
            // RFC 7143 §12.1.3: the secrets of the two directions must differ.
            return bad("mutual_secret must differ from chap_secret");
        }
        Ok(())
    }
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            devices: Vec::new(),
            file_size: ByteSize::mib(256),
            segment_size: None,
            t_wait_us: 50,
            t_switch: 0.0,
            dispatch_on_idle: true,
            direct_io: false,
            device_depth: 1,
        }
    }
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            sync_interval_ms: 500,
            sync_size: ByteSize::mib(64),
            payload_budget: None,
            apply_idle_ms: 20,
            apply_max_delay_ms: 30_000,
            apply_max_held: ByteSize::gib(1),
        }
    }
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            max_connections: 512,
            max_in_flight_bytes: ByteSize::mib(64),
            payload_timeout_ms: 30_000,
        }
    }
}

impl LimitsSection {
    /// Upper bound of `max_in_flight_bytes`: the budget is counted in `u32` bytes.
    const MAX_IN_FLIGHT: u64 = u32::MAX as u64;

    fn validate(&self) -> Result<(), NodeError> {
        let bad = |m: &str| Err(NodeError::Config(format!("limits.{m}")));
        if !(1..=1 << 20).contains(&self.max_connections) {
            return bad("max_connections: between 1 and 1048576");
        }
        let bytes = self.max_in_flight_bytes.as_u64();
        if !(1 << 20..=Self::MAX_IN_FLIGHT).contains(&bytes) {
            return bad("max_in_flight_bytes: between 1 MiB and 4 GiB");
        }
        if self.payload_timeout_ms == 0 {
            return bad("payload_timeout_ms: at least 1");
        }
        Ok(())
    }

    /// The caps for [`mariner_limits::Limits`].
    pub fn to_limits(&self) -> mariner_limits::LimitsConfig {
        mariner_limits::LimitsConfig {
            max_connections: self.max_connections,
            max_in_flight_bytes: u32::try_from(self.max_in_flight_bytes.as_u64())
                .unwrap_or(u32::MAX),
            payload_timeout: std::time::Duration::from_millis(self.payload_timeout_ms),
        }
    }

    /// What one NBD connection may hold: a quarter of the node's budget, so one client cannot
    /// take all of it, and at most 16 MiB (docs/ARCHITECTURE.md "Memory").
    pub fn per_connection_bytes(&self) -> u32 {
        let quarter = self.max_in_flight_bytes.as_u64() / 4;
        u32::try_from(quarter.min(16 << 20)).unwrap_or(16 << 20)
    }
}

impl Default for VolumeDefaults {
    fn default() -> Self {
        Self {
            default_name: "vol0".into(),
            default_size: ByteSize::gib(1),
            block_size: 512,
        }
    }
}

impl Config {
    /// Reads a TOML file over the defaults.
    pub fn from_file(path: &Path) -> Result<Self, NodeError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| NodeError::Config(format!("{}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| NodeError::Config(format!("{}: {e}", path.display())))
    }

    /// Checks values that the types cannot.
    pub fn validate(&self) -> Result<(), NodeError> {
        let bad = |m: &str| Err(NodeError::Config(m.to_string()));
        if self
            .worker_threads
            .is_some_and(|n| !(1..=1024).contains(&n))
        {
            return bad("worker_threads: between 1 and 1024");
        }
        if self.nbd.listen.is_empty() {
            return bad("nbd.listen: at least one address");
        }
        for (volume, target) in &self.iscsi.targets {
            target.validate(volume)?;
        }
        let seg = self.log.segment_size.map_or(1 << 20, |s| s.as_u64());
        if !(64 * 1024..=256 << 20).contains(&seg) || !seg.is_multiple_of(4096) {
            return bad("log.segment_size: a multiple of 4 KiB between 64 KiB and 256 MiB");
        }
        if self.log.file_size.as_u64() < 64 * 1024 + 4 * seg {
            return bad("log.file_size: room for at least four segments (at least 4 MiB)");
        }
        if !self.log.t_switch.is_finite() || self.log.t_switch < 0.0 {
            return bad("log.t_switch: a number >= 0 (0 disables early switching)");
        }
        if !(1..=16).contains(&self.log.device_depth) {
            return bad("log.device_depth: between 1 and 16");
        }
        if !self.volume.block_size.is_power_of_two()
            || !(512..=4096).contains(&self.volume.block_size)
        {
            return bad("volume.block_size: 512, 1024, 2048 or 4096");
        }
        if self.store.sync_interval_ms == 0 {
            return bad("store.sync_interval_ms: at least 1");
        }
        self.limits.validate()?;
        self.history.validate()
    }
}

/// The segment size for a log whose smallest device has `device_bytes`: 1/32 of it, a power of
/// two between 1 MiB and 16 MiB. Large enough that a segment holds several of the largest
/// records (4 MiB), small enough that space is released in fine steps.
pub fn default_segment_bytes(device_bytes: u64) -> u64 {
    let target = (device_bytes / 32).clamp(1 << 20, 16 << 20);
    1u64 << (63 - target.leading_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_size_follows_the_device() {
        assert_eq!(default_segment_bytes(64 << 20), 2 << 20);
        assert_eq!(default_segment_bytes(256 << 20), 8 << 20);
        assert_eq!(default_segment_bytes(1 << 30), 16 << 20);
        assert_eq!(default_segment_bytes(1 << 40), 16 << 20);
        assert_eq!(default_segment_bytes(5 << 20), 1 << 20);
    }

    #[test]
    fn payload_budget_defaults_to_none_unless_the_log_bypasses_the_page_cache() {
        let c: Config = toml::from_str("").unwrap();
        assert_eq!(c.payload_budget(), ByteSize::b(0));
        let direct: Config = toml::from_str("[log]\ndirect_io = true\n").unwrap();
        assert_eq!(direct.payload_budget(), ByteSize::mib(64));
        let set: Config = toml::from_str("[store]\npayload_budget = \"8MiB\"\n").unwrap();
        assert_eq!(set.payload_budget(), ByteSize::mib(8));
    }

    #[test]
    fn iscsi_targets_parse_and_validate() {
        let c: Config = toml::from_str(
            "[iscsi]\nlisten = [\"127.0.0.1:0\"]\n[iscsi.targets.vol0]\nchap_user = \"u\"\n\
             chap_secret = \"secretsecret\"\ninitiators = [\"iqn.x:a\"]\n",
        )
        .unwrap();
        assert_eq!(c.iscsi.targets["vol0"].initiators, ["iqn.x:a"]);
        c.validate().unwrap();
        let short: Config =
            toml::from_str("[iscsi.targets.v]\nchap_user = \"u\"\nchap_secret = \"elevenchars\"\n")
                .unwrap();
        let err = short.validate().unwrap_err().to_string();
        assert!(err.contains("at least 12 bytes"), "{err}");
        let half: Config = toml::from_str("[iscsi.targets.v]\nchap_user = \"u\"\n").unwrap();
        assert!(half.validate().is_err());
        let mutual_only: Config =
            toml::from_str("[iscsi.targets.v]\nmutual_user = \"t\"\nmutual_secret = \"s\"\n")
                .unwrap();
        assert!(mutual_only.validate().is_err());
        assert!(toml::from_str::<Config>("[iscsi.targets.v]\nchap = 1\n").is_err());
    }

    #[test]
    fn limits_parse_validate_and_split_per_connection() {
        let c: Config = toml::from_str("").unwrap();
        assert_eq!(c.limits.max_connections, 512);
        assert_eq!(c.limits.per_connection_bytes(), 16 << 20);
        c.validate().unwrap();
        let small: Config = toml::from_str(
            "[limits]\nmax_connections = 8\nmax_in_flight_bytes = \"8MiB\"\n\
             payload_timeout_ms = 500\n",
        )
        .unwrap();
        small.validate().unwrap();
        assert_eq!(small.limits.per_connection_bytes(), 2 << 20);
        let l = small.limits.to_limits();
        assert_eq!((l.max_connections, l.max_in_flight_bytes), (8, 8 << 20));
        assert_eq!(l.payload_timeout.as_millis(), 500);
        for bad in [
            "max_connections = 0",
            "max_in_flight_bytes = \"64KiB\"",
            "max_in_flight_bytes = \"8GiB\"",
            "payload_timeout_ms = 0",
        ] {
            let c: Config = toml::from_str(&format!("[limits]\n{bad}\n")).unwrap();
            assert!(c.validate().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(toml::from_str::<Config>("[log]\nbogus = 1\n").is_err());
        let c: Config = toml::from_str("[log]\nt_wait_us = 7\n").unwrap();
        assert_eq!(c.log.t_wait_us, 7);
    }
}
