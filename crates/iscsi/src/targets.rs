//! What the server serves: targets by IQN, each with LUN 0, optional CHAP and an initiator
//! ACL.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use mariner_scsi::Lun;

/// CHAP credentials of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chap {
    /// Name the initiator must present (CHAP_N).
    pub user: String,
    /// Secret the initiator proves (at least 12 bytes recommended).
    pub secret: String,
    /// For mutual CHAP: the name and secret the target proves to the initiator.
    pub mutual: Option<(String, String)>,
}

/// One target.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its iSCSI qualified name.
    pub iqn: String,
    /// LUN 0.
    pub lun: Arc<Lun>,
    /// When set, logins must authenticate with CHAP.
    pub chap: Option<Chap>,
    /// Initiator names allowed in; empty allows everyone.
    pub allowed_initiators: Vec<String>,
}

impl Target {
    /// Whether `initiator` may log in.
    pub fn allows(&self, initiator: &str) -> bool {
        self.allowed_initiators.is_empty() || self.allowed_initiators.iter().any(|i| i == initiator)
    }
}

/// The set of targets a server offers.
pub trait Targets: Send + Sync {
    /// Every target's IQN, for SendTargets=All.
    fn names(&self) -> Vec<String>;
    /// Looks a target up by IQN.
    fn get(&self, iqn: &str) -> Option<Target>;
    /// A normal session logged in to `target`; the returned value is dropped when the session
    /// ends (the node counts the session as a connection to the volume while it lives).
    fn hold(&self, _target: &Target) -> Box<dyn Send + Sync> {
        Box::new(())
    }
}

/// An in-memory [`Targets`] for tests and examples.
#[derive(Debug, Default)]
pub struct MemoryTargets {
    targets: RwLock<BTreeMap<String, Target>>,
}

impl MemoryTargets {
    /// No targets.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a target.
    pub fn add(&self, target: Target) {
        if let Ok(mut map) = self.targets.write() {
            map.insert(target.iqn.clone(), target);
        }
    }
}

impl Targets for MemoryTargets {
    fn names(&self) -> Vec<String> {
        self.targets
            .read()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn get(&self, iqn: &str) -> Option<Target> {
        self.targets.read().ok()?.get(iqn).cloned()
    }
}
