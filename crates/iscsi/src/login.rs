//! The login phase as a sans-I/O state machine (RFC 7143 §6.3, §11.12–11.13).
//!
//! [`Login::handle`] takes one Login Request PDU and returns the Login Response to send and
//! what happens next: keep going, enter the full feature phase with the negotiated
//! [`Established`] session, or close after the (failure) response.
//!
//! Stages: security (CSG 0: AuthMethod, then CHAP_A → CHAP_I/CHAP_C → CHAP_N/CHAP_R
//! [/CHAP_I/CHAP_C for mutual]), operational (CSG 1: [`crate::params`]), full feature (3).
//! When the target has CHAP configured, a login that skips or fails it is refused with
//! "authentication failure" (0x0201).

use std::sync::Arc;

use crate::chap;
use crate::params::{negotiate, SessionParams, TargetLimits};
use crate::pdu::{Opcode, Pdu};
use crate::targets::{Target, Targets};
use crate::text;

/// Login status class/detail (RFC 7143 §11.13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum LoginStatus {
    Success,
    InitiatorError,
    AuthenticationFailed,
    AuthorizationFailed,
    NotFound,
    UnsupportedVersion,
    MissingParameter,
    SessionTypeNotSupported,
    InvalidDuringLogin,
    TargetError,
    OutOfResources,
}

impl LoginStatus {
    /// (class, detail).
    pub fn code(self) -> (u8, u8) {
        match self {
            Self::Success => (0, 0),
            Self::InitiatorError => (2, 0),
            Self::AuthenticationFailed => (2, 1),
            Self::AuthorizationFailed => (2, 2),
            Self::NotFound => (2, 3),
            Self::UnsupportedVersion => (2, 5),
            Self::MissingParameter => (2, 7),
            Self::SessionTypeNotSupported => (2, 9),
            Self::InvalidDuringLogin => (2, 0x0b),
            Self::TargetError => (3, 0),
            Self::OutOfResources => (3, 2),
        }
    }
}

/// The kind of session being logged in.
#[derive(Debug, Clone)]
pub enum SessionKind {
    /// SendTargets only.
    Discovery,
    /// I/O to a target.
    Normal(Target),
}

/// A completed login.
#[derive(Debug, Clone)]
pub struct Established {
    /// Discovery or normal.
    pub kind: SessionKind,
    /// Negotiated parameters.
    pub params: SessionParams,
    /// The initiator's name.
    pub initiator: String,
    /// The initiator session ID; with the name it identifies the initiator port (I_T nexus).
    pub isid: [u8; 6],
    /// Next StatSN to use.
    pub stat_sn: u32,
    /// Next expected CmdSN.
    pub exp_cmd_sn: u32,
}

/// What to do after sending the response.
#[derive(Debug)]
pub enum Next {
    /// Wait for the next Login Request.
    Continue,
    /// Enter the full feature phase.
    FullFeature(Box<Established>),
    /// Close the connection.
    Close,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Auth {
    /// Nothing exchanged yet.
    Start,
    /// AuthMethod=CHAP agreed; waiting for CHAP_A.
    ChapAlgorithm,
    /// Challenge sent; waiting for CHAP_N/CHAP_R.
    ChapResponse {
        id: u8,
        challenge: [u8; chap::CHALLENGE_LEN],
    },
    /// Authenticated (or no authentication needed).
    Done,
}

/// Window of CmdSNs the target accepts beyond ExpCmdSN.
pub const CMD_WINDOW: u32 = 64;

/// The login state machine of one connection.
pub struct Login {
    targets: Arc<dyn Targets>,
    limits: TargetLimits,
    tsih: u16,
    auth: Auth,
    kind: Option<SessionKind>,
    initiator: Option<String>,
    params: SessionParams,
    isid: [u8; 6],
    stat_sn: u32,
    exp_cmd_sn: u32,
    first: bool,
    tpgt_sent: bool,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl Login {
    /// A fresh login for a connection; `tsih` is the session handle to assign.
    pub fn new(targets: Arc<dyn Targets>, limits: TargetLimits, tsih: u16) -> Self {
        Self {
            targets,
            limits,
            tsih,
            auth: Auth::Start,
            kind: None,
            initiator: None,
            params: SessionParams::defaults(&limits),
            isid: [0; 6],
            stat_sn: 0,
            exp_cmd_sn: 0,
            first: true,
            tpgt_sent: false,
        }
    }

    /// Handles one Login Request.
    pub fn handle(&mut self, req: &Pdu) -> (Pdu, Next) {
        match self.step(req) {
            Ok(out) => out,
            Err(status) => (
                self.response(req, status, false, 0, Vec::new()),
                Next::Close,
            ),
        }
    }

    fn step(&mut self, req: &Pdu) -> Result<(Pdu, Next), LoginStatus> {
        if req.opcode() != Opcode::LoginRequest {
            return Err(LoginStatus::InvalidDuringLogin);
        }
        if req.flags() & 0x40 != 0 {
            // Continued text spanning PDUs is not needed by any login we accept.
            return Err(LoginStatus::InitiatorError);
        }
        let transit = req.flags() & 0x80 != 0;
        let csg = (req.flags() >> 2) & 0x03;
        let nsg = req.flags() & 0x03;
        if self.first {
            self.start(req)?;
        }
        let pairs = text::parse(&req.data).map_err(|_| LoginStatus::InitiatorError)?;
        if self.first {
            self.identify(&pairs)?;
            self.first = false;
        }
        let mut answers: Vec<(String, String)> = Vec::new();
        match csg {
            0 => self.security(&pairs, &mut answers)?,
            1 => self.operational(&pairs, &mut answers)?,
            _ => return Err(LoginStatus::InitiatorError),
        }
        if self.first_answer_pending() {
            answers.push(("TargetPortalGroupTag".into(), "1".into()));
        }
        let can_transit = transit && self.auth == Auth::Done && nsg > csg && nsg != 2;
        if transit && !can_transit && self.auth == Auth::Done {
            return Err(LoginStatus::InitiatorError);
        }
        if can_transit && nsg == 3 {
            answers.push((
                "MaxRecvDataSegmentLength".into(),
                self.limits.max_recv_data_segment.to_string(),
            ));
        }
        let data = text::encode(&answers);
        let nsg_out = if can_transit { nsg } else { 0 };
        let resp = self.response(
            req,
            LoginStatus::Success,
            can_transit,
            (csg << 2) | nsg_out,
            data,
        );
        if can_transit && nsg == 3 {
            return Ok((resp, Next::FullFeature(Box::new(self.established()?))));
        }
        Ok((resp, Next::Continue))
    }

    fn first_answer_pending(&mut self) -> bool {
        // TargetPortalGroupTag goes in the first response of a normal session.
        let pending = matches!(self.kind, Some(SessionKind::Normal(_))) && !self.tpgt_sent;
        self.tpgt_sent |= pending;
        pending
    }

    fn start(&mut self, req: &Pdu) -> Result<(), LoginStatus> {
        let (max, min) = (req.bhs[2], req.bhs[3]);
        if min > 0 || max < min {
            return Err(LoginStatus::UnsupportedVersion);
        }
        self.isid.copy_from_slice(&req.bhs[8..14]);
        self.stat_sn = req.u32_at(28);
        self.exp_cmd_sn = req.u32_at(24);
        Ok(())
    }

    fn identify(&mut self, pairs: &[(String, String)]) -> Result<(), LoginStatus> {
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        let initiator = get("InitiatorName").ok_or(LoginStatus::MissingParameter)?;
        self.initiator = Some(initiator.to_string());
        self.kind = Some(match get("SessionType").unwrap_or("Normal") {
            "Discovery" => SessionKind::Discovery,
            "Normal" => {
                let name = get("TargetName").ok_or(LoginStatus::MissingParameter)?;
                let target = self.targets.get(name).ok_or(LoginStatus::NotFound)?;
                if !target.allows(initiator) {
                    return Err(LoginStatus::AuthorizationFailed);
                }
                SessionKind::Normal(target)
            }
            _ => return Err(LoginStatus::SessionTypeNotSupported),
        });
        if self.chap_config().is_none() {
            self.auth = Auth::Done;
        }
        Ok(())
    }

    fn chap_config(&self) -> Option<crate::targets::Chap> {
        match &self.kind {
            Some(SessionKind::Normal(t)) => t.chap.clone(),
            _ => None,
        }
    }

    fn security(
        &mut self,
        pairs: &[(String, String)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), LoginStatus> {
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        if let Some(methods) = get("AuthMethod") {
            let offered: Vec<&str> = methods.split(',').collect();
            let chosen = if self.chap_config().is_some() {
                if !offered.contains(&"CHAP") {
                    return Err(LoginStatus::AuthenticationFailed);
                }
                self.auth = Auth::ChapAlgorithm;
                "CHAP"
            } else if offered.contains(&"None") {
                "None"
            } else {
                "Reject"
            };
            out.push(("AuthMethod".into(), chosen.into()));
        }
        match self.auth.clone() {
            Auth::ChapAlgorithm => {
                if let Some(algs) = get("CHAP_A") {
                    if !algs.split(',').any(|a| a == chap::MD5_ALGORITHM) {
                        return Err(LoginStatus::AuthenticationFailed);
                    }
                    let challenge = chap::challenge().ok_or(LoginStatus::TargetError)?;
                    let id = challenge[0];
                    out.push(("CHAP_A".into(), chap::MD5_ALGORITHM.into()));
                    out.push(("CHAP_I".into(), id.to_string()));
                    out.push(("CHAP_C".into(), chap::to_hex(&challenge)));
                    self.auth = Auth::ChapResponse { id, challenge };
                }
            }
            Auth::ChapResponse { id, challenge } => self.verify_chap(id, &challenge, pairs, out)?,
            Auth::Start => {
                if self.chap_config().is_some() {
                    return Err(LoginStatus::AuthenticationFailed);
                }
            }
            Auth::Done => {}
        }
        self.negotiate_all(pairs, out)
    }

    fn verify_chap(
        &mut self,
        id: u8,
        challenge: &[u8],
        pairs: &[(String, String)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), LoginStatus> {
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        let config = self
            .chap_config()
            .ok_or(LoginStatus::AuthenticationFailed)?;
        let fail = LoginStatus::AuthenticationFailed;
        let name = get("CHAP_N").ok_or(fail)?;
        let response = get("CHAP_R").and_then(chap::from_binary).ok_or(fail)?;
        let expected = chap::response(id, config.secret.as_bytes(), challenge);
        if name != config.user || !chap::equal(&response, &expected) {
            return Err(fail);
        }
        if let Some(their_id) = get("CHAP_I") {
            let (user, secret) = config.mutual.ok_or(fail)?;
            let their_id: u8 = their_id.parse().map_err(|_| fail)?;
            let their_challenge = get("CHAP_C").and_then(chap::from_binary).ok_or(fail)?;
            // A reflected challenge would let an attacker use us as an oracle.
            if their_challenge == challenge || their_challenge.len() < 8 {
                return Err(fail);
            }
            let ours = chap::response(their_id, secret.as_bytes(), &their_challenge);
            out.push(("CHAP_N".into(), user));
            out.push(("CHAP_R".into(), chap::to_hex(&ours)));
        } else if config.mutual.is_some() {
            // The target is configured for mutual CHAP; one-way is still acceptable to us.
        }
        self.auth = Auth::Done;
        Ok(())
    }

    fn operational(
        &mut self,
        pairs: &[(String, String)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), LoginStatus> {
        if self.auth != Auth::Done {
            return Err(LoginStatus::AuthenticationFailed);
        }
        self.negotiate_all(pairs, out)
    }

    fn negotiate_all(
        &mut self,
        pairs: &[(String, String)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), LoginStatus> {
        for (key, value) in pairs {
            let answer = negotiate(&mut self.params, &self.limits, key, value)
                .map_err(|_| LoginStatus::InitiatorError)?;
            if let Some(answer) = answer {
                out.push((key.clone(), answer));
            }
        }
        Ok(())
    }

    fn established(&self) -> Result<Established, LoginStatus> {
        Ok(Established {
            kind: self.kind.clone().ok_or(LoginStatus::InitiatorError)?,
            params: self.params,
            initiator: self.initiator.clone().unwrap_or_default(),
            isid: self.isid,
            stat_sn: self.stat_sn.wrapping_add(1),
            exp_cmd_sn: self.exp_cmd_sn,
        })
    }

    fn response(
        &self,
        req: &Pdu,
        status: LoginStatus,
        transit: bool,
        stages: u8,
        data: Vec<u8>,
    ) -> Pdu {
        let mut p = Pdu::new(Opcode::LoginResponse);
        p.bhs[1] = if transit { 0x80 } else { 0 } | stages;
        p.bhs[2] = 0;
        p.bhs[3] = 0;
        p.bhs[8..14].copy_from_slice(&req.bhs[8..14]);
        if transit && stages & 0x03 == 3 {
            crate::wire::put_be(&mut p.bhs[14..16], u64::from(self.tsih));
        }
        p.set_itt(req.itt());
        p.set_u32(24, self.stat_sn);
        p.set_u32(28, self.exp_cmd_sn);
        p.set_u32(32, self.exp_cmd_sn.wrapping_add(CMD_WINDOW - 1));
        let (class, detail) = status.code();
        p.bhs[36] = class;
        p.bhs[37] = detail;
        p.data = data;
        p
    }
}
