//! CDB decoding (SPC-4 §4.2, SBC-3 §5) into an open enum.
//!
//! [`Cdb::parse`] checks the length a CDB needs for its operation code and the reserved or
//! unsupported bits of the fields it decodes; an operation code this crate does not execute
//! decodes to [`Cdb::Unsupported`], which the executor answers with INVALID COMMAND OPERATION
//! CODE. A decoding error is the sense data to return.

use crate::sense::Sense;
use crate::wire::{be, be16, be32, be64};

/// Operation codes this crate decodes.
pub mod op {
    #![allow(missing_docs)]
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0a;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1a;
    pub const START_STOP_UNIT: u8 = 0x1b;
    pub const PREVENT_ALLOW: u8 = 0x1e;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2a;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2e;
    pub const VERIFY_10: u8 = 0x2f;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const RESERVE_10: u8 = 0x56;
    pub const RELEASE_10: u8 = 0x57;
    pub const MODE_SENSE_10: u8 = 0x5a;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5e;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8a;
    pub const ORWRITE_16: u8 = 0x8b;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8e;
    pub const VERIFY_16: u8 = 0x8f;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const WRITE_ATOMIC_16: u8 = 0x9c;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    pub const REPORT_LUNS: u8 = 0xa0;
    pub const MAINTENANCE_IN: u8 = 0xa3;
    pub const READ_12: u8 = 0xa8;
    pub const WRITE_12: u8 = 0xaa;
    pub const WRITE_AND_VERIFY_12: u8 = 0xae;
    pub const VERIFY_12: u8 = 0xaf;
    pub const READ_DEFECT_DATA_12: u8 = 0xb7;
    /// SERVICE ACTION IN(16) service actions.
    pub const SA_READ_CAPACITY_16: u16 = 0x10;
    pub const SA_GET_LBA_STATUS: u16 = 0x12;
    /// MAINTENANCE IN service action.
    pub const SA_REPORT_SUPPORTED_OPCODES: u16 = 0x0c;
}

/// Length of the CDB an operation code's group implies (SPC-4 §4.2.5.1), if fixed.
pub fn cdb_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// A block-range command's common fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// First logical block.
    pub lba: u64,
    /// Number of logical blocks.
    pub blocks: u32,
}

/// A decoded CDB. Field names are the SPC/SBC field names, lower-cased.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cdb {
    /// TEST UNIT READY.
    TestUnitReady,
    /// REQUEST SENSE; `descriptor` asks for descriptor-format sense.
    RequestSense { descriptor: bool, alloc: u32 },
    /// INQUIRY; `page` is a VPD page when `evpd`.
    Inquiry { evpd: bool, page: u8, alloc: u32 },
    /// MODE SELECT(6)/(10).
    ModeSelect {
        ten: bool,
        pf: bool,
        save: bool,
        param_len: u32,
    },
    /// MODE SENSE(6)/(10).
    ModeSense {
        ten: bool,
        dbd: bool,
        llbaa: bool,
        pc: u8,
        page: u8,
        subpage: u8,
        alloc: u32,
    },
    /// START STOP UNIT.
    StartStopUnit {
        immed: bool,
        power_condition: u8,
        loej: bool,
        start: bool,
    },
    /// PREVENT ALLOW MEDIUM REMOVAL.
    PreventAllow { prevent: u8 },
    /// READ CAPACITY(10).
    ReadCapacity10 { pmi: bool, lba: u32 },
    /// READ CAPACITY(16).
    ReadCapacity16 { alloc: u32 },
    /// READ(6/10/12/16).
    Read { range: Range, fua: bool },
    /// WRITE(6/10/12/16).
    Write { range: Range, fua: bool },
    /// VERIFY(10/12/16); `bytchk` 0 = medium only, 1 = compare, 3 = compare one block to each.
    Verify { range: Range, bytchk: u8 },
    /// WRITE AND VERIFY(10/12/16).
    WriteAndVerify { range: Range, bytchk: u8 },
    /// SYNCHRONIZE CACHE(10/16).
    SynchronizeCache { range: Range, immed: bool },
    /// PRE-FETCH(10/16).
    PreFetch { range: Range, immed: bool },
    /// WRITE SAME(10/16); `ndob`: no data-out buffer, the block is zeros. Zero blocks means
    /// from `range.lba` to the end of the medium.
    WriteSame {
        range: Range,
        unmap: bool,
        ndob: bool,
    },
    /// UNMAP.
    Unmap { param_len: u32 },
    /// GET LBA STATUS.
    GetLbaStatus { lba: u64, alloc: u32 },
    /// COMPARE AND WRITE.
    CompareAndWrite { lba: u64, blocks: u8, fua: bool },
    /// ORWRITE(16): ORs the data-out into the blocks, atomically.
    OrWrite { range: Range, fua: bool },
    /// WRITE ATOMIC(16), SBC-4; `boundary` is the ATOMIC BOUNDARY field.
    WriteAtomic {
        range: Range,
        boundary: u16,
        fua: bool,
    },
    /// READ DEFECT DATA(10/12); `format` is the DEFECT LIST FORMAT, `index` the ADDRESS
    /// DESCRIPTOR INDEX (12 only).
    ReadDefectData {
        twelve: bool,
        plist: bool,
        glist: bool,
        format: u8,
        index: u32,
        alloc: u32,
    },
    /// EXTENDED COPY (LID1), the only service action executed.
    ExtendedCopy { param_len: u32 },
    /// RECEIVE COPY RESULTS: COPY STATUS (for `list_id`) or OPERATING PARAMETERS, the
    /// service actions executed.
    ReceiveCopyResults {
        service_action: u8,
        list_id: u8,
        alloc: u32,
    },
    /// REPORT LUNS.
    ReportLuns { select: u8, alloc: u32 },
    /// REPORT SUPPORTED OPERATION CODES.
    ReportSupportedOpcodes {
        rctd: bool,
        options: u8,
        opcode: u8,
        service_action: u16,
        alloc: u32,
    },
    /// PERSISTENT RESERVE IN.
    PersistentReserveIn { service_action: u8, alloc: u32 },
    /// PERSISTENT RESERVE OUT; `scope_type` is byte 2 (SCOPE and TYPE).
    PersistentReserveOut {
        service_action: u8,
        scope_type: u8,
        param_len: u32,
    },
    /// RESERVE(6/10), SPC-2.
    Reserve,
    /// RELEASE(6/10), SPC-2.
    Release,
    /// An operation code (and service action, for codes that carry one) not executed here.
    Unsupported {
        opcode: u8,
        service_action: Option<u16>,
    },
}

fn bit(byte: u8, mask: u8) -> bool {
    byte & mask != 0
}

fn need(cdb: &[u8], len: usize) -> Result<&[u8], Sense> {
    // A CDB shorter than its group's length cannot be decoded: its fields are missing.
    cdb.get(..len).ok_or(Sense::invalid_field_in_cdb(0))
}

/// Fails with INVALID FIELD IN CDB at `byte` if any bit of `mask` is set there.
fn reserved(cdb: &[u8], byte: usize, mask: u8) -> Result<(), Sense> {
    if cdb[byte] & mask != 0 {
        return Err(Sense::invalid_field_in_cdb(byte as u16));
    }
    Ok(())
}

/// RDPROTECT/WRPROTECT/VRPROTECT live in byte 1 bits 7..5; protection information is not
/// supported, so any nonzero value is an invalid field.
fn no_protection(cdb: &[u8]) -> Result<(), Sense> {
    reserved(cdb, 1, 0xe0)
}

fn range(lba: u64, blocks: u64) -> Range {
    Range {
        lba,
        blocks: blocks as u32,
    }
}

impl Cdb {
    /// Decodes `cdb` (which may carry trailing padding beyond the command's length).
    pub fn parse(cdb: &[u8]) -> Result<Self, Sense> {
        let Some(&opcode) = cdb.first() else {
            return Err(Sense::invalid_opcode());
        };
        let Some(len) = cdb_len(opcode) else {
            return Ok(Self::Unsupported {
                opcode,
                service_action: None,
            });
        };
        let c = need(cdb, len)?;
        match opcode {
            op::TEST_UNIT_READY => Ok(Self::TestUnitReady),
            op::REQUEST_SENSE => Ok(Self::RequestSense {
                descriptor: bit(c[1], 0x01),
                alloc: u32::from(c[4]),
            }),
            op::INQUIRY => parse_inquiry(c),
            op::MODE_SELECT_6 => Ok(Self::ModeSelect {
                ten: false,
                pf: bit(c[1], 0x10),
                save: bit(c[1], 0x01),
                param_len: u32::from(c[4]),
            }),
            op::MODE_SELECT_10 => Ok(Self::ModeSelect {
                ten: true,
                pf: bit(c[1], 0x10),
                save: bit(c[1], 0x01),
                param_len: u32::from(be16(&c[7..9])),
            }),
            op::MODE_SENSE_6 => Ok(Self::ModeSense {
                ten: false,
                dbd: bit(c[1], 0x08),
                llbaa: false,
                pc: c[2] >> 6,
                page: c[2] & 0x3f,
                subpage: c[3],
                alloc: u32::from(c[4]),
            }),
            op::MODE_SENSE_10 => Ok(Self::ModeSense {
                ten: true,
                dbd: bit(c[1], 0x08),
                llbaa: bit(c[1], 0x10),
                pc: c[2] >> 6,
                page: c[2] & 0x3f,
                subpage: c[3],
                alloc: u32::from(be16(&c[7..9])),
            }),
            op::START_STOP_UNIT => Ok(Self::StartStopUnit {
                immed: bit(c[1], 0x01),
                power_condition: c[4] >> 4,
                loej: bit(c[4], 0x02),
                start: bit(c[4], 0x01),
            }),
            op::PREVENT_ALLOW => Ok(Self::PreventAllow {
                prevent: c[4] & 0x03,
            }),
            op::READ_CAPACITY_10 => Ok(Self::ReadCapacity10 {
                pmi: bit(c[8], 0x01),
                lba: be32(&c[2..6]),
            }),
            op::READ_6 | op::WRITE_6 => parse_rw6(c),
            op::READ_10 | op::WRITE_10 => parse_rw(c, be(&c[2..6]), be(&c[7..9])),
            op::READ_12 | op::WRITE_12 => parse_rw(c, be(&c[2..6]), be(&c[6..10])),
            op::READ_16 | op::WRITE_16 => parse_rw(c, be64(&c[2..10]), be(&c[10..14])),
            op::VERIFY_10 | op::WRITE_AND_VERIFY_10 => {
                parse_verify(c, range(be(&c[2..6]), be(&c[7..9])))
            }
            op::VERIFY_12 | op::WRITE_AND_VERIFY_12 => {
                parse_verify(c, range(be(&c[2..6]), be(&c[6..10])))
            }
            op::VERIFY_16 | op::WRITE_AND_VERIFY_16 => {
                parse_verify(c, range(be64(&c[2..10]), be(&c[10..14])))
            }
            op::SYNCHRONIZE_CACHE_10 | op::PRE_FETCH_10 => {
                parse_cache(c, range(be(&c[2..6]), be(&c[7..9])))
            }
            op::SYNCHRONIZE_CACHE_16 | op::PRE_FETCH_16 => {
                parse_cache(c, range(be64(&c[2..10]), be(&c[10..14])))
            }
            op::WRITE_SAME_10 => parse_write_same(c, range(be(&c[2..6]), be(&c[7..9]))),
            op::WRITE_SAME_16 => parse_write_same(c, range(be64(&c[2..10]), be(&c[10..14]))),
            op::UNMAP => {
                reserved(c, 1, 0x01)?;
                Ok(Self::Unmap {
                    param_len: u32::from(be16(&c[7..9])),
                })
            }
            op::COMPARE_AND_WRITE => {
                no_protection(c)?;
                Ok(Self::CompareAndWrite {
                    lba: be64(&c[2..10]),
                    blocks: c[13],
                    fua: bit(c[1], 0x08),
                })
            }
            op::ORWRITE_16 => {
                no_protection(c)?;
                Ok(Self::OrWrite {
                    range: range(be64(&c[2..10]), be(&c[10..14])),
                    fua: bit(c[1], 0x08),
                })
            }
            op::WRITE_ATOMIC_16 => {
                no_protection(c)?;
                Ok(Self::WriteAtomic {
                    range: range(be64(&c[2..10]), be(&c[12..14])),
                    boundary: be16(&c[10..12]),
                    fua: bit(c[1], 0x08),
                })
            }
            op::READ_DEFECT_DATA_10 | op::READ_DEFECT_DATA_12 => parse_read_defect_data(c),
            op::EXTENDED_COPY | op::RECEIVE_COPY_RESULTS => parse_copy(c),
            op::SERVICE_ACTION_IN_16 => parse_service_action_in(c),
            op::REPORT_LUNS => Ok(Self::ReportLuns {
                select: c[2],
                alloc: be32(&c[6..10]),
            }),
            op::MAINTENANCE_IN => parse_maintenance_in(c),
            op::PERSISTENT_RESERVE_IN => Ok(Self::PersistentReserveIn {
                service_action: c[1] & 0x1f,
                alloc: u32::from(be16(&c[7..9])),
            }),
            op::PERSISTENT_RESERVE_OUT => Ok(Self::PersistentReserveOut {
                service_action: c[1] & 0x1f,
                scope_type: c[2],
                param_len: be32(&c[5..9]),
            }),
            op::RESERVE_6 | op::RELEASE_6 | op::RESERVE_10 | op::RELEASE_10 => parse_legacy(c),
            _ => Ok(Self::Unsupported {
                opcode,
                service_action: None,
            }),
        }
    }
}

/// RESERVE/RELEASE(6/10): third-party reservations, long IDs and extents are not supported.
fn parse_legacy(c: &[u8]) -> Result<Cdb, Sense> {
    reserved(c, 1, 0x1f)?;
    Ok(match c[0] {
        op::RESERVE_6 | op::RESERVE_10 => Cdb::Reserve,
        _ => Cdb::Release,
    })
}

fn parse_inquiry(c: &[u8]) -> Result<Cdb, Sense> {
    let evpd = bit(c[1], 0x01);
    reserved(c, 1, 0xfe)?;
    if !evpd && c[2] != 0 {
        return Err(Sense::invalid_field_in_cdb(2));
    }
    Ok(Cdb::Inquiry {
        evpd,
        page: c[2],
        alloc: u32::from(be16(&c[3..5])),
    })
}

fn parse_rw6(c: &[u8]) -> Result<Cdb, Sense> {
    let lba = be(&c[1..4]) & 0x1f_ffff;
    // A TRANSFER LENGTH of zero means 256 blocks in the 6-byte commands.
    let blocks = if c[4] == 0 { 256 } else { u64::from(c[4]) };
    let range = range(lba, blocks);
    Ok(if c[0] == op::READ_6 {
        Cdb::Read { range, fua: false }
    } else {
        Cdb::Write { range, fua: false }
    })
}

fn parse_rw(c: &[u8], lba: u64, blocks: u64) -> Result<Cdb, Sense> {
    no_protection(c)?;
    let range = range(lba, blocks);
    let fua = bit(c[1], 0x08);
    Ok(match c[0] {
        op::READ_10 | op::READ_12 | op::READ_16 => Cdb::Read { range, fua },
        _ => Cdb::Write { range, fua },
    })
}

fn parse_verify(c: &[u8], range: Range) -> Result<Cdb, Sense> {
    no_protection(c)?;
    let bytchk = (c[1] >> 1) & 0x03;
    if bytchk == 2 {
        return Err(Sense::invalid_field_in_cdb(1));
    }
    Ok(match c[0] {
        op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16 => Cdb::Verify { range, bytchk },
        _ => Cdb::WriteAndVerify { range, bytchk },
    })
}

fn parse_cache(c: &[u8], range: Range) -> Result<Cdb, Sense> {
    let immed = bit(c[1], 0x02);
    Ok(match c[0] {
        op::SYNCHRONIZE_CACHE_10 | op::SYNCHRONIZE_CACHE_16 => {
            Cdb::SynchronizeCache { range, immed }
        }
        _ => Cdb::PreFetch { range, immed },
    })
}

fn parse_write_same(c: &[u8], range: Range) -> Result<Cdb, Sense> {
    no_protection(c)?;
    // ANCHOR (0x10) is not supported; PBDATA/LBDATA (0x04/0x02) are obsolete or unsupported.
    reserved(c, 1, 0x16)?;
    let ndob = c[0] == op::WRITE_SAME_16 && bit(c[1], 0x01);
    Ok(Cdb::WriteSame {
        range,
        unmap: bit(c[1], 0x08),
        ndob,
    })
}

/// READ DEFECT DATA: the list flags and format sit in byte 2 of the 10-byte CDB and in byte 1
/// of the 12-byte one (SBC-3 5.13, 5.14).
fn parse_read_defect_data(c: &[u8]) -> Result<Cdb, Sense> {
    let twelve = c[0] == op::READ_DEFECT_DATA_12;
    let at = if twelve { 1 } else { 2 };
    reserved(c, at, 0xe0)?;
    let (index, alloc) = if twelve {
        (be32(&c[2..6]), be32(&c[6..10]))
    } else {
        (0, u32::from(be16(&c[7..9])))
    };
    Ok(Cdb::ReadDefectData {
        twelve,
        plist: bit(c[at], 0x10),
        glist: bit(c[at], 0x08),
        format: c[at] & 0x07,
        index,
        alloc,
    })
}

/// EXTENDED COPY and RECEIVE COPY RESULTS (SPC-4 6.4, 6.18): an operation code served with
/// a service action it does not serve is an invalid field (the SERVICE ACTION, byte 1).
fn parse_copy(c: &[u8]) -> Result<Cdb, Sense> {
    use crate::xcopy::{SA_COPY_STATUS, SA_EXTENDED_COPY_LID1, SA_OPERATING_PARAMETERS};
    let service_action = c[1] & 0x1f;
    match (c[0], service_action) {
        (op::EXTENDED_COPY, SA_EXTENDED_COPY_LID1) => Ok(Cdb::ExtendedCopy {
            param_len: be32(&c[10..14]),
        }),
        (op::RECEIVE_COPY_RESULTS, SA_COPY_STATUS | SA_OPERATING_PARAMETERS) => {
            Ok(Cdb::ReceiveCopyResults {
                service_action,
                list_id: c[2],
                alloc: be32(&c[10..14]),
            })
        }
        _ => Err(Sense::invalid_field_in_cdb(1)),
    }
}

fn parse_service_action_in(c: &[u8]) -> Result<Cdb, Sense> {
    let service_action = u16::from(c[1] & 0x1f);
    match service_action {
        op::SA_READ_CAPACITY_16 => Ok(Cdb::ReadCapacity16 {
            alloc: be32(&c[10..14]),
        }),
        op::SA_GET_LBA_STATUS => Ok(Cdb::GetLbaStatus {
            lba: be64(&c[2..10]),
            alloc: be32(&c[10..14]),
        }),
        _ => Ok(Cdb::Unsupported {
            opcode: c[0],
            service_action: Some(service_action),
        }),
    }
}

fn parse_maintenance_in(c: &[u8]) -> Result<Cdb, Sense> {
    let service_action = u16::from(c[1] & 0x1f);
    if service_action != op::SA_REPORT_SUPPORTED_OPCODES {
        return Ok(Cdb::Unsupported {
            opcode: c[0],
            service_action: Some(service_action),
        });
    }
    Ok(Cdb::ReportSupportedOpcodes {
        rctd: bit(c[2], 0x80),
        options: c[2] & 0x07,
        opcode: c[3],
        service_action: be16(&c[4..6]),
        alloc: be32(&c[6..10]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::{Asc, SenseKey};

    fn cdb16(opcode: u8) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = opcode;
        c
    }

    #[test]
    fn read10_fields() {
        let c = [0x28, 0x08, 0, 0, 0x01, 0x00, 0, 0, 0x10, 0];
        let cdb = Cdb::parse(&c).unwrap();
        assert_eq!(
            cdb,
            Cdb::Read {
                range: Range {
                    lba: 256,
                    blocks: 16
                },
                fua: true
            }
        );
    }

    #[test]
    fn read6_zero_length_means_256() {
        let c = [0x08, 0x1f, 0xff, 0xff, 0, 0];
        let Cdb::Read { range, .. } = Cdb::parse(&c).unwrap() else {
            panic!("not a read");
        };
        assert_eq!(range.lba, 0x1f_ffff);
        assert_eq!(range.blocks, 256);
    }

    #[test]
    fn read16_and_write16() {
        let mut c = cdb16(op::WRITE_16);
        c[2..10].copy_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2]);
        c[13] = 3;
        let Cdb::Write { range, fua } = Cdb::parse(&c).unwrap() else {
            panic!("not a write");
        };
        assert_eq!(range.lba, (1 << 32) | 2);
        assert_eq!(range.blocks, 3);
        assert!(!fua);
    }

    #[test]
    fn protection_bits_are_invalid_fields() {
        let c = [0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0];
        let err = Cdb::parse(&c).unwrap_err();
        assert_eq!(err.key, SenseKey::IllegalRequest);
        assert_eq!(err.asc, Asc::INVALID_FIELD_IN_CDB);
    }

    #[test]
    fn inquiry_page_without_evpd_is_invalid() {
        let err = Cdb::parse(&[0x12, 0, 0x80, 0, 255, 0]).unwrap_err();
        assert_eq!(err.asc, Asc::INVALID_FIELD_IN_CDB);
        assert_eq!(
            Cdb::parse(&[0x12, 1, 0x83, 1, 0, 0]).unwrap(),
            Cdb::Inquiry {
                evpd: true,
                page: 0x83,
                alloc: 256
            }
        );
    }

    #[test]
    fn unknown_opcodes_are_unsupported() {
        assert_eq!(
            Cdb::parse(&[0xc0, 0, 0, 0, 0, 0]).unwrap(),
            Cdb::Unsupported {
                opcode: 0xc0,
                service_action: None
            }
        );
        let mut c = cdb16(op::SERVICE_ACTION_IN_16);
        c[1] = 0x11;
        assert_eq!(
            Cdb::parse(&c).unwrap(),
            Cdb::Unsupported {
                opcode: 0x9e,
                service_action: Some(0x11)
            }
        );
        assert!(Cdb::parse(&[]).is_err());
    }

    #[test]
    fn short_cdb_is_rejected() {
        assert!(Cdb::parse(&[0x28, 0, 0]).is_err());
    }

    #[test]
    fn service_action_in_and_maintenance_in() {
        let mut c = cdb16(op::SERVICE_ACTION_IN_16);
        c[1] = 0x10;
        c[13] = 32;
        assert_eq!(Cdb::parse(&c).unwrap(), Cdb::ReadCapacity16 { alloc: 32 });
        let mut m = [0u8; 12];
        m[0] = op::MAINTENANCE_IN;
        m[1] = 0x0c;
        m[2] = 0x81;
        m[3] = 0x28;
        m[9] = 64;
        assert_eq!(
            Cdb::parse(&m).unwrap(),
            Cdb::ReportSupportedOpcodes {
                rctd: true,
                options: 1,
                opcode: 0x28,
                service_action: 0,
                alloc: 64
            }
        );
    }

    #[test]
    fn write_same_flags() {
        let mut c = cdb16(op::WRITE_SAME_16);
        c[1] = 0x09;
        c[13] = 8;
        assert_eq!(
            Cdb::parse(&c).unwrap(),
            Cdb::WriteSame {
                range: Range { lba: 0, blocks: 8 },
                unmap: true,
                ndob: true
            }
        );
        c[1] = 0x10;
        assert!(Cdb::parse(&c).is_err());
    }

    #[test]
    fn orwrite_and_write_atomic_fields() {
        let mut c = cdb16(op::ORWRITE_16);
        c[1] = 0x18;
        c[9] = 5;
        c[13] = 2;
        assert_eq!(
            Cdb::parse(&c).unwrap(),
            Cdb::OrWrite {
                range: Range { lba: 5, blocks: 2 },
                fua: true
            }
        );
        c[1] = 0x40;
        assert_eq!(
            Cdb::parse(&c).unwrap_err().asc,
            Asc::INVALID_FIELD_IN_CDB,
            "ORPROTECT without protection information"
        );
        let mut a = cdb16(op::WRITE_ATOMIC_16);
        a[9] = 8;
        a[11] = 4;
        a[13] = 3;
        assert_eq!(
            Cdb::parse(&a).unwrap(),
            Cdb::WriteAtomic {
                range: Range { lba: 8, blocks: 3 },
                boundary: 4,
                fua: false
            }
        );
        a[1] = 0x20;
        assert!(Cdb::parse(&a).is_err());
    }

    #[test]
    fn read_defect_data_fields() {
        let c = [op::READ_DEFECT_DATA_10, 0, 0x1d, 0, 0, 0, 0, 1, 0, 0];
        assert_eq!(
            Cdb::parse(&c).unwrap(),
            Cdb::ReadDefectData {
                twelve: false,
                plist: true,
                glist: true,
                format: 5,
                index: 0,
                alloc: 256
            }
        );
        let mut t = [0u8; 12];
        t[0] = op::READ_DEFECT_DATA_12;
        t[1] = 0x08;
        t[5] = 7;
        t[9] = 32;
        assert_eq!(
            Cdb::parse(&t).unwrap(),
            Cdb::ReadDefectData {
                twelve: true,
                plist: false,
                glist: true,
                format: 0,
                index: 7,
                alloc: 32
            }
        );
        t[1] = 0x80;
        assert!(Cdb::parse(&t).is_err());
    }
}
