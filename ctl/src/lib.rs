//! `snowkeepctl`: administers a snowkeep cluster through any of its servers'
//! `AdminService`, with an API key that has the `admin` permission when
//! authentication is on. Flags follow the server's conventions: every flag
//! has a `SNOWKEEP_*` environment variable, secrets can be read from files.
//! Output is a table for people, or JSON with `--output json` for scripts.
//! Exits 0 on success, 1 on an error (printed on stderr as `snowkeepctl:
//! CODE_NAME: message`, with a `hint:` line when a flag fixes it), 2 on bad
//! usage. A closed stdout (`snowkeepctl machine-ids | head -3`) is a normal
//! end: exit 0, nothing on stderr.
//!
//! The `snowkeepctl` binary is built by the server package
//! (`server/src/bin/snowkeepctl.rs`, which calls [`main`]), so the server's
//! integration tests can run it against a live cluster.

mod auth;
mod conn;
mod decode;
mod health;
mod keys;
pub mod lifetime;
mod output;
mod state;
mod transfer;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// The cluster's security mode (API keys required or not), kept in etcd
    /// and followed by every server.
    #[command(subcommand)]
    Auth(auth::AuthCommand),
    /// Checks a server's grpc.health.v1 status (for probes): exits 0 when SERVING.
    Health(health::HealthArgs),
}

/// Parses the command line, runs the command and returns the exit code.
pub fn main() -> std::process::ExitCode {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli.conn.settle_key_sources(&matches);
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
            Command::Auth(c) => c.run(&cli.conn, cli.output).await,
            Command::Health(c) => c.run(&cli.conn).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<output::StdoutClosed>().is_some() => {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            let text = conn::render(&e);
            #[allow(clippy::print_stderr)]
            {
                eprintln!("snowkeepctl: {text}");
                if let Some(hint) = conn::hint(&e, &text, &cli.conn.endpoint) {
                    eprintln!("hint: {hint}");
                }
            }
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(args: &[&str]) -> conn::ConnArgs {
        let matches = Cli::command().try_get_matches_from(args).unwrap();
        let mut cli = Cli::from_arg_matches(&matches).unwrap();
        cli.conn.settle_key_sources(&matches);
        cli.conn
    }

    #[test]
    fn api_key_flags_no_longer_conflict_and_the_key_flag_wins() {
        // Both as flags, before or after the subcommand: --api-key wins.
        let c = conn(&[
            "snowkeepctl",
            "--api-key-file",
            "/no/such/file",
            "key",
            "list",
            "--api-key",
            "k.s",
        ]);
        assert!(!c.file_over_key);
        let c = conn(&["snowkeepctl", "key", "list", "--api-key-file", "f"]);
        assert!(c.file_over_key);
        let c = conn(&["snowkeepctl", "--api-key-file", "f", "key", "list"]);
        assert!(c.file_over_key);
        let c = conn(&["snowkeepctl", "key", "list"]);
        assert!(!c.file_over_key);
    }

    #[test]
    fn evict_defaults_its_namespace() {
        assert!(Cli::command()
            .try_get_matches_from(["snowkeepctl", "evict", "3"])
            .is_ok());
    }
}
