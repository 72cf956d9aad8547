//! Reservations (SPC-4 §5.9 persistent reservations, SPC-2 §5.5.1 RESERVE/RELEASE) as a
//! sans-I/O state machine: [`PrState`] takes a decoded request and the initiator port it came
//! from and changes itself or answers with the sense (or RESERVATION CONFLICT) to return.
//!
//! One target port, so every reservation has logical-unit scope and ALL_TG_PT and SPEC_I_PT
//! are refused (REPORT CAPABILITIES says so). Unit attentions to other registrants are not
//! raised (the executor raises none at all). PREEMPT AND ABORT preempts like PREEMPT: tasks
//! of the preempted initiators in other sessions are not aborted.

use std::collections::BTreeMap;

use crate::cdb::Cdb;
use crate::nexus::Nexus;
use crate::sense::{Asc, Sense, SenseKey};
use crate::wire::{be64, push_be};

/// Largest number of registrations kept; a REGISTER beyond it gets INSUFFICIENT RESOURCES.
pub const MAX_REGISTRATIONS: usize = 1024;
/// PERSISTENT RESERVE OUT parameter list length (without SPEC_I_PT).
pub const PROUT_PARAM_LEN: u32 = 24;

/// A persistent reservation type (SPC-4 table 170).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum PrType {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

impl PrType {
    /// The type a TYPE field holds, if valid.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::WriteExclusive,
            3 => Self::ExclusiveAccess,
            5 => Self::WriteExclusiveRegistrantsOnly,
            6 => Self::ExclusiveAccessRegistrantsOnly,
            7 => Self::WriteExclusiveAllRegistrants,
            8 => Self::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// The TYPE code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Every registrant holds the reservation.
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            Self::WriteExclusiveAllRegistrants | Self::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants (not only the holder) may access the medium.
    fn registrants_access(self) -> bool {
        !matches!(self, Self::WriteExclusive | Self::ExclusiveAccess)
    }

    /// Reads by initiators without access conflict too.
    fn excludes_reads(self) -> bool {
        matches!(
            self,
            Self::ExclusiveAccess
                | Self::ExclusiveAccessRegistrantsOnly
                | Self::ExclusiveAccessAllRegistrants
        )
    }
}

/// How a command is treated in the presence of a reservation (SPC-4 table 63, SBC-3 table 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Allowed whatever the reservation (INQUIRY, REPORT LUNS, PR IN, ...).
    Always,
    /// Reads the medium: allowed under Write Exclusive types.
    Read,
    /// Changes the medium or the unit's state: allowed only to initiators with access.
    Write,
    /// PERSISTENT RESERVE OUT: checked by its service action; conflicts with a legacy reservation.
    PersistentReserveOut,
    /// RESERVE(6/10) and RELEASE(6/10): conflict with any registration.
    Legacy,
}

impl Access {
    /// The class of a decoded command.
    pub fn of(cdb: &Cdb) -> Self {
        match *cdb {
            Cdb::TestUnitReady
            | Cdb::RequestSense { .. }
            | Cdb::Inquiry { .. }
            | Cdb::ReadCapacity10 { .. }
            | Cdb::ReadCapacity16 { .. }
            | Cdb::ReportLuns { .. }
            | Cdb::ReportSupportedOpcodes { .. }
            | Cdb::PersistentReserveIn { .. }
            | Cdb::Unsupported { .. } => Self::Always,
            Cdb::PreventAllow { prevent: 0 } => Self::Always,
            Cdb::StartStopUnit {
                start: true,
                power_condition: 0,
                loej: false,
                ..
            } => Self::Always,
            Cdb::Read { .. }
            | Cdb::Verify { .. }
            | Cdb::PreFetch { .. }
            | Cdb::GetLbaStatus { .. }
            | Cdb::ReadDefectData { .. }
            | Cdb::ReceiveCopyResults { .. } => Self::Read,
            Cdb::PersistentReserveOut { .. } => Self::PersistentReserveOut,
            Cdb::Reserve | Cdb::Release => Self::Legacy,
            Cdb::Write { .. }
            | Cdb::WriteAndVerify { .. }
            | Cdb::WriteSame { .. }
            | Cdb::Unmap { .. }
            | Cdb::CompareAndWrite { .. }
            | Cdb::OrWrite { .. }
            | Cdb::WriteAtomic { .. }
            | Cdb::ExtendedCopy { .. }
            | Cdb::SynchronizeCache { .. }
            | Cdb::ModeSelect { .. }
            | Cdb::ModeSense { .. }
            | Cdb::PreventAllow { .. }
            | Cdb::StartStopUnit { .. } => Self::Write,
        }
    }
}

/// A persistent reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The initiator port that reserved (for all-registrants types, every registrant holds it).
    pub holder: Nexus,
    /// Its type.
    pub kind: PrType,
}

/// PERSISTENT RESERVE OUT service actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum OutAction {
    Register,
    Reserve,
    Release,
    Clear,
    Preempt,
    PreemptAndAbort,
    RegisterAndIgnore,
}

impl OutAction {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::Register,
            1 => Self::Reserve,
            2 => Self::Release,
            3 => Self::Clear,
            4 => Self::Preempt,
            5 => Self::PreemptAndAbort,
            6 => Self::RegisterAndIgnore,
            _ => return None,
        })
    }
}

/// A decoded PERSISTENT RESERVE OUT command with its parameter list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutRequest {
    /// The service action.
    pub action: OutAction,
    /// The TYPE field (checked by RESERVE, RELEASE and PREEMPT only).
    pub type_code: u8,
    /// RESERVATION KEY.
    pub key: u64,
    /// SERVICE ACTION RESERVATION KEY.
    pub sa_key: u64,
    /// APTPL: persist through power loss (REGISTER and REGISTER AND IGNORE EXISTING KEY).
    pub aptpl: bool,
}

impl OutRequest {
    /// Decodes the CDB fields and the parameter list (`params` at least `param_len` bytes).
    pub fn parse(service_action: u8, scope_type: u8, params: &[u8]) -> Result<Self, Sense> {
        let action = OutAction::from_code(service_action).ok_or(Sense::invalid_field_in_cdb(1))?;
        if params.len() < PROUT_PARAM_LEN as usize {
            return Err(Sense::parameter_list_length());
        }
        let flags = params[20];
        if flags & 0x08 != 0 {
            return Err(Sense::invalid_field_in_parameters(20)); // SPEC_I_PT
        }
        if flags & 0x04 != 0 {
            return Err(Sense::invalid_field_in_parameters(20)); // ALL_TG_PT
        }
        let needs_type = matches!(
            action,
            OutAction::Reserve
                | OutAction::Release
                | OutAction::Preempt
                | OutAction::PreemptAndAbort
        );
        if needs_type && scope_type >> 4 != 0 {
            return Err(Sense::invalid_field_in_cdb(2)); // only LU_SCOPE
        }
        Ok(Self {
            action,
            type_code: scope_type & 0x0f,
            key: be64(&params[0..8]),
            sa_key: be64(&params[8..16]),
            aptpl: flags & 0x01 != 0,
        })
    }

    fn kind(&self) -> Result<PrType, Sense> {
        PrType::from_code(self.type_code).ok_or(Sense::invalid_field_in_cdb(2))
    }
}

/// PERSISTENT RESERVE IN service actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InAction {
    /// READ KEYS.
    ReadKeys,
    /// READ RESERVATION.
    ReadReservation,
    /// REPORT CAPABILITIES.
    ReportCapabilities,
    /// READ FULL STATUS.
    ReadFullStatus,
}

impl InAction {
    /// The service action a code names.
    pub fn from_code(code: u8) -> Result<Self, Sense> {
        Ok(match code {
            0 => Self::ReadKeys,
            1 => Self::ReadReservation,
            2 => Self::ReportCapabilities,
            3 => Self::ReadFullStatus,
            _ => return Err(Sense::invalid_field_in_cdb(1)),
        })
    }
}

/// Why a command may not run: the status to return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// RESERVATION CONFLICT, no sense data.
    Conflict,
    /// CHECK CONDITION with this sense.
    Check(Sense),
}

impl From<Sense> for Refusal {
    fn from(s: Sense) -> Self {
        Self::Check(s)
    }
}

/// Registrations and reservations of one logical unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrState {
    /// PRGENERATION.
    pub generation: u32,
    /// Registered initiator ports and their keys.
    pub registrations: BTreeMap<Nexus, u64>,
    /// The persistent reservation, if any.
    pub reservation: Option<Reservation>,
    /// Activate persist through power loss: the state is to be kept across restarts.
    pub aptpl: bool,
    /// The SPC-2 RESERVE holder (never persisted: it ends with a restart).
    pub legacy: Option<Nexus>,
    /// The unit may keep state through power loss (REPORT CAPABILITIES PTPL_C).
    pub ptpl_capable: bool,
}

impl PrState {
    /// An empty state; `ptpl_capable` when the owner can persist it.
    pub fn new(ptpl_capable: bool) -> Self {
        Self {
            ptpl_capable,
            ..Self::default()
        }
    }

    /// Anything that can make a command conflict.
    pub fn is_active(&self) -> bool {
        self.reservation.is_some() || self.legacy.is_some() || !self.registrations.is_empty()
    }

    /// A reservation exists that denies writes to an initiator that is not registered (every
    /// persistent type does, and a legacy reservation does).
    pub fn excludes_unregistered_writers(&self) -> bool {
        self.reservation.is_some() || self.legacy.is_some()
    }

    /// A reservation exists that denies reads to an initiator that is not registered.
    pub fn excludes_unregistered_readers(&self) -> bool {
        self.legacy.is_some()
            || self
                .reservation
                .as_ref()
                .is_some_and(|r| r.kind.excludes_reads())
    }

    fn key_of(&self, nexus: &Nexus) -> Option<u64> {
        self.registrations.get(nexus).copied()
    }

    /// `nexus` holds the persistent reservation.
    pub fn is_holder(&self, nexus: &Nexus) -> bool {
        match &self.reservation {
            Some(r) if r.kind.all_registrants() => self.registrations.contains_key(nexus),
            Some(r) => &r.holder == nexus,
            None => false,
        }
    }

    /// Whether a command of class `access` from `nexus` may run.
    pub fn check(&self, nexus: &Nexus, access: Access) -> Result<(), Refusal> {
        if let Some(holder) = &self.legacy {
            return match access {
                _ if holder == nexus => Ok(()),
                Access::Always | Access::Legacy => Ok(()),
                _ => Err(Refusal::Conflict),
            };
        }
        if access == Access::Legacy && !self.registrations.is_empty() {
            return Err(Refusal::Conflict);
        }
        let Some(r) = &self.reservation else {
            return Ok(());
        };
        if self.is_holder(nexus) {
            return Ok(());
        }
        let registered = self.registrations.contains_key(nexus);
        let allowed = match access {
            Access::Always | Access::PersistentReserveOut | Access::Legacy => true,
            _ if registered && r.kind.registrants_access() => true,
            Access::Read => !r.kind.excludes_reads(),
            Access::Write => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(Refusal::Conflict)
        }
    }

    /// RESERVE(6/10) from `nexus`.
    pub fn legacy_reserve(&mut self, nexus: &Nexus) -> Result<(), Refusal> {
        self.check(nexus, Access::Legacy)?;
        if self.reservation.is_some() {
            return Err(Refusal::Conflict);
        }
        match &self.legacy {
            Some(holder) if holder != nexus => Err(Refusal::Conflict),
            _ => {
                self.legacy = Some(nexus.clone());
                Ok(())
            }
        }
    }

    /// RELEASE(6/10) from `nexus`: releases only its own reservation, else does nothing.
    pub fn legacy_release(&mut self, nexus: &Nexus) -> Result<(), Refusal> {
        self.check(nexus, Access::Legacy)?;
        if self.legacy.as_ref() == Some(nexus) {
            self.legacy = None;
        }
        Ok(())
    }

    /// The I_T nexus is gone (logout, connection loss) or its logical unit was reset: an
    /// SPC-2 reservation it held ends. Persistent registrations stay.
    pub fn nexus_lost(&mut self, nexus: &Nexus) {
        if self.legacy.as_ref() == Some(nexus) {
            self.legacy = None;
        }
    }

    /// A LOGICAL UNIT RESET releases the SPC-2 reservation, whoever holds it.
    pub fn reset(&mut self) {
        self.legacy = None;
    }

    /// PERSISTENT RESERVE OUT from `nexus`.
    pub fn out(&mut self, nexus: &Nexus, req: &OutRequest) -> Result<(), Refusal> {
        if self.legacy.as_ref().is_some_and(|h| h != nexus) {
            return Err(Refusal::Conflict);
        }
        if req.aptpl && !self.ptpl_capable {
            return Err(Sense::invalid_field_in_parameters(20).into());
        }
        match req.action {
            OutAction::Register => self.register(nexus, req, false),
            OutAction::RegisterAndIgnore => self.register(nexus, req, true),
            OutAction::Reserve => self.reserve(nexus, req),
            OutAction::Release => self.release(nexus, req),
            OutAction::Clear => self.clear(nexus, req),
            OutAction::Preempt | OutAction::PreemptAndAbort => self.preempt(nexus, req),
        }
    }

    /// The caller's registration matches `key`, else RESERVATION CONFLICT.
    fn registered_with(&self, nexus: &Nexus, key: u64) -> Result<(), Refusal> {
        match self.key_of(nexus) {
            Some(k) if k == key => Ok(()),
            _ => Err(Refusal::Conflict),
        }
    }

    fn register(&mut self, nexus: &Nexus, req: &OutRequest, ignore: bool) -> Result<(), Refusal> {
        match self.key_of(nexus) {
            None if !ignore && req.key != 0 => return Err(Refusal::Conflict),
            None if req.sa_key == 0 => return Ok(()),
            None if self.registrations.len() >= MAX_REGISTRATIONS
                || nexus.name.len() > image::MAX_NAME_LEN =>
            {
                let s = Sense::new(SenseKey::IllegalRequest, Asc::INSUFFICIENT_RESOURCES);
                return Err(s.into());
            }
            Some(k) if !ignore && k != req.key => return Err(Refusal::Conflict),
            _ => {}
        }
        if req.sa_key == 0 {
            self.unregister(nexus);
        } else {
            self.registrations.insert(nexus.clone(), req.sa_key);
        }
        self.aptpl = req.aptpl;
        self.bump();
        Ok(())
    }

    /// Removes one registration; the reservation goes with it if this port held it (for
    /// all-registrants types, with the last registrant).
    fn unregister(&mut self, nexus: &Nexus) {
        let held = self.is_holder(nexus);
        self.registrations.remove(nexus);
        let all = self
            .reservation
            .as_ref()
            .is_some_and(|r| r.kind.all_registrants());
        if held && (!all || self.registrations.is_empty()) {
            self.reservation = None;
        }
    }

    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    fn reserve(&mut self, nexus: &Nexus, req: &OutRequest) -> Result<(), Refusal> {
        self.registered_with(nexus, req.key)?;
        let kind = req.kind()?;
        match &self.reservation {
            None => {
                self.reservation = Some(Reservation {
                    holder: nexus.clone(),
                    kind,
                });
                Ok(())
            }
            Some(r) if r.kind == kind && self.is_holder(nexus) => Ok(()),
            Some(_) => Err(Refusal::Conflict),
        }
    }

    fn release(&mut self, nexus: &Nexus, req: &OutRequest) -> Result<(), Refusal> {
        self.registered_with(nexus, req.key)?;
        let Some(r) = &self.reservation else {
            return Ok(());
        };
        if !self.is_holder(nexus) {
            return Ok(());
        }
        if r.kind.code() != req.type_code {
            let s = Sense::new(SenseKey::IllegalRequest, Asc::INVALID_RELEASE_OF_PR);
            return Err(s.into());
        }
        self.reservation = None;
        Ok(())
    }

    fn clear(&mut self, nexus: &Nexus, req: &OutRequest) -> Result<(), Refusal> {
        self.registered_with(nexus, req.key)?;
        self.registrations.clear();
        self.reservation = None;
        self.bump();
        Ok(())
    }

    fn preempt(&mut self, nexus: &Nexus, req: &OutRequest) -> Result<(), Refusal> {
        self.registered_with(nexus, req.key)?;
        let kind = req.kind()?;
        let Some(r) = self.reservation.clone() else {
            return self.remove_keyed(nexus, req.sa_key, true);
        };
        if r.kind.all_registrants() {
            if req.sa_key == 0 {
                self.registrations.retain(|n, _| n == nexus);
                self.take_reservation(nexus, kind);
                self.bump();
                return Ok(());
            }
            return self.remove_keyed(nexus, req.sa_key, false);
        }
        if self.key_of(&r.holder) == Some(req.sa_key) {
            self.registrations
                .retain(|n, k| n == nexus || *k != req.sa_key);
            self.take_reservation(nexus, kind);
            self.bump();
            return Ok(());
        }
        self.remove_keyed(nexus, req.sa_key, true)
    }

    fn take_reservation(&mut self, nexus: &Nexus, kind: PrType) {
        self.reservation = Some(Reservation {
            holder: nexus.clone(),
            kind,
        });
    }

    /// Removes every other registration holding `sa_key` (zero refused when `zero_invalid`);
    /// RESERVATION CONFLICT when there is none.
    fn remove_keyed(
        &mut self,
        nexus: &Nexus,
        sa_key: u64,
        zero_invalid: bool,
    ) -> Result<(), Refusal> {
        if sa_key == 0 && zero_invalid {
            return Err(Sense::invalid_field_in_parameters(8).into());
        }
        let before = self.registrations.len();
        self.registrations.retain(|n, k| n == nexus || *k != sa_key);
        if self.registrations.len() == before {
            return Err(Refusal::Conflict);
        }
        // The caller stays registered and the holder's key differs from `sa_key`, so the
        // reservation survives.
        self.bump();
        Ok(())
    }

    /// PERSISTENT RESERVE IN data (not yet clipped to the allocation length).
    pub fn read(&self, action: InAction) -> Vec<u8> {
        match action {
            InAction::ReadKeys => self.read_keys(),
            InAction::ReadReservation => self.read_reservation(),
            InAction::ReportCapabilities => self.capabilities(),
            InAction::ReadFullStatus => self.full_status(),
        }
    }

    fn read_keys(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 8 * self.registrations.len());
        push_be(&mut out, u64::from(self.generation), 4);
        push_be(&mut out, 8 * self.registrations.len() as u64, 4);
        for key in self.registrations.values() {
            push_be(&mut out, *key, 8);
        }
        out
    }

    /// The key reported for the reservation: the holder's, or zero for all-registrants types.
    fn reservation_key(&self, r: &Reservation) -> u64 {
        if r.kind.all_registrants() {
            return 0;
        }
        self.key_of(&r.holder).unwrap_or(0)
    }

    fn read_reservation(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        push_be(&mut out, u64::from(self.generation), 4);
        let Some(r) = &self.reservation else {
            push_be(&mut out, 0, 4);
            return out;
        };
        push_be(&mut out, 16, 4);
        push_be(&mut out, self.reservation_key(r), 8);
        out.extend_from_slice(&[0, 0, 0, 0, 0, r.kind.code(), 0, 0]);
        out
    }

    fn capabilities(&self) -> Vec<u8> {
        // CRH 0, SIP_C 0, ATP_C 0, PTPL_C; TMV with the type mask; PTPL_A.
        let ptpl_c = u8::from(self.ptpl_capable);
        let ptpl_a = u8::from(self.aptpl);
        // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX | EX_AC_AR.
        vec![0, 8, ptpl_c, 0x80 | ptpl_a, 0xea, 0x01, 0, 0]
    }

    fn full_status(&self) -> Vec<u8> {
        let mut body = Vec::new();
        for (nexus, key) in &self.registrations {
            let holder = self.is_holder(nexus);
            let tid = transport_id(nexus);
            push_be(&mut body, *key, 8);
            body.extend_from_slice(&[0, 0, 0, 0, u8::from(holder)]);
            let kind = self
                .reservation
                .as_ref()
                .filter(|_| holder)
                .map_or(0, |r| r.kind.code());
            body.push(kind);
            body.extend_from_slice(&[0, 0, 0, 0, 0, 1]); // relative target port 1
            push_be(&mut body, tid.len() as u64, 4);
            body.extend_from_slice(&tid);
        }
        let mut out = Vec::with_capacity(8 + body.len());
        push_be(&mut out, u64::from(self.generation), 4);
        push_be(&mut out, body.len() as u64, 4);
        out.extend_from_slice(&body);
        out
    }
}

/// The iSCSI TransportID with an initiator session ID (SPC-4 §7.6.4.6, format 01b): the port
/// name, NUL-terminated, padded to a multiple of four bytes.
pub fn transport_id(nexus: &Nexus) -> Vec<u8> {
    let mut name = nexus.port_name().into_bytes();
    name.push(0);
    while !name.len().is_multiple_of(4) || name.len() < 20 {
        name.push(0);
    }
    let mut out = vec![0x45, 0];
    push_be(&mut out, name.len() as u64, 2);
    out.extend_from_slice(&name);
    out
}

pub mod image;

#[cfg(test)]
mod tests;
