//! `snowkeepctl`: administers a snowkeep cluster through any of its servers'
//! `AdminService`, with an API key that has the `admin` permission when
//! authentication is on. Flags follow the server's conventions: every flag
//! has a `SNOWKEEP_*` environment variable, secrets can be read from files.
//! Output is a table for people, or JSON with `--output json` for scripts.
//! Exits 0 on success, 1 on an error (printed on stderr), 2 on bad usage.
//!
//! The `snowkeepctl` binary is built by the server package
//! (`server/src/bin/snowkeepctl.rs`, which calls [`main`]), so the server's
//! integration tests can run it against a live cluster.

mod conn;
mod health;
mod keys;
mod output;
mod state;

use clap::{Parser, Subcommand};

/// snowkeep administration.
#[derive(Parser)]
#[command(name = "snowkeepctl", version, about)]
struct Cli {
    #[command(flatten)]
    conn: conn::ConnArgs,
    /// Output format.
    #[arg(long, short = 'o', global = true, env = "SNOWKEEP_OUTPUT", value_enum, default_value_t = output::Output::Table)]
    output: output::Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    State(state::StateCommand),
    /// API keys: create, list, expire, revoke.
    #[command(subcommand)]
    Key(keys::KeyCommand),
    /// The audit trail.
    #[command(subcommand)]
    Audit(keys::AuditCommand),
    /// Checks a server's grpc.health.v1 status (for probes): exits 0 when SERVING.
    Health(health::HealthArgs),
}

/// Parses the command line, runs the command and returns the exit code.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("snowkeepctl: cannot start the runtime: {e}");
            }
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::State(c) => c.run(&cli.conn, cli.output).await,
            Command::Key(c) => c.run(&cli.conn, cli.output).await,
            Command::Audit(c) => c.run(&cli.conn, cli.output).await,
            Command::Health(c) => c.run(&cli.conn).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("snowkeepctl: {e:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
