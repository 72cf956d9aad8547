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
