//! A blocking client for the tessd socket.

use crate::frame::{self, FrameError};
use crate::{Body, ErrorKind, Request, Response, PROTOCOL_VERSION, SOCKET_ENV};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The daemon answered with an error.
    #[error("{message}")]
    Daemon {
        /// Category.
        kind: ErrorKind,
        /// Message from the daemon.
        message: String,
    },
    /// The daemon could not be reached.
    #[error("cannot reach tessd at {}: {cause} (is it running? start it with `tessd`, or set {SOCKET_ENV})", path.display())]
    Unreachable {
        /// Socket path.
        path: PathBuf,
        /// Cause (kept out of the error chain: the message already says it).
        cause: std::io::Error,
    },
    /// The connection failed mid-call.
    #[error("lost the connection to tessd: {0} (the change may or may not have been applied; check with `tess cell list`)")]
    Connection(FrameError),
    /// The daemon sent something unexpected.
    #[error("unexpected reply from tessd: {0}")]
    Unexpected(String),
}

impl From<FrameError> for ApiError {
    fn from(e: FrameError) -> Self {
        ApiError::Connection(e)
    }
}

impl ApiError {
    /// CLI exit status for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            ApiError::Daemon { kind, .. } => kind.exit_code(),
            ApiError::Unreachable { .. } => crate::EXIT_UNREACHABLE,
            ApiError::Connection(_) | ApiError::Unexpected(_) => 1,
        }
    }
}

/// A connection to tessd.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    /// The same socket, read through a buffer: a reply's length and body in one system call.
    reader: std::io::BufReader<UnixStream>,
}

/// The socket path: `$TESS_SOCKET`, or the default.
pub fn socket_path() -> PathBuf {
    std::env::var_os(SOCKET_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(crate::DEFAULT_SOCKET))
}

impl Client {
    /// Connects and greets the daemon.
    pub fn connect(path: &Path) -> Result<Client, ApiError> {
        let stream = UnixStream::connect(path).map_err(|cause| ApiError::Unreachable {
            path: path.to_path_buf(),
            cause,
        })?;
        let reader = std::io::BufReader::with_capacity(
            64 << 10,
            stream.try_clone().map_err(|cause| ApiError::Unreachable {
                path: path.to_path_buf(),
                cause,
            })?,
        );
        let mut c = Client { stream, reader };
        c.call(&Request::Hello {
            version: PROTOCOL_VERSION,
        })?;
        Ok(c)
    }

    /// Connects to [`socket_path`].
    pub fn connect_default() -> Result<Client, ApiError> {
        Client::connect(&socket_path())
    }

    /// Sets a timeout for each reply.
    pub fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.stream.set_read_timeout(t)
    }

    /// Sends a request and waits for its reply.
    pub fn call(&mut self, req: &Request) -> Result<Body, ApiError> {
        frame::write(&mut self.stream, req)?;
        match frame::read_response(&mut self.reader)? {
            Response::Ok { body } => Ok(body),
            Response::Error { kind, message } => Err(ApiError::Daemon { kind, message }),
        }
    }
}

/// A connection to tessd that owns the cells it creates: they are deleted when it is dropped,
/// even when the caller fails half-way (what benchmarks and test drivers need).
#[derive(Debug)]
pub struct CellSession {
    /// The connection, for other calls.
    pub client: Client,
    created: Vec<String>,
}

impl CellSession {
    /// Connects to [`socket_path`].
    pub fn connect() -> Result<CellSession, ApiError> {
        Ok(CellSession {
            client: Client::connect_default()?,
            created: Vec::new(),
        })
    }

    /// The daemon's status.
    pub fn status(&mut self) -> Result<crate::StatusInfo, ApiError> {
        match self.client.call(&Request::Status)? {
            Body::Status(s) => Ok(*s),
            other => Err(ApiError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Creates or updates `cells` in one transaction; the session owns them from now on.
    pub fn apply(
        &mut self,
        cells: Vec<tess_core::spec::CellSpec>,
    ) -> Result<crate::ApplyResult, ApiError> {
        for c in &cells {
            if !self.created.contains(&c.name) {
                self.created.push(c.name.clone());
            }
        }
        match self.client.call(&Request::Apply {
            cells,
            delete: vec![],
            prune: false,
            dry_run: false,
        })? {
            Body::Applied(r) => Ok(r),
            other => Err(ApiError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Deletes `names` now (best effort: a cell already gone is no error).
    pub fn delete(&mut self, names: &[&str]) {
        for n in names {
            let _ = self.client.call(&Request::DeleteCell {
                name: n.to_string(),
            });
            self.created.retain(|c| c != n);
        }
    }

    /// Deletes every cell the session still owns.
    pub fn delete_all(&mut self) {
        for n in std::mem::take(&mut self.created) {
            let _ = self.client.call(&Request::DeleteCell { name: n });
        }
    }
}

impl Drop for CellSession {
    fn drop(&mut self) {
        self.delete_all();
    }
}
