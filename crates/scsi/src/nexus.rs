//! The initiator a command comes from (its I_T nexus; one target port here), which persistent
//! reservations are kept for.

/// An initiator port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nexus {
    /// The initiator's name (an iSCSI name).
    pub name: String,
    /// The iSCSI initiator session ID, which with the name makes the initiator port.
    pub isid: [u8; 6],
}

impl Nexus {
    /// An iSCSI initiator port.
    pub fn iscsi(name: &str, isid: [u8; 6]) -> Self {
        Self {
            name: name.to_string(),
            isid,
        }
    }

    /// The iSCSI initiator port name, `<name>,i,0x<isid>` (SPC-4 §7.6.4.6, the iSCSI TransportID).
    pub fn port_name(&self) -> String {
        let isid: String = self.isid.iter().map(|b| format!("{b:02x}")).collect();
        format!("{},i,0x{isid}", self.name)
    }
}
