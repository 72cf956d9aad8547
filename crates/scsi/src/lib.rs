//! SCSI block commands (SPC-4 / SBC-3) for Mariner volumes, with no I/O of its own.
//!
//! - [`cdb`]: CDB decoding into the open enum [`Cdb`] (unknown operation codes decode to
//!   [`Cdb::Unsupported`]).
//! - [`sense`]: status codes and fixed/descriptor sense data.
//! - [`backend`]: the [`BlockBackend`] trait a volume implements; [`memory`]: a RAM one.
//! - [`lun`]: command execution ([`Lun::execute`]); [`inquiry`], [`mode`], [`opcodes`]: the
//!   data those commands return.
//!
//! Commands executed: TEST UNIT READY, REQUEST SENSE, INQUIRY (VPD 0x00, 0x80, 0x83, 0x8F,
//! 0xB0, 0xB1, 0xB2), MODE SENSE/SELECT 6/10 (Caching, Control), START STOP UNIT, PREVENT ALLOW
//! MEDIUM REMOVAL, READ CAPACITY 10/16, READ/WRITE 6/10/12/16, VERIFY and WRITE AND VERIFY
//! 10/12/16, SYNCHRONIZE CACHE 10/16, PRE-FETCH 10/16, WRITE SAME 10/16 (with UNMAP/NDOB, zero
//! blocks = to the end), UNMAP, GET LBA STATUS, COMPARE AND WRITE, ORWRITE 16, WRITE ATOMIC 16,
//! READ DEFECT DATA 10/12 ([`defect`]), EXTENDED COPY (LID1) and RECEIVE COPY RESULTS (COPY
//! STATUS, OPERATING PARAMETERS) within the unit ([`xcopy`]), REPORT LUNS, REPORT SUPPORTED
//! OPERATION CODES, PERSISTENT RESERVE IN/OUT and RESERVE/RELEASE(6/10) ([`pr`], shared per
//! unit by [`reservations`]). Unit attentions and the task set a LOGICAL UNIT RESET aborts are
//! shared per unit by [`unit`].
//! Everything else answers ILLEGAL REQUEST / INVALID COMMAND OPERATION CODE.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod cdb;
pub mod defect;
pub mod fuzzing;
pub mod inquiry;
pub mod lun;
pub mod memory;
pub mod mode;
pub mod nexus;
pub mod opcodes;
pub mod pr;
pub mod reservations;
pub mod sense;
pub mod unit;
pub mod wire;
pub mod xcopy;

pub use backend::{BackendError, BlockBackend, CompareOutcome, Geometry, Provisioning};
pub use cdb::Cdb;
pub use lun::{data_out_len, Lun, Response};
pub use memory::MemoryBackend;
pub use nexus::Nexus;
pub use pr::{PrState, Refusal};
pub use reservations::{PrPersist, Reservations};
pub use sense::{Asc, Sense, SenseKey, Status};
pub use unit::{Attachment, TaskTicket, UnitState};
