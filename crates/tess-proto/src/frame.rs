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

/// `msg` as the bytes of one frame: its length, then its JSON.
pub fn encode<T: serde::Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let mut buf = vec![0u8; 4];
    serde_json::to_writer(&mut buf, msg)?;
    let n = buf.len() - 4;
    if n > MAX_FRAME {
        return Err(FrameError::TooLarge(n));
    }
    buf[..4].copy_from_slice(&(n as u32).to_le_bytes());
    Ok(buf)
}

/// Writes `msg` as one frame.
pub fn write<W: Write, T: serde::Serialize>(w: &mut W, msg: &T) -> Result<(), FrameError> {
    w.write_all(&encode(msg)?)?;
    w.flush()?;
    Ok(())
}

/// The length of the frame at the start of `buf` (its 4-byte header included) when all of it
/// has arrived, `None` while more is to come: for readers that buffer what a non-blocking
/// socket gives them. A header announcing more than [`MAX_FRAME`] is an error at once.
pub fn complete_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(header) = buf.first_chunk::<4>() else {
        return Ok(None);
    };
    let n = u32::from_le_bytes(*header) as usize;
    if n > MAX_FRAME {
        return Err(FrameError::TooLarge(n));
    }
    Ok((buf.len() >= 4 + n).then_some(4 + n))
}

/// Reads one frame and decodes it.
pub fn read<R: Read, T: serde::de::DeserializeOwned>(r: &mut R) -> Result<T, FrameError> {
    Ok(serde_json::from_slice(&read_bytes(r)?)?)
}

/// Reads one frame holding a daemon's reply and decodes it, the hot replies through a fast
/// path (see [`crate::decode`]); the same result as `read::<_, Response>`.
pub fn read_response<R: Read>(r: &mut R) -> Result<crate::Response, FrameError> {
    Ok(crate::decode::response(&read_bytes(r)?)?)
}

/// Reads one frame's JSON bytes.
fn read_bytes<R: Read>(r: &mut R) -> Result<Vec<u8>, FrameError> {
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
    Ok(body)
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
        assert_eq!(complete_len(&bad).unwrap(), None, "header only");
        bad.extend_from_slice(b"{x");
        assert_eq!(complete_len(&bad).unwrap(), None, "a byte short");
        bad.truncate(4);
        bad.extend_from_slice(b"{x}");
        assert!(matches!(
            read::<_, Vec<i32>>(&mut bad.as_slice()),
            Err(FrameError::Json(_))
        ));
        assert_eq!(complete_len(&bad).unwrap(), Some(7));
        assert_eq!(complete_len(&buf).unwrap(), Some(buf.len()));
        assert!(matches!(complete_len(&huge), Err(FrameError::TooLarge(_))));
        assert_eq!(complete_len(&[1, 0]).unwrap(), None);
    }
}
