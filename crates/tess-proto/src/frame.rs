//! Length-prefixed JSON frames.

use std::io::{Read, Write};

/// Largest frame accepted; larger lengths are a protocol error, not an allocation.
pub const MAX_FRAME: usize = 1 << 20;

/// Framing failure.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection.
    #[error("connection closed")]
    Closed,
    /// I/O error.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// Oversized frame.
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    /// Not valid JSON for the expected type.
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
}

/// Writes `msg` as one frame.
pub fn write<W: Write, T: serde::Serialize>(w: &mut W, msg: &T) -> Result<(), FrameError> {
    let body = serde_json::to_vec(msg)?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame and decodes it.
pub fn read<R: Read, T: serde::de::DeserializeOwned>(r: &mut R) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(FrameError::TooLarge(n));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    Ok(serde_json::from_slice(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_limits() {
        let mut buf = Vec::new();
        write(&mut buf, &vec![1, 2, 3]).unwrap();
        let back: Vec<i32> = read(&mut buf.as_slice()).unwrap();
        assert_eq!(back, vec![1, 2, 3]);
        let huge = (MAX_FRAME as u32 + 1).to_le_bytes();
        assert!(matches!(
            read::<_, Vec<i32>>(&mut huge.as_slice()),
            Err(FrameError::TooLarge(_))
        ));
        assert!(matches!(
            read::<_, Vec<i32>>(&mut [].as_slice()),
            Err(FrameError::Closed)
        ));
        let mut bad = 3u32.to_le_bytes().to_vec();
        bad.extend_from_slice(b"{x}");
        assert!(matches!(
            read::<_, Vec<i32>>(&mut bad.as_slice()),
            Err(FrameError::Json(_))
        ));
    }
}
