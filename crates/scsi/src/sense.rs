//! Status codes and fixed-format sense data (SPC-4 §4.5.3).
//!
//! ```text
//! byte 0      0x70 current error (| 0x80 VALID when INFORMATION is meaningful)
//! byte 2      sense key (| 0x20 ILI)
//! bytes 3..7  INFORMATION (big-endian)
//! byte 7      additional sense length = 10
//! bytes 12,13 ASC, ASCQ
//! bytes 15..18 sense-key specific (SKSV 0x80 in byte 15)
//! ```

use crate::wire::put_be;

/// Length of the fixed-format sense data this crate produces.
pub const FIXED_SENSE_LEN: usize = 18;

/// SAM status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// 0x00.
    Good,
    /// 0x02: sense data describes the error.
    CheckCondition,
    /// 0x04.
    ConditionMet,
    /// 0x08.
    Busy,
    /// 0x18.
    ReservationConflict,
    /// 0x28.
    TaskSetFull,
    /// 0x40.
    TaskAborted,
}

impl Status {
    /// The status byte.
    pub fn code(self) -> u8 {
        match self {
            Self::Good => 0x00,
            Self::CheckCondition => 0x02,
            Self::ConditionMet => 0x04,
            Self::Busy => 0x08,
            Self::ReservationConflict => 0x18,
            Self::TaskSetFull => 0x28,
            Self::TaskAborted => 0x40,
        }
    }
}

/// Sense keys (SPC-4 table 28).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum SenseKey {
    NoSense = 0x0,
    RecoveredError = 0x1,
    NotReady = 0x2,
    MediumError = 0x3,
    HardwareError = 0x4,
    IllegalRequest = 0x5,
    UnitAttention = 0x6,
    DataProtect = 0x7,
    CopyAborted = 0xa,
    AbortedCommand = 0xb,
    Miscompare = 0xe,
}

/// An additional sense code and qualifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Asc(pub u8, pub u8);

impl Asc {
    /// 00/00.
    pub const NO_ADDITIONAL_SENSE: Self = Self(0x00, 0x00);
    /// 00/16 OPERATION IN PROGRESS (an EXTENDED COPY with the same list identifier runs).
    pub const OPERATION_IN_PROGRESS: Self = Self(0x00, 0x16);
    /// 0C/00.
    pub const WRITE_ERROR: Self = Self(0x0c, 0x00);
    /// 0D/02 COPY TARGET DEVICE NOT REACHABLE.
    pub const COPY_TARGET_DEVICE_NOT_REACHABLE: Self = Self(0x0d, 0x02);
    /// 0D/03 INCORRECT COPY TARGET DEVICE TYPE.
    pub const INCORRECT_COPY_TARGET_DEVICE_TYPE: Self = Self(0x0d, 0x03);
    /// 0E/03 INVALID FIELD IN COMMAND INFORMATION UNIT (transport length mismatch).
    pub const INVALID_FIELD_IN_COMMAND_IU: Self = Self(0x0e, 0x03);
    /// 11/00.
    pub const UNRECOVERED_READ_ERROR: Self = Self(0x11, 0x00);
    /// 1A/00.
    pub const PARAMETER_LIST_LENGTH_ERROR: Self = Self(0x1a, 0x00);
    /// 1D/00.
    pub const MISCOMPARE_DURING_VERIFY: Self = Self(0x1d, 0x00);
    /// 20/00.
    pub const INVALID_COMMAND_OPERATION_CODE: Self = Self(0x20, 0x00);
    /// 21/00.
    pub const LBA_OUT_OF_RANGE: Self = Self(0x21, 0x00);
    /// 24/00.
    pub const INVALID_FIELD_IN_CDB: Self = Self(0x24, 0x00);
    /// 25/00.
    pub const LOGICAL_UNIT_NOT_SUPPORTED: Self = Self(0x25, 0x00);
    /// 26/00.
    pub const INVALID_FIELD_IN_PARAMETER_LIST: Self = Self(0x26, 0x00);
    /// 26/04 INVALID RELEASE OF PERSISTENT RESERVATION.
    pub const INVALID_RELEASE_OF_PR: Self = Self(0x26, 0x04);
    /// 26/06 TOO MANY TARGET DESCRIPTORS (EXTENDED COPY CSCD descriptors).
    pub const TOO_MANY_TARGET_DESCRIPTORS: Self = Self(0x26, 0x06);
    /// 26/07 UNSUPPORTED TARGET DESCRIPTOR TYPE CODE.
    pub const UNSUPPORTED_TARGET_DESCRIPTOR_TYPE: Self = Self(0x26, 0x07);
    /// 26/08 TOO MANY SEGMENT DESCRIPTORS.
    pub const TOO_MANY_SEGMENT_DESCRIPTORS: Self = Self(0x26, 0x08);
    /// 26/09 UNSUPPORTED SEGMENT DESCRIPTOR TYPE CODE.
    pub const UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE: Self = Self(0x26, 0x09);
    /// 26/0B INLINE DATA LENGTH EXCEEDED.
    pub const INLINE_DATA_LENGTH_EXCEEDED: Self = Self(0x26, 0x0b);
    /// 27/00.
    pub const WRITE_PROTECTED: Self = Self(0x27, 0x00);
    /// 27/07 SPACE ALLOCATION FAILED WRITE PROTECT: a thinly provisioned unit found no room
    /// for a write (SBC-4 4.7.3.7).
    pub const SPACE_ALLOCATION_FAILED_WRITE_PROTECT: Self = Self(0x27, 0x07);
    /// 29/00.
    pub const POWER_ON_RESET: Self = Self(0x29, 0x00);
    /// 29/03 BUS DEVICE RESET FUNCTION OCCURRED (after a LUN reset).
    pub const BUS_DEVICE_RESET: Self = Self(0x29, 0x03);
    /// 39/00.
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: Self = Self(0x39, 0x00);
    /// 44/00.
    pub const INTERNAL_TARGET_FAILURE: Self = Self(0x44, 0x00);
    /// 55/03 INSUFFICIENT RESOURCES.
    pub const INSUFFICIENT_RESOURCES: Self = Self(0x55, 0x03);
}

/// Where in the CDB or parameter list the offending field is (sense-key specific bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldPointer {
    /// True for the CDB, false for the parameter list.
    pub in_cdb: bool,
    /// Byte offset of the field.
    pub byte: u16,
    /// Bit of the field's most significant bit, if pointing at a bit field.
    pub bit: Option<u8>,
}

/// Sense data for one error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sense {
    /// Sense key.
    pub key: SenseKey,
    /// ASC/ASCQ.
    pub asc: Asc,
    /// INFORMATION field, reported with VALID set.
    pub information: Option<u64>,
    /// Offending field.
    pub field: Option<FieldPointer>,
}

impl Sense {
    /// Sense with key and code only.
    pub const fn new(key: SenseKey, asc: Asc) -> Self {
        Self {
            key,
            asc,
            information: None,
            field: None,
        }
    }

    /// ILLEGAL REQUEST / INVALID COMMAND OPERATION CODE.
    pub const fn invalid_opcode() -> Self {
        Self::new(
            SenseKey::IllegalRequest,
            Asc::INVALID_COMMAND_OPERATION_CODE,
        )
    }

    /// ILLEGAL REQUEST / INVALID FIELD IN CDB, pointing at `byte`.
    pub const fn invalid_field_in_cdb(byte: u16) -> Self {
        Self {
            key: SenseKey::IllegalRequest,
            asc: Asc::INVALID_FIELD_IN_CDB,
            information: None,
            field: Some(FieldPointer {
                in_cdb: true,
                byte,
                bit: None,
            }),
        }
    }

    /// ILLEGAL REQUEST / INVALID FIELD IN PARAMETER LIST, pointing at `byte`.
    pub const fn invalid_field_in_parameters(byte: u16) -> Self {
        Self {
            key: SenseKey::IllegalRequest,
            asc: Asc::INVALID_FIELD_IN_PARAMETER_LIST,
            information: None,
            field: Some(FieldPointer {
                in_cdb: false,
                byte,
                bit: None,
            }),
        }
    }

    /// ILLEGAL REQUEST / PARAMETER LIST LENGTH ERROR.
    pub const fn parameter_list_length() -> Self {
        Self::new(SenseKey::IllegalRequest, Asc::PARAMETER_LIST_LENGTH_ERROR)
    }

    /// ILLEGAL REQUEST / LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const fn lba_out_of_range() -> Self {
        Self::new(SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE)
    }

    /// DATA PROTECT / WRITE PROTECTED.
    pub const fn write_protected() -> Self {
        Self::new(SenseKey::DataProtect, Asc::WRITE_PROTECTED)
    }

    /// MISCOMPARE / MISCOMPARE DURING VERIFY OPERATION at byte `offset` of the compared data.
    pub const fn miscompare(offset: u64) -> Self {
        Self {
            key: SenseKey::Miscompare,
            asc: Asc::MISCOMPARE_DURING_VERIFY,
            information: Some(offset),
            field: None,
        }
    }

    /// Fixed-format sense data (18 bytes).
    pub fn to_fixed(&self) -> [u8; FIXED_SENSE_LEN] {
        let mut out = [0u8; FIXED_SENSE_LEN];
        out[0] = 0x70;
        out[2] = self.key as u8;
        if let Some(info) = self.information {
            out[0] |= 0x80;
            // The fixed format carries 4 bytes; larger values are clipped to the low bytes.
            put_be(&mut out[3..7], info);
        }
        out[7] = (FIXED_SENSE_LEN - 8) as u8;
        out[12] = self.asc.0;
        out[13] = self.asc.1;
        if let Some(field) = self.field {
            out[15] = 0x80 | if field.in_cdb { 0x40 } else { 0 };
            if let Some(bit) = field.bit {
                out[15] |= 0x08 | (bit & 0x07);
            }
            put_be(&mut out[16..18], u64::from(field.byte));
        }
        out
    }

    /// Descriptor-format sense data (SPC-4 §4.5.2), with an information descriptor if set.
    pub fn to_descriptor(&self) -> Vec<u8> {
        let mut out = vec![0x72, self.key as u8, self.asc.0, self.asc.1, 0, 0, 0, 0];
        if let Some(info) = self.information {
            out.extend_from_slice(&[0x00, 0x0a, 0x80, 0]);
            let start = out.len();
            out.resize(start + 8, 0);
            put_be(&mut out[start..], info);
        }
        out[7] = (out.len() - 8) as u8;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_layout() {
        let s = Sense::invalid_field_in_cdb(2).to_fixed();
        assert_eq!(s[0], 0x70);
        assert_eq!(s[2], 0x05);
        assert_eq!(s[7], 10);
        assert_eq!((s[12], s[13]), (0x24, 0x00));
        assert_eq!(s[15], 0xc0);
        assert_eq!(s[17], 2);
        let m = Sense::miscompare(0x1234).to_fixed();
        assert_eq!(m[0], 0xf0);
        assert_eq!(m[2], 0x0e);
        assert_eq!(&m[3..7], &[0, 0, 0x12, 0x34]);
        assert_eq!((m[12], m[13]), (0x1d, 0x00));
    }

    #[test]
    fn descriptor_format_layout() {
        let d = Sense::miscompare(7).to_descriptor();
        assert_eq!(d[0], 0x72);
        assert_eq!(d[1], 0x0e);
        assert_eq!(d[7] as usize, d.len() - 8);
        assert_eq!(d[19], 7);
        assert_eq!(Sense::lba_out_of_range().to_descriptor().len(), 8);
    }

    #[test]
    fn status_codes() {
        assert_eq!(Status::CheckCondition.code(), 2);
        assert_eq!(Status::ReservationConflict.code(), 0x18);
    }
}
