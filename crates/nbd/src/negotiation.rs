//! Option-level handshake logic: one parsed option in, the replies (and maybe the end of the
//! handshake) out. Byte framing lives in [`crate::handshake`].

use std::sync::Arc;

use crate::backend::{ConnectionGuard, Export, ExportInfo, Exports};
use crate::option::{ClientOption, InfoRequest, MetaContextRequest, OptionError};
use crate::option_reply::{InfoReply, OptionReply, OptionReplyBody};
use crate::wire::{InfoType, OptionReplyType, OptionType, TransmissionFlags, WireString};

/// Name of the only metadata context this server offers.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Context id `base:allocation` gets from `NBD_OPT_SET_META_CONTEXT`.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// Upper bound applied to an export's `max_payload_bytes`: 2^25, the size the spec says no
/// client should have to go beyond, and what one in-flight request may make the server buffer.
pub const MAX_PAYLOAD_LIMIT: u32 = 1 << 25;

/// The block size constraints of an export, checked against the spec's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    min: u32,
    preferred: u32,
    max_payload: u32,
}

/// An export's block sizes break the spec's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid block sizes: min {min}, preferred {preferred}, max payload {max_payload}")]
pub struct InvalidBlockSizes {
    /// `block_size_min` as given.
    pub min: u32,
    /// `block_size_preferred` as given.
    pub preferred: u32,
    /// `max_payload_bytes` as given.
    pub max_payload: u32,
}

impl BlockSizes {
    /// Checks an export's sizes: min a power of two up to 64 KiB, preferred a power of two at
    /// least max(min, 512), max payload at least preferred. The payload is capped at
    /// [`MAX_PAYLOAD_LIMIT`].
    pub fn from_info(info: &ExportInfo) -> Result<Self, InvalidBlockSizes> {
        let (min, preferred) = (info.block_size_min, info.block_size_preferred);
        let max_payload = info.max_payload_bytes.min(MAX_PAYLOAD_LIMIT);
        let min_ok = min.is_power_of_two() && min <= 1 << 16;
        let preferred_ok = preferred.is_power_of_two() && preferred >= min.max(512);
        if !min_ok || !preferred_ok || max_payload < preferred {
            let max_payload = info.max_payload_bytes;
            return Err(InvalidBlockSizes {
                min,
                preferred,
                max_payload,
            });
        }
        Ok(Self {
            min,
            preferred,
            max_payload,
        })
    }

    /// The spec's defaults for a client that negotiated nothing: 1-byte blocks, 4 KiB
    /// preferred, 32 MiB payloads.
    pub fn spec_default() -> Self {
        Self {
            min: 1,
            preferred: 4096,
            max_payload: MAX_PAYLOAD_LIMIT,
        }
    }

    /// Minimum block size: every offset and length must be a multiple.
    pub fn min(&self) -> u32 {
        self.min
    }

    /// Preferred block size.
    pub fn preferred(&self) -> u32 {
        self.preferred
    }

    /// Maximum READ/WRITE payload, at most [`MAX_PAYLOAD_LIMIT`].
    pub fn max_payload(&self) -> u32 {
        self.max_payload
    }

    /// Whether `value` is a multiple of the minimum block size (a power of two).
    pub fn is_aligned(&self, value: u64) -> bool {
        value & (u64::from(self.min) - 1) == 0
    }
}

/// The transmission flags advertised for `info`.
///
/// `SEND_DF` depends on structured replies: reads are always answered with a single data
/// chunk, so "don't fragment" holds for every read this server accepts.
pub fn transmission_flags(info: &ExportInfo, structured: bool) -> TransmissionFlags {
    let mut flags =
        TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_FLUSH | TransmissionFlags::SEND_FUA;
    let optional = [
        (info.read_only, TransmissionFlags::READ_ONLY),
        (info.can_trim, TransmissionFlags::SEND_TRIM),
        (info.can_write_zeroes, TransmissionFlags::SEND_WRITE_ZEROES),
        (info.can_multi_conn, TransmissionFlags::CAN_MULTI_CONN),
        (structured, TransmissionFlags::SEND_DF),
    ];
    for (on, flag) in optional {
        if on {
            flags |= flag;
        }
    }
    flags
}

/// Why the handshake ended with a hard disconnect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The client set flags this server did not offer.
    #[error("client sent unknown flags {0:#x}")]
    UnknownClientFlags(u32),
    /// The client does not speak fixed newstyle.
    #[error("client does not support fixed newstyle negotiation")]
    NotFixedNewstyle,
    /// An option header did not start with `IHAVEOPT`.
    #[error("bad option magic {0:#018x}")]
    BadOptionMagic(u64),
    /// `NBD_OPT_EXPORT_NAME` longer than the 4096-byte string limit.
    #[error("export name of {0} bytes is too long")]
    ExportNameTooLong(u32),
    /// `NBD_OPT_EXPORT_NAME` carried a malformed name.
    #[error("bad export name: {0}")]
    BadExportName(OptionError),
    /// `NBD_OPT_EXPORT_NAME` named an export that does not exist (it cannot be refused).
    #[error("no such export: {0:?}")]
    UnknownExport(String),
    /// `NBD_OPT_EXPORT_NAME` selected an export that cannot be served.
    #[error("export {name:?} cannot be served: {reason}")]
    ExportUnusable {
        /// Export name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The client sent more options than a sane client needs.
    #[error("too many options ({0})")]
    TooManyOptions(u32),
    /// Input arrived after the handshake had already ended.
    #[error("handshake already finished")]
    Finished,
}

/// The result of a completed negotiation: everything transmission needs.
pub struct Negotiated {
    /// The selected export.
    pub export: Arc<dyn Export>,
    /// The export's description as negotiated.
    pub info: ExportInfo,
    /// The name the connection is registered under.
    pub name: String,
    /// Transmission flags sent to the client.
    pub flags: TransmissionFlags,
    /// Checked block size constraints.
    pub block_sizes: BlockSizes,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// Context id of `base:allocation`, if selected for this export.
    pub base_allocation: Option<u32>,
    /// The client asked for `NBD_INFO_BLOCK_SIZE` in `NBD_OPT_GO`, committing to obey it.
    pub block_size_negotiated: bool,
    /// Keeps the export's connection count; dropped when the connection is done.
    pub guard: ConnectionGuard,
}

impl std::fmt::Debug for Negotiated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Negotiated")
            .field("name", &self.name)
            .field("size_bytes", &self.info.size_bytes)
            .field("flags", &self.flags)
            .field("structured", &self.structured)
            .field("base_allocation", &self.base_allocation)
            .field("block_size_negotiated", &self.block_size_negotiated)
            .finish_non_exhaustive()
    }
}

/// What handling one option produced.
#[derive(Debug)]
pub enum Step {
    /// Send these replies and keep negotiating.
    Continue(Vec<OptionReply>),
    /// Send these replies (ending in `NBD_REP_ACK`), then enter transmission.
    Go(Vec<OptionReply>, Box<Negotiated>),
    /// Send the `NBD_OPT_EXPORT_NAME` reply, then enter transmission.
    ExportName(Box<Negotiated>),
    /// Send this acknowledgement, then close.
    Abort(OptionReply),
    /// Hard disconnect.
    Close(HandshakeError),
}

/// Settings of the option-level negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NegotiationConfig {
    /// Refuse `NBD_OPT_GO` without an `NBD_INFO_BLOCK_SIZE` request
    /// (`NBD_REP_ERR_BLOCK_SIZE_REQD`) and `NBD_OPT_EXPORT_NAME` altogether. Off by default:
    /// requests violating the constraints are refused per request with `NBD_EINVAL` anyway.
    pub require_block_size: bool,
}

/// Option-level negotiation state.
pub struct Negotiation {
    exports: Arc<dyn Exports>,
    config: NegotiationConfig,
    structured: bool,
    /// Canonical name of the export `base:allocation` was selected for.
    meta_export: Option<String>,
}

impl Negotiation {
    /// Starts negotiating against `exports`.
    pub fn new(exports: Arc<dyn Exports>, config: NegotiationConfig) -> Self {
        Self {
            exports,
            config,
            structured: false,
            meta_export: None,
        }
    }

    /// Whether structured replies have been negotiated so far.
    pub fn structured(&self) -> bool {
        self.structured
    }

    /// Parses and handles one option's raw data.
    pub fn handle_raw(&mut self, option: OptionType, data: &[u8]) -> Step {
        match ClientOption::parse(option, data) {
            Ok(parsed) => self.handle_option(parsed),
            Err(e) if option == OptionType::ExportName => {
                Step::Close(HandshakeError::BadExportName(e))
            }
            Err(e) => {
                let reply = OptionReply::error(option, OptionReplyType::ErrInvalid, &e.to_string());
                Step::Continue(vec![reply])
            }
        }
    }

    /// Handles one parsed option.
    pub fn handle_option(&mut self, option: ClientOption) -> Step {
        match option {
            ClientOption::ExportName(name) => self.export_name(name.as_str()),
            ClientOption::Abort => Step::Abort(OptionReply::ack(OptionType::Abort)),
            ClientOption::List => Step::Continue(self.list()),
            ClientOption::StartTls => Step::Continue(vec![OptionReply::error(
                OptionType::StartTls,
                OptionReplyType::ErrPolicy,
                "TLS is not supported by this server",
            )]),
            ClientOption::StructuredReply => {
                self.structured = true;
                Step::Continue(vec![OptionReply::ack(OptionType::StructuredReply)])
            }
            ClientOption::Info(req) => self.info_or_go(OptionType::Info, &req),
            ClientOption::Go(req) => self.info_or_go(OptionType::Go, &req),
            ClientOption::ListMetaContext(req) => Step::Continue(self.list_meta(&req)),
            ClientOption::SetMetaContext(req) => Step::Continue(self.set_meta(&req)),
            ClientOption::Unsupported(option) => Step::Continue(vec![OptionReply::error(
                option,
                OptionReplyType::ErrUnsup,
                "",
            )]),
        }
    }

    /// Maps a requested name (empty = default) to the canonical name and the export.
    fn resolve(&self, name: &str) -> Option<(String, Arc<dyn Export>)> {
        let canonical = match name {
            "" => self.exports.default_name()?,
            other => other.to_owned(),
        };
        let export = self.exports.open(&canonical)?;
        Some((canonical, export))
    }

    fn list(&self) -> Vec<OptionReply> {
        let mut replies: Vec<OptionReply> = self
            .exports
            .list()
            .into_iter()
            .filter_map(|info| {
                // A name that is no valid protocol string could not be selected anyway.
                let name = WireString::new(info.name).ok()?;
                let details = WireString::lossy(&info.description);
                let body = OptionReplyBody::Server { name, details };
                Some(OptionReply {
                    option: OptionType::List,
                    body,
                })
            })
            .collect();
        replies.push(OptionReply::ack(OptionType::List));
        replies
    }

    fn export_name(&mut self, name: &str) -> Step {
        let Some((canonical, export)) = self.resolve(name) else {
            return Step::Close(HandshakeError::UnknownExport(name.to_owned()));
        };
        let info = export.info();
        let unusable = |reason: String| {
            Step::Close(HandshakeError::ExportUnusable {
                name: canonical.clone(),
                reason,
            })
        };
        if self.config.require_block_size {
            return unusable("block size negotiation (NBD_OPT_GO) is required".into());
        }
        match BlockSizes::from_info(&info) {
            Ok(sizes) => Step::ExportName(Box::new(
                self.negotiated(canonical, export, info, sizes, false),
            )),
            Err(e) => unusable(e.to_string()),
        }
    }

    fn info_or_go(&mut self, option: OptionType, req: &InfoRequest) -> Step {
        let Some((canonical, export)) = self.resolve(req.name.as_str()) else {
            let msg = format!("no export named {:?}", req.name.as_str());
            return Step::Continue(vec![OptionReply::error(
                option,
                OptionReplyType::ErrUnknown,
                &msg,
            )]);
        };
        let info = export.info();
        let sizes = match BlockSizes::from_info(&info) {
            Ok(sizes) => sizes,
            Err(e) => {
                tracing::warn!(export = %canonical, "refusing export: {e}");
                let reply = OptionReply::error(option, OptionReplyType::ErrPolicy, &e.to_string());
                return Step::Continue(vec![reply]);
            }
        };
        let wants_block_size = req.requests.contains(&InfoType::BlockSize);
        let mut replies = self.info_replies(option, req, &canonical, &info, sizes);
        if option == OptionType::Go && self.config.require_block_size && !wants_block_size {
            let msg = "request NBD_INFO_BLOCK_SIZE to use this export";
            replies.push(OptionReply::error(
                option,
                OptionReplyType::ErrBlockSizeReqd,
                msg,
            ));
            return Step::Continue(replies);
        }
        replies.push(OptionReply::ack(option));
        if option != OptionType::Go {
            return Step::Continue(replies);
        }
        let negotiated = self.negotiated(canonical, export, info, sizes, wants_block_size);
        Step::Go(replies, Box::new(negotiated))
    }

    /// The `NBD_REP_INFO` replies: EXPORT and BLOCK_SIZE always, NAME and DESCRIPTION on
    /// request.
    fn info_replies(
        &self,
        option: OptionType,
        req: &InfoRequest,
        canonical: &str,
        info: &ExportInfo,
        sizes: BlockSizes,
    ) -> Vec<OptionReply> {
        let flags = transmission_flags(info, self.structured);
        let mut items = vec![InfoReply::Export {
            size_bytes: info.size_bytes,
            flags,
        }];
        if req.requests.contains(&InfoType::Name) {
            items.push(InfoReply::Name(WireString::lossy(canonical)));
        }
        if req.requests.contains(&InfoType::Description) && !info.description.is_empty() {
            items.push(InfoReply::Description(WireString::lossy(&info.description)));
        }
        items.push(InfoReply::BlockSize {
            min: sizes.min,
            preferred: sizes.preferred,
            max_payload: sizes.max_payload,
        });
        items
            .into_iter()
            .map(|item| OptionReply::info(option, item))
            .collect()
    }

    fn negotiated(
        &self,
        name: String,
        export: Arc<dyn Export>,
        info: ExportInfo,
        block_sizes: BlockSizes,
        block_size_negotiated: bool,
    ) -> Negotiated {
        let selected = self.structured && self.meta_export.as_deref() == Some(name.as_str());
        Negotiated {
            export,
            flags: transmission_flags(&info, self.structured),
            info,
            block_sizes,
            structured: self.structured,
            base_allocation: selected.then_some(BASE_ALLOCATION_ID),
            block_size_negotiated,
            guard: ConnectionGuard::new(Arc::clone(&self.exports), name.clone()),
            name,
        }
    }

    /// Checks the preconditions shared by both meta context options; `Err` is the reply.
    fn meta_export(
        &self,
        option: OptionType,
        req: &MetaContextRequest,
    ) -> Result<String, OptionReply> {
        if !self.structured {
            let msg = "negotiate structured replies first";
            return Err(OptionReply::error(option, OptionReplyType::ErrInvalid, msg));
        }
        match self.resolve(req.export.as_str()) {
            Some((canonical, _)) => Ok(canonical),
            None => {
                let msg = format!("no export named {:?}", req.export.as_str());
                Err(OptionReply::error(
                    option,
                    OptionReplyType::ErrUnknown,
                    &msg,
                ))
            }
        }
    }

    fn list_meta(&self, req: &MetaContextRequest) -> Vec<OptionReply> {
        let option = OptionType::ListMetaContext;
        if let Err(reply) = self.meta_export(option, req) {
            return vec![reply];
        }
        // No query lists everything; "base:" is the namespace wildcard.
        let matches = req.queries.is_empty()
            || req
                .queries
                .iter()
                .any(|q| matches!(q.as_str(), "base:" | BASE_ALLOCATION));
        let mut replies = Vec::new();
        if matches {
            replies.push(meta_context_reply(option, 0));
        }
        replies.push(OptionReply::ack(option));
        replies
    }

    fn set_meta(&mut self, req: &MetaContextRequest) -> Vec<OptionReply> {
        let option = OptionType::SetMetaContext;
        // The selection is replaced even when this request fails.
        self.meta_export = None;
        let canonical = match self.meta_export(option, req) {
            Ok(canonical) => canonical,
            Err(reply) => return vec![reply],
        };
        let mut replies = Vec::new();
        if req.queries.iter().any(|q| q.as_str() == BASE_ALLOCATION) {
            self.meta_export = Some(canonical);
            replies.push(meta_context_reply(option, BASE_ALLOCATION_ID));
        }
        replies.push(OptionReply::ack(option));
        replies
    }
}

fn meta_context_reply(option: OptionType, id: u32) -> OptionReply {
    let name = WireString::lossy(BASE_ALLOCATION);
    OptionReply {
        option,
        body: OptionReplyBody::MetaContext { id, name },
    }
}

#[cfg(test)]
mod tests;
