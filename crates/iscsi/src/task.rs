//! One SCSI task: a command whose data-out has all arrived, run against the LUN apart from
//! the session loop. It produces a [`Completion`] (data-in, status, residuals); the session
//! turns it into PDUs, stamping StatSN, ExpCmdSN and MaxCmdSN in the order completions arrive.

use std::sync::Arc;

use mariner_scsi::pr::Access;
use mariner_scsi::{data_out_len, Asc, Cdb, Lun, Nexus, Sense, SenseKey, Status};

/// SCSI Response flag: residual overflow (the command wanted more than EDTL).
pub(crate) const OVERFLOW: u8 = 0x04;
/// SCSI Response flag: residual underflow (the command moved less than EDTL).
pub(crate) const UNDERFLOW: u8 = 0x02;

/// A command ready to run.
#[derive(Debug)]
pub(crate) struct Command {
    pub itt: u32,
    pub lun_id: u64,
    pub cdb: [u8; 16],
    /// Expected data transfer length from the SCSI Command PDU.
    pub edtl: u32,
    /// The data-out buffer (empty for reads).
    pub data: Vec<u8>,
    /// The command carried the W bit or data.
    pub write: bool,
}

/// What a finished command sends back.
#[derive(Debug)]
pub(crate) struct Completion {
    pub itt: u32,
    pub lun_id: u64,
    /// Data-in, already clipped to EDTL.
    pub data_in: Vec<u8>,
    pub status: Status,
    pub sense: Option<Sense>,
    /// [`OVERFLOW`], [`UNDERFLOW`] or 0.
    pub flag: u8,
    pub resid: u32,
}

impl Completion {
    fn check(cmd: &Command, sense: Sense, flag: u8, resid: u32) -> Self {
        Self {
            itt: cmd.itt,
            lun_id: cmd.lun_id,
            data_in: Vec::new(),
            status: Status::CheckCondition,
            sense: Some(sense),
            flag,
            resid,
        }
    }
}

/// Runs `cmd` for the initiator port `nexus`.
pub(crate) async fn run(lun: Arc<Lun>, nexus: Arc<Nexus>, mut cmd: Command) -> Completion {
    if cmd.lun_id != 0 {
        let sense = Sense::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED);
        return Completion::check(&cmd, sense, 0, 0);
    }
    let block_size = lun.block_size();
    let expected_out = data_out_len(&cmd.cdb, block_size).unwrap_or(0);
    let edtl = u64::from(cmd.edtl);
    let parsed = Cdb::parse(&cmd.cdb);
    if expected_out != edtl && matches!(parsed, Ok(Cdb::CompareAndWrite { .. })) {
        // SBC-3 5.2: the data-out is exactly the verify and the write data; any other
        // length means the NUMBER OF LOGICAL BLOCKS field is wrong. Nothing is written.
        return Completion::check(&cmd, Sense::invalid_field_in_cdb(13), 0, 0);
    }
    if expected_out < edtl && matches!(parsed, Ok(Cdb::WriteSame { ndob: false, .. })) {
        // WRITE SAME's data-out is one block by definition: more is a malformed command, not
        // a short transfer. (Less is refused below, as for any command but WRITE.)
        let sense = Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_COMMAND_IU);
        return Completion::check(&cmd, sense, UNDERFLOW, (edtl - expected_out) as u32);
    }
    if expected_out > edtl {
        return run_overflow(&lun, &nexus, &cmd, parsed, (expected_out - edtl) as u32).await;
    }
    let carried_data = !cmd.data.is_empty();
    let data_out = bytes::Bytes::from(std::mem::take(&mut cmd.data));
    let resp = lun.execute_owned(&nexus, &cmd.cdb, data_out).await;
    let produced = if cmd.write || carried_data {
        expected_out
    } else {
        resp.data.len() as u64
    };
    let (flag, resid) = if produced > edtl {
        (OVERFLOW, (produced - edtl) as u32)
    } else if produced < edtl {
        (UNDERFLOW, (edtl - produced) as u32)
    } else {
        (0, 0)
    };
    let mut data_in = resp.data;
    data_in.truncate(cmd.edtl as usize);
    Completion {
        itt: cmd.itt,
        lun_id: cmd.lun_id,
        data_in,
        status: resp.status,
        sense: resp.sense,
        flag,
        resid,
    }
}

/// The CDB wants more data-out than EDTL allows.
async fn run_overflow(
    lun: &Lun,
    nexus: &Nexus,
    cmd: &Command,
    parsed: Result<Cdb, Sense>,
    resid: u32,
) -> Completion {
    let writes = matches!(&parsed, Ok(c) if Access::of(c) == Access::Write);
    if matches!(parsed, Ok(Cdb::Write { .. } | Cdb::WriteAndVerify { .. }))
        || (writes && lun.geometry().read_only)
    {
        // Process the write without transferring data beyond EDTL (whole blocks). On a
        // write-protected unit any command that writes fails with WRITE PROTECTED whatever
        // data came with it: the unit answers before it looks at the data.
        let resp = if lun.geometry().read_only {
            lun.execute_as(nexus, &cmd.cdb, &cmd.data).await
        } else {
            lun.execute_truncated_write_as(nexus, &cmd.cdb, &cmd.data)
                .await
        };
        return Completion {
            itt: cmd.itt,
            lun_id: cmd.lun_id,
            data_in: Vec::new(),
            status: resp.status,
            sense: resp.sense,
            flag: OVERFLOW,
            resid,
        };
    }
    // Other commands cannot be truncated meaningfully: refuse without writing.
    let sense = Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_COMMAND_IU);
    Completion::check(cmd, sense, OVERFLOW, resid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mariner_scsi::MemoryBackend;

    fn write_command(cdb: &[u8], data: Vec<u8>) -> Command {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        Command {
            itt: 1,
            lun_id: 0,
            cdb: c,
            edtl: data.len() as u32,
            data,
            write: true,
        }
    }

    #[tokio::test]
    async fn write_same_data_out_must_be_exactly_one_block() {
        let lun = Arc::new(Lun::new(Arc::new(MemoryBackend::new("t", 512, 64))));
        let nexus = Arc::new(Nexus::iscsi("i", [0; 6]));
        let mut cdb = [0u8; 16];
        cdb[0] = 0x93;
        cdb[1] = 0x08; // UNMAP
        cdb[13] = 1;
        for len in [256, 1024] {
            let cmd = write_command(&cdb, vec![0; len]);
            let done = run(lun.clone(), nexus.clone(), cmd).await;
            assert_eq!(
                done.status,
                Status::CheckCondition,
                "data-out of {len} bytes"
            );
            let sense = done.sense.expect("sense data");
            assert_eq!(sense.asc, Asc::INVALID_FIELD_IN_COMMAND_IU);
        }
        let done = run(lun, nexus, write_command(&cdb, vec![0; 512])).await;
        assert_eq!((done.status, done.flag), (Status::Good, 0));
    }
}
