//! Subcommands that talk to tessd.

pub mod apply;
pub mod cell;
pub mod heartbeat_pipe;
pub mod logs;
pub mod ns;
pub mod quota;
pub mod run;
pub mod status;
pub mod top;
pub mod trace;
pub mod web;

use tess_proto::{ApiError, Body, Client, Request};

/// Exit status for an error: the daemon's category if it came from the daemon, else 1.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    if let Some(api) = e.downcast_ref::<ApiError>() {
        return api.exit_code();
    }
    if let Some(u) = e.downcast_ref::<UsageError>() {
        let _ = u;
        return 2;
    }
    1
}

/// A usage error found by the CLI itself (exit status 2).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Returns a usage error.
pub fn usage<T>(msg: impl Into<String>) -> anyhow::Result<T> {
    Err(UsageError(msg.into()).into())
}

/// One call to the daemon.
pub fn call(req: Request) -> anyhow::Result<Body> {
    let mut c = Client::connect_default()?;
    Ok(c.call(&req)?)
}
