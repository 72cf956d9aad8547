//! Operational parameter negotiation (RFC 7143 §13): the initiator's offers in, our answers
//! and the resulting session parameters out.

/// Parameters in force after login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionParams {
    /// CRC32C header digest.
    pub header_digest: bool,
    /// CRC32C data digest.
    pub data_digest: bool,
    /// Largest data segment we may send (the initiator's declaration).
    pub initiator_max_recv: u32,
    /// Largest data segment the initiator may send us (our declaration).
    pub target_max_recv: u32,
    /// Largest solicited (and unsolicited) burst.
    pub max_burst: u32,
    /// Largest unsolicited burst.
    pub first_burst: u32,
    /// Data may ride in the SCSI Command PDU.
    pub immediate_data: bool,
    /// Unsolicited Data-Out PDUs are not allowed.
    pub initial_r2t: bool,
    /// R2Ts outstanding per task.
    pub max_outstanding_r2t: u32,
}

/// Our limits and preferences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetLimits {
    /// Our MaxRecvDataSegmentLength.
    pub max_recv_data_segment: u32,
    /// Our MaxBurstLength.
    pub max_burst: u32,
    /// Our FirstBurstLength.
    pub first_burst: u32,
}

impl Default for TargetLimits {
    fn default() -> Self {
        Self {
            max_recv_data_segment: 256 * 1024,
            max_burst: 1 << 20,
            first_burst: 256 * 1024,
        }
    }
}

impl SessionParams {
    /// RFC 7143 defaults.
    pub fn defaults(limits: &TargetLimits) -> Self {
        Self {
            header_digest: false,
            data_digest: false,
            initiator_max_recv: 8192,
            target_max_recv: limits.max_recv_data_segment,
            max_burst: 262_144.min(limits.max_burst),
            first_burst: 65_536.min(limits.first_burst),
            immediate_data: true,
            initial_r2t: true,
            max_outstanding_r2t: 1,
        }
    }
}

/// The result of negotiating one key: the answer to send (if any) or a failure.
pub type Answer = Result<Option<String>, NegotiationError>;

/// A key's value was not acceptable; login fails with an initiator error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unacceptable value {value:?} for {key}")]
pub struct NegotiationError {
    /// The key.
    pub key: String,
    /// Its value.
    pub value: String,
}

fn number(key: &str, value: &str, min: u32, max: u32) -> Result<u32, NegotiationError> {
    match value.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(NegotiationError {
            key: key.into(),
            value: value.into(),
        }),
    }
}

fn boolean(key: &str, value: &str) -> Result<bool, NegotiationError> {
    match value {
        "Yes" => Ok(true),
        "No" => Ok(false),
        _ => Err(NegotiationError {
            key: key.into(),
            value: value.into(),
        }),
    }
}

fn yes_no(b: bool) -> String {
    if b { "Yes" } else { "No" }.into()
}

fn digest(value: &str) -> Option<bool> {
    value.split(',').find_map(|v| match v {
        "CRC32C" => Some(true),
        "None" => Some(false),
        _ => None,
    })
}

/// Negotiates one operational key, updating `p`. Returns the answer value, `None` for keys
/// that are answered elsewhere (security, declarative login keys), or `NotUnderstood`.
pub fn negotiate(p: &mut SessionParams, limits: &TargetLimits, key: &str, value: &str) -> Answer {
    let answer = match key {
        "HeaderDigest" | "DataDigest" => {
            let Some(on) = digest(value) else {
                return Ok(Some("Reject".into()));
            };
            if key == "HeaderDigest" {
                p.header_digest = on
            } else {
                p.data_digest = on
            }
            if on { "CRC32C" } else { "None" }.into()
        }
        "MaxRecvDataSegmentLength" => {
            p.initiator_max_recv = number(key, value, 512, 16_777_215)?;
            return Ok(None);
        }
        "MaxBurstLength" => {
            p.max_burst = number(key, value, 512, 16_777_215)?.min(limits.max_burst);
            p.first_burst = p.first_burst.min(p.max_burst);
            p.max_burst.to_string()
        }
        "FirstBurstLength" => {
            p.first_burst = number(key, value, 512, 16_777_215)?.min(limits.first_burst);
            p.first_burst = p.first_burst.min(p.max_burst);
            p.first_burst.to_string()
        }
        "ImmediateData" => {
            p.immediate_data = boolean(key, value)?;
            yes_no(p.immediate_data)
        }
        "InitialR2T" => {
            p.initial_r2t = boolean(key, value)?;
            yes_no(p.initial_r2t)
        }
        "MaxOutstandingR2T" => {
            p.max_outstanding_r2t = number(key, value, 1, 65535)?.min(1);
            p.max_outstanding_r2t.to_string()
        }
        "DataPDUInOrder" | "DataSequenceInOrder" => {
            boolean(key, value)?;
            // We require in-order data (result is the OR of both sides).
            "Yes".into()
        }
        "ErrorRecoveryLevel" => {
            number(key, value, 0, 2)?;
            "0".into()
        }
        "MaxConnections" => {
            number(key, value, 1, 65535)?;
            "1".into()
        }
        "DefaultTime2Wait" => {
            number(key, value, 0, 3600)?;
            "2".into()
        }
        "DefaultTime2Retain" => {
            number(key, value, 0, 3600)?;
            "0".into()
        }
        "IFMarker" | "OFMarker" => "No".into(),
        "InitiatorName" | "InitiatorAlias" | "TargetName" | "SessionType" | "AuthMethod"
        | "TargetAlias" => return Ok(None),
        k if k.starts_with("CHAP_") => return Ok(None),
        k if k.starts_with("X-") || k.starts_with("X#") => "NotUnderstood".into(),
        _ => "NotUnderstood".into(),
    };
    Ok(Some(answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pairs: &[(&str, &str)]) -> (SessionParams, Vec<(String, Option<String>)>) {
        let limits = TargetLimits::default();
        let mut p = SessionParams::defaults(&limits);
        let answers = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), negotiate(&mut p, &limits, k, v).unwrap()))
            .collect();
        (p, answers)
    }

    #[test]
    fn negotiates_standard_keys() {
        let (p, a) = run(&[
            ("HeaderDigest", "CRC32C,None"),
            ("DataDigest", "None"),
            ("MaxRecvDataSegmentLength", "65536"),
            ("MaxBurstLength", "16776192"),
            ("FirstBurstLength", "262144"),
            ("ImmediateData", "Yes"),
            ("InitialR2T", "No"),
            ("MaxOutstandingR2T", "8"),
            ("ErrorRecoveryLevel", "2"),
            ("MaxConnections", "4"),
            ("X-com.example", "1"),
        ]);
        assert!(p.header_digest && !p.data_digest);
        assert_eq!(p.initiator_max_recv, 65536);
        assert_eq!(p.max_burst, 1 << 20);
        assert_eq!(p.first_burst, 262_144);
        assert!(!p.initial_r2t);
        assert_eq!(a[7].1.as_deref(), Some("1"));
        assert_eq!(a[8].1.as_deref(), Some("0"));
        assert_eq!(a[9].1.as_deref(), Some("1"));
        assert_eq!(a[10].1.as_deref(), Some("NotUnderstood"));
        assert_eq!(a[2].1, None);
    }

    #[test]
    fn bad_values_fail() {
        let limits = TargetLimits::default();
        let mut p = SessionParams::defaults(&limits);
        assert!(negotiate(&mut p, &limits, "MaxBurstLength", "12x").is_err());
        assert!(negotiate(&mut p, &limits, "ImmediateData", "Maybe").is_err());
        assert_eq!(
            negotiate(&mut p, &limits, "HeaderDigest", "MD5")
                .unwrap()
                .as_deref(),
            Some("Reject")
        );
    }
}
