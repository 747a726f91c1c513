//! The interference of seed 000's Group 2 (Table 1), rebuilt from ordinary programs:
//!
//! - **video players** (cells D and E): `ffmpeg -re` decoding a real H.264 clip at its native
//!   30 frames/s, looping. The clip (640x360, 30 fps, 10 s, `testsrc2` with temporal noise so
//!   every frame carries fresh detail) is generated once with ffmpeg's `lavfi` source into a
//!   cache directory and reused. The size is chosen so that a player keeps up with 30 frames/s
//!   inside the reservations a 2-hart machine can give its video cells (a few ms of CPU per
//!   frame); a 1080p clip could never play in real time there and would only be a CPU burner.
//!   Decoding still streams every frame through the caches, the interference the paper blames
//!   for its slightly longer tail.
//! - **best-effort EP** (cells G, H, I): `tess-ep`, the NAS EP kernel, one process per cell.
//!
//! Worked example: two players at 30 frames/s decode 60 frames of 640 x 360 x 1.5 bytes =
//! 20.7 MB/s of raw video between them.

use super::launch::CommandSpec;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Width, height, frame rate and length of the generated clip.
pub const CLIP: (u32, u32, u32, u32) = (640, 360, 30, 10);

/// Error preparing interference.
#[derive(Debug, thiserror::Error)]
pub enum InterferenceError {
    /// ffmpeg could not be run.
    #[error("cannot run ffmpeg (install it; scripts/setup does): {0}")]
    Spawn(#[source] std::io::Error),
    /// ffmpeg failed to generate the clip.
    #[error("ffmpeg could not generate {path}: {stderr}")]
    Generate {
        /// Target file.
        path: PathBuf,
        /// ffmpeg's messages.
        stderr: String,
    },
    /// The cache directory could not be created.
    #[error("cannot create cache directory {path}: {source}")]
    Cache {
        /// The directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The default cache directory: `$XDG_CACHE_HOME/tess`, else `$HOME/.cache/tess`, else
/// `/var/tmp/tess`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("tess");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".cache").join("tess");
    }
    PathBuf::from("/var/tmp/tess")
}

/// The clip in `cache_dir`, generated on first use (takes some 10-30 s once).
pub fn ensure_clip(cache_dir: &Path) -> Result<PathBuf, InterferenceError> {
    let (w, h, fps, secs) = CLIP;
    let path = cache_dir.join(format!("music-clip-{w}x{h}-{fps}fps-{secs}s.mp4"));
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(cache_dir).map_err(|source| InterferenceError::Cache {
        path: cache_dir.to_path_buf(),
        source,
    })?;
    let tmp = cache_dir.join(format!(".clip-{}.mp4", std::process::id()));
    let out = Command::new("ffmpeg")
        .args(["-nostdin", "-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i"])
        .arg(format!(
            "testsrc2=size={w}x{h}:rate={fps},noise=alls=12:allf=t+u"
        ))
        .args(["-t", &secs.to_string()])
        .args([
            "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p",
        ])
        .arg(&tmp)
        .output()
        .map_err(InterferenceError::Spawn)?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(InterferenceError::Generate {
            path,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    std::fs::rename(&tmp, &path).map_err(|source| InterferenceError::Cache {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// A video player: decode `clip` at its native 30 frames/s (`-re`), looping, discarding frames.
pub fn video_player(clip: &Path) -> CommandSpec {
    CommandSpec {
        program: "ffmpeg".into(),
        args: [
            "-nostdin",
            "-hide_banner",
            "-loglevel",
            "error",
            "-re",
            "-stream_loop",
            "-1",
            "-i",
        ]
        .iter()
        .map(Into::into)
        .chain([clip.as_os_str().to_owned()])
        .chain(["-f", "null", "-"].iter().map(Into::into))
        .collect(),
        stdout: None,
        stderr: None,
    }
}

/// A best-effort EP process with `threads` threads (runs until SIGTERM).
pub fn ep_process(bin_dir: &Path, threads: usize) -> CommandSpec {
    CommandSpec {
        program: bin_dir.join("tess-ep"),
        args: vec!["--threads".into(), threads.to_string().into()],
        stdout: None,
        stderr: None,
    }
}
