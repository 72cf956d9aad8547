//! A running node: data directory, log, store and volumes, opened and recovered together.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mariner_disk::{Disk, FailAfter, FileDisk, OpenOptions, VolatileDisk};
use mariner_log::{Entry, LinearModel, Log, LogConfig, RecordKind};
use mariner_nbd::{Export, ExportInfo, Exports};
use mariner_store::{Progress, Store, StoreConfig};
use serde::Serialize;

use crate::config::Config;
use crate::datadir::{DataDir, NodeState, VolumeMeta, FORMAT_VERSION};
use crate::initialise::{initialise, FirstStart};
use crate::volume::Volume;
use crate::NodeError;
use crate::{image, logdevices};

/// What recovery did at start-up.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryReport {
    pub records_replayed: usize,
    pub voided: usize,
    pub segments_scanned: u64,
    pub bytes_scanned: u64,
    pub torn_tails: u64,
    pub elapsed_ms: f64,
}

/// A volume as `volume list` / `volume info` show it.
#[derive(Debug, Clone, Serialize)]
pub struct VolumeInfo {
    pub id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub block_size: u32,
    pub allocated_bytes: u64,
    pub connections: usize,
    /// Why writes are refused, if they are: an I/O failure, or the operator's flag.
    pub read_only: Option<String>,
    /// The operator's read-only flag (`mariner volume set NAME --read-only true`).
    pub read_only_set: bool,
    pub created_ns: u64,
    /// The instants that can be read, against the configured window; `None` without history.
    pub history: Option<crate::history::HistoryInfo>,
}

pub struct Node {
    pub(crate) cfg: Config,
    pub(crate) dir: DataDir,
    state: Mutex<NodeState>,
    pub(crate) log: Log,
    pub(crate) store: Arc<Store>,
    /// `None` with `[history] enabled = false`.
    pub(crate) history: Option<mariner_history::History>,
    volumes: RwLock<BTreeMap<String, Arc<Volume>>>,
    /// Snapshot exports by export name (`<volume>@<snapshot>`).
    pub(crate) snapshots: RwLock<BTreeMap<String, Arc<crate::snapshot::Snapshot>>>,
    /// The addresses the front ends listen on (NBD, iSCSI), once bound: what export URLs name.
    endpoints: RwLock<(Vec<std::net::SocketAddr>, Vec<std::net::SocketAddr>)>,
    /// Rollbacks running, and each volume's last.
    pub(crate) rollbacks: crate::history::Rollbacks,
    connections: Mutex<HashMap<String, usize>>,
    pub recovery: RecoveryReport,
    /// Serialises volume create/delete/grow.
    admin: Mutex<()>,
    /// Connections and payload bytes in flight, node-wide (all front ends).
    limits: mariner_limits::Limits,
}

pub(crate) fn now_ns() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Volume names: 1–64 of `[A-Za-z0-9._-]`, not starting with a dot or dash.
pub fn valid_volume_name(name: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    (1..=64).contains(&name.len())
        && name.chars().all(ok_char)
        && !name.starts_with('.')
        && !name.starts_with('-')
}

impl Node {
    /// Opens (or on first use creates) the node described by `cfg`, running recovery. A first
    /// start that fails leaves nothing behind (see `initialise.rs`).
    pub fn open(cfg: Config) -> Result<Arc<Self>, NodeError> {
        cfg.validate()?;
        let mut first = FirstStart::before(&cfg.data);
        let node = Self::open_or_create(cfg, &mut first);
        if node.is_err() {
            first.undo();
        }
        node
    }

    fn open_or_create(cfg: Config, first: &mut FirstStart) -> Result<Arc<Self>, NodeError> {
        let dir = DataDir::open(&cfg.data)?;
        let (state, fresh) = match dir.load_state()? {
            Some(s) => (s, false),
            None => (initialise(&dir, &cfg, first)?, true),
        };
        let paths = logdevices::resolve(dir.root(), &state)?;
        let devices = open_log_devices(&dir, &cfg, &paths)?;
        let progress = Progress::load(&dir.path("store.progress"))
            .map_err(|e| NodeError::Corrupt(format!("store.progress: {e}")))?;
        let history = crate::history::open(&dir, &cfg, progress.applied_seq, progress.applied_ts)?;
        let store = Store::new(store_config(&dir, &cfg), progress);
        let metas = dir.load_volumes()?;
        let mut images = Vec::with_capacity(metas.len());
        for m in &metas {
            let image = open_image(&dir, &cfg, m)?;
            store.add_volume(m.id, image.clone(), m.size_bytes);
            images.push((m.clone(), image));
        }
        let pins = crate::snapshot::pin_recorded(&dir, history.as_ref(), &metas)?;
        let mut sinks: Vec<Arc<dyn mariner_log::DurableSink>> = vec![store.clone()];
        let mut holders = vec![store.holder_spec()];
        if let Some(h) = &history {
            sinks.push(h.sink());
            holders.push(h.holder_spec());
        }
        let sink = Arc::new(crate::history::Tee(sinks));
        let (log, rec) = Log::open(devices, log_config(&cfg), state.log_id()?, &holders, sink)?;
        let started = upgrade(&dir, state, &paths).and_then(|state| {
            if let Some(h) = &history {
                crate::history::start(h, &cfg, &log, &rec, &images)?;
            }
            Ok(state)
        });
        let state = match started {
            Ok(s) => s,
            Err(e) => {
                if let Some(h) = &history {
                    let _ = crate::history::off_runtime(|| h.shutdown(false));
                }
                log.shutdown();
                return Err(e);
            }
        };
        store.set_paused(cfg.test.pause_apply);
        if let Err(e) = store.start(log.clone(), &rec) {
            if let Some(h) = &history {
                let _ = crate::history::off_runtime(|| h.shutdown(false));
            }
            log.shutdown();
            return Err(NodeError::Io(e.to_string()));
        }
        let recovery = RecoveryReport {
            records_replayed: rec.records.len(),
            voided: rec.voided.len(),
            segments_scanned: rec.segments_scanned,
            bytes_scanned: rec.bytes_scanned,
            torn_tails: rec.torn_tails,
            elapsed_ms: rec.elapsed.as_secs_f64() * 1000.0,
        };
        tracing::info!(
            records_replayed = recovery.records_replayed,
            voided = recovery.voided,
            torn_tails = recovery.torn_tails,
            bytes_scanned = recovery.bytes_scanned,
            elapsed_ms = recovery.elapsed_ms,
            "recovery complete"
        );
        let mut volumes = BTreeMap::new();
        for m in metas {
            let reservations = crate::reservations::open(&dir.volume_dir(&m.name))?;
            let vol = Volume::new(m.clone(), log.clone(), store.clone(), reservations);
            volumes.insert(m.name, Arc::new(vol));
        }
        let limits = mariner_limits::Limits::new(cfg.limits.to_limits());
        let node = Arc::new(Self {
            limits,
            cfg,
            dir,
            state: Mutex::new(state),
            log,
            store,
            history,
            volumes: RwLock::new(volumes),
            snapshots: RwLock::new(BTreeMap::new()),
            endpoints: RwLock::default(),
            rollbacks: crate::history::Rollbacks::default(),
            connections: Mutex::new(HashMap::new()),
            recovery,
            admin: Mutex::new(()),
        });
        node.restore_snapshots(pins)?;
        node.resume_rollbacks();
        if fresh && !node.cfg.volume.default_name.is_empty() {
            // create_volume warns about overcommit itself.
            let name = node.cfg.volume.default_name.clone();
            if let Err(e) = node.create_volume(&name, node.cfg.volume.default_size.as_u64(), None) {
                node.shutdown();
                return Err(e);
            }
        } else {
            node.warn_overcommit();
        }
        Ok(node)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The node-wide caps every front end shares.
    pub fn limits(&self) -> &mariner_limits::Limits {
        &self.limits
    }

    /// Records the addresses the front ends listen on (export URLs name them).
    pub fn set_endpoints(&self, nbd: Vec<std::net::SocketAddr>, iscsi: Vec<std::net::SocketAddr>) {
        if let Ok(mut e) = self.endpoints.write() {
            *e = (nbd, iscsi);
        }
    }

    /// The NBD and iSCSI listen addresses, once bound.
    pub fn endpoints(&self) -> (Vec<std::net::SocketAddr>, Vec<std::net::SocketAddr>) {
        self.endpoints.read().map(|e| e.clone()).unwrap_or_default()
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.root()
    }

    pub fn log(&self) -> &Log {
        &self.log
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// History, when enabled.
    pub fn history(&self) -> Option<&mariner_history::History> {
        self.history.as_ref()
    }

    pub fn volume(&self, name: &str) -> Option<Arc<Volume>> {
        self.volumes.read().ok()?.get(name).cloned()
    }

    /// The block size of the volume numbered `id`, if there is one.
    pub(crate) fn block_size_of(&self, id: u32) -> Option<u32> {
        self.volumes
            .read()
            .ok()?
            .values()
            .map(|v| v.meta())
            .find(|m| m.id == id)
            .map(|m| m.block_size)
    }

    pub fn volume_names(&self) -> Vec<String> {
        self.volumes
            .read()
            .map(|v| v.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub fn volume_info(&self, name: &str) -> Option<VolumeInfo> {
        let v = self.volume(name)?;
        let m = v.meta();
        let allocated = self
            .store
            .allocation(m.id, 0, m.size_bytes)
            .map(|ex| {
                ex.iter()
                    .filter(|(_, a)| *a == mariner_store::Allocation::Data)
                    .map(|(l, _)| *l)
                    .sum()
            })
            .unwrap_or(0);
        Some(VolumeInfo {
            id: m.id,
            name: m.name.clone(),
            size_bytes: m.size_bytes,
            block_size: m.block_size,
            allocated_bytes: allocated,
            connections: self.connections(name),
            read_only: v.read_only_reason(),
            read_only_set: m.read_only,
            created_ns: m.created_ns,
            history: self.history_info(m.id, &m.name),
        })
    }

    pub fn connections(&self, name: &str) -> usize {
        self.connections
            .lock()
            .map(|c| c.get(name).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Connections to `name` once those closing have gone: up to 2 s for the count to reach
    /// 0. A client that has just exited (`qemu-io …; mariner rollback …`) may still be counted
    /// until the server reads its connection's end; refusing then would make the command
    /// depend on that race. A client that stays connected costs the caller the 2 s.
    pub fn connections_settled(&self, name: &str) -> usize {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let n = self.connections(name);
            if n == 0 || std::time::Instant::now() >= until {
                return n;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Creates a thin volume.
    /// `block_size` is the volume's logical block size (512, 1024, 2048 or 4096); the
    /// configured `volume.block_size` when `None`.
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_size: Option<u32>,
    ) -> Result<VolumeInfo, NodeError> {
        let _g = self.admin_lock()?;
        if !valid_volume_name(name) {
            return Err(NodeError::BadRequest(format!(
                "invalid volume name {name:?}: 1-64 of A-Z a-z 0-9 . _ -, not starting with . or -"
            )));
        }
        let block_size = block_size.unwrap_or(self.cfg.volume.block_size);
        if !block_size.is_power_of_two() || !(512..=4096).contains(&block_size) {
            return Err(NodeError::BadRequest(format!(
                "block size {block_size}: must be 512, 1024, 2048 or 4096"
            )));
        }
        let bs = u64::from(block_size);
        if size_bytes == 0 || !size_bytes.is_multiple_of(bs) || size_bytes > 1 << 50 {
            return Err(NodeError::BadRequest(format!(
                "volume size must be a positive multiple of the block size {bs} (at most 1 PiB)"
            )));
        }
        if self.volume(name).is_some() {
            return Err(NodeError::Exists(name.to_string()));
        }
        // The image first: a size the file system cannot hold is refused before a volume id
        // is used up, and any failure leaves neither files nor a used id behind.
        let vdir = self.dir.volume_dir(name);
        image::create(&vdir, size_bytes, bs)?;
        let made = self.allocate_volume_id().and_then(|id| {
            let meta = VolumeMeta {
                id,
                name: name.to_string(),
                size_bytes,
                block_size,
                created_ns: now_ns(),
                read_only: false,
            };
            // The record that the volume exists precedes any of its writes in the log.
            let created = Entry::extent(RecordKind::VolumeCreated, id, size_bytes, block_size);
            if let Some(h) = &self.history {
                h.set_window(id, self.cfg.history.window_of(name))
                    .map_err(|e| NodeError::Io(format!("history: {e}")))?;
            }
            let saved = open_image(&self.dir, &self.cfg, &meta)
                .and_then(|image| self.dir.save_volume(&meta).map(|()| image))
                .and_then(|image| self.log_lifecycle(created).map(|()| image));
            if saved.is_err() {
                self.release_volume_id(id);
            }
            saved.map(|image| (meta, image))
        });
        let (meta, image) = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&vdir);
                return Err(e);
            }
        };
        let id = meta.id;
        self.store.add_volume(id, image, size_bytes);
        let reservations = crate::reservations::open(&self.dir.volume_dir(name))?;
        let vol = Volume::new(meta, self.log.clone(), self.store.clone(), reservations);
        let vol = Arc::new(vol);
        if let Ok(mut v) = self.volumes.write() {
            v.insert(name.to_string(), vol);
        }
        tracing::info!(volume = name, id, size_bytes, "volume created");
        self.warn_overcommit();
        self.volume_info(name)
            .ok_or_else(|| NodeError::NotFound(name.to_string()))
    }

    /// Takes the next volume id, durably.
    fn allocate_volume_id(&self) -> Result<u32, NodeError> {
        let mut st = self
            .state
            .lock()
            .map_err(|_| NodeError::Io("lock poisoned".into()))?;
        let id = st.next_volume_id;
        st.next_volume_id += 1;
        if let Err(e) = self.dir.save_state(&st) {
            st.next_volume_id = id;
            return Err(e);
        }
        Ok(id)
    }

    /// Gives back the id just allocated for a volume that was never made: no log record can
    /// name it. If that cannot be saved the id stays used, which is safe.
    fn release_volume_id(&self, id: u32) {
        if let Ok(mut st) = self.state.lock() {
            if st.next_volume_id == id + 1 {
                st.next_volume_id = id;
                if self.dir.save_state(&st).is_err() {
                    st.next_volume_id = id + 1;
                }
            }
        }
    }

    /// Deletes a volume; refused while clients are connected to it.
    pub fn delete_volume(&self, name: &str) -> Result<(), NodeError> {
        let _g = self.admin_lock()?;
        let vol = self.existing(name)?;
        // Holding the connection table while removing makes a racing connect that was already
        // counted block the delete; one that opened the volume but was not yet counted finds
        // it marked deleted below.
        let conns = self
            .connections
            .lock()
            .map_err(|_| NodeError::Io("lock poisoned".into()))?;
        let n = conns.get(name).copied().unwrap_or(0);
        if n > 0 {
            return Err(NodeError::Busy(format!(
                "volume {name} has {n} connected client(s)"
            )));
        }
        if self.has_snapshots(name) {
            return Err(NodeError::Busy(format!(
                "volume {name} has snapshot exports (mariner snapshot list); remove them first"
            )));
        }
        let id = vol.meta().id;
        self.log_lifecycle(Entry::extent(RecordKind::VolumeDeleted, id, 0, 0))?;
        if let Ok(mut v) = self.volumes.write() {
            v.remove(name);
        }
        drop(conns);
        // A client that looked the volume up just before its connection was counted gets
        // errors, never acknowledgements for writes that would be dropped.
        vol.mark_deleted();
        self.store.remove_volume(vol.meta().id);
        self.dir.delete_volume(name)?;
        tracing::info!(volume = name, "volume deleted");
        Ok(())
    }

    /// Appends a volume lifecycle record (created, resized, deleted) and waits until it is
    /// durable. Called on administration paths: a blocking-pool thread, or start-up, which
    /// may run on a runtime thread where blocking on the log's future is not allowed — so the
    /// wait runs on a thread of its own (a few per volume's lifetime).
    fn log_lifecycle(&self, entry: Entry) -> Result<(), NodeError> {
        let durable = self.log.append(entry)?;
        let waited = std::thread::scope(|s| s.spawn(|| durable.blocking_recv()).join());
        match waited {
            Ok(Ok(Ok(_))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e.into()),
            Ok(Err(_)) => Err(mariner_log::LogError::Shutdown.into()),
            Err(_) => Err(NodeError::Io("waiting for the log panicked".into())),
        }
    }

    /// The lock that serializes volume administration.
    pub(crate) fn admin_lock(&self) -> Result<std::sync::MutexGuard<'_, ()>, NodeError> {
        self.admin
            .lock()
            .map_err(|_| NodeError::Io("lock poisoned".into()))
    }

    /// The volume called `name`, or NotFound.
    fn existing(&self, name: &str) -> Result<Arc<Volume>, NodeError> {
        self.volume(name)
            .ok_or_else(|| NodeError::NotFound(name.to_string()))
    }

    /// Grows a volume (shrinking is refused: it would destroy data silently).
    pub fn grow_volume(&self, name: &str, size_bytes: u64) -> Result<VolumeInfo, NodeError> {
        let _g = self.admin_lock()?;
        let vol = self.existing(name)?;
        let mut m = vol.meta();
        let bs = u64::from(m.block_size);
        if size_bytes < m.size_bytes || !size_bytes.is_multiple_of(bs) {
            return Err(NodeError::BadRequest(format!(
                "new size must be at least the current {} bytes and a multiple of {bs}",
                m.size_bytes
            )));
        }
        if size_bytes > 1 << 50 {
            return Err(NodeError::BadRequest(
                "volume size must be at most 1 PiB".into(),
            ));
        }
        // A failed set_len changes nothing, so the image's own answer is the check.
        self.store
            .grow_volume(m.id, size_bytes)
            .map_err(|e| match e {
                mariner_store::StoreError::Io(io)
                    if io.kind() == std::io::ErrorKind::FileTooLarge =>
                {
                    image::too_large(&self.dir.volume_dir(name), size_bytes, bs)
                }
                other => NodeError::Io(other.to_string()),
            })?;
        m.size_bytes = size_bytes;
        self.dir.save_volume(&m)?;
        vol.set_size(size_bytes);
        self.log_lifecycle(Entry::extent(
            RecordKind::VolumeResized,
            m.id,
            size_bytes,
            0,
        ))?;
        tracing::info!(volume = name, size_bytes, "volume grown");
        self.warn_overcommit();
        self.volume_info(name)
            .ok_or_else(|| NodeError::NotFound(name.to_string()))
    }

    /// Sets or clears a volume's read-only flag, durably; it applies to every client at once
    /// (NBD clients connected before keep their transmission flags but get EPERM).
    pub fn set_read_only(&self, name: &str, read_only: bool) -> Result<VolumeInfo, NodeError> {
        let _g = self.admin_lock()?;
        let vol = self.existing(name)?;
        let mut m = vol.meta();
        if m.read_only != read_only {
            m.read_only = read_only;
            self.dir.save_volume(&m)?;
            vol.set_read_only(read_only);
            tracing::info!(volume = name, read_only, "volume read-only flag changed");
        }
        self.volume_info(name)
            .ok_or_else(|| NodeError::NotFound(name.to_string()))
    }

    /// Warns when thin volumes could outgrow the space left for them.
    fn warn_overcommit(&self) {
        let Ok(vfs) = rustix::fs::statvfs(self.dir.root()) else {
            return;
        };
        let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
        let mut unallocated = 0u64;
        for name in self.volume_names() {
            if let Some(i) = self.volume_info(&name) {
                unallocated += i.size_bytes.saturating_sub(i.allocated_bytes);
            }
        }
        if unallocated > free {
            tracing::warn!(
                unallocated_bytes = unallocated,
                free_bytes = free,
                "thin volumes are overcommitted: filling them would exhaust the data directory"
            );
        }
    }

    /// Stops history (indexing what is left), the store (final sync) and the log.
    pub fn shutdown(&self) {
        if let Some(h) = &self.history {
            if let Err(e) = crate::history::off_runtime(|| h.shutdown(true)) {
                tracing::warn!(error = %e, "history: the last flush failed; the next start indexes again");
            }
        }
        self.store.shutdown();
        self.log.shutdown();
    }
}

impl Exports for Node {
    fn list(&self) -> Vec<ExportInfo> {
        let vols: Vec<_> = self
            .volumes
            .read()
            .map(|v| v.values().cloned().collect())
            .unwrap_or_default();
        let snaps: Vec<_> = self
            .snapshots
            .read()
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        vols.iter()
            .map(|v| crate::nbd::export_info(&**v))
            .chain(
                snaps
                    .into_iter()
                    .map(|s| crate::nbd::export_info(&crate::snapshot::ViewRef(s.view.clone()))),
            )
            .collect()
    }

    fn default_name(&self) -> Option<String> {
        let d = &self.cfg.volume.default_name;
        if self.volume(d).is_some() {
            return Some(d.clone());
        }
        self.volume_names().into_iter().next()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        if self.rolling_back(name) {
            tracing::warn!(
                volume = name,
                "NBD connection refused: the volume is rolling back"
            );
            return None;
        }
        if let Some(v) = self.volume(name) {
            return Some(Arc::new(crate::nbd::NbdExport(v)) as Arc<dyn Export>);
        }
        let s = self.snapshot(name)?;
        let view = Arc::new(crate::snapshot::ViewRef(s.view.clone()));
        Some(Arc::new(crate::nbd::NbdExport(view)) as Arc<dyn Export>)
    }

    fn connection_opened(&self, name: &str) {
        if let Ok(mut c) = self.connections.lock() {
            *c.entry(name.to_string()).or_insert(0) += 1;
        }
    }

    fn connection_closed(&self, name: &str) {
        if let Ok(mut c) = self.connections.lock() {
            if let Some(n) = c.get_mut(name) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

/// Rewrites a format-1 `mariner.json` as format 2, its log devices recorded as found at
/// `paths` (the log has just checked that they are its devices).
fn upgrade(dir: &DataDir, mut state: NodeState, paths: &[PathBuf]) -> Result<NodeState, NodeError> {
    if state.format_version >= FORMAT_VERSION {
        return Ok(state);
    }
    let from = state.format_version;
    state.log_devices = paths
        .iter()
        .map(|p| logdevices::recorded(dir.root(), p))
        .collect::<Result<_, _>>()?;
    state.format_version = FORMAT_VERSION;
    dir.save_state(&state)?;
    tracing::info!(
        from,
        to = FORMAT_VERSION,
        log_devices = ?state.log_devices,
        "mariner.json rewritten: paths inside the data directory are now relative to it"
    );
    Ok(state)
}

/// Opens the log devices at `paths` (the recorded ones, resolved), refusing a configured list
/// that names other devices.
fn open_log_devices(
    dir: &DataDir,
    cfg: &Config,
    paths: &[PathBuf],
) -> Result<Vec<Arc<dyn Disk>>, NodeError> {
    let same = cfg.log.devices.len() == paths.len()
        && cfg
            .log
            .devices
            .iter()
            .zip(paths)
            .all(|(a, b)| logdevices::same_device(a, b));
    if !cfg.log.devices.is_empty() && !same {
        return Err(NodeError::Config(format!(
            "log devices {:?} differ from {:?}, which {} was created with",
            cfg.log.devices,
            paths,
            dir.root().display()
        )));
    }
    paths
        .iter()
        .map(|p| {
            if !p.exists() {
                return Err(NodeError::Config(format!(
                    "log device {} is missing",
                    p.display()
                )));
            }
            let disk = open_disk(p, cfg.log.direct_io, cfg.test.volatile)?;
            Ok(match cfg.test.fail_log_after {
                Some(n) => Arc::new(FailAfter::new(disk, n)) as Arc<dyn Disk>,
                None => disk,
            })
        })
        .collect()
}

pub(crate) fn open_disk(
    path: &Path,
    direct: bool,
    volatile: bool,
) -> Result<Arc<dyn Disk>, NodeError> {
    // Volatile and direct: the O_DSYNC durability path of the direct log, with writes through
    // the page cache (VolatileDisk turns O_DIRECT off but keeps its alignment rules), so a
    // kill -9 keeps exactly the writes that returned.
    let opts = OpenOptions::new().direct(direct).dsync(direct);
    let f = FileDisk::open(path, &opts)
        .map_err(|e| NodeError::Io(format!("{}: {e}", path.display())))?;
    if volatile {
        let v = if direct {
            VolatileDisk::write_through(f)
        } else {
            VolatileDisk::new(f)
        };
        return Ok(Arc::new(v.map_err(|e| NodeError::Io(e.to_string()))?));
    }
    Ok(Arc::new(f))
}

fn open_image(dir: &DataDir, cfg: &Config, m: &VolumeMeta) -> Result<Arc<dyn Disk>, NodeError> {
    let path = dir.volume_dir(&m.name).join("image");
    let disk = open_disk(&path, false, cfg.test.volatile)?;
    let len = disk.len().map_err(|e| NodeError::Io(e.to_string()))?;
    if len < m.size_bytes {
        // A grow that crashed between the image and volume.json: finish it.
        disk.set_len(m.size_bytes)
            .and_then(|()| disk.sync())
            .map_err(|e| NodeError::Io(e.to_string()))?;
    }
    Ok(disk)
}

pub(crate) fn log_config(cfg: &Config) -> LogConfig {
    let l = &cfg.log;
    LogConfig {
        // Only used when formatting; an existing log keeps the geometry in its superblocks.
        segment_bytes: l.segment_size.map_or(1 << 20, |s| s.as_u64()),
        align_bytes: if l.direct_io { 4096 } else { 512 },
        t_wait_ns: l.t_wait_us * 1000,
        t_switch: if l.t_switch == 0.0 {
            f64::INFINITY
        } else {
            l.t_switch
        },
        dispatch_on_idle: l.dispatch_on_idle,
        sync_each_write: !l.direct_io,
        device_depth: l.device_depth,
        model: LinearModel::default(),
    }
}

fn store_config(dir: &DataDir, cfg: &Config) -> StoreConfig {
    StoreConfig {
        progress_path: dir.path("store.progress"),
        sync_interval_ms: cfg.store.sync_interval_ms,
        sync_bytes: cfg.store.sync_size.as_u64(),
        payload_budget_bytes: cfg.payload_budget().as_u64(),
        apply_idle_ms: cfg.store.apply_idle_ms,
        apply_max_delay_ms: cfg.store.apply_max_delay_ms,
        apply_max_held_bytes: cfg.store.apply_max_held.as_u64(),
    }
}
