//! The byte-level handshake state machine (sans I/O).
//!
//! Construct a [`Handshake`], send what [`Handshake::take_output`] returns, feed everything
//! the client sends to [`Handshake::receive`], and send the output again after every call.
//! `receive` returns `Ok(Some(outcome))` once negotiation has ended and `Err` when the server
//! must hard-disconnect; errors stick.
//!
//! ```text
//! S: u64 NBDMAGIC, u64 IHAVEOPT, u16 handshake flags (FIXED_NEWSTYLE | NO_ZEROES)
//! C: u32 client flags (must include FIXED_NEWSTYLE; no unknown bits)
//! repeat:
//!   C: u64 IHAVEOPT, u32 option, u32 length, data
//!   S: option replies (or, for NBD_OPT_EXPORT_NAME, the export-name reply)
//! ```
//!
//! Memory is bounded whatever the client sends: option data is buffered only up to
//! [`HandshakeConfig::max_option_bytes`]; a longer option is skipped without buffering and
//! answered with `NBD_REP_ERR_TOO_BIG` (an over-long `NBD_OPT_EXPORT_NAME`, which cannot be
//! answered with an error, closes the connection).

use std::sync::Arc;

use bytes::BufMut;

use crate::backend::Exports;
use crate::negotiation::{HandshakeError, Negotiated, Negotiation, NegotiationConfig, Step};
use crate::option::OptionHeader;
use crate::option_reply::{encode_export_name_reply, OptionReply};
use crate::wire::{
    ClientFlags, HandshakeFlags, OptionReplyType, OptionType, Reader, CLIENT_FLAGS_LEN, IHAVEOPT,
    MAX_STRING_LEN, NBD_MAGIC, OPTION_HEADER_LEN,
};

/// Limits of the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeConfig {
    /// Longest option data buffered; longer options get `NBD_REP_ERR_TOO_BIG`.
    pub max_option_bytes: u32,
    /// Options accepted before the client is considered abusive and disconnected.
    pub max_options: u32,
    /// See [`NegotiationConfig::require_block_size`].
    pub require_block_size: bool,
}

impl Default for HandshakeConfig {
    fn default() -> Self {
        Self {
            max_option_bytes: 64 * 1024,
            max_options: 1024,
            require_block_size: false,
        }
    }
}

/// How a successful handshake ended.
#[derive(Debug)]
pub enum Outcome {
    /// Enter transmission. `leftover` holds bytes the client sent after its final option,
    /// which belong to the transmission phase.
    Go {
        /// The negotiated export and features.
        negotiated: Box<Negotiated>,
        /// Transmission-phase bytes already received.
        leftover: Vec<u8>,
    },
    /// The client sent `NBD_OPT_ABORT`; send the output, then close.
    Abort,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    ClientFlags,
    OptionHeader,
    OptionData { option: OptionType, length: usize },
    Discard { option: OptionType, remaining: u64 },
    Finished,
    Failed(HandshakeError),
}

/// The server side of the fixed-newstyle handshake.
pub struct Handshake {
    negotiation: Negotiation,
    config: HandshakeConfig,
    state: State,
    /// Bytes of the field currently being assembled (bounded by `max_option_bytes`).
    pending: Vec<u8>,
    output: Vec<u8>,
    no_zeroes: bool,
    options_seen: u32,
}

impl Handshake {
    /// Starts a handshake; the greeting is queued as output.
    pub fn new(exports: Arc<dyn Exports>, config: HandshakeConfig) -> Self {
        let negotiation_config = NegotiationConfig {
            require_block_size: config.require_block_size,
        };
        let mut output = Vec::with_capacity(64);
        output.put_u64(NBD_MAGIC);
        output.put_u64(IHAVEOPT);
        output.put_u16((HandshakeFlags::FIXED_NEWSTYLE | HandshakeFlags::NO_ZEROES).0);
        Self {
            negotiation: Negotiation::new(exports, negotiation_config),
            config,
            state: State::ClientFlags,
            pending: Vec::new(),
            output,
            no_zeroes: false,
            options_seen: 0,
        }
    }

    /// Takes the bytes to send to the client.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// Whether output is waiting to be sent.
    pub fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// How many more bytes the current step needs (at least 1 while negotiating, 0 after).
    pub fn wanted(&self) -> usize {
        match &self.state {
            State::ClientFlags => CLIENT_FLAGS_LEN - self.pending.len(),
            State::OptionHeader => OPTION_HEADER_LEN - self.pending.len(),
            State::OptionData { length, .. } => length - self.pending.len(),
            State::Discard { remaining, .. } => usize::try_from(*remaining).unwrap_or(usize::MAX),
            State::Finished | State::Failed(_) => 0,
        }
    }

    /// Feeds client bytes. Processes as many complete steps as `input` allows.
    pub fn receive(&mut self, mut input: &[u8]) -> Result<Option<Outcome>, HandshakeError> {
        loop {
            match self.state.clone() {
                State::Finished => return Err(HandshakeError::Finished),
                State::Failed(e) => return Err(e),
                // A zero-length option is complete without further input.
                _ if input.is_empty() && self.wanted() > 0 => return Ok(None),
                _ => {}
            }
            match self.step(&mut input) {
                Ok(None) => {}
                Ok(Some(outcome)) => return Ok(Some(self.finish(outcome, input))),
                Err(e) => {
                    self.state = State::Failed(e.clone());
                    return Err(e);
                }
            }
        }
    }

    fn finish(&mut self, outcome: Outcome, input: &[u8]) -> Outcome {
        self.state = State::Finished;
        match outcome {
            Outcome::Go { negotiated, .. } => Outcome::Go {
                negotiated,
                leftover: input.to_vec(),
            },
            Outcome::Abort => Outcome::Abort,
        }
    }

    /// Consumes some of `input` for the current state.
    fn step(&mut self, input: &mut &[u8]) -> Result<Option<Outcome>, HandshakeError> {
        match self.state.clone() {
            State::ClientFlags => {
                if let Some(bytes) = self.fill(input, CLIENT_FLAGS_LEN) {
                    self.client_flags(&bytes)?;
                }
                Ok(None)
            }
            State::OptionHeader => match self.fill(input, OPTION_HEADER_LEN) {
                Some(bytes) => self.option_header(&bytes).map(|()| None),
                None => Ok(None),
            },
            State::OptionData { option, length } => match self.fill(input, length) {
                Some(data) => self.option_data(option, &data),
                None => Ok(None),
            },
            State::Discard { option, remaining } => Ok(self.discard(input, option, remaining)),
            State::Finished | State::Failed(_) => Ok(None),
        }
    }

    /// Accumulates bytes until `want` are pending; then returns them.
    fn fill(&mut self, input: &mut &[u8], want: usize) -> Option<Vec<u8>> {
        let take = (want - self.pending.len()).min(input.len());
        let (head, tail) = input.split_at(take);
        self.pending.extend_from_slice(head);
        *input = tail;
        (self.pending.len() == want).then(|| std::mem::take(&mut self.pending))
    }

    fn client_flags(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
        let raw = Reader::new(bytes).u32().unwrap_or(0);
        let flags = ClientFlags(raw);
        if !flags.without(ClientFlags::KNOWN).is_empty() {
            return Err(HandshakeError::UnknownClientFlags(raw));
        }
        if !flags.contains(ClientFlags::FIXED_NEWSTYLE) {
            return Err(HandshakeError::NotFixedNewstyle);
        }
        self.no_zeroes = flags.contains(ClientFlags::NO_ZEROES);
        self.state = State::OptionHeader;
        Ok(())
    }

    fn option_header(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
        let mut header = [0u8; OPTION_HEADER_LEN];
        header.copy_from_slice(bytes);
        let header =
            OptionHeader::parse(&header).map_err(|e| HandshakeError::BadOptionMagic(e.0))?;
        self.options_seen += 1;
        if self.options_seen > self.config.max_options {
            return Err(HandshakeError::TooManyOptions(self.options_seen));
        }
        let (option, length) = (header.option, header.length);
        let data_len = usize::try_from(length).unwrap_or(usize::MAX);
        if option == OptionType::ExportName && data_len > MAX_STRING_LEN {
            return Err(HandshakeError::ExportNameTooLong(length));
        }
        self.state = if length > self.config.max_option_bytes {
            State::Discard {
                option,
                remaining: u64::from(length),
            }
        } else {
            State::OptionData {
                option,
                length: data_len,
            }
        };
        Ok(())
    }

    fn option_data(
        &mut self,
        option: OptionType,
        data: &[u8],
    ) -> Result<Option<Outcome>, HandshakeError> {
        self.state = State::OptionHeader;
        match self.negotiation.handle_raw(option, data) {
            Step::Continue(replies) => {
                self.queue(&replies);
                Ok(None)
            }
            Step::Go(replies, negotiated) => {
                self.queue(&replies);
                Ok(Some(Outcome::Go {
                    negotiated,
                    leftover: Vec::new(),
                }))
            }
            Step::ExportName(negotiated) => {
                let (size, flags) = (negotiated.info.size_bytes, negotiated.flags);
                encode_export_name_reply(size, flags, self.no_zeroes, &mut self.output);
                Ok(Some(Outcome::Go {
                    negotiated,
                    leftover: Vec::new(),
                }))
            }
            Step::Abort(reply) => {
                self.queue(std::slice::from_ref(&reply));
                Ok(Some(Outcome::Abort))
            }
            Step::Close(e) => Err(e),
        }
    }

    fn discard(
        &mut self,
        input: &mut &[u8],
        option: OptionType,
        remaining: u64,
    ) -> Option<Outcome> {
        let take = usize::try_from(remaining)
            .unwrap_or(usize::MAX)
            .min(input.len());
        *input = &input[take..];
        let remaining = remaining - take as u64;
        if remaining > 0 {
            self.state = State::Discard { option, remaining };
            return None;
        }
        self.state = State::OptionHeader;
        let msg = format!("option data exceeds {} bytes", self.config.max_option_bytes);
        self.queue(&[OptionReply::error(option, OptionReplyType::ErrTooBig, &msg)]);
        None
    }

    fn queue(&mut self, replies: &[OptionReply]) {
        for reply in replies {
            reply.encode(&mut self.output);
        }
    }
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("state", &self.state)
            .field("options_seen", &self.options_seen)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
