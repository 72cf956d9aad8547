//! Rollback (stub, filled in next).

use std::collections::BTreeMap;

use crate::engine::History;
use crate::HistoryError;

#[derive(Debug, Default)]
pub(crate) struct Rollbacks(#[allow(dead_code)] BTreeMap<u32, ()>);

impl History {
    pub(crate) fn load_rollbacks(&self) -> Result<(), HistoryError> {
        let _ = &self.inner.rollbacks;
        Ok(())
    }
}

// TEMPORARY STUB (main tree only, never committed): the helper's real rollback replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollbackWrite<'a> {
    Data { offset: u64, data: &'a [u8] },
    Zero { offset: u64, length: u64 },
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackStatus {
    pub volume: u32,
    pub to: crate::Point,
    pub from: crate::Point,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub finished: bool,
}
impl History {
    pub fn begin_rollback(
        &self,
        _v: u32,
        _to: crate::Point,
    ) -> Result<RollbackStatus, HistoryError> {
        Err(HistoryError::Config("stub".into()))
    }
    pub fn run_rollback(
        &self,
        _v: u32,
        _c: u64,
        _w: &mut dyn FnMut(RollbackWrite<'_>) -> Result<(), String>,
        _p: &mut dyn FnMut(&RollbackStatus),
    ) -> Result<RollbackStatus, HistoryError> {
        Err(HistoryError::Config("stub".into()))
    }
    pub fn pending_rollbacks(&self) -> Vec<RollbackStatus> {
        Vec::new()
    }
}
