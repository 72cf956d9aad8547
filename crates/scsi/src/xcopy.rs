//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS (SPC-4 §6.4, §6.18): the copy manager of one
//! logical unit, copying blocks within that unit.
//!
//! The LID1 parameter list:
//!
//! ```text
//! byte 0        LIST IDENTIFIER
//! byte 1        STR (0x20) | LIST ID USAGE (0x18) | PRIORITY (0x07)
//! bytes 2..4    CSCD DESCRIPTOR LIST LENGTH (bytes)
//! bytes 8..12   SEGMENT DESCRIPTOR LIST LENGTH (bytes)
//! bytes 12..16  INLINE DATA LENGTH (bytes)
//! 16..          CSCD descriptors, then segment descriptors, then inline data
//! ```
//!
//! Supported: identification-descriptor CSCD descriptors (0xE4) naming a unit by its NAA
//! designator, and block-to-block segment descriptors (0x02). A CSCD naming any unit but
//! this one (another volume of the node included) is unreachable: a segment using it ends
//! the command with COPY ABORTED / COPY TARGET DEVICE NOT REACHABLE. Malformed lists are
//! refused with ILLEGAL REQUEST before anything is copied; errors met while processing a
//! segment end the command with COPY ABORTED, segments before it having been copied.
//!
//! The copy runs before the command completes, in chunks of at most `max_transfer_blocks`
//! blocks (and [`CHUNK_BYTES`]), overlapping ranges copied as if read whole first. The status
//! of commands whose LIST ID USAGE asks for it is kept per initiator port and list identifier
//! in a table of [`MAX_TRACKED_LISTS`] entries for RECEIVE COPY RESULTS (COPY STATUS), which
//! reports each completed command once.
//!
//! [`operating_parameters`] and [`third_party_copy_descriptors`] (VPD page 0x8F) report the
//! limits below; the parser enforces the same constants.

use std::sync::{Mutex, MutexGuard};

use crate::backend::{BackendError, BlockBackend, Geometry};
use crate::nexus::Nexus;
use crate::sense::{Asc, Sense, SenseKey};
use crate::wire::{be, be16, be32, be64, push_be, put_be};

/// Largest number of CSCD descriptors in one parameter list.
pub const MAX_CSCD_DESCRIPTORS: u16 = 16;
/// Largest number of segment descriptors in one parameter list.
pub const MAX_SEGMENT_DESCRIPTORS: u16 = 64;
/// Largest combined length of the CSCD and segment descriptor lists, in bytes.
pub const MAX_DESCRIPTOR_LIST_LENGTH: u32 = 4096;
/// Inline data is not supported (no segment descriptor that uses it is).
pub const MAX_INLINE_DATA_LENGTH: u32 = 0;
/// Largest number of blocks one segment copies (its NUMBER OF BLOCKS field is 16 bits).
pub const MAX_SEGMENT_BLOCKS: u32 = u16::MAX as u32;
/// Copies whose status is tracked at once, per logical unit; also the number of concurrent
/// copies reported.
pub const MAX_TRACKED_LISTS: usize = 16;
/// Largest read and write the copy issues to the backend, in bytes (fewer when the unit's
/// `max_transfer_blocks` says so).
pub const CHUNK_BYTES: u32 = 1 << 20;

/// Segment descriptor type code: block device to block device.
pub const SEGMENT_BLOCK_TO_BLOCK: u8 = 0x02;
/// CSCD descriptor type code: identification descriptor.
pub const CSCD_IDENTIFICATION: u8 = 0xe4;
/// Descriptor type codes implemented, ascending (OPERATING PARAMETERS and VPD page 0x8F).
pub const IMPLEMENTED_DESCRIPTORS: [u8; 2] = [SEGMENT_BLOCK_TO_BLOCK, CSCD_IDENTIFICATION];

/// EXTENDED COPY service action: LID1.
pub const SA_EXTENDED_COPY_LID1: u8 = 0x00;
/// RECEIVE COPY RESULTS service action: COPY STATUS.
pub const SA_COPY_STATUS: u8 = 0x00;
/// RECEIVE COPY RESULTS service action: OPERATING PARAMETERS.
pub const SA_OPERATING_PARAMETERS: u8 = 0x03;

const HEADER_LEN: usize = 16;
const CSCD_LEN: usize = 32;
const B2B_LEN: usize = 28;
/// DESCRIPTOR LENGTH of a block-to-block segment descriptor (bytes after the first four).
const B2B_DESCRIPTOR_LENGTH: u16 = 0x18;
/// CSCD descriptor IDs above this are special values (SPC-4 table 150), none supported.
const MAX_CSCD_INDEX: u16 = 0x07ff;
/// COPY STATUS: COPY MANAGER STATUS values.
const STATUS_IN_PROGRESS: u8 = 0x00;
const STATUS_COMPLETED: u8 = 0x01;
const STATUS_FAILED: u8 = 0x02;

/// What the LIST ID USAGE field asks of the copy manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListIdUsage {
    /// 00b: status held for RECEIVE COPY RESULTS; the identifier is unique among running copies.
    Hold,
    /// 10b: nothing needs to be held, but the identifier is unique among running copies.
    Discard,
    /// 11b: no identifier (it must be zero); nothing is held.
    None,
}

/// What a CSCD descriptor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// This logical unit, as a block device of its block size.
    ThisUnit,
    /// This logical unit, described as another peripheral device type.
    WrongType,
    /// Some other logical unit.
    Unreachable,
}

/// A block-to-block segment descriptor; `at` is its offset in the parameter list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    at: usize,
    src: u16,
    dst: u16,
    blocks: u16,
    src_lba: u64,
    dst_lba: u64,
}

/// A parsed, well-formed EXTENDED COPY (LID1) parameter list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyList {
    /// LIST IDENTIFIER.
    pub list_id: u8,
    /// LIST ID USAGE.
    pub usage: ListIdUsage,
    targets: Vec<Target>,
    segments: Vec<Segment>,
}

/// ILLEGAL REQUEST / INVALID FIELD IN PARAMETER LIST at byte `at` of the list.
fn invalid(at: usize) -> Sense {
    Sense::invalid_field_in_parameters(pointer(at))
}

/// Sense with `key`/`asc` and a field pointer to byte `at` of the parameter list (for COPY
/// ABORTED this is the segment pointer format with SD = 0, which has the same layout).
fn at_field(key: SenseKey, asc: Asc, at: usize) -> Sense {
    let mut sense = invalid(at);
    sense.key = key;
    sense.asc = asc;
    sense
}

fn illegal(asc: Asc, at: usize) -> Sense {
    at_field(SenseKey::IllegalRequest, asc, at)
}

fn aborted(asc: Asc, at: usize) -> Sense {
    at_field(SenseKey::CopyAborted, asc, at)
}

/// Offsets are bounded by the parameter list length, itself bounded by the header checks.
fn pointer(at: usize) -> u16 {
    u16::try_from(at).unwrap_or(u16::MAX)
}

impl CopyList {
    /// Parses a non-empty parameter list against this unit's geometry, checking every field the
    /// copy manager reads; the copy itself checks reachability and ranges, segment by segment.
    pub fn parse(params: &[u8], g: &Geometry) -> Result<Self, Sense> {
        let header = params
            .get(..HEADER_LEN)
            .ok_or(Sense::parameter_list_length())?;
        let list_id = header[0];
        let usage = match (header[1] >> 3) & 0x03 {
            0 => ListIdUsage::Hold,
            2 => ListIdUsage::Discard,
            3 if list_id == 0 => ListIdUsage::None,
            3 => return Err(invalid(0)),
            _ => return Err(invalid(1)),
        };
        let cscd_len = usize::from(be16(&header[2..4]));
        let segment_len = u64::from(be32(&header[8..12]));
        let inline_len = be32(&header[12..16]);
        if cscd_len as u64 + segment_len > u64::from(MAX_DESCRIPTOR_LIST_LENGTH) {
            return Err(Sense::parameter_list_length());
        }
        if inline_len > MAX_INLINE_DATA_LENGTH {
            return Err(illegal(Asc::INLINE_DATA_LENGTH_EXCEEDED, 12));
        }
        // Bounded by MAX_DESCRIPTOR_LIST_LENGTH above.
        let segment_len = segment_len as usize;
        let end = HEADER_LEN + cscd_len + segment_len + inline_len as usize;
        if end > params.len() {
            return Err(Sense::parameter_list_length());
        }
        let cscds = &params[HEADER_LEN..HEADER_LEN + cscd_len];
        let segments_at = HEADER_LEN + cscd_len;
        let segments = &params[segments_at..segments_at + segment_len];
        Ok(Self {
            list_id,
            usage,
            targets: parse_cscds(cscds, g)?,
            segments: parse_segments(segments, segments_at)?,
        })
    }

    /// Number of segment descriptors.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The unit a segment's CSCD descriptor ID names; `at` is the ID field's offset.
    fn target(&self, id: u16, at: usize) -> Result<(), Sense> {
        match self.targets.get(usize::from(id)) {
            Some(Target::ThisUnit) => Ok(()),
            Some(Target::WrongType) => Err(aborted(Asc::INCORRECT_COPY_TARGET_DEVICE_TYPE, at)),
            Some(Target::Unreachable) | None => {
                Err(aborted(Asc::COPY_TARGET_DEVICE_NOT_REACHABLE, at))
            }
        }
    }
}

fn parse_cscds(list: &[u8], g: &Geometry) -> Result<Vec<Target>, Sense> {
    if !list.len().is_multiple_of(CSCD_LEN) {
        return Err(invalid(2));
    }
    if list.len() / CSCD_LEN > usize::from(MAX_CSCD_DESCRIPTORS) {
        return Err(illegal(Asc::TOO_MANY_TARGET_DESCRIPTORS, 2));
    }
    list.chunks_exact(CSCD_LEN)
        .enumerate()
        .map(|(i, d)| {
            let at = HEADER_LEN + i * CSCD_LEN;
            match d[0] {
                CSCD_IDENTIFICATION => parse_identification(d, at, g),
                _ => Err(illegal(Asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE, at)),
            }
        })
        .collect()
}

/// An identification descriptor CSCD (32 bytes at `at`): byte 1 LU ID TYPE (ignored, SPC-4),
/// NUL (obsolete) and PERIPHERAL DEVICE TYPE; bytes 4..24 a designation descriptor; bytes
/// 28..32 the block device parameters (PAD, DISK BLOCK LENGTH).
fn parse_identification(d: &[u8], at: usize, g: &Geometry) -> Result<Target, Sense> {
    let designator_len = usize::from(d[7]);
    let Some(designator) = d
        .get(8..8 + designator_len)
        .filter(|_| designator_len <= 16)
    else {
        return Err(invalid(at + 7));
    };
    let code_set = d[4] & 0x0f;
    let association = (d[5] >> 4) & 0x03;
    let designator_type = d[5] & 0x0f;
    let ours = crate::inquiry::naa_designator(g);
    // Binary (1), logical unit association (0), NAA (3), equal to VPD page 0x83's.
    if (code_set, association, designator_type) != (1, 0, 3) || designator != ours {
        return Ok(Target::Unreachable);
    }
    if d[1] & 0x1f != 0 {
        return Ok(Target::WrongType);
    }
    if be(&d[29..32]) != u64::from(g.block_size) {
        return Err(invalid(at + 29));
    }
    Ok(Target::ThisUnit)
}

fn parse_segments(list: &[u8], base: usize) -> Result<Vec<Segment>, Sense> {
    let mut segments = Vec::new();
    let mut pos = 0;
    while pos < list.len() {
        let at = base + pos;
        if segments.len() >= usize::from(MAX_SEGMENT_DESCRIPTORS) {
            return Err(illegal(Asc::TOO_MANY_SEGMENT_DESCRIPTORS, 8));
        }
        // A descriptor running past the list's end contradicts SEGMENT DESCRIPTOR LIST LENGTH.
        let head = list.get(pos..pos + 4).ok_or(invalid(8))?;
        if head[0] != SEGMENT_BLOCK_TO_BLOCK {
            return Err(illegal(Asc::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE, at));
        }
        if be16(&head[2..4]) != B2B_DESCRIPTOR_LENGTH {
            return Err(invalid(at + 2));
        }
        let d = list.get(pos..pos + B2B_LEN).ok_or(invalid(8))?;
        let (src, dst) = (be16(&d[4..6]), be16(&d[6..8]));
        if src > MAX_CSCD_INDEX {
            return Err(invalid(at + 4));
        }
        if dst > MAX_CSCD_INDEX {
            return Err(invalid(at + 6));
        }
        // Byte 1's DC and CAT bits change nothing: source and destination are one unit with
        // one block size, so counts agree and no residue is left.
        segments.push(Segment {
            at,
            src,
            dst,
            blocks: be16(&d[10..12]),
            src_lba: be64(&d[12..20]),
            dst_lba: be64(&d[20..28]),
        });
        pos += B2B_LEN;
    }
    Ok(segments)
}

/// How far a copy has got: whole segments done and bytes written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Progress {
    segments: u16,
    bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Completed,
    Failed,
}

#[derive(Debug)]
struct Entry {
    nexus: Nexus,
    list_id: u8,
    /// Order of arrival, to evict the oldest finished entry and to find this one again.
    seq: u64,
    state: State,
    progress: Progress,
}

#[derive(Debug, Default)]
struct Lists {
    entries: Vec<Entry>,
    next_seq: u64,
}

/// The copy manager of one logical unit: runs EXTENDED COPY and answers RECEIVE COPY RESULTS,
/// keeping copy status per initiator port and list identifier.
#[derive(Debug, Default)]
pub struct CopyManager {
    lists: Mutex<Lists>,
}

impl CopyManager {
    /// A copy manager tracking no copies.
    pub fn new() -> Self {
        Self::default()
    }

    fn lists(&self) -> MutexGuard<'_, Lists> {
        // The table holds plain data that no panic leaves inconsistent.
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs an EXTENDED COPY (LID1) from `nexus` whose parameter list is `params` (exactly
    /// PARAMETER LIST LENGTH bytes; empty copies nothing).
    pub async fn extended_copy(
        &self,
        backend: &dyn BlockBackend,
        g: &Geometry,
        nexus: &Nexus,
        params: &[u8],
    ) -> Result<(), Sense> {
        if params.is_empty() {
            return Ok(());
        }
        let list = CopyList::parse(params, g)?;
        if g.read_only && !list.segments.is_empty() {
            return Err(Sense::write_protected());
        }
        let seq = self.begin(nexus, &list)?;
        let mut progress = Progress::default();
        let mut result = Ok(());
        for segment in &list.segments {
            result = copy_segment(backend, g, &list, segment, |bytes| {
                progress.bytes += bytes;
                self.update(seq, progress, State::Running);
            })
            .await;
            if result.is_err() {
                break;
            }
            progress.segments += 1;
        }
        let state = match result {
            Ok(()) => State::Completed,
            Err(_) => State::Failed,
        };
        self.update(seq, progress, state);
        result
    }

    /// Registers a copy whose LIST ID USAGE asks for tracking; `None` when it does not.
    fn begin(&self, nexus: &Nexus, list: &CopyList) -> Result<Option<u64>, Sense> {
        if list.usage == ListIdUsage::None {
            return Ok(None);
        }
        let mut lists = self.lists();
        let same = |e: &Entry| e.list_id == list.list_id && e.nexus == *nexus;
        if let Some(i) = lists.entries.iter().position(same) {
            if lists.entries[i].state == State::Running {
                return Err(illegal(Asc::OPERATION_IN_PROGRESS, 0));
            }
            // A new copy with the identifier discards the old one's status.
            lists.entries.remove(i);
        }
        if lists.entries.len() >= MAX_TRACKED_LISTS {
            let oldest = lists
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.state != State::Running)
                .min_by_key(|(_, e)| e.seq)
                .map(|(i, _)| i);
            let Some(i) = oldest else {
                return Err(Sense::new(
                    SenseKey::IllegalRequest,
                    Asc::INSUFFICIENT_RESOURCES,
                ));
            };
            lists.entries.remove(i);
        }
        let seq = lists.next_seq;
        lists.next_seq += 1;
        lists.entries.push(Entry {
            nexus: nexus.clone(),
            list_id: list.list_id,
            seq,
            state: State::Running,
            progress: Progress::default(),
        });
        Ok(Some(seq))
    }

    fn update(&self, seq: Option<u64>, progress: Progress, state: State) {
        let Some(seq) = seq else { return };
        let mut lists = self.lists();
        if let Some(e) = lists.entries.iter_mut().find(|e| e.seq == seq) {
            e.progress = progress;
            e.state = state;
        }
    }

    /// Answers RECEIVE COPY RESULTS with `service_action` (COPY STATUS for `list_id` from
    /// `nexus`, or OPERATING PARAMETERS); the data before clipping to the allocation length.
    pub fn receive(
        &self,
        g: &Geometry,
        nexus: &Nexus,
        service_action: u8,
        list_id: u8,
    ) -> Result<Vec<u8>, Sense> {
        match service_action {
            SA_COPY_STATUS => self.copy_status(nexus, list_id),
            SA_OPERATING_PARAMETERS => Ok(operating_parameters(g)),
            _ => Err(Sense::invalid_field_in_cdb(1)),
        }
    }

    /// COPY STATUS: a finished copy's status is reported once, then forgotten.
    fn copy_status(&self, nexus: &Nexus, list_id: u8) -> Result<Vec<u8>, Sense> {
        let mut lists = self.lists();
        let i = lists
            .entries
            .iter()
            .position(|e| e.list_id == list_id && e.nexus == *nexus)
            .ok_or(Sense::invalid_field_in_cdb(2))?;
        let (state, progress) = (lists.entries[i].state, lists.entries[i].progress);
        if state != State::Running {
            lists.entries.remove(i);
        }
        drop(lists);
        Ok(copy_status_data(state, progress))
    }

    /// Forgets the status of the finished copies of `nexus` (all initiators' when `None`), as
    /// an I_T nexus loss or logical unit reset does.
    pub fn forget(&self, nexus: Option<&Nexus>) {
        self.lists()
            .entries
            .retain(|e| e.state == State::Running || nexus.is_some_and(|n| e.nexus != *n));
    }
}

/// COPY STATUS parameter data (12 bytes): AVAILABLE DATA, HDD and COPY MANAGER STATUS,
/// SEGMENTS PROCESSED, TRANSFER COUNT UNITS and TRANSFER COUNT.
fn copy_status_data(state: State, progress: Progress) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    push_be(&mut out, 8, 4);
    out.push(match state {
        State::Running => STATUS_IN_PROGRESS,
        State::Completed => STATUS_COMPLETED,
        State::Failed => STATUS_FAILED,
    });
    push_be(&mut out, u64::from(progress.segments), 2);
    // Units 0 (bytes) to 6 (exbibytes): the smallest in which the count fits four bytes.
    let unit = (0u8..=6)
        .find(|u| progress.bytes >> (10 * u32::from(*u)) <= u64::from(u32::MAX))
        .unwrap_or(6);
    out.push(unit);
    push_be(&mut out, progress.bytes >> (10 * u32::from(unit)), 4);
    out
}

/// Largest segment in bytes: [`MAX_SEGMENT_BLOCKS`] blocks.
fn max_segment_bytes(g: &Geometry) -> u64 {
    (u64::from(MAX_SEGMENT_BLOCKS) * u64::from(g.block_size)).min(u64::from(u32::MAX))
}

/// log2 of the block size: every segment copies whole blocks.
fn data_segment_granularity(g: &Geometry) -> u8 {
    g.block_size.max(1).ilog2() as u8
}

/// OPERATING PARAMETERS parameter data (SPC-4 §6.18.4).
pub fn operating_parameters(g: &Geometry) -> Vec<u8> {
    let mut out = vec![0u8; 44];
    out[4] = 0x01; // SNLID: LIST ID USAGE 11b is supported
    put_be(&mut out[8..10], u64::from(MAX_CSCD_DESCRIPTORS));
    put_be(&mut out[10..12], u64::from(MAX_SEGMENT_DESCRIPTORS));
    put_be(&mut out[12..16], u64::from(MAX_DESCRIPTOR_LIST_LENGTH));
    put_be(&mut out[16..20], max_segment_bytes(g));
    put_be(&mut out[20..24], u64::from(MAX_INLINE_DATA_LENGTH));
    // HELD DATA LIMIT and MAXIMUM STREAM DEVICE TRANSFER SIZE: none held, no streams.
    put_be(&mut out[34..36], MAX_TRACKED_LISTS as u64);
    out[36] = MAX_TRACKED_LISTS as u8;
    out[37] = data_segment_granularity(g);
    out[43] = IMPLEMENTED_DESCRIPTORS.len() as u8;
    out.extend_from_slice(&IMPLEMENTED_DESCRIPTORS);
    let available = out.len() - 4;
    put_be(&mut out[0..4], available as u64);
    out
}

/// Appends a third-party copy descriptor: type, length, `body` padded to a multiple of four.
fn push_descriptor(out: &mut Vec<u8>, kind: u16, body: &[u8]) {
    let padded = body.len().next_multiple_of(4);
    push_be(out, u64::from(kind), 2);
    push_be(out, padded as u64, 2);
    out.extend_from_slice(body);
    out.resize(out.len() + padded - body.len(), 0);
}

/// The descriptors of the Third-party Copy VPD page (0x8F): Supported Commands, Parameter
/// Data, Supported Descriptors and General Copy Operations.
pub fn third_party_copy_descriptors(g: &Geometry) -> Vec<u8> {
    let mut out = Vec::new();
    // Supported Commands: each opcode with its list of service actions.
    let commands = [
        crate::cdb::op::EXTENDED_COPY,
        1,
        SA_EXTENDED_COPY_LID1,
        crate::cdb::op::RECEIVE_COPY_RESULTS,
        2,
        SA_COPY_STATUS,
        SA_OPERATING_PARAMETERS,
    ];
    let mut body = vec![commands.len() as u8];
    body.extend_from_slice(&commands);
    push_descriptor(&mut out, 0x0001, &body);
    // Parameter Data.
    let mut body = vec![0u8; 28];
    put_be(&mut body[4..6], u64::from(MAX_CSCD_DESCRIPTORS));
    put_be(&mut body[6..8], u64::from(MAX_SEGMENT_DESCRIPTORS));
    put_be(&mut body[8..12], u64::from(MAX_DESCRIPTOR_LIST_LENGTH));
    put_be(&mut body[12..16], u64::from(MAX_INLINE_DATA_LENGTH));
    push_descriptor(&mut out, 0x0004, &body);
    // Supported Descriptors.
    let mut body = vec![IMPLEMENTED_DESCRIPTORS.len() as u8];
    body.extend_from_slice(&IMPLEMENTED_DESCRIPTORS);
    push_descriptor(&mut out, 0x0008, &body);
    // General Copy Operations.
    let mut body = vec![0u8; 32];
    put_be(&mut body[0..4], MAX_TRACKED_LISTS as u64);
    put_be(&mut body[4..8], MAX_TRACKED_LISTS as u64);
    put_be(&mut body[8..12], max_segment_bytes(g));
    body[12] = data_segment_granularity(g);
    push_descriptor(&mut out, 0x8001, &body);
    out
}

/// Blocks per backend read and write.
fn chunk_blocks(g: &Geometry) -> u64 {
    let by_bytes = CHUNK_BYTES / g.block_size.max(1);
    u64::from(by_bytes.min(g.max_transfer_blocks).max(1))
}

/// The sense for a backend failure while copying segment `at`.
fn copy_failure(err: BackendError, at: usize) -> Sense {
    match err {
        BackendError::Read(_) => aborted(Asc::UNRECOVERED_READ_ERROR, at),
        BackendError::Write(_) => aborted(Asc::WRITE_ERROR, at),
        BackendError::NoSpace => aborted(Asc::INSUFFICIENT_RESOURCES, at),
        BackendError::ReadOnly => Sense::write_protected(),
    }
}

/// Copies one segment, calling `written` with the bytes of each chunk written.
async fn copy_segment(
    backend: &dyn BlockBackend,
    g: &Geometry,
    list: &CopyList,
    s: &Segment,
    mut written: impl FnMut(u64),
) -> Result<(), Sense> {
    list.target(s.src, s.at + 4)?;
    list.target(s.dst, s.at + 6)?;
    let n = u64::from(s.blocks);
    let fits = |lba: u64| lba.checked_add(n).is_some_and(|end| end <= g.block_count);
    // Beyond the copy target's capacity: the only additional sense codes SPC-4 and the
    // libiscsi conformance tests agree on carry no detail; the pointer names the LBA field.
    if !fits(s.src_lba) {
        return Err(aborted(Asc::NO_ADDITIONAL_SENSE, s.at + 12));
    }
    if !fits(s.dst_lba) {
        return Err(aborted(Asc::NO_ADDITIONAL_SENSE, s.at + 20));
    }
    let chunk = chunk_blocks(g);
    let bs = u64::from(g.block_size);
    // A destination overlapping the source from above is copied from the end, so every block
    // is read before it is overwritten.
    let backwards = s.dst_lba > s.src_lba && s.dst_lba < s.src_lba + n;
    let mut done = 0;
    while done < n {
        let len = (n - done).min(chunk);
        let offset = if backwards { n - done - len } else { done };
        let data = backend
            .read(s.src_lba + offset, len as u32)
            .await
            .map_err(|e| copy_failure(e, s.at))?;
        if data.len() as u64 != len * bs {
            return Err(aborted(Asc::UNRECOVERED_READ_ERROR, s.at));
        }
        backend
            .write(s.dst_lba + offset, bytes::Bytes::from(data))
            .await
            .map_err(|e| copy_failure(e, s.at))?;
        done += len;
        written(len * bs);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
