//! Command execution: one [`Lun`] over a [`BlockBackend`], answering decoded CDBs.
//!
//! The transport hands [`Lun::execute`] the CDB and the data-out buffer it collected and gets
//! back a [`Response`] (status, data-in, sense). Transport length mismatches (expected
//! transfer length versus what the CDB implies) are the transport's business; it can ask
//! [`data_out_len`] what a CDB needs.

use std::sync::Arc;

use bytes::Bytes;

use crate::backend::{BackendError, BlockBackend, CompareOutcome, Geometry, Provisioning};
use crate::cdb::{Cdb, Range};
use crate::nexus::Nexus;
use crate::pr::{Access, InAction, OutRequest, Refusal};
use crate::reservations::Reservations;
use crate::sense::{Asc, Sense, SenseKey, Status};
use crate::unit::UnitState;
use crate::wire::{be16, be32, be64, push_be};
use crate::xcopy::CopyManager;
use crate::{defect, inquiry, mode, opcodes};

/// Largest number of UNMAP block descriptors accepted in one command.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;
/// Largest number of blocks one UNMAP descriptor or WRITE SAME may cover.
pub const MAX_UNMAP_BLOCKS: u32 = 1 << 20;
/// Largest COMPARE AND WRITE, in blocks.
pub const MAX_COMPARE_AND_WRITE_BLOCKS: u8 = 64;

/// MAXIMUM WRITE SAME LENGTH (Block Limits VPD page): a WRITE SAME that writes data is bounded
/// by one transfer; zero blocks ("to the end of the medium") beyond this is refused.
pub fn max_write_same_blocks(g: &Geometry) -> u32 {
    MAX_UNMAP_BLOCKS.min(g.max_transfer_blocks)
}

/// The result of one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// SAM status.
    pub status: Status,
    /// Data-in bytes (already clipped to the allocation length).
    pub data: Vec<u8>,
    /// Sense data for CHECK CONDITION.
    pub sense: Option<Sense>,
}

impl Response {
    /// GOOD with data.
    pub fn good(data: Vec<u8>) -> Self {
        Self {
            status: Status::Good,
            data,
            sense: None,
        }
    }

    /// CHECK CONDITION with `sense`.
    pub fn check(sense: Sense) -> Self {
        Self {
            status: Status::CheckCondition,
            data: Vec::new(),
            sense: Some(sense),
        }
    }
}

type Outcome = Result<Vec<u8>, Sense>;

fn clip(mut data: Vec<u8>, alloc: u32) -> Vec<u8> {
    data.truncate(alloc as usize);
    data
}

fn backend_sense(err: BackendError) -> Sense {
    match err {
        BackendError::Read(_) => Sense::new(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR),
        BackendError::Write(_) => Sense::new(SenseKey::MediumError, Asc::WRITE_ERROR),
        BackendError::ReadOnly => Sense::write_protected(),
        BackendError::NoSpace => Sense::new(
            SenseKey::DataProtect,
            Asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        ),
    }
}

/// Bytes of data-out the command in `cdb` transfers with this block size, or `None` when the
/// CDB does not decode (the executor will report why).
pub fn data_out_len(cdb: &[u8], block_size: u32) -> Option<u64> {
    let bs = u64::from(block_size);
    Some(match Cdb::parse(cdb).ok()? {
        Cdb::Write { range, .. } | Cdb::OrWrite { range, .. } | Cdb::WriteAtomic { range, .. } => {
            u64::from(range.blocks) * bs
        }
        Cdb::WriteAndVerify { range, .. } => u64::from(range.blocks) * bs,
        Cdb::Verify { range, bytchk: 1 } => u64::from(range.blocks) * bs,
        Cdb::Verify { bytchk: 3, .. } => bs,
        Cdb::WriteSame { ndob: false, .. } => bs,
        Cdb::CompareAndWrite { blocks, .. } => 2 * u64::from(blocks) * bs,
        Cdb::ModeSelect { param_len, .. }
        | Cdb::Unmap { param_len }
        | Cdb::PersistentReserveOut { param_len, .. }
        | Cdb::ExtendedCopy { param_len } => u64::from(param_len),
        _ => 0,
    })
}

/// One logical unit.
pub struct Lun {
    backend: Arc<dyn BlockBackend>,
    reservations: Arc<Reservations>,
    unit: Arc<UnitState>,
    /// EXTENDED COPY status, per initiator port of this `Lun` object.
    copies: CopyManager,
}

/// The initiator port [`Lun::execute`] runs commands as.
fn local_nexus() -> Nexus {
    Nexus::iscsi("", [0; 6])
}

fn respond(outcome: Result<Vec<u8>, Refusal>) -> Response {
    match outcome {
        Ok(data) => Response::good(data),
        Err(Refusal::Check(sense)) => Response::check(sense),
        Err(Refusal::Conflict) => Response {
            status: Status::ReservationConflict,
            data: Vec::new(),
            sense: None,
        },
    }
}

impl std::fmt::Debug for Lun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lun").finish_non_exhaustive()
    }
}

impl Lun {
    /// A logical unit over `backend` with reservations of its own, which cannot persist
    /// through power loss.
    pub fn new(backend: Arc<dyn BlockBackend>) -> Self {
        Self::with_reservations(backend, Arc::new(Reservations::in_memory()))
    }

    /// A logical unit over `backend` sharing `reservations` (one per volume, whatever the
    /// number of sessions and `Lun` objects serving it).
    pub fn with_reservations(
        backend: Arc<dyn BlockBackend>,
        reservations: Arc<Reservations>,
    ) -> Self {
        Self::shared(backend, reservations, Arc::new(UnitState::new()))
    }

    /// A logical unit over `backend` sharing `reservations` and `unit` (its task set and unit
    /// attentions) with every other `Lun` object serving the same volume.
    pub fn shared(
        backend: Arc<dyn BlockBackend>,
        reservations: Arc<Reservations>,
        unit: Arc<UnitState>,
    ) -> Self {
        Self {
            backend,
            reservations,
            unit,
            copies: CopyManager::new(),
        }
    }

    /// The unit's reservations.
    pub fn reservations(&self) -> &Arc<Reservations> {
        &self.reservations
    }

    /// The unit's task set and unit attentions.
    pub fn unit(&self) -> &Arc<UnitState> {
        &self.unit
    }

    /// LOGICAL UNIT RESET (SAM-5 §6.3.3): aborts every task of the unit, from any nexus,
    /// establishes the unit attention BUS DEVICE RESET FUNCTION OCCURRED for every nexus,
    /// releases an SPC-2 reservation (persistent ones stay), discards held EXTENDED COPY
    /// status, and returns once the aborted tasks are gone.
    pub async fn reset(&self) {
        self.unit.reset(Some(Asc::BUS_DEVICE_RESET)).await;
        self.reservations.reset();
        self.copies.forget(None);
    }

    /// A unit attention pending for `nexus` that this command reports instead of running
    /// (SPC-4 §5.14 with UA_INTLCK_CTRL 00b): INQUIRY and REPORT LUNS run and leave it
    /// pending; REQUEST SENSE returns it as its data; every other command is terminated with
    /// it.
    fn unit_attention(&self, nexus: &Nexus, cdb: &[u8]) -> Option<Response> {
        const REQUEST_SENSE: u8 = 0x03;
        const INQUIRY: u8 = 0x12;
        const REPORT_LUNS: u8 = 0xa0;
        match *cdb.first()? {
            INQUIRY | REPORT_LUNS => None,
            REQUEST_SENSE => {
                let Ok(Cdb::RequestSense { descriptor, alloc }) = Cdb::parse(cdb) else {
                    return None;
                };
                let asc = self.unit.take_attention(nexus)?;
                let sense = Sense::new(SenseKey::UnitAttention, asc);
                Some(Response::good(request_sense(sense, descriptor, alloc)))
            }
            _ => {
                let asc = self.unit.take_attention(nexus)?;
                Some(Response::check(Sense::new(SenseKey::UnitAttention, asc)))
            }
        }
    }

    /// The backend's geometry.
    pub fn geometry(&self) -> Geometry {
        self.backend.geometry()
    }

    /// The logical block size ([`BlockBackend::block_size`]).
    pub fn block_size(&self) -> u32 {
        self.backend.block_size()
    }

    /// Executes a WRITE or WRITE AND VERIFY truncated to the whole blocks of `data_out`,
    /// for a transport whose expected transfer length is shorter than the CDB asks (FCP-4
    /// and iSCSI: process the command without transferring data beyond that length).
    pub async fn execute_truncated_write(&self, cdb: &[u8], data_out: &[u8]) -> Response {
        self.execute_truncated_write_as(&local_nexus(), cdb, data_out)
            .await
    }

    /// [`Lun::execute_truncated_write`] for a command from the initiator port `nexus`.
    pub async fn execute_truncated_write_as(
        &self,
        nexus: &Nexus,
        cdb: &[u8],
        data_out: &[u8],
    ) -> Response {
        if let Some(attention) = self.unit_attention(nexus, cdb) {
            return attention;
        }
        let g = self.backend.geometry();
        let parsed = match Cdb::parse(cdb) {
            Ok(Cdb::Write { range, .. } | Cdb::WriteAndVerify { range, .. }) => {
                let blocks = (data_out.len() as u64 / u64::from(g.block_size.max(1))) as u32;
                let range = Range {
                    lba: range.lba,
                    blocks: blocks.min(range.blocks),
                };
                Cdb::Write { range, fua: false }
            }
            Ok(_) => return Response::check(Sense::invalid_field_in_cdb(0)),
            Err(sense) => return Response::check(sense),
        };
        let data_out = Bytes::copy_from_slice(data_out);
        respond(self.run(&g, nexus, parsed, &data_out).await)
    }

    /// Executes one command from the initiator port `nexus`. `data_out` holds the data-out
    /// buffer (at least what the CDB needs, see [`data_out_len`]; extra bytes are ignored).
    pub async fn execute_as(&self, nexus: &Nexus, cdb: &[u8], data_out: &[u8]) -> Response {
        self.execute_owned(nexus, cdb, Bytes::copy_from_slice(data_out))
            .await
    }

    /// [`Lun::execute_as`] taking the data-out buffer over: a write hands (a slice of) it to
    /// the backend without copying.
    pub async fn execute_owned(&self, nexus: &Nexus, cdb: &[u8], data_out: Bytes) -> Response {
        if let Some(attention) = self.unit_attention(nexus, cdb) {
            return attention;
        }
        let geometry = self.backend.geometry();
        match Cdb::parse(cdb) {
            Ok(parsed) => respond(self.run(&geometry, nexus, parsed, &data_out).await),
            Err(sense) => Response::check(sense),
        }
    }

    /// [`Lun::execute_as`] from an initiator port with an empty name.
    pub async fn execute(&self, cdb: &[u8], data_out: &[u8]) -> Response {
        self.execute_as(&local_nexus(), cdb, data_out).await
    }

    /// Checks the command against the reservations, then executes it.
    async fn run(
        &self,
        g: &Geometry,
        nexus: &Nexus,
        cdb: Cdb,
        data_out: &Bytes,
    ) -> Result<Vec<u8>, Refusal> {
        self.reservations.check(nexus, Access::of(&cdb))?;
        let pr = &self.reservations;
        match cdb {
            Cdb::PersistentReserveIn {
                service_action,
                alloc,
            } => {
                let action = InAction::from_code(service_action)?;
                Ok(clip(pr.snapshot().read(action), alloc))
            }
            Cdb::PersistentReserveOut {
                service_action,
                scope_type,
                param_len,
            } => {
                if param_len != crate::pr::PROUT_PARAM_LEN {
                    return Err(Sense::parameter_list_length().into());
                }
                let params = need(data_out, param_len)?;
                let req = OutRequest::parse(service_action, scope_type, params)?;
                pr.change(|s| s.out(nexus, &req)).await.map(|()| Vec::new())
            }
            Cdb::Reserve => pr
                .change(|s| s.legacy_reserve(nexus))
                .await
                .map(|()| Vec::new()),
            Cdb::Release => pr
                .change(|s| s.legacy_release(nexus))
                .await
                .map(|()| Vec::new()),
            Cdb::ExtendedCopy { param_len } => {
                let params = need(data_out, param_len)?;
                let backend = self.backend.as_ref();
                self.copies.extended_copy(backend, g, nexus, params).await?;
                Ok(Vec::new())
            }
            Cdb::ReceiveCopyResults {
                service_action,
                list_id,
                alloc,
            } => {
                let data = self.copies.receive(g, nexus, service_action, list_id)?;
                Ok(clip(data, alloc))
            }
            other => Ok(self.run_medium(g, other, data_out).await?),
        }
    }

    async fn run_medium(&self, g: &Geometry, cdb: Cdb, data_out: &Bytes) -> Outcome {
        match cdb {
            Cdb::TestUnitReady | Cdb::PreventAllow { .. } => Ok(Vec::new()),
            Cdb::StartStopUnit { .. } => Ok(Vec::new()),
            Cdb::RequestSense { descriptor, alloc } => {
                let none = Sense::new(SenseKey::NoSense, Asc::NO_ADDITIONAL_SENSE);
                Ok(request_sense(none, descriptor, alloc))
            }
            Cdb::Inquiry { evpd, page, alloc } => {
                inquiry::inquiry(g, evpd, page).map(|d| clip(d, alloc))
            }
            Cdb::ModeSense { .. } => mode::sense(g, &cdb),
            Cdb::ModeSelect {
                ten,
                pf,
                save,
                param_len,
            } => mode::select(g, ten, pf, save, need(data_out, param_len)?),
            Cdb::ReadCapacity10 { pmi, lba } => read_capacity_10(g, pmi, lba),
            Cdb::ReadCapacity16 { alloc } => Ok(clip(read_capacity_16(g), alloc)),
            Cdb::Read { range, .. } => self.read(g, range).await,
            Cdb::Write { range, .. } => self.write(g, range, data_out).await,
            Cdb::WriteAndVerify { range, .. } => self.write(g, range, data_out).await,
            Cdb::Verify { range, bytchk } => self.verify(g, range, bytchk, data_out).await,
            Cdb::SynchronizeCache { range, .. } => {
                check_range(g, range)?;
                self.backend.flush().await.map_err(backend_sense)?;
                Ok(Vec::new())
            }
            Cdb::PreFetch { range, .. } => check_range(g, range).map(|()| Vec::new()),
            Cdb::WriteSame { range, unmap, ndob } => {
                self.write_same(g, range, unmap, ndob, data_out).await
            }
            Cdb::Unmap { param_len } => self.unmap(g, need(data_out, param_len)?).await,
            Cdb::GetLbaStatus { lba, alloc } => self.get_lba_status(g, lba, alloc).await,
            Cdb::CompareAndWrite { lba, blocks, .. } => {
                self.compare_and_write(g, lba, blocks, data_out).await
            }
            Cdb::OrWrite { range, .. } => self.or_write(g, range, data_out).await,
            Cdb::WriteAtomic {
                range, boundary, ..
            } => self.write_atomic(g, range, boundary, data_out).await,
            Cdb::ReadDefectData {
                twelve,
                plist,
                glist,
                format,
                alloc,
                ..
            } => defect::read_defect_data(twelve, plist, glist, format).map(|d| clip(d, alloc)),
            Cdb::ReportLuns { select, alloc } => report_luns(select, alloc),
            Cdb::ReportSupportedOpcodes { .. } => opcodes::report(&cdb),
            // Reservation and copy commands are answered by `run`, before this.
            Cdb::Unsupported { .. }
            | Cdb::PersistentReserveIn { .. }
            | Cdb::PersistentReserveOut { .. }
            | Cdb::Reserve
            | Cdb::Release
            | Cdb::ExtendedCopy { .. }
            | Cdb::ReceiveCopyResults { .. } => Err(Sense::invalid_opcode()),
        }
    }

    async fn read(&self, g: &Geometry, range: Range) -> Outcome {
        check_transfer(g, range)?;
        if range.blocks == 0 {
            return Ok(Vec::new());
        }
        self.backend
            .read(range.lba, range.blocks)
            .await
            .map_err(backend_sense)
    }

    async fn write(&self, g: &Geometry, range: Range, data_out: &Bytes) -> Outcome {
        if let Some(data) = write_data(g, range, data_out)? {
            self.backend
                .write(range.lba, data_out.slice_ref(data))
                .await
                .map_err(backend_sense)?;
        }
        Ok(Vec::new())
    }

    async fn verify(&self, g: &Geometry, range: Range, bytchk: u8, data_out: &[u8]) -> Outcome {
        check_transfer(g, range)?;
        if bytchk == 0 || range.blocks == 0 {
            return Ok(Vec::new());
        }
        let bs = g.block_size as usize;
        let current = self
            .backend
            .read(range.lba, range.blocks)
            .await
            .map_err(backend_sense)?;
        let expected_len = if bytchk == 1 { current.len() } else { bs };
        let expected = need(data_out, expected_len as u32)?;
        let mismatch = current
            .chunks(expected.len())
            .enumerate()
            .find_map(|(i, chunk)| {
                first_difference(chunk, expected).map(|o| i * expected.len() + o)
            });
        match mismatch {
            Some(offset) => Err(Sense::miscompare(offset as u64)),
            None => Ok(Vec::new()),
        }
    }

    async fn write_same(
        &self,
        g: &Geometry,
        range: Range,
        unmap: bool,
        ndob: bool,
        data_out: &[u8],
    ) -> Outcome {
        let range = write_same_range(g, range)?;
        check_writable(g)?;
        let bs = g.block_size as usize;
        let block = if ndob {
            vec![0u8; bs]
        } else {
            need(data_out, bs as u32)?.to_vec()
        };
        // SBC-3 5.42/5.43: with UNMAP set the device server may unmap each LBA instead of
        // writing the block to it; unmapped blocks read as zeros (LBPRZ). One trim covers the
        // whole range, however long. NDOB's block is zeros, which an unmap gives as well.
        if (unmap || ndob) && g.can_unmap {
            return self
                .backend
                .unmap(range.lba, u64::from(range.blocks))
                .await
                .map(|()| Vec::new())
                .map_err(backend_sense);
        }
        let chunk_blocks = (1u32 << 20) / g.block_size.max(1);
        let mut lba = range.lba;
        let end = range.lba + u64::from(range.blocks);
        while lba < end {
            let n = (end - lba).min(u64::from(chunk_blocks.max(1)));
            let data = block.repeat(n as usize);
            self.backend
                .write(lba, Bytes::from(data))
                .await
                .map_err(backend_sense)?;
            lba += n;
        }
        Ok(Vec::new())
    }

    /// ORWRITE(16): the backend ORs the data-out into the blocks atomically.
    async fn or_write(&self, g: &Geometry, range: Range, data_out: &[u8]) -> Outcome {
        if let Some(data) = write_data(g, range, data_out)? {
            self.backend
                .or_write(range.lba, data)
                .await
                .map_err(backend_sense)?;
        }
        Ok(Vec::new())
    }

    /// WRITE ATOMIC(16) (SBC-4 5.48): a write the backend performs as one unit, refused when
    /// longer than the Block Limits page promises. Atomic boundaries are not supported (their
    /// limits are reported as zero), so a nonzero ATOMIC BOUNDARY is an invalid field.
    async fn write_atomic(
        &self,
        g: &Geometry,
        range: Range,
        boundary: u16,
        data_out: &Bytes,
    ) -> Outcome {
        if g.max_atomic_blocks == 0 {
            return Err(Sense::invalid_opcode());
        }
        check_range(g, range)?;
        if boundary != 0 {
            return Err(Sense::invalid_field_in_cdb(10));
        }
        if range.blocks > g.max_atomic_blocks {
            return Err(Sense::invalid_field_in_cdb(12));
        }
        self.write(g, range, data_out).await
    }

    async fn unmap(&self, g: &Geometry, params: &[u8]) -> Outcome {
        if !g.can_unmap {
            return Err(Sense::invalid_opcode());
        }
        check_writable(g)?;
        let extents = parse_unmap(g, params)?;
        for (lba, blocks) in extents {
            self.backend
                .unmap(lba, u64::from(blocks))
                .await
                .map_err(backend_sense)?;
        }
        Ok(Vec::new())
    }

    async fn get_lba_status(&self, g: &Geometry, lba: u64, alloc: u32) -> Outcome {
        if lba >= g.block_count {
            return Err(Sense::lba_out_of_range());
        }
        let (state, run) = self.backend.lba_status(lba).await.map_err(backend_sense)?;
        let run = run.clamp(1, u64::from(u32::MAX));
        let mut out = Vec::with_capacity(24);
        push_be(&mut out, 20, 4);
        push_be(&mut out, 0, 4);
        push_be(&mut out, lba, 8);
        push_be(&mut out, run, 4);
        out.push(match state {
            Provisioning::Mapped => 0,
            Provisioning::Deallocated => 1,
        });
        out.extend_from_slice(&[0, 0, 0]);
        Ok(clip(out, alloc))
    }

    async fn compare_and_write(&self, g: &Geometry, lba: u64, blocks: u8, data: &[u8]) -> Outcome {
        if blocks > MAX_COMPARE_AND_WRITE_BLOCKS {
            return Err(Sense::invalid_field_in_cdb(13));
        }
        let range = Range {
            lba,
            blocks: u32::from(blocks),
        };
        check_range(g, range)?;
        if blocks == 0 {
            return Ok(Vec::new());
        }
        check_writable(g)?;
        let half = usize::from(blocks) * g.block_size as usize;
        let both = need(data, 2 * half as u32)?;
        let (expected, new) = both.split_at(half);
        match self
            .backend
            .compare_and_write(lba, expected, new)
            .await
            .map_err(backend_sense)?
        {
            CompareOutcome::Written => Ok(Vec::new()),
            CompareOutcome::Mismatch { offset } => Err(Sense::miscompare(offset)),
        }
    }
}

/// Checks a block write (range, transfer limit, write protection) and returns its data-out,
/// or `None` for zero blocks (nothing to do).
fn write_data<'a>(
    g: &Geometry,
    range: Range,
    data_out: &'a [u8],
) -> Result<Option<&'a [u8]>, Sense> {
    check_transfer(g, range)?;
    check_writable(g)?;
    if range.blocks == 0 {
        return Ok(None);
    }
    let len = u64::from(range.blocks) * u64::from(g.block_size);
    need(data_out, len as u32).map(Some)
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// The first `len` bytes of the data-out buffer, or PARAMETER LIST LENGTH ERROR if the
/// transport delivered fewer.
fn need(data: &[u8], len: u32) -> Result<&[u8], Sense> {
    data.get(..len as usize)
        .ok_or(Sense::parameter_list_length())
}

fn check_range(g: &Geometry, range: Range) -> Result<(), Sense> {
    match range.lba.checked_add(u64::from(range.blocks)) {
        Some(end) if end <= g.block_count => Ok(()),
        _ => Err(Sense::lba_out_of_range()),
    }
}

fn check_transfer(g: &Geometry, range: Range) -> Result<(), Sense> {
    check_range(g, range)?;
    if range.blocks > g.max_transfer_blocks {
        return Err(Sense::invalid_field_in_cdb(7));
    }
    Ok(())
}

/// The blocks a WRITE SAME covers. WSNZ is clear in the Block Limits page, so zero blocks means
/// from the LBA to the end of the medium (SBC-3 5.42); more than the maximum write same length
/// is refused with INVALID FIELD IN CDB.
fn write_same_range(g: &Geometry, range: Range) -> Result<Range, Sense> {
    let blocks = if range.blocks == 0 {
        if range.lba >= g.block_count {
            return Err(Sense::lba_out_of_range());
        }
        g.block_count - range.lba
    } else {
        u64::from(range.blocks)
    };
    if range
        .lba
        .checked_add(blocks)
        .is_none_or(|end| end > g.block_count)
    {
        return Err(Sense::lba_out_of_range());
    }
    if blocks > u64::from(max_write_same_blocks(g)) {
        return Err(Sense::invalid_field_in_cdb(7));
    }
    Ok(Range {
        lba: range.lba,
        blocks: blocks as u32,
    })
}

fn check_writable(g: &Geometry) -> Result<(), Sense> {
    if g.read_only {
        return Err(Sense::write_protected());
    }
    Ok(())
}

/// REQUEST SENSE data. Sense is returned with each failed command (autosense), so only a
/// unit attention is ever pending; otherwise `sense` is NO SENSE.
fn request_sense(sense: Sense, descriptor: bool, alloc: u32) -> Vec<u8> {
    let data = if descriptor {
        sense.to_descriptor()
    } else {
        sense.to_fixed().to_vec()
    };
    clip(data, alloc)
}

fn read_capacity_10(g: &Geometry, pmi: bool, lba: u32) -> Outcome {
    if !pmi && lba != 0 {
        return Err(Sense::invalid_field_in_cdb(2));
    }
    let last = g.block_count.saturating_sub(1).min(u64::from(u32::MAX));
    let mut out = Vec::with_capacity(8);
    push_be(&mut out, last, 4);
    push_be(&mut out, u64::from(g.block_size), 4);
    Ok(out)
}

fn read_capacity_16(g: &Geometry) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    push_be(&mut out, g.block_count.saturating_sub(1), 8);
    push_be(&mut out, u64::from(g.block_size), 4);
    out.push(0); // no protection
    out.push(g.physical_block_exponent() & 0x0f);
    // LBPME and LBPRZ: unmapped blocks read as zeros. Lowest aligned LBA 0.
    out.push(if g.can_unmap { 0xc0 } else { 0 });
    out.push(0);
    out.resize(32, 0);
    out
}

fn report_luns(select: u8, alloc: u32) -> Outcome {
    let luns: u64 = match select {
        0x00 | 0x02 => 1,
        0x01 | 0x10 | 0x11 => 0,
        0x12 => 1,
        _ => return Err(Sense::invalid_field_in_cdb(2)),
    };
    let mut out = Vec::with_capacity(16);
    push_be(&mut out, luns * 8, 4);
    push_be(&mut out, 0, 4);
    out.resize(8 + luns as usize * 8, 0);
    Ok(clip(out, alloc))
}

/// Parses an UNMAP parameter list into `(lba, blocks)` extents, checking every one.
fn parse_unmap(g: &Geometry, params: &[u8]) -> Result<Vec<(u64, u32)>, Sense> {
    if params.is_empty() {
        return Ok(Vec::new());
    }
    if params.len() < 8 {
        return Err(Sense::parameter_list_length());
    }
    let data_len = usize::from(be16(&params[0..2]));
    let desc_len = usize::from(be16(&params[2..4]));
    if data_len + 2 > params.len() || desc_len + 8 > params.len() || desc_len % 16 != 0 {
        return Err(Sense::parameter_list_length());
    }
    if desc_len / 16 > MAX_UNMAP_DESCRIPTORS as usize {
        return Err(Sense::invalid_field_in_parameters(2));
    }
    let mut extents = Vec::with_capacity(desc_len / 16);
    for (i, d) in params[8..8 + desc_len].chunks_exact(16).enumerate() {
        let lba = be64(&d[0..8]);
        let blocks = be32(&d[8..12]);
        if blocks > MAX_UNMAP_BLOCKS {
            return Err(Sense::invalid_field_in_parameters((8 + i * 16 + 8) as u16));
        }
        check_range(g, Range { lba, blocks })?;
        extents.push((lba, blocks));
    }
    Ok(extents)
}

#[cfg(test)]
mod tests;
