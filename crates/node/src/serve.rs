//! `mariner serve`: bind the front ends (before the node opens: [`bind`]), record the ports,
//! serve until SIGTERM/SIGINT, then shut down in order (stop accepting, finish in-flight
//! requests, final store sync, log).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;

use crate::datadir::DataDir;
use crate::iscsi::VolumeTargets;
use crate::{admin, Config, Node, NodeError};

/// The TCP listeners of a server, bound before the data directory is opened or created: a port
/// in use is reported before anything is written.
pub struct Listeners {
    nbd: Vec<(TcpListener, SocketAddr)>,
    iscsi: Vec<(TcpListener, SocketAddr)>,
}

/// Binds every NBD and iSCSI address of `cfg`. A data directory another server holds is
/// reported first (its ports are likely the ones in use); nothing is created either way.
pub async fn bind(cfg: &Config) -> Result<Listeners, NodeError> {
    cfg.validate()?;
    DataDir::check_unlocked(&cfg.data)?;
    let mut nbd = Vec::new();
    for addr in &cfg.nbd.listen {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| NodeError::Config(format!("cannot listen for NBD on {addr}: {e}")))?;
        let bound = l.local_addr().map_err(|e| NodeError::Io(e.to_string()))?;
        if !bound.ip().is_loopback() {
            tracing::warn!(
                %bound,
                "NBD is served beyond loopback without TLS: anyone who can reach this address \
                 can read and write the volumes"
            );
        }
        nbd.push((l, bound));
    }
    let iscsi = bind_iscsi(cfg).await?;
    Ok(Listeners { nbd, iscsi })
}

/// Serves `node` on `listeners` until a termination signal (or `stop` turns true).
pub async fn run(
    node: Arc<Node>,
    listeners: Listeners,
    mut stop: watch::Receiver<bool>,
) -> Result<(), NodeError> {
    // Before ports.json announces the server: a SIGTERM from then on is a clean shutdown.
    let signals = Signals::new();
    let Listeners { nbd, iscsi } = listeners;
    let (admin_listener, admin_path) =
        admin::bind(node.data_dir()).map_err(|e| NodeError::Io(format!("admin.sock: {e}")))?;
    let bound: Vec<SocketAddr> = nbd.iter().map(|(_, a)| *a).collect();
    let iscsi_bound: Vec<SocketAddr> = iscsi.iter().map(|(_, a)| *a).collect();
    let ports = serde_json::json!({
        "nbd": bound.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "iscsi": iscsi_bound.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "admin": admin_path,
        "pid": std::process::id(),
    });
    node.set_endpoints(bound.clone(), iscsi_bound.clone());
    node.dir.write_ports(&ports)?;
    tracing::info!(nbd = ?bound, iscsi = ?iscsi_bound, admin = %admin_path.display(), "serving");

    let (quit_tx, quit_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for (l, _) in nbd {
        let exports: Arc<dyn mariner_nbd::Exports> = node.clone();
        let mut q = quit_rx.clone();
        // Payload in flight per connection (a quarter of the node's budget, at most 16 MiB)
        // and node-wide bound what writers blocked on a full log, or clients that stall, can
        // make the server hold (docs/ARCHITECTURE.md "Memory").
        let cfg = mariner_nbd::ServerConfig {
            max_in_flight_bytes: node.config().limits.per_connection_bytes(),
            limits: node.limits().clone(),
            ..mariner_nbd::ServerConfig::default()
        };
        tasks.spawn(async move {
            let shutdown = async move {
                let _ = q.wait_for(|v| *v).await;
            };
            if let Err(e) = mariner_nbd::serve(l, exports, cfg, shutdown).await {
                tracing::error!(error = %e, "NBD server stopped");
            }
        });
    }
    let targets: Arc<dyn mariner_iscsi::Targets> = Arc::new(VolumeTargets::new(node.clone()));
    for (l, _) in iscsi {
        let targets = targets.clone();
        let mut q = quit_rx.clone();
        let cfg = mariner_iscsi::ServerConfig {
            node_limits: node.limits().clone(),
            ..mariner_iscsi::ServerConfig::default()
        };
        tasks.spawn(async move {
            let shutdown = async move {
                let _ = q.wait_for(|v| *v).await;
            };
            if let Err(e) = mariner_iscsi::serve(l, targets, cfg, shutdown).await {
                tracing::error!(error = %e, "iSCSI server stopped");
            }
        });
    }
    let router = admin::router(node.clone());
    let mut q = quit_rx.clone();
    tasks.spawn(async move {
        let shutdown = async move {
            let _ = q.wait_for(|v| *v).await;
        };
        if let Err(e) = axum::serve(admin_listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "admin API stopped");
        }
    });

    tasks.spawn(crate::history::reseed::watch(node.clone(), quit_rx.clone()));

    signals.wait(&mut stop).await;
    tracing::info!("shutting down: finishing in-flight requests");
    let _ = quit_tx.send(true);
    while tasks.join_next().await.is_some() {}
    let n = node.clone();
    let _ = tokio::task::spawn_blocking(move || n.shutdown()).await;
    let _ = std::fs::remove_file(&admin_path);
    let _ = std::fs::remove_file(node.data_dir().join("ports.json"));
    tracing::info!("stopped");
    Ok(())
}

/// Binds every `[iscsi] listen` address (none: no iSCSI).
async fn bind_iscsi(cfg: &Config) -> Result<Vec<(TcpListener, SocketAddr)>, NodeError> {
    let mut out = Vec::new();
    for addr in &cfg.iscsi.listen {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| NodeError::Config(format!("cannot listen for iSCSI on {addr}: {e}")))?;
        let bound = l.local_addr().map_err(|e| NodeError::Io(e.to_string()))?;
        if !bound.ip().is_loopback() {
            let protected = cfg.iscsi.targets.values().filter(|t| t.chap_user.is_some());
            tracing::warn!(
                %bound,
                volumes_with_chap = protected.count(),
                "iSCSI is served beyond loopback without encryption: anyone who can reach this \
                 address can read and write every volume that has no CHAP configured"
            );
        }
        out.push((l, bound));
    }
    Ok(out)
}

/// SIGTERM and SIGINT, caught from creation on.
struct Signals(Option<(Signal, Signal)>);

impl Signals {
    fn new() -> Self {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Self(Some((term, int))),
            _ => Self(None),
        }
    }

    async fn wait(self, stop: &mut watch::Receiver<bool>) {
        let Some((mut term, mut int)) = self.0 else {
            let _ = stop.wait_for(|v| *v).await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = stop.wait_for(|v| *v) => {}
        }
    }
}
