//! The iSCSI front end: every volume is a target `iqn.2026-11.dev.mariner:<volume>` with the
//! volume as LUN 0, CHAP and an initiator ACL from `[iscsi.targets.<volume>]`.
//!
//! The SCSI adapter beside the NBD one (`crate::nbd`): both reach the volume through its
//! write path ([`WritePath`]) and only translate — blocks to bytes, [`VolumeError`] to SCSI
//! errors. Writes are acknowledged once durable in the log. COMPARE AND WRITE and ORWRITE take
//! the volume's writer lock exclusively, so they are atomic against NBD writers too. A write
//! of up to [`Volume::max_io_bytes`] is one log record, hence atomic (WRITE ATOMIC(16)).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use mariner_iscsi::{Chap, Target, Targets};
use mariner_nbd::ConnectionGuard;
use mariner_scsi::{BackendError, BlockBackend, CompareOutcome, Geometry, Lun, Provisioning};
use mariner_store::Allocation;

use crate::config::IscsiTargetConfig;
use crate::volume::{ReadPath, Volume, VolumeError, WritePath, Zeroing};
use crate::Node;

/// Every target's IQN is this prefix followed by the volume name.
pub const IQN_PREFIX: &str = "iqn.2026-11.dev.mariner:";

/// Longest run GET LBA STATUS looks at in one call; the initiator asks again for the rest.
const LBA_STATUS_SPAN_BYTES: u64 = 1 << 30;

/// The IQN of the target serving `volume`.
pub fn target_iqn(volume: &str) -> String {
    format!("{IQN_PREFIX}{volume}")
}

/// The node's volumes as iSCSI targets.
pub struct VolumeTargets {
    node: Arc<Node>,
}

impl VolumeTargets {
    pub fn new(node: Arc<Node>) -> Self {
        Self { node }
    }

    /// The volume an IQN names. IQNs are case-insensitive (RFC 3722 folds them to lower
    /// case), volume names are not: an exact match wins, else a unique case-folded one.
    fn volume_name(&self, iqn: &str) -> Option<String> {
        let prefix = iqn.get(..IQN_PREFIX.len())?;
        if !prefix.eq_ignore_ascii_case(IQN_PREFIX) {
            return None;
        }
        let wanted = &iqn[IQN_PREFIX.len()..];
        let names = self.node.volume_names();
        if names.iter().any(|n| n == wanted) {
            return Some(wanted.to_string());
        }
        let mut folded = names.into_iter().filter(|n| n.eq_ignore_ascii_case(wanted));
        let first = folded.next()?;
        folded.next().is_none().then_some(first)
    }
}

fn chap(cfg: &IscsiTargetConfig) -> Option<Chap> {
    let mutual = cfg.mutual_user.clone().zip(cfg.mutual_secret.clone());
    Some(Chap {
        user: cfg.chap_user.clone()?,
        secret: cfg.chap_secret.clone()?,
        mutual,
    })
}

impl VolumeTargets {
    /// The snapshot export an IQN names (`<prefix><volume>:<snapshot>`), by its export name
    /// (`<volume>@<snapshot>`): an exact match, else a unique case-folded one.
    fn snapshot_export(&self, iqn: &str) -> Option<String> {
        let prefix = iqn.get(..IQN_PREFIX.len())?;
        if !prefix.eq_ignore_ascii_case(IQN_PREFIX) {
            return None;
        }
        let (volume, snap) = iqn[IQN_PREFIX.len()..].split_once(':')?;
        let wanted = crate::snapshot::export_name(volume, snap);
        let names: Vec<String> = self
            .node
            .snapshot_infos()
            .into_iter()
            .map(|s| s.export)
            .collect();
        if names.contains(&wanted) {
            return Some(wanted);
        }
        let mut folded = names
            .into_iter()
            .filter(|n| n.eq_ignore_ascii_case(&wanted));
        let first = folded.next()?;
        folded.next().is_none().then_some(first)
    }

    /// A snapshot export as a target, with its volume's CHAP and initiator ACL.
    fn snapshot_target(&self, export: &str) -> Option<Target> {
        let s = self.node.snapshot(export)?;
        let access = self.node.config().iscsi.targets.get(&s.volume);
        let view = crate::snapshot::ViewRef(s.view.clone());
        Some(Target {
            iqn: crate::snapshot::target_iqn(&s.volume, &s.meta.name),
            lun: Arc::new(Lun::shared(
                Arc::new(ScsiDisk(Arc::new(view))),
                s.view.reservations.clone(),
                s.view.unit.clone(),
            )),
            chap: access.and_then(chap),
            allowed_initiators: access.map(|a| a.initiators.clone()).unwrap_or_default(),
        })
    }
}

impl Targets for VolumeTargets {
    fn names(&self) -> Vec<String> {
        let snapshots = self.node.snapshot_infos().into_iter().map(|s| s.iqn);
        self.node
            .volume_names()
            .iter()
            .map(|n| target_iqn(n))
            .chain(snapshots)
            .collect()
    }

    fn get(&self, iqn: &str) -> Option<Target> {
        let Some(name) = self.volume_name(iqn) else {
            let export = self.snapshot_export(iqn)?;
            return self.snapshot_target(&export);
        };
        if self.node.rolling_back(&name) {
            tracing::warn!(volume = %name, "iSCSI login refused: the volume is rolling back");
            return None;
        }
        let volume = self.node.volume(&name)?;
        let access = self.node.config().iscsi.targets.get(&name);
        Some(Target {
            iqn: target_iqn(&name),
            lun: Arc::new(Lun::shared(
                Arc::new(ScsiDisk(volume.clone())),
                volume.reservations().clone(),
                volume.unit().clone(),
            )),
            chap: access.and_then(chap),
            allowed_initiators: access.map(|a| a.initiators.clone()).unwrap_or_default(),
        })
    }

    /// A session counts as a connection to its volume, like an NBD client: `mariner volume
    /// delete` is refused while it lasts.
    fn hold(&self, target: &Target) -> Box<dyn Send + Sync> {
        let name = target.iqn.strip_prefix(IQN_PREFIX).unwrap_or(&target.iqn);
        // A snapshot's target counts against its export (`<volume>@<snapshot>`).
        let name = name.replacen(':', "@", 1);
        Box::new(ConnectionGuard::new(self.node.clone(), name))
    }
}

fn read_error(e: VolumeError) -> BackendError {
    match e {
        VolumeError::ReadOnly => BackendError::ReadOnly,
        other => BackendError::Read(other.to_string()),
    }
}

fn write_error(e: VolumeError) -> BackendError {
    match e {
        VolumeError::ReadOnly => BackendError::ReadOnly,
        VolumeError::NoSpace => BackendError::NoSpace,
        VolumeError::Failed(why) => BackendError::Write(why),
        other => BackendError::Write(other.to_string()),
    }
}

/// A stable 16-byte identifier for the NAA designator: the volume's creation time and id,
/// which no other volume of this node shares.
pub(crate) fn naa_id(id: u32, created_ns: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&created_ns.to_le_bytes());
    out[8..12].copy_from_slice(&id.to_le_bytes());
    out
}

/// What the SCSI adapter needs of a unit beyond its write path: its block size and its
/// geometry, both asked for on every command (so they must not allocate).
pub trait ScsiUnit: WritePath + 'static {
    fn block_size(&self) -> u32;
    fn geometry(&self) -> Geometry;
}

impl ScsiUnit for Volume {
    fn block_size(&self) -> u32 {
        self.with_meta(|m| m.block_size)
    }

    fn geometry(&self) -> Geometry {
        let (id, created_ns, size_bytes, block_size) =
            self.with_meta(|m| (m.id, m.created_ns, m.size_bytes, m.block_size));
        let max_blocks = (self.max_io_bytes() / u64::from(block_size)) as u32;
        Geometry {
            block_size,
            block_count: size_bytes / u64::from(block_size),
            read_only: self.read_only_lasting(),
            can_unmap: true,
            max_transfer_blocks: max_blocks,
            physical_block_size: self.physical_block_bytes(),
            // Every write of up to max_io_bytes is one log record: all of it or none.
            max_atomic_blocks: max_blocks,
            serial: self.serial().clone(),
            naa_id: naa_id(id, created_ns),
        }
    }
}

/// A volume (or anything with its write path and a geometry: a snapshot export) as a SCSI
/// block device.
pub struct ScsiDisk<V>(pub Arc<V>);

#[async_trait]
impl<V: ScsiUnit> BlockBackend for ScsiDisk<V> {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }

    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Vec<u8>, BackendError> {
        let bs = u64::from(self.0.block_size());
        ReadPath::read(&*self.0, lba * bs, u64::from(blocks) * bs)
            .await
            .map_err(read_error)
    }

    async fn write(&self, lba: u64, data: Bytes) -> Result<(), BackendError> {
        let bs = u64::from(self.0.block_size());
        WritePath::write(&*self.0, lba * bs, data)
            .await
            .map_err(write_error)
    }

    async fn flush(&self) -> Result<(), BackendError> {
        // Every completed write is durable in the log already.
        ReadPath::flush(&*self.0).map_err(write_error)
    }

    async fn unmap(&self, lba: u64, blocks: u64) -> Result<(), BackendError> {
        let bs = u64::from(self.0.block_size());
        self.0
            .zero(lba * bs, blocks * bs, Zeroing::Trim)
            .await
            .map_err(write_error)
    }

    async fn compare_and_write(
        &self,
        lba: u64,
        expected: &[u8],
        data: &[u8],
    ) -> Result<CompareOutcome, BackendError> {
        let bs = u64::from(self.0.block_size());
        let data = Bytes::copy_from_slice(data);
        let outcome = WritePath::compare_and_write(&*self.0, lba * bs, expected, data)
            .await
            .map_err(write_error)?;
        Ok(match outcome {
            None => CompareOutcome::Written,
            Some(offset) => CompareOutcome::Mismatch { offset },
        })
    }

    async fn or_write(&self, lba: u64, data: &[u8]) -> Result<(), BackendError> {
        let bs = u64::from(self.0.block_size());
        WritePath::or_write(&*self.0, lba * bs, data)
            .await
            .map_err(write_error)
    }

    async fn lba_status(&self, lba: u64) -> Result<(Provisioning, u64), BackendError> {
        let bs = u64::from(self.0.block_size());
        let runs = ReadPath::allocation(&*self.0, lba * bs, LBA_STATUS_SPAN_BYTES)
            .await
            .map_err(read_error)?;
        let state = |a: Allocation| match a {
            Allocation::Data => Provisioning::Mapped,
            Allocation::Hole | Allocation::Zero => Provisioning::Deallocated,
        };
        let mut runs = runs.into_iter().map(|(len, a)| (len, state(a)));
        let Some((first_len, first)) = runs.next() else {
            return Err(BackendError::Read("no allocation information".into()));
        };
        let same: u64 = runs.take_while(|(_, s)| *s == first).map(|(l, _)| l).sum();
        // Runs from the file system are at least block-aligned in practice; a partial block
        // belongs to the run it starts in.
        Ok((first, ((first_len + same) / bs).max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iqn_is_the_prefix_and_the_volume_name() {
        assert_eq!(target_iqn("vol0"), "iqn.2026-11.dev.mariner:vol0");
    }

    #[test]
    fn chap_needs_user_and_secret() {
        let mut cfg = IscsiTargetConfig::default();
        assert!(chap(&cfg).is_none());
        cfg.chap_user = Some("u".into());
        cfg.chap_secret = Some("s".into());
        cfg.mutual_user = Some("t".into());
        cfg.mutual_secret = Some("m".into());
        let c = chap(&cfg).unwrap();
        assert_eq!(c.mutual, Some(("t".into(), "m".into())));
    }
}
