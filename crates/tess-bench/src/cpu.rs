//! How busy each hart was over a run, and how long the hypervisor kept it off the host CPU
//! (steal time): the evidence for stalls that no Linux setting can prevent, read from the
//! per-CPU lines of `/proc/stat` before and after.

use serde::Serialize;

/// One hart's time over a run.
#[derive(Debug, Clone, Serialize)]
pub struct HartLoad {
    /// The hart.
    pub hart: usize,
    /// Busy time (user, nice, system, irq, softirq) / wall time.
    pub busy_fraction: f64,
    /// Steal time, milliseconds.
    pub steal_ms: f64,
}

/// One reading of the per-CPU counters: (hart, busy ticks, all ticks, steal ticks).
#[derive(Debug, Clone, Default)]
pub struct Ticks(Vec<(usize, u64, u64, u64)>);

/// Reads the per-CPU counters now.
pub fn ticks() -> Ticks {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    Ticks(parse(&text))
}

fn parse(text: &str) -> Vec<(usize, u64, u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let hart = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let v: Vec<u64> = f.filter_map(|x| x.parse().ok()).collect();
            // user nice system idle iowait irq softirq steal ...
            let busy = v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)?;
            let steal = *v.get(7)?;
            let all = busy + v.get(3)? + v.get(4)? + steal;
            Some((hart, busy, all, steal))
        })
        .collect()
}

/// The per-hart loads between two readings.
pub fn loads(before: &Ticks, after: &Ticks) -> Vec<HartLoad> {
    // USER_HZ is 100 on every Linux architecture that tess runs on (x86, arm64).
    let hz = 100.0;
    after
        .0
        .iter()
        .filter_map(|&(hart, busy, all, steal)| {
            let &(_, b0, a0, s0) = before.0.iter().find(|b| b.0 == hart)?;
            let span = all.saturating_sub(a0).max(1) as f64;
            Some(HartLoad {
                hart,
                busy_fraction: busy.saturating_sub(b0) as f64 / span,
                steal_ms: steal.saturating_sub(s0) as f64 * 1000.0 / hz,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_are_the_difference_of_two_readings() {
        let a = Ticks(parse(
            "cpu  1 1 1 1 1 1 1 1\ncpu0 10 0 10 70 0 0 0 10 0 0\ncpu1 0 0 0 100 0 0 0 0\n",
        ));
        let b = Ticks(parse(
            "cpu0 40 0 10 100 0 0 10 30 0 0\ncpu1 0 0 0 200 0 0 0 0\nintr 5\n",
        ));
        let l = loads(&a, &b);
        assert_eq!(l.len(), 2, "the summary line and others are skipped");
        assert_eq!(l[0].hart, 0);
        // busy +40, idle +30, steal +20 over 90 ticks
        assert!((l[0].busy_fraction - 40.0 / 90.0).abs() < 1e-12);
        assert_eq!(l[0].steal_ms, 200.0);
        assert_eq!((l[1].busy_fraction, l[1].steal_ms), (0.0, 0.0));
    }
}
