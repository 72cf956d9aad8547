//! Serves one in-memory LUN over iSCSI, for trying the target with real initiators.
//!
//! ```text
//! cargo run --release -p mariner-iscsi --example memtarget -- [ADDR] [SIZE_MIB] [IQN]
//! #   ADDR defaults to 127.0.0.1:3262, SIZE_MIB to 64, IQN to iqn.2026-11.dev.mariner:test
//! iscsi-inq iscsi://127.0.0.1:3262/iqn.2026-11.dev.mariner:test/0
//! ```
//!
//! Set `MEMTARGET_CHAP=user:secret` to require CHAP.

use std::sync::Arc;

use mariner_iscsi::{serve, Chap, MemoryTargets, ServerConfig, Target, Targets};
use mariner_scsi::{Lun, MemoryBackend};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3262".into());
    let size_mib: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(64);
    let iqn = args
        .next()
        .unwrap_or_else(|| "iqn.2026-11.dev.mariner:test".into());
    let chap = std::env::var("MEMTARGET_CHAP").ok().and_then(|v| {
        let (user, secret) = v.split_once(':')?;
        Some(Chap {
            user: user.into(),
            secret: secret.into(),
            mutual: None,
        })
    });
    let backend = Arc::new(MemoryBackend::new("MEM0001", 512, size_mib * 2048));
    let targets = Arc::new(MemoryTargets::new());
    targets.add(Target {
        iqn: iqn.clone(),
        lun: Arc::new(Lun::new(backend)),
        chap,
        allowed_initiators: Vec::new(),
    });
    let listener = TcpListener::bind(&addr).await?;
    eprintln!(
        "serving {iqn} ({size_mib} MiB) on iscsi://{}",
        listener.local_addr()?
    );
    let targets: Arc<dyn Targets> = targets;
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve(listener, targets, ServerConfig::default(), ctrl_c).await?;
    Ok(())
}
