//! A volume's SCSI reservations, shared by every iSCSI session of the volume and consulted by
//! NBD. With APTPL set they live in `<data>/volumes/<name>/reservations.bin`
//! (docs/FORMATS.md, "Persistent reservations"), replaced atomically on every change.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use mariner_scsi::pr::image;
use mariner_scsi::{PrPersist, Reservations};

use crate::datadir::{remove_durably, write_atomic};
use crate::NodeError;

/// The file name in the volume's directory.
pub const FILE_NAME: &str = "reservations.bin";

struct PrFile {
    path: PathBuf,
}

#[async_trait]
impl PrPersist for PrFile {
    async fn save(&self, image: Option<Vec<u8>>) -> Result<(), String> {
        let path = self.path.clone();
        let r = tokio::task::spawn_blocking(move || match image {
            Some(bytes) => write_atomic(&path, &bytes),
            None => remove_durably(&path),
        })
        .await;
        r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
    }
}

/// Loads the volume's reservations: those saved with APTPL, or none.
pub fn open(volume_dir: &Path) -> Result<Arc<Reservations>, NodeError> {
    let path = volume_dir.join(FILE_NAME);
    let restored = match std::fs::read(&path) {
        Ok(bytes) => Some(
            image::decode(&bytes)
                .map_err(|e| NodeError::Corrupt(format!("{}: {e}", path.display())))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(NodeError::Io(format!("{}: {e}", path.display()))),
    };
    if let Some(state) = &restored {
        tracing::info!(
            path = %path.display(),
            registrations = state.registrations.len(),
            reserved = state.reservation.is_some(),
            "persistent reservations restored (APTPL)"
        );
    }
    let persist = Arc::new(PrFile { path });
    Ok(Arc::new(Reservations::persistent(restored, persist)))
}
