//! REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35): the table of executed commands with
//! their CDB usage masks (which bits of each CDB byte the device server looks at).

use crate::cdb::{op, Cdb};
use crate::sense::Sense;
use crate::wire::push_be;
use crate::xcopy::{SA_COPY_STATUS, SA_EXTENDED_COPY_LID1, SA_OPERATING_PARAMETERS};

/// One supported command.
#[derive(Debug, Clone, Copy)]
pub struct Command {
    /// Operation code.
    pub opcode: u8,
    /// Service action, for codes that carry one.
    pub service_action: Option<u16>,
    /// CDB usage data: byte 0 is the opcode, then a mask of the bits examined.
    pub usage: &'static [u8],
}

const fn cmd(opcode: u8, service_action: Option<u16>, usage: &'static [u8]) -> Command {
    Command {
        opcode,
        service_action,
        usage,
    }
}

const PRIN_USAGE: [u8; 10] = [0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0x07];
const PROUT_USAGE: [u8; 10] = [0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x07];

/// Every command the executor supports.
pub const COMMANDS: &[Command] = &[
    cmd(op::TEST_UNIT_READY, None, &[0x00, 0, 0, 0, 0, 0x07]),
    cmd(op::REQUEST_SENSE, None, &[0x03, 0x01, 0, 0, 0xff, 0x07]),
    cmd(op::READ_6, None, &[0x08, 0x1f, 0xff, 0xff, 0xff, 0x07]),
    cmd(op::WRITE_6, None, &[0x0a, 0x1f, 0xff, 0xff, 0xff, 0x07]),
    cmd(op::INQUIRY, None, &[0x12, 0x01, 0xff, 0xff, 0xff, 0x07]),
    cmd(op::MODE_SELECT_6, None, &[0x15, 0x11, 0, 0, 0xff, 0x07]),
    cmd(op::RESERVE_6, None, &[0x16, 0, 0, 0, 0, 0x07]),
    cmd(op::RELEASE_6, None, &[0x17, 0, 0, 0, 0, 0x07]),
    cmd(
        op::MODE_SENSE_6,
        None,
        &[0x1a, 0x08, 0xff, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::START_STOP_UNIT,
        None,
        &[0x1b, 0x01, 0, 0x0f, 0xf7, 0x07],
    ),
    cmd(op::PREVENT_ALLOW, None, &[0x1e, 0, 0, 0, 0x03, 0x07]),
    cmd(
        op::READ_CAPACITY_10,
        None,
        &[0x25, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0x07],
    ),
    cmd(
        op::READ_10,
        None,
        &[0x28, 0x18, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::WRITE_10,
        None,
        &[0x2a, 0x18, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::WRITE_AND_VERIFY_10,
        None,
        &[0x2e, 0x16, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::VERIFY_10,
        None,
        &[0x2f, 0x16, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::PRE_FETCH_10,
        None,
        &[0x34, 0x02, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::SYNCHRONIZE_CACHE_10,
        None,
        &[0x35, 0x02, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::READ_DEFECT_DATA_10,
        None,
        &[0x37, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::WRITE_SAME_10,
        None,
        &[0x41, 0x08, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::UNMAP,
        None,
        &[0x42, 0, 0, 0, 0, 0, 0x3f, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::MODE_SELECT_10,
        None,
        &[0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0x07],
    ),
    cmd(
        op::MODE_SENSE_10,
        None,
        &[0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0x07],
    ),
    cmd(op::RESERVE_10, None, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0x07]),
    cmd(op::RELEASE_10, None, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0x07]),
    cmd(op::PERSISTENT_RESERVE_IN, Some(0), &PRIN_USAGE),
    cmd(op::PERSISTENT_RESERVE_IN, Some(1), &PRIN_USAGE),
    cmd(op::PERSISTENT_RESERVE_IN, Some(2), &PRIN_USAGE),
    cmd(op::PERSISTENT_RESERVE_IN, Some(3), &PRIN_USAGE),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(0), &PROUT_USAGE),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(1), &PROUT_USAGE),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(2), &PROUT_USAGE),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(3), &PROUT_USAGE),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(4), &PROUT_USAGE),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(5), &PROUT_USAGE),
    cmd(op::PERSISTENT_RESERVE_OUT, Some(6), &PROUT_USAGE),
    cmd(
        op::EXTENDED_COPY,
        Some(SA_EXTENDED_COPY_LID1 as u16),
        &[
            0x83, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
    cmd(
        op::RECEIVE_COPY_RESULTS,
        Some(SA_COPY_STATUS as u16),
        &[
            0x84, 0x00, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
    cmd(
        op::RECEIVE_COPY_RESULTS,
        Some(SA_OPERATING_PARAMETERS as u16),
        &[
            0x84, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
    cmd(
        op::READ_16,
        None,
        &[
            0x88, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x07,
        ],
    ),
    cmd(
        op::COMPARE_AND_WRITE,
        None,
        &[
            0x89, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0x3f, 0x07,
        ],
    ),
    cmd(
        op::WRITE_16,
        None,
        &[
            0x8a, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x07,
        ],
    ),
    cmd(
        op::ORWRITE_16,
        None,
        &[
            0x8b, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x07,
        ],
    ),
    cmd(
        op::WRITE_AND_VERIFY_16,
        None,
        &[
            0x8e, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x07,
        ],
    ),
    cmd(
        op::VERIFY_16,
        None,
        &[
            0x8f, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x07,
        ],
    ),
    cmd(
        op::PRE_FETCH_16,
        None,
        &[
            0x90, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x07,
        ],
    ),
    cmd(
        op::SYNCHRONIZE_CACHE_16,
        None,
        &[
            0x91, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x07,
        ],
    ),
    cmd(
        op::WRITE_SAME_16,
        None,
        &[
            0x93, 0x09, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x07,
        ],
    ),
    cmd(
        op::WRITE_ATOMIC_16,
        None,
        &[
            0x9c, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x07,
        ],
    ),
    cmd(
        op::SERVICE_ACTION_IN_16,
        Some(op::SA_READ_CAPACITY_16),
        &[
            0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
    cmd(
        op::SERVICE_ACTION_IN_16,
        Some(op::SA_GET_LBA_STATUS),
        &[
            0x9e, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0x07,
        ],
    ),
    cmd(
        op::REPORT_LUNS,
        None,
        &[0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07],
    ),
    cmd(
        op::MAINTENANCE_IN,
        Some(op::SA_REPORT_SUPPORTED_OPCODES),
        &[
            0xa3, 0x0c, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
    cmd(
        op::READ_12,
        None,
        &[
            0xa8, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0x07,
        ],
    ),
    cmd(
        op::WRITE_12,
        None,
        &[
            0xaa, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0x07,
        ],
    ),
    cmd(
        op::WRITE_AND_VERIFY_12,
        None,
        &[
            0xae, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0x07,
        ],
    ),
    cmd(
        op::VERIFY_12,
        None,
        &[
            0xaf, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 0x07,
        ],
    ),
    cmd(
        op::READ_DEFECT_DATA_12,
        None,
        &[
            0xb7, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
];

/// Command timeouts descriptor: length 0x0a, no recommended timeouts (zero = unspecified).
const TIMEOUTS: [u8; 12] = [0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// Builds the parameter data for a decoded [`Cdb::ReportSupportedOpcodes`].
pub fn report(cdb: &Cdb) -> Result<Vec<u8>, Sense> {
    let Cdb::ReportSupportedOpcodes {
        rctd,
        options,
        opcode,
        service_action,
        alloc,
    } = *cdb
    else {
        return Err(Sense::invalid_opcode());
    };
    let mut out = match options {
        0 => all_commands(rctd),
        1..=3 => one_command(rctd, options, opcode, service_action)?,
        _ => return Err(Sense::invalid_field_in_cdb(2)),
    };
    out.truncate(alloc as usize);
    Ok(out)
}

fn all_commands(rctd: bool) -> Vec<u8> {
    let mut body = Vec::new();
    for c in COMMANDS {
        body.push(c.opcode);
        body.push(0);
        push_be(&mut body, u64::from(c.service_action.unwrap_or(0)), 2);
        body.push(0);
        body.push(u8::from(rctd) << 1 | u8::from(c.service_action.is_some()));
        push_be(&mut body, c.usage.len() as u64, 2);
        if rctd {
            body.extend_from_slice(&TIMEOUTS);
        }
    }
    let mut out = Vec::with_capacity(body.len() + 4);
    push_be(&mut out, body.len() as u64, 4);
    out.extend(body);
    out
}

fn one_command(rctd: bool, options: u8, opcode: u8, sa: u16) -> Result<Vec<u8>, Sense> {
    let has_sa = COMMANDS
        .iter()
        .any(|c| c.opcode == opcode && c.service_action.is_some());
    let found = match options {
        // Opcode only: invalid if the opcode has service actions.
        1 if has_sa => return Err(Sense::invalid_field_in_cdb(2)),
        1 => COMMANDS.iter().find(|c| c.opcode == opcode),
        // Opcode and service action: invalid if the opcode has none (and is known).
        2 if !has_sa && COMMANDS.iter().any(|c| c.opcode == opcode) => {
            return Err(Sense::invalid_field_in_cdb(2))
        }
        2 => COMMANDS
            .iter()
            .find(|c| c.opcode == opcode && c.service_action == Some(sa)),
        _ => COMMANDS
            .iter()
            .find(|c| c.opcode == opcode && c.service_action.is_none_or(|s| s == sa)),
    };
    let mut out = vec![0u8, 0];
    let Some(c) = found else {
        out[1] = 0x01; // not supported
        out.extend_from_slice(&[0, 0]);
        return Ok(out);
    };
    out[1] = 0x03 | if rctd { 0x80 } else { 0 };
    push_be(&mut out, c.usage.len() as u64, 2);
    out.extend_from_slice(c.usage);
    if rctd {
        out.extend_from_slice(&TIMEOUTS);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::cdb_len;
    use crate::wire::be32;

    fn rsoc(rctd: bool, options: u8, opcode: u8, sa: u16) -> Cdb {
        Cdb::ReportSupportedOpcodes {
            rctd,
            options,
            opcode,
            service_action: sa,
            alloc: 65535,
        }
    }

    #[test]
    fn usage_masks_match_cdb_lengths() {
        for c in COMMANDS {
            assert_eq!(c.usage[0], c.opcode);
            assert_eq!(
                Some(c.usage.len()),
                cdb_len(c.opcode),
                "opcode {:#x}",
                c.opcode
            );
        }
    }

    #[test]
    fn all_commands_layout() {
        let d = report(&rsoc(false, 0, 0, 0)).unwrap();
        assert_eq!(be32(&d) as usize, d.len() - 4);
        assert_eq!((d.len() - 4) / 8, COMMANDS.len());
        let t = report(&rsoc(true, 0, 0, 0)).unwrap();
        assert_eq!((t.len() - 4) / 20, COMMANDS.len());
    }

    #[test]
    fn one_command_formats() {
        let d = report(&rsoc(false, 1, op::READ_10, 0)).unwrap();
        assert_eq!(d[1] & 7, 3);
        assert_eq!(d[4], op::READ_10);
        assert!(report(&rsoc(false, 1, op::SERVICE_ACTION_IN_16, 0)).is_err());
        let d = report(&rsoc(false, 2, op::SERVICE_ACTION_IN_16, 0x10)).unwrap();
        assert_eq!(d[1] & 7, 3);
        assert!(report(&rsoc(false, 2, op::READ_10, 0)).is_err());
        let d = report(&rsoc(false, 1, 0xc5, 0)).unwrap();
        assert_eq!(d[1] & 7, 1);
    }

    #[test]
    fn new_writes_report_dpo_and_fua() {
        // Mode sense sets DPOFUA, so the usage data of these writes must show DPO and FUA.
        for opcode in [op::ORWRITE_16, op::WRITE_ATOMIC_16] {
            let d = report(&rsoc(false, 1, opcode, 0)).unwrap();
            assert_eq!(d[1] & 7, 3, "opcode {opcode:#x} supported");
            assert_eq!(d[5] & 0x18, 0x18, "opcode {opcode:#x}");
        }
        for opcode in [op::READ_DEFECT_DATA_10, op::READ_DEFECT_DATA_12] {
            assert_eq!(report(&rsoc(false, 1, opcode, 0)).unwrap()[1] & 7, 3);
        }
    }
}
