//! Runs one checked request against the export and encodes its reply.

use std::sync::Arc;

use bytes::Bytes;

use crate::backend::{Export, ExportError};
use crate::reply::{clip_extents, encode_simple_reply, Chunk};
use crate::request::{Command, Request};
use crate::server::writer::Frame;
use crate::wire::{CommandType, ErrorCode, WireString};

/// How replies are framed on this connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplyStyle {
    pub(crate) structured: bool,
}

impl ReplyStyle {
    /// A successful reply without data.
    pub(crate) fn ok(self, cookie: u64) -> Frame {
        let mut head = Vec::with_capacity(16);
        encode_simple_reply(cookie, None, &mut head);
        Frame::new(head)
    }

    /// An error reply; structured when negotiated, so the message reaches the client.
    pub(crate) fn error(self, cookie: u64, error: ErrorCode, message: &str) -> Frame {
        let mut head = Vec::with_capacity(32 + message.len());
        if self.structured {
            let message = WireString::lossy(message);
            Chunk::Error {
                error,
                message: &message,
            }
            .encode(cookie, true, &mut head);
        } else {
            encode_simple_reply(cookie, Some(error), &mut head);
        }
        Frame::new(head)
    }

    /// A successful READ reply carrying `data`: one OFFSET_DATA chunk marked done (the data
    /// is complete in memory before anything is sent, so no error can follow), which also
    /// satisfies `NBD_CMD_FLAG_DF`.
    fn read_data(self, cookie: u64, offset: u64, data: Bytes, data_len: u32) -> Frame {
        let mut head = Vec::with_capacity(28);
        match (self.structured, data_len) {
            (true, 0) => Chunk::None.encode(cookie, true, &mut head),
            (true, _) => Chunk::OffsetData { offset, data_len }.encode(cookie, true, &mut head),
            (false, _) => encode_simple_reply(cookie, None, &mut head),
        }
        Frame {
            head,
            data,
            _budget: None,
        }
    }
}

/// Executes `request` and returns its reply.
pub(crate) async fn execute(export: Arc<dyn Export>, request: Request, style: ReplyStyle) -> Frame {
    let (cookie, kind) = (request.cookie, request.kind);
    let result = match request.command {
        Command::Read { offset, length } => {
            return read(&*export, cookie, offset, length, style).await
        }
        Command::BlockStatus {
            offset,
            length,
            req_one,
            context_id,
        } => {
            return block_status(
                &*export,
                cookie,
                (offset, length),
                req_one,
                context_id,
                style,
            )
            .await
        }
        Command::Write { offset, data, fua } if !data.is_empty() => {
            export.write(offset, data, fua).await
        }
        Command::Flush => export.flush().await,
        Command::Trim {
            offset,
            length,
            fua,
        } if length > 0 => export.trim(offset, length, fua).await,
        Command::WriteZeroes {
            offset,
            length,
            fua,
            may_trim,
        } if length > 0 => export.write_zeroes(offset, length, fua, may_trim).await,
        // Zero-length writes/trims/zeroing, CACHE hints and DISC need no export call.
        _ => Ok(()),
    };
    match result {
        Ok(()) => style.ok(cookie),
        Err(e) => export_error(style, cookie, kind, &e),
    }
}

fn export_error(style: ReplyStyle, cookie: u64, kind: CommandType, e: &ExportError) -> Frame {
    tracing::debug!(cookie, ?kind, "export error: {e}");
    style.error(cookie, e.error_code(kind), &e.to_string())
}

async fn read(
    export: &dyn Export,
    cookie: u64,
    offset: u64,
    length: u32,
    style: ReplyStyle,
) -> Frame {
    match export.read(offset, length).await {
        Ok(data) if data.len() == usize::try_from(length).unwrap_or(usize::MAX) => {
            style.read_data(cookie, offset, data, length)
        }
        Ok(data) => {
            tracing::error!(
                cookie,
                offset,
                length,
                got = data.len(),
                "export returned a short read"
            );
            style.error(
                cookie,
                ErrorCode::Io,
                "export returned the wrong amount of data",
            )
        }
        Err(e) => export_error(style, cookie, CommandType::Read, &e),
    }
}

async fn block_status(
    export: &dyn Export,
    cookie: u64,
    (offset, length): (u64, u32),
    req_one: bool,
    context_id: u32,
    style: ReplyStyle,
) -> Frame {
    match export.block_status(offset, length).await {
        Ok(raw) => {
            let extents = clip_extents(&raw, length, req_one);
            let mut head = Vec::with_capacity(24 + extents.len() * 8);
            Chunk::BlockStatus {
                context_id,
                extents: &extents,
            }
            .encode(cookie, true, &mut head);
            Frame::new(head)
        }
        Err(e) => export_error(style, cookie, CommandType::BlockStatus, &e),
    }
}
