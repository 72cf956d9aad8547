//! Serves one in-memory export over NBD, for trying the server with real clients.
//!
//! ```text
//! cargo run -p mariner-nbd --example memserver -- [ADDR] [SIZE] [NAME]
//! #   ADDR defaults to 127.0.0.1:10809, SIZE to 64M (suffixes K, M, G), NAME to "mem"
//! nbdinfo --map nbd://127.0.0.1:10809
//! qemu-io -f raw -c 'write -P 0xab 0 64k' -c 'read -P 0xab 0 64k' nbd://127.0.0.1:10809
//! ```
//!
//! Stops on Ctrl-C, after in-flight requests have finished. Set `RUST_LOG`-style verbosity
//! with `MEMSERVER_DEBUG=1` to see per-connection debug events on stderr.

use std::sync::Arc;

use mariner_nbd::memory::{MemoryExport, MemoryExports};
use mariner_nbd::{serve, Exports, ServerConfig};
use tokio::net::TcpListener;

fn parse_size(text: &str) -> Option<usize> {
    let (digits, shift) = match text.chars().last()?.to_ascii_uppercase() {
        'K' => (&text[..text.len() - 1], 10),
        'M' => (&text[..text.len() - 1], 20),
        'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:10809".into());
    let size_arg = args.next().unwrap_or_else(|| "64M".into());
    let name = args.next().unwrap_or_else(|| "mem".into());
    let Some(size) = parse_size(&size_arg) else {
        return Err(format!("bad size {size_arg:?}: use e.g. 1048576, 512K, 64M, 1G").into());
    };
    if std::env::var_os("MEMSERVER_DEBUG").is_some() {
        install_stderr_logger();
    }
    let exports = Arc::new(MemoryExports::new());
    exports.add(Arc::new(MemoryExport::new(&name, size)));
    let listener = TcpListener::bind(&addr).await?;
    eprintln!(
        "serving export {name:?} ({size} bytes) on nbd://{}",
        listener.local_addr()?
    );
    let exports: Arc<dyn Exports> = exports;
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve(listener, exports, ServerConfig::default(), ctrl_c).await?;
    eprintln!("stopped");
    Ok(())
}

/// A tiny `tracing` subscriber printing events to stderr (avoids a dependency on
/// `tracing-subscriber` just for the example).
fn install_stderr_logger() {
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    struct Line(String);
    impl Visit for Line {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={:?}", field.name(), value));
        }
    }
    struct Stderr;
    impl Subscriber for Stderr {
        fn enabled(&self, meta: &Metadata<'_>) -> bool {
            *meta.level() <= tracing::Level::DEBUG
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut line = Line(String::new());
            event.record(&mut line);
            eprintln!(
                "{} {}:{}",
                event.metadata().level(),
                event.metadata().target(),
                line.0
            );
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
    let _ = tracing::subscriber::set_global_default(Stderr);
}
