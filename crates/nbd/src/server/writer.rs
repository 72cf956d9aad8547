//! The single writer of a connection: replies arrive on a channel in completion order and are
//! written whole, so chunks of different replies never interleave mid-message.

use std::future::Future;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

use crate::server::connection::Budget;

/// One encoded reply: a header and, for reads, the data that follows it.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) head: Vec<u8>,
    pub(crate) data: Bytes,
    /// Payload budget held until the data has been written.
    pub(crate) _budget: Option<Budget>,
}

impl Frame {
    pub(crate) fn new(head: Vec<u8>) -> Self {
        Self {
            head,
            data: Bytes::new(),
            _budget: None,
        }
    }
}

/// Writes frames until every sender is gone or the socket fails, then shuts the socket down.
/// A frame or flush the client does not take within `stall` fails with `TimedOut`: queued
/// replies hold payload budget that other connections may be waiting for.
pub(crate) async fn write_loop<W>(
    writer: W,
    mut frames: mpsc::Receiver<Frame>,
    stall: Duration,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut out = BufWriter::with_capacity(64 * 1024, writer);
    while let Some(frame) = frames.recv().await {
        within(stall, write_frame(&mut out, frame)).await?;
        // Batch whatever else is ready before paying for a flush.
        while let Ok(frame) = frames.try_recv() {
            within(stall, write_frame(&mut out, frame)).await?;
        }
        within(stall, out.flush()).await?;
    }
    out.shutdown().await
}

async fn within(stall: Duration, io: impl Future<Output = io::Result<()>>) -> io::Result<()> {
    match tokio::time::timeout(stall, io).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client took no reply in time",
        )),
    }
}

async fn write_frame<W: AsyncWrite + Unpin>(
    out: &mut BufWriter<W>,
    frame: Frame,
) -> io::Result<()> {
    out.write_all(&frame.head).await?;
    if !frame.data.is_empty() {
        out.write_all(&frame.data).await?;
    }
    Ok(())
}
