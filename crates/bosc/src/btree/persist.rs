//! Writing router images and opening from them: the I/O side of [`super::image`], whose
//! module docs give the reasoning (what an image says, the lease, the write order).
//!
//! Apart from open and the batch path because both use it: open reads an image (or falls
//! back to the scan) and writes a fresh one; a split that finds the lease used up writes the
//! next one before it takes a block ([`BPlusTree::alloc`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mariner_disk::Disk;

use super::image::{
    encode_body, BodyPrefix, ImageError, ImageHeader, RouterImage, IMAGE_BODY_START,
    IMAGE_HEADER_LEN, IMAGE_LEAF_LEN, IMAGE_SLOTS,
};
use super::leaf::{Key, LeafApp, LeafView};
use super::router::{Fence, FreeBlocks, Leaf, Router};
use super::{lock, BPlusTree};
use crate::{Bosc, Error};

/// A lease grants at least this many blocks...
const LEASE_MIN: u64 = 32;
/// ...and otherwise a sixteenth of the leaves: an open scans at most that share of the tree
/// beyond the image, and a growing tree writes an image every that many splits (an image is
/// 24 bytes a leaf, 0.6 % of 4 KiB leaves, so the writes cost about a tenth of the leaves').
const LEASE_SHARE: u64 = 16;
/// An image body is written in pieces of about this many bytes, so writing one takes this
/// much memory beside the router, not a copy of it.
const IMAGE_WRITE_CHUNK: usize = 1 << 20;
/// Open checks, for this many of the newest leaves its lease scan found, that the leaf
/// before each holds nothing at or above its fence (a split torn by the crash).
const TORN_CHECKS: usize = 8;

/// Open reads this many free blocks past the lease: a leaf there means the image is older
/// than the tree (a copy of the file put back) and is not used.
const PAST_LEASE: u64 = 64;

/// The router image disk of an open tree.
pub(super) struct Persist {
    disk: Arc<dyn Disk>,
    generation: u64,
    /// The newest durable body `(offset, len)`: the next body must not overlap it.
    newest: Option<(u64, u64)>,
    /// Blocks the allocator may still take under the newest image's lease.
    lease_left: u64,
}

/// How [`BPlusTree::open_with_router`] built the router.
#[derive(Debug, Clone, Default)]
pub struct RouterOpen {
    /// From an image (then `blocks_scanned` is its lease), or by reading every block.
    pub from_image: bool,
    /// Why no image was used, when an image disk was given.
    pub fallback: Option<String>,
    /// Blocks the open scanned.
    pub blocks_scanned: u64,
    /// Leaves found in the lease: created after the image.
    pub leaves_found: u64,
    /// Bytes of the image read.
    pub image_bytes: u64,
    pub elapsed: Duration,
}

/// The next body's offset: the start of the body area if it fits below the newest body,
/// else past it (4 KiB aligned). Two bodies alternate, so the file stays near twice one.
fn place(newest: Option<(u64, u64)>, len: u64) -> u64 {
    match newest {
        Some((o, _)) if IMAGE_BODY_START + len <= o => IMAGE_BODY_START,
        Some((o, l)) => (o + l).next_multiple_of(4096),
        None => IMAGE_BODY_START,
    }
}

/// Grows the image disk to `len` bytes if shorter (a file grows by writing; a memory disk
/// only by `set_len`).
fn grow(disk: &dyn Disk, len: u64) -> Result<(), Error> {
    if disk.len()? < len {
        disk.set_len(len)?;
    }
    Ok(())
}

/// `runs` (ascending, disjoint) with `blocks` (ascending) added, coalesced.
fn with_blocks(runs: &[(u64, u64)], blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = runs.to_vec();
    all.extend(blocks.iter().map(|&b| (b, b + 1)));
    all.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
    for (s, e) in all {
        match out.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// `runs` (ascending) without `blocks` (ascending, each inside some run).
fn without_blocks(runs: &[(u64, u64)], blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(runs.len() + blocks.len());
    let mut taken = blocks.iter().peekable();
    for &(mut s, e) in runs {
        while let Some(&&b) = taken.peek() {
            if b >= e {
                break;
            }
            taken.next();
            if b >= s {
                out.push((s, b));
                s = b + 1;
            }
        }
        out.push((s, e));
    }
    out.retain(|r| r.0 < r.1);
    out
}

/// Reads and checks the image on `disk` for `bosc`'s data disk.
fn read_image(disk: &dyn Disk, bosc: &Bosc<LeafApp>) -> Result<(ImageHeader, RouterImage), String> {
    let len = disk.len().map_err(|e| e.to_string())?;
    if len < IMAGE_BODY_START {
        return Err(ImageError::Missing.to_string());
    }
    let mut slots = [[0u8; IMAGE_HEADER_LEN]; 2];
    for (buf, at) in slots.iter_mut().zip(IMAGE_SLOTS) {
        disk.read_at(buf, at).map_err(|e| e.to_string())?;
    }
    let h = ImageHeader::pick([&slots[0], &slots[1]]).map_err(|e| e.to_string())?;
    if h.disk_id != bosc.disk_id() {
        return Err(ImageError::Foreign.to_string());
    }
    let end = h.body_offset.checked_add(h.body_len);
    if h.body_offset < IMAGE_BODY_START || end.is_none_or(|e| e > len) {
        return Err(ImageError::Inconsistent("body outside the file").to_string());
    }
    let mut body = vec![0u8; h.body_len as usize];
    disk.read_at(&mut body, h.body_offset)
        .map_err(|e| e.to_string())?;
    if crc32c::crc32c(&body) != h.body_crc {
        return Err(ImageError::BodyChecksum.to_string());
    }
    let img = RouterImage::decode(&body).map_err(|e| e.to_string())?;
    if img.block_count != bosc.block_count() || img.payload_bytes as usize != bosc.payload_bytes() {
        return Err(ImageError::Foreign.to_string());
    }
    Ok((h, img))
}

/// The router an image and its lease scan give, before the tree is assembled.
struct FromImage {
    leaves: BTreeMap<Fence, Leaf>,
    free: FreeBlocks,
    /// Leaves found in the lease, in allocation order.
    found: Vec<(Key, u64)>,
    /// Splits the crash tore: (old leaf's fence, its block, the new leaf's fence).
    torn: Vec<(Key, u64, Key)>,
    scanned: u64,
}

/// Scans the image's lease for leaves created after it. An inconsistency (a malformed leaf,
/// a fence the image has) is a reason to read every leaf instead.
fn scan_lease(
    bosc: &Bosc<LeafApp>,
    capacity: usize,
    img: &RouterImage,
) -> Result<FromImage, String> {
    // Leaves from the image start unread: the count is an upper bound, and the image cannot
    // know the puts since (see the image module's docs).
    let mut leaves: BTreeMap<Fence, Leaf> = img
        .leaves
        .iter()
        .map(|(f, b)| (Fence::from(*f), Leaf::unread(u64::from(*b))))
        .collect();
    let mut found = Vec::new();
    let mut scanned = 0;
    for (start, end) in img.lease_runs() {
        scanned += end - start;
        bosc.scan(start, end - start, |block, p| {
            let v = LeafView(p);
            if !v.is_leaf() {
                return Ok(());
            }
            if let Some(why) = v.malformed(capacity) {
                return Err(Error::Index(format!("block {block}: {why}")));
            }
            let fence = v.fence();
            if leaves
                .insert(Fence::from(fence), Leaf::new(block, v.count()))
                .is_some()
            {
                return Err(Error::Index(format!("two leaves with fence {fence:?}")));
            }
            found.push((fence, block));
            Ok(())
        })
        .map_err(|e| format!("lease scan: {e}"))?;
    }
    for (start, end) in img.past_lease_runs(PAST_LEASE) {
        scanned += end - start;
        bosc.scan(start, end - start, |block, p| {
            if LeafView(p).is_leaf() {
                return Err(Error::Index(format!(
                    "router image is stale: block {block}, past its lease, holds a leaf"
                )));
            }
            Ok(())
        })
        .map_err(|e| match e {
            Error::Index(why) => why,
            e => format!("past-lease scan: {e}"),
        })?;
    }
    let blocks: Vec<u64> = found.iter().map(|(_, b)| *b).collect();
    let free = FreeBlocks::from_ascending(without_blocks(&img.free, &blocks));
    let torn = torn_splits(bosc, &leaves, &found)?;
    Ok(FromImage {
        leaves,
        free,
        found,
        torn,
        scanned,
    })
}

/// The splits a crash tore: only the newest split can be (a split's two changes are
/// consecutive in the log, and the log recovers a prefix), and its new leaf is among the
/// last the lease scan found. For those, the leaf before each must hold nothing at or above
/// the found leaf's fence. A block there that holds no leaf is a reason for the full scan.
fn torn_splits(
    bosc: &Bosc<LeafApp>,
    leaves: &BTreeMap<Fence, Leaf>,
    found: &[(Key, u64)],
) -> Result<Vec<(Key, u64, Key)>, String> {
    let mut torn = Vec::new();
    for &(fence, _) in found.iter().rev().take(TORN_CHECKS) {
        let Some((pf, pl)) = leaves.range(..Fence::from(fence)).next_back() else {
            continue;
        };
        let block = pl.block();
        let above = bosc
            .query(block, |p| {
                LeafView::checked(block, p)
                    .map(|v| v.count().checked_sub(1).is_some_and(|i| v.key(i) >= fence))
            })
            .and_then(|r| r)
            .map_err(|e| format!("torn split check: {e}"))?;
        if above {
            torn.push((pf.key(), block, fence));
        }
    }
    Ok(torn)
}

impl BPlusTree {
    /// [`BPlusTree::open`] with the router persisted on `image` (a file beside the data
    /// disk; an empty one to start): the router is read from the newest image and the
    /// image's lease is scanned for leaves created since, instead of every block. Without a
    /// usable image (missing, damaged, foreign, inconsistent) it reads every leaf as
    /// [`BPlusTree::open`] does, and says why in [`Self::router_open`]. Either way it then
    /// writes a fresh image, and the tree keeps writing one whenever its lease runs out.
    pub fn open_with_router(
        bosc: Bosc<LeafApp>,
        split_threshold: Option<usize>,
        image: Arc<dyn Disk>,
    ) -> Result<Self, Error> {
        let started = Instant::now();
        let capacity = Self::check_engine(&bosc)?;
        let loaded = read_image(image.as_ref(), &bosc).and_then(|(h, img)| {
            let from = scan_lease(&bosc, capacity, &img)?;
            Ok((h, from))
        });
        let mut tree = match loaded {
            Ok((h, from)) => {
                let tree = Self::assemble(bosc, capacity, split_threshold, from.leaves, from.free);
                tree.repair_torn(&from.torn)?;
                let mut r = lock(&tree.router);
                r.persist = Some(Persist {
                    disk: image,
                    generation: h.generation,
                    newest: Some((h.body_offset, h.body_len)),
                    lease_left: 0,
                });
                tree.write_image(&mut r, &[])?;
                drop(r);
                tree.refresher
                    .start(&tree.bosc, &tree.router, &tree.stats)?;
                let mut tree = tree;
                tree.opened = RouterOpen {
                    from_image: true,
                    fallback: None,
                    blocks_scanned: from.scanned,
                    leaves_found: from.found.len() as u64,
                    image_bytes: h.body_len + 2 * IMAGE_HEADER_LEN as u64,
                    elapsed: Duration::ZERO,
                };
                tree
            }
            Err(why) => {
                let blocks = bosc.block_count();
                let mut tree = Self::open(bosc, split_threshold)?;
                tree.stats.router_fallbacks.fetch_add(1, Ordering::Relaxed);
                // Neither slot is trusted: both are cleared before the first new image, so
                // no older header can outrank it.
                grow(image.as_ref(), IMAGE_BODY_START)?;
                image.write_at(&[0u8; IMAGE_BODY_START as usize], 0)?;
                image.sync()?;
                let mut r = lock(&tree.router);
                r.persist = Some(Persist {
                    disk: image,
                    generation: 0,
                    newest: None,
                    lease_left: 0,
                });
                tree.write_image(&mut r, &[])?;
                drop(r);
                tree.opened = RouterOpen {
                    from_image: false,
                    fallback: Some(why),
                    blocks_scanned: blocks,
                    ..RouterOpen::default()
                };
                tree
            }
        };
        tree.opened.elapsed = started.elapsed();
        Ok(tree)
    }

    /// Waits until the background count refresher that an open from a router image starts
    /// has read every leaf (or stopped); at once if none runs. For measurements and tests:
    /// the tree serves operations meanwhile.
    pub fn wait_for_counts(&self) {
        self.refresher.wait();
    }

    /// How the router was built at open ([`Self::open_with_router`]).
    pub fn router_open(&self) -> &RouterOpen {
        &self.opened
    }

    /// Writes a router image now (a tree opened with one), renewing the lease: e.g. before a
    /// planned shutdown, so the next open scans as little as possible.
    pub fn persist_router(&self) -> Result<(), Error> {
        let mut r = lock(&self.router);
        r.check()?;
        if r.persist.is_none() {
            return Ok(());
        }
        self.write_image(&mut r, &[])
    }

    /// Finishes the splits [`torn_splits`] found torn, as [`BPlusTree::open`]'s repair does.
    fn repair_torn(&self, torn: &[(Key, u64, Key)]) -> Result<(), Error> {
        let mut r = lock(&self.router);
        self.finish_splits(&mut r, torn)
    }

    /// Takes a free block for a new leaf. Under a router image, only inside the newest
    /// image's lease: when it is used up, a new image (leaving out `created`, the batch's new
    /// leaves, which are not durable yet) is written and synced first.
    pub(super) fn alloc(&self, r: &mut Router, created: &[(Key, u64)]) -> Result<u64, Error> {
        if r.persist.as_ref().is_some_and(|p| p.lease_left == 0) {
            self.write_image(r, created)?;
        }
        let block = r
            .free
            .pop()
            .ok_or_else(|| Error::Index("B+tree is out of blocks".into()))?;
        if let Some(p) = &mut r.persist {
            p.lease_left = p.lease_left.saturating_sub(1);
        }
        Ok(block)
    }

    /// Writes the router, less `created`, as the next image: body, sync, header over the
    /// older slot, sync. Renews the lease.
    pub(super) fn write_image(&self, r: &mut Router, created: &[(Key, u64)]) -> Result<(), Error> {
        let Some(p) = &r.persist else {
            return Ok(());
        };
        let new: HashSet<Key> = created.iter().map(|(f, _)| *f).collect();
        // The leaves are encoded straight from the router, not collected first: a large
        // tree's copy would take as much memory again as the router the budget counts.
        let kept = || {
            r.leaves
                .iter()
                .map(|(f, l)| (f.key(), l.block))
                .filter(|(f, _)| !new.contains(f))
        };
        let leaves = kept().count();
        let mut created_blocks: Vec<u64> = created.iter().map(|(_, b)| *b).collect();
        created_blocks.sort_unstable();
        let free = with_blocks(&r.free.ascending(), &created_blocks);
        let free_blocks: u64 = free.iter().map(|(s, e)| e - s).sum();
        let lease = (leaves as u64 / LEASE_SHARE)
            .max(LEASE_MIN)
            .saturating_add(created.len() as u64)
            .min(free_blocks);
        let too_many = |_| Error::Index("the router image has over 4 G entries".into());
        let prefix = BodyPrefix {
            block_count: self.bosc.block_count(),
            payload_bytes: u32::try_from(self.bosc.payload_bytes())
                .map_err(|_| Error::Config("payload too large".into()))?,
            leaves: u32::try_from(leaves).map_err(too_many)?,
            free_runs: u32::try_from(free.len()).map_err(too_many)?,
            lease_blocks: lease,
        };
        let body_len = prefix.body_len();
        let offset = place(p.newest, body_len);
        grow(p.disk.as_ref(), offset + body_len)?;
        let (mut at, mut body_crc) = (offset, 0u32);
        let mut buf = Vec::with_capacity(IMAGE_WRITE_CHUNK + IMAGE_LEAF_LEN);
        let written = encode_body(
            &prefix,
            kept(),
            free.iter().copied(),
            IMAGE_WRITE_CHUNK,
            &mut buf,
            &mut |b: &mut Vec<u8>| -> Result<(), Error> {
                p.disk.write_at(b, at)?;
                body_crc = crc32c::crc32c_append(body_crc, b);
                at += b.len() as u64;
                b.clear();
                Ok(())
            },
        )?;
        // Both counts came from the same router, unchanged under its lock.
        if written != body_len {
            return Err(Error::Failed(format!(
                "router image body of {written} bytes, its prefix says {body_len}"
            )));
        }
        p.disk.sync()?;
        let h = ImageHeader {
            generation: p.generation + 1,
            disk_id: self.bosc.disk_id(),
            body_offset: offset,
            body_len,
            body_crc,
        };
        let slot = IMAGE_SLOTS[usize::from(h.generation % 2 == 1)];
        p.disk.write_at(&h.encode(), slot)?;
        p.disk.sync()?;
        if let Some(p) = &mut r.persist {
            p.generation = h.generation;
            p.newest = Some((offset, h.body_len));
            p.lease_left = lease.saturating_sub(created.len() as u64);
        }
        self.stats
            .router_images_written
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_gain_and_lose_blocks() {
        let runs = [(2, 5), (8, 10)];
        assert_eq!(
            with_blocks(&runs, &[0, 5, 7]),
            vec![(0, 1), (2, 6), (7, 10)]
        );
        assert_eq!(without_blocks(&runs, &[2, 4, 9]), vec![(3, 4), (8, 9)]);
        assert_eq!(place(None, 10), IMAGE_BODY_START);
        assert_eq!(place(Some((IMAGE_BODY_START, 10)), 10), 12288);
        assert_eq!(place(Some((12288, 10)), 4096), IMAGE_BODY_START);
        assert_eq!(place(Some((12288, 10)), 4097), 16384);
    }
}
