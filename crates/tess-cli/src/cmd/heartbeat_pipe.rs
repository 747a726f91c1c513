//! `tess run --heartbeat-pipe FRAME_BYTES`: heartbeats for a program that was never written for
//! them.
//!
//! The program reads its input from a pipe that this process fills from its own standard input;
//! every time the program has taken another FRAME_BYTES bytes, the heartbeat beats. This serves
//! any program that consumes fixed-size units on its input (an encoder fed raw frames, an audio
//! filter fed raw blocks), counts exactly, and needs no knowledge of the program's output
//! format. The pipe holds one frame, so "written into the pipe" is at most one frame ahead of
//! "taken by the program": a rate over a decision period is off by at most one frame. (A
//! one-page pipe counted exactly but cost the program one hand-off with this process per 4 KiB,
//! 54 per 512x288 frame; in a time-triggered cell a hand-off that misses the window waits for
//! the next one, and `tess bench pota` saw the encoder stall for a second or more at its
//! phase changes.) The alternative, parsing a progress line on standard error, was
//! rejected: x264 prints its progress only a few times a second and other programs print
//! different lines or none (docs/broker.md).
//!
//! This process runs in the cell beside the program (it attached before forking), so the copy
//! is charged to the cell whose work it is.

use std::io::{Read, Write};
use std::time::Duration;
use tess_heartbeat::{Heartbeat, Target};

/// Parses `30/s` (a rate) or `33ms` (a time per unit).
pub fn parse_target(s: &str) -> Result<Target, String> {
    if let Some(rate) = s.strip_suffix("/s") {
        let r: f64 = rate
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not a rate such as 30/s"))?;
        if !(r.is_finite() && r > 0.0) {
            return Err(format!("'{s}': the rate must be positive"));
        }
        return Ok(Target::Rate(r));
    }
    let d: Duration = tess_core::units::parse_duration(s)
        .map_err(|e| format!("'{s}' is neither a rate (30/s) nor a time per unit (33ms): {e}"))?;
    if d.is_zero() {
        return Err("the time per unit must be positive".into());
    }
    Ok(Target::PerUnit(d))
}

/// Beats once per `frame_bytes` bytes passed through.
#[derive(Debug)]
pub struct FrameCounter {
    frame_bytes: u64,
    carried: u64,
}

impl FrameCounter {
    /// A counter of `frame_bytes`-byte frames (at least 1).
    pub fn new(frame_bytes: u64) -> FrameCounter {
        FrameCounter {
            frame_bytes: frame_bytes.max(1),
            carried: 0,
        }
    }

    /// `n` more bytes went through: returns how many frames were completed.
    pub fn add(&mut self, n: u64) -> u64 {
        self.carried += n;
        let frames = self.carried / self.frame_bytes;
        self.carried %= self.frame_bytes;
        frames
    }
}

/// Runs the program with its standard input fed through the counting pipe; returns its exit
/// status.
pub fn run(
    command: &[String],
    frame_bytes: u64,
    name: &str,
    target: Option<Target>,
) -> anyhow::Result<i32> {
    anyhow::ensure!(
        frame_bytes > 0,
        "--heartbeat-pipe: FRAME_BYTES must be positive"
    );
    let hb =
        Heartbeat::register(name, target).map_err(|e| anyhow::anyhow!("--heartbeat-pipe: {e}"))?;
    let (reader, mut writer) = std::io::pipe()?;
    // One frame of buffer (the kernel rounds up to a power of two pages; 1 MiB is the default
    // most an unprivileged process may ask for): the program takes a frame in one read, and
    // the count runs at most one frame ahead of what it took (module docs).
    {
        use std::os::fd::AsRawFd;
        let size = frame_bytes.clamp(4096, 1 << 20) as libc::c_int;
        // SAFETY: F_SETPIPE_SZ on a pipe we own, with an integer argument; failure is harmless
        // (the pipe keeps its default size).
        unsafe { libc::fcntl(writer.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
    }
    let mut child = match std::process::Command::new(&command[0])
        .args(&command[1..])
        .stdin(reader)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tess: cannot run {}: {e}", command[0]);
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let mut counter = FrameCounter::new(frame_bytes);
    let mut buf = vec![0u8; 64 * 1024];
    let mut input = std::io::stdin().lock();
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("tess: reading standard input: {e}");
                break;
            }
        };
        // Write in page-sized pieces so each beat follows the program's reads closely.
        let mut broken = false;
        for chunk in buf[..n].chunks(4096) {
            if writer.write_all(chunk).is_err() {
                broken = true; // the program stopped reading (exited): stop feeding it
                break;
            }
            for _ in 0..counter.add(chunk.len() as u64) {
                hb.beat();
            }
        }
        if broken {
            break;
        }
    }
    drop(writer);
    let status = child.wait()?;
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_counted_across_chunk_boundaries() {
        let mut c = FrameCounter::new(10);
        assert_eq!(c.add(4), 0);
        assert_eq!(c.add(6), 1);
        assert_eq!(c.add(25), 2);
        assert_eq!(c.add(5), 1);
        assert_eq!(c.add(0), 0);
    }

    #[test]
    fn targets_parse_as_rates_or_times() {
        assert_eq!(parse_target("30/s").unwrap(), Target::Rate(30.0));
        assert_eq!(
            parse_target("33ms").unwrap(),
            Target::PerUnit(Duration::from_millis(33))
        );
        assert!(parse_target("0/s").is_err());
        assert!(parse_target("fast").is_err());
        assert!(parse_target("0ms").is_err());
    }
}
