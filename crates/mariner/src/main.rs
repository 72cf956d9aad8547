//! The `mariner` command. Thin: argument parsing and output; the work is in the crates.

mod client;
mod history_cmd;
mod logtool;
mod sim_cmd;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use bytesize::ByteSize;
use clap::{Args, Parser, Subcommand};
use mariner_node::{Config, Node};

#[derive(Parser)]
#[command(
    name = "mariner",
    version,
    about = "Mariner: block storage with continuous data protection",
    long_about = "Mariner serves virtual disks (volumes) over NBD and iSCSI. Every write is durable in a \
                  sequential log (the Trail log) before it is acknowledged.\n\n\
                  Start with `mariner serve`: it creates ./mariner-data with one 1 GiB volume \
                  `vol0` and serves it on nbd://127.0.0.1:10809 and \
                  iscsi://127.0.0.1:3260/iqn.2026-11.dev.mariner:vol0/0."
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (creates the data directory and a default volume on first use).
    Serve(ServeArgs),
    /// Create, list, inspect, grow, change or delete volumes on a running server.
    #[command(subcommand)]
    Volume(VolumeCmd),
    /// Export a volume as of an instant (NBD and iSCSI), list or remove such exports.
    #[command(subcommand)]
    Snapshot(history_cmd::SnapshotCmd),
    /// A volume's writes over time (a histogram), and bookmarks of instants.
    History(history_cmd::HistoryArgs),
    /// The extents of a volume that changed between two instants.
    Diff(history_cmd::DiffArgs),
    /// Roll a volume back to an instant, by writing what changed since as new writes (so
    /// the rollback can itself be undone).
    Rollback(history_cmd::RollbackArgs),
    /// What a running server is doing: log, store, and history's window against the
    /// configured one, per volume.
    Status {
        #[command(flatten)]
        target: Target,
    },
    /// Inspect log devices offline.
    #[command(subcommand)]
    Log(LogCmd),
    /// Run a disk/array simulation experiment (Trail, Mariner, EW-Array papers); see docs/simulation.md.
    Sim(sim_cmd::SimArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file; flags override it. See docs/CONFIG.md.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Data directory [default: ./mariner-data].
    #[arg(long, env = "MARINER_DATA")]
    data: Option<PathBuf>,
    /// NBD listen address, repeatable; port 0 picks a free port (see <data>/ports.json)
    /// [default: 127.0.0.1:10809].
    #[arg(long)]
    listen: Vec<SocketAddr>,
    /// iSCSI listen address, repeatable; port 0 picks a free port (see <data>/ports.json).
    /// Each volume is target iqn.2026-11.dev.mariner:<volume>, LUN 0 [default: 127.0.0.1:3260].
    #[arg(long = "iscsi-listen")]
    iscsi_listen: Vec<SocketAddr>,
    /// Log device (file or block device), repeatable; order matters [default: <data>/log/log0].
    #[arg(long = "log-dev")]
    log_dev: Vec<PathBuf>,
    /// Size of log files Mariner creates [default: 256MiB].
    #[arg(long, value_parser = parse_size, allow_hyphen_values = true)]
    log_size: Option<ByteSize>,
    /// Batching wait T_wait in microseconds [default: 50].
    #[arg(long)]
    t_wait_us: Option<u64>,
    /// Open log devices with O_DIRECT|O_DSYNC instead of write + fdatasync.
    #[arg(long)]
    direct_io: bool,
    /// Size of the default volume created in a new data directory [default: 1GiB].
    #[arg(long, value_parser = parse_size, allow_hyphen_values = true)]
    default_volume_size: Option<ByteSize>,
    /// Keep no history (continuous data protection off; see [history] in docs/CONFIG.md).
    #[arg(long)]
    no_history: bool,
    /// The protection window: every write this recent stays readable, e.g. 7d, 12h, 30m
    /// [default: 7d].
    #[arg(long, value_parser = humantime::parse_duration)]
    history_window: Option<std::time::Duration>,
    /// Test only: hold unsynced writes in memory so kill -9 loses them.
    #[arg(long, hide = true)]
    test_volatile: bool,
    /// Test only: do not apply the log to the volume images.
    #[arg(long, hide = true)]
    test_pause_apply: bool,
    /// Test only: log devices fail with EIO after this many writes and syncs.
    #[arg(long, hide = true)]
    test_fail_log_after: Option<u64>,
}

#[derive(Args, Clone)]
pub(crate) struct Target {
    /// Data directory of the running server [default: ./mariner-data].
    #[arg(long, env = "MARINER_DATA", default_value = "mariner-data")]
    pub(crate) data: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Subcommand)]
enum VolumeCmd {
    /// Create a thin volume.
    Create {
        name: String,
        /// Size, e.g. 10GiB.
        #[arg(long, value_parser = parse_size, allow_hyphen_values = true)]
        size: ByteSize,
        /// Logical block size in bytes: 512, 1024, 2048 or 4096 [default: the server's
        /// volume.block_size, 512]. Volumes with blocks under 4096 bytes report 4096-byte
        /// physical blocks over iSCSI.
        #[arg(long)]
        block_size: Option<u32>,
        #[command(flatten)]
        target: Target,
    },
    /// List volumes.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Show one volume.
    Info {
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Delete a volume and its data (refused while clients are connected).
    Delete {
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Grow a volume.
    Grow {
        name: String,
        /// New size, e.g. 20GiB.
        #[arg(long, value_parser = parse_size, allow_hyphen_values = true)]
        size: ByteSize,
        #[command(flatten)]
        target: Target,
    },
    /// Change a volume's settings.
    Set {
        name: String,
        /// Refuse every write (NBD: read-only export, EPERM; iSCSI: write-protected, DATA
        /// PROTECT) until set back to false. Kept across restarts.
        #[arg(long, value_name = "true|false")]
        read_only: Option<bool>,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand)]
enum LogCmd {
    /// Print every valid record header of the log devices.
    Dump(logtool::LogArgs),
    /// Check every log device: superblocks, records, checksums, sequence numbers.
    Verify(logtool::LogArgs),
    /// Give a stopped server's log more room, so history keeps a longer window: adds log
    /// files the size of the first (log/log1, log/log2, ...) until the log holds SIZE in all.
    /// Every record is kept; run it again if it was cut short. A configuration that lists
    /// [log] devices must list the new files too.
    Grow(LogGrowArgs),
}

#[derive(clap::Args)]
struct LogGrowArgs {
    /// Data directory whose log to grow (no server may run on it).
    #[arg(long, env = "MARINER_DATA", default_value = "mariner-data")]
    data: std::path::PathBuf,
    /// What the log should hold in all, rounded up to whole files of the first's size.
    #[arg(long, value_parser = parse_size, allow_hyphen_values = true)]
    size: ByteSize,
}

/// glibc raises its mmap threshold after the first large buffers are freed and then keeps
/// freed write payloads (up to 4 MiB each) in per-thread pools: the server grew to 400 MB under
/// four busy connections and never shrank. A fixed threshold sends every buffer of 128 KiB or
/// more straight back to the kernel when freed, so memory follows the data in flight.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn bound_allocator_retention() {
    // SAFETY: mallopt only adjusts glibc allocator tunables; it is called once, before any
    // other thread exists, with a valid parameter and value.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn bound_allocator_retention() {}

fn main() -> ExitCode {
    bound_allocator_retention();
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let result = match cli.command {
        Command::Serve(a) => serve(a),
        Command::Volume(c) => volume(c),
        Command::Status { target } => status(&target),
        Command::Snapshot(c) => history_cmd::snapshot(c),
        Command::History(a) => history_cmd::history(a),
        Command::Diff(a) => history_cmd::diff(a),
        Command::Rollback(a) => history_cmd::rollback(a),
        Command::Log(LogCmd::Dump(a)) => logtool::dump(&a),
        Command::Log(LogCmd::Verify(a)) => logtool::verify(&a),
        Command::Log(LogCmd::Grow(a)) => mariner_node::log_grow::grow_log(&a.data, a.size.as_u64())
            .map(|g| {
                println!("{g}");
                ExitCode::SUCCESS
            })
            .map_err(|e| e.to_string()),
        Command::Sim(a) => sim_cmd::run(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mariner: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A size argument: `10GiB`, `512MiB`, `4096`. Negative sizes get a message of their own
/// rather than clap's "unexpected argument" (a leading `-` read as a flag).
fn parse_size(s: &str) -> Result<ByteSize, String> {
    if s.trim_start().starts_with('-') {
        return Err(format!("{s:?}: a size cannot be negative"));
    }
    s.parse::<ByteSize>()
        .map_err(|_| format!("{s:?} is not a size; write e.g. 4096, 512MiB, 20GiB or 1TiB"))
}

fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: a log file or journal gets plain text.
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().init(),
    }
}

fn serve_config(a: &ServeArgs) -> Result<Config, String> {
    let mut cfg = match &a.config {
        Some(p) => Config::from_file(p).map_err(|e| e.to_string())?,
        None => Config::default(),
    };
    if let Some(d) = &a.data {
        cfg.data = d.clone();
    }
    if !a.listen.is_empty() {
        cfg.nbd.listen = a.listen.clone();
    }
    if !a.iscsi_listen.is_empty() {
        cfg.iscsi.listen = a.iscsi_listen.clone();
    }
    if !a.log_dev.is_empty() {
        cfg.log.devices = a.log_dev.clone();
    }
    if let Some(s) = a.log_size {
        cfg.log.file_size = s;
    }
    if let Some(t) = a.t_wait_us {
        cfg.log.t_wait_us = t;
    }
    if let Some(s) = a.default_volume_size {
        cfg.volume.default_size = s;
    }
    cfg.log.direct_io |= a.direct_io;
    if a.no_history {
        cfg.history.enabled = false;
    }
    if let Some(w) = a.history_window {
        cfg.history.window = w;
        cfg.history.min_window = cfg.history.min_window.min(w);
    }
    cfg.test.volatile |= a.test_volatile;
    cfg.test.pause_apply |= a.test_pause_apply;
    if a.test_fail_log_after.is_some() {
        cfg.test.fail_log_after = a.test_fail_log_after;
    }
    // Before anything uses it: the runtime is built from `worker_threads`.
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(cfg)
}

fn serve(a: ServeArgs) -> Result<ExitCode, String> {
    let cfg = serve_config(&a)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.worker_threads())
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    // Ports first: one in use is reported before the data directory is created or opened.
    let listeners = rt
        .block_on(mariner_node::serve::bind(&cfg))
        .map_err(|e| e.to_string())?;
    let node = Node::open(cfg).map_err(|e| e.to_string())?;
    let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    rt.block_on(mariner_node::serve::run(node, listeners, stop_rx))
        .map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}

/// Names are checked here as on the server, so a name can never be read as another path.
pub(crate) fn checked(name: &str) -> Result<&str, String> {
    if mariner_node::valid_volume_name(name) {
        Ok(name)
    } else {
        Err(format!(
            "invalid volume name {name:?}: 1-64 of A-Z a-z 0-9 . _ -, not starting with . or -"
        ))
    }
}

fn status(target: &Target) -> Result<ExitCode, String> {
    let v = client::request(&target.data, "GET", "/v1/status", None)?;
    if target.json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        print!("{}", client::status_text(&v));
    }
    Ok(ExitCode::SUCCESS)
}

fn volume(c: VolumeCmd) -> Result<ExitCode, String> {
    let (target, value) = match c {
        VolumeCmd::Create {
            name,
            size,
            block_size,
            target,
        } => {
            let mut body = serde_json::json!({ "name": name, "size_bytes": size.as_u64() });
            if let Some(bs) = block_size {
                body["block_size"] = serde_json::json!(bs);
            }
            let v = client::request(&target.data, "POST", "/v1/volumes", Some(&body))?;
            (target, v)
        }
        VolumeCmd::List { target } => {
            let v = client::request(&target.data, "GET", "/v1/volumes", None)?;
            (target, v)
        }
        VolumeCmd::Info { name, target } => {
            let path = format!("/v1/volumes/{}", checked(&name)?);
            let v = client::request(&target.data, "GET", &path, None)?;
            (target, v)
        }
        VolumeCmd::Delete { name, target } => {
            let path = format!("/v1/volumes/{}", checked(&name)?);
            client::request(&target.data, "DELETE", &path, None)?;
            println!("deleted {name}");
            return Ok(ExitCode::SUCCESS);
        }
        VolumeCmd::Grow { name, size, target } => {
            let body = serde_json::json!({ "size_bytes": size.as_u64() });
            let path = format!("/v1/volumes/{}/grow", checked(&name)?);
            let v = client::request(&target.data, "POST", &path, Some(&body))?;
            (target, v)
        }
        VolumeCmd::Set {
            name,
            read_only,
            target,
        } => {
            let read_only = read_only.ok_or("nothing to set: give --read-only true|false")?;
            let body = serde_json::json!({ "read_only": read_only });
            let path = format!("/v1/volumes/{}/read-only", checked(&name)?);
            let v = client::request(&target.data, "POST", &path, Some(&body))?;
            (target, v)
        }
    };
    if target.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        client::print_volumes(&value);
    }
    Ok(ExitCode::SUCCESS)
}
