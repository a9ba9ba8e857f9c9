//! SIGTERM or SIGINT → a cancelled `CancellationToken`. Nothing exits the
//! process from a signal handler: the token starts the ordered shutdown in
//! [`crate::run()`].

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Spawns a task that cancels `token` on the first SIGTERM or SIGINT.
pub fn cancel_on_signal(token: CancellationToken) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = token.cancelled() => return,
        };
        info!(signal = name, "shutting down");
        token.cancel();
    });
    Ok(())
}
