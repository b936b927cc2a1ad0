//! `tidings-pusher` delivers until SIGTERM (`tidings_pusher::run`); `vapid-keygen`: a key pair.

use clap::Parser;
use tidings_pusher::config::vapid_keygen;
use tidings_runtime::signals;

/// mimalloc rather than glibc's malloc: the pusher allocates per message (JSON, the encrypted
/// body, HTTP/2 frames) on many threads, where glibc's malloc took ~10 % of its CPU
/// (docs/benchmarks.md has the measured difference).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("vapid-keygen") {
        print!("{}", vapid_keygen()?);
        return Ok(());
    }
    let config = tidings_pusher::Config::parse();
    Ok(signals::serve("tidings-pusher", |s| tidings_pusher::run(config, s)).await?)
}
