//! Errors of the heartbeat library.

/// Why a heartbeat could not be created, registered or opened.
#[derive(Debug, thiserror::Error)]
pub enum HeartbeatError {
    /// The name is empty, too long or has other characters than `a-z A-Z 0-9 - _ . @`.
    #[error("invalid heartbeat name '{0}': 1-64 of a-z A-Z 0-9 - _ . @")]
    BadName(String),
    /// A target of zero or a rate that is not a positive finite number.
    #[error("invalid target {0}: give a positive time per unit of work or a positive rate")]
    BadTarget(String),
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What we were doing.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The shared region handed to a reader is not a valid heartbeat.
    #[error("not a valid heartbeat region: {0}")]
    BadRegion(String),
    /// The broker refused or could not understand a registration.
    #[error("the broker refused the heartbeat: {0}")]
    Refused(String),
}

impl HeartbeatError {
    pub(crate) fn last_os(what: impl Into<String>) -> HeartbeatError {
        HeartbeatError::Os {
            what: what.into(),
            source: std::io::Error::last_os_error(),
        }
    }
}
