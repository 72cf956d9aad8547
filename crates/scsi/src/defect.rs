//! READ DEFECT DATA(10) and (12) (SBC-3 5.13, 5.14). A volume is a logical construct: it has no
//! medium defects, so its primary (PLIST) and grown (GLIST) defect lists exist and are empty.
//! An empty list can be given in any address descriptor format, so the requested format is
//! echoed; reserved and vendor-specific format codes are invalid fields.

use crate::sense::Sense;

/// Address descriptor formats SBC-3 defines (DEFECT LIST FORMAT field): short block, long
/// block, bytes from index, physical sector.
const FORMATS: [u8; 4] = [0b000, 0b011, 0b100, 0b101];

/// The parameter data (before clipping to the allocation length): the defect list header with
/// PLISTV/GLISTV set for the lists asked for and a defect list length of zero. The 12-byte
/// header's GENERATION CODE is zero: not supported.
pub fn read_defect_data(
    twelve: bool,
    plist: bool,
    glist: bool,
    format: u8,
) -> Result<Vec<u8>, Sense> {
    if !FORMATS.contains(&format) {
        // The flags byte: byte 1 of the 12-byte CDB, byte 2 of the 10-byte one.
        return Err(Sense::invalid_field_in_cdb(if twelve { 1 } else { 2 }));
    }
    let flags = u8::from(plist) << 4 | u8::from(glist) << 3 | format;
    let len = if twelve { 8 } else { 4 };
    let mut out = vec![0u8; len];
    out[1] = flags;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::Asc;

    #[test]
    fn empty_lists_in_the_requested_format() {
        assert_eq!(
            read_defect_data(false, false, false, 0).unwrap(),
            [0, 0, 0, 0]
        );
        assert_eq!(
            read_defect_data(false, true, true, 3).unwrap(),
            [0, 0x1b, 0, 0]
        );
        assert_eq!(
            read_defect_data(true, false, true, 5).unwrap(),
            [0, 0x0d, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn reserved_and_vendor_formats_are_invalid() {
        for format in [1, 2, 6, 7] {
            let err = read_defect_data(false, true, false, format).unwrap_err();
            assert_eq!(err.asc, Asc::INVALID_FIELD_IN_CDB);
        }
    }
}
