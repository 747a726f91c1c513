//! Who calls ([`Caller`]) and how a request fails ([`EngineError`]).

use std::time::Duration;
use tess_core::admission::AdmissionError;
use tess_core::spec::SpecError;
use tess_proto::ErrorKind;

/// Who is calling, as the kernel vouches (`SO_PEERCRED`).
#[derive(Debug)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// Process id at connect time.
    pub pid: i32,
    /// A pidfd for that process, when the kernel offers `SO_PEERPIDFD` (immune to pid reuse).
    pub pidfd: Option<std::os::fd::OwnedFd>,
}

impl Caller {
    /// The daemon itself (housekeeping).
    pub fn daemon() -> Caller {
        Caller {
            uid: 0,
            pid: std::process::id() as i32,
            pidfd: None,
        }
    }

    pub(crate) fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the calling process is still the one that connected.
    pub(crate) fn still_alive(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                use std::os::fd::AsRawFd;
                let mut pfd = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, zero timeout.
                let n = unsafe { libc::poll(&mut pfd, 1, 0) };
                n == 0
            }
            None => tess_sched::proc::uid_of(self.pid) == Some(self.uid),
        }
    }
}

/// A failed request.
#[derive(Debug)]
pub struct EngineError {
    /// Category.
    pub kind: ErrorKind,
    /// Message.
    pub message: String,
}

impl EngineError {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        EngineError {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn not_found(name: &str) -> Self {
        EngineError::new(ErrorKind::NotFound, format!("no cell named '{name}'"))
    }
}

impl From<AdmissionError> for EngineError {
    fn from(e: AdmissionError) -> Self {
        EngineError::new(ErrorKind::Admission, e.to_string())
    }
}

impl From<anyhow::Error> for EngineError {
    /// An unexpected failure (database, kernel) with its whole context chain.
    fn from(e: anyhow::Error) -> Self {
        EngineError::new(ErrorKind::Internal, format!("{e:#}"))
    }
}

impl From<SpecError> for EngineError {
    fn from(e: SpecError) -> Self {
        EngineError::new(ErrorKind::Usage, e.to_string())
    }
}

pub(crate) type EResult<T> = std::result::Result<T, EngineError>;

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
