//! What an idle spinner costs: the CPU time of a spinning cell's `SCHED_IDLE` spinner (tessd
//! runs one per spinning hart as `tessd __spin-idle HART`) over a measured stretch, so that
//! every table that benefits from a spinner can show what it burned.

use std::time::Instant;

/// tessd's idle spinner on `hart`, found by its command line (`tessd __spin-idle HART`). For
/// measuring only: nothing is ever signalled by what this finds.
pub fn tessd_idle_spinner(hart: usize) -> Option<i32> {
    let hart = hart.to_string();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args.len() >= 3 && args[1] == b"__spin-idle" && args[2] == hart.as_bytes() {
            return Some(pid);
        }
    }
    None
}

/// A single-threaded process's CPU time over a stretch of wall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SpinCost {
    /// CPU time the process used, milliseconds.
    pub cpu_ms: f64,
    /// Wall time of the stretch, milliseconds.
    pub wall_ms: f64,
}

impl SpinCost {
    /// CPU time as a fraction of the wall time (of one hart).
    pub fn fraction(&self) -> f64 {
        if self.wall_ms > 0.0 {
            self.cpu_ms / self.wall_ms
        } else {
            0.0
        }
    }
}

/// Measures the CPU time of single-threaded process `pid` from [`SpinMeter::start`] to
/// [`SpinMeter::stop`].
#[derive(Debug)]
pub struct SpinMeter {
    pid: i32,
    cpu0: u64,
    t0: Instant,
}

impl SpinMeter {
    /// Starts measuring `pid`; `None` if it is gone.
    pub fn start(pid: i32) -> Option<SpinMeter> {
        Some(SpinMeter {
            pid,
            cpu0: tess_sched::proc::thread_cpu_ns(pid, pid)?,
            t0: Instant::now(),
        })
    }

    /// What it used since the start; `None` if it exited meanwhile.
    pub fn stop(self) -> Option<SpinCost> {
        let cpu1 = tess_sched::proc::thread_cpu_ns(self.pid, self.pid)?;
        Some(SpinCost {
            cpu_ms: cpu1.saturating_sub(self.cpu0) as f64 / 1e6,
            wall_ms: self.t0.elapsed().as_secs_f64() * 1e3,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meter_measures_a_live_process_and_no_spinner_is_invented() {
        let me = std::process::id() as i32;
        assert!(tessd_idle_spinner(1 << 20).is_none());
        let m = SpinMeter::start(me).expect("this process exists");
        let c = m.stop().expect("it still does");
        assert!(c.wall_ms >= 0.0 && c.cpu_ms >= 0.0);
        assert!(SpinCost::default().fraction() == 0.0);
        let half = SpinCost {
            cpu_ms: 5.0,
            wall_ms: 10.0,
        };
        assert!((half.fraction() - 0.5).abs() < 1e-12);
    }
}
