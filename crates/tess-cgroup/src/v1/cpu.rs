//! v1 `cpu` controller files.

use crate::fs::Fs;
use crate::Result;
use std::path::Path;
use std::time::Duration;

/// CFS weight; 1024 is the default.
pub const SHARES: &str = "cpu.shares";
/// CFS bandwidth quota in microseconds per period, -1 for none.
pub const CFS_QUOTA_US: &str = "cpu.cfs_quota_us";
/// CFS bandwidth period in microseconds.
pub const CFS_PERIOD_US: &str = "cpu.cfs_period_us";

/// Sets the weight on the v2 scale (1..=10000, default 100), converted to shares (x 1024 / 100).
pub fn set_weight(fs: &Fs, dir: &Path, weight: u32) -> Result<()> {
    let shares = (u64::from(weight) * 1024 / 100).max(2);
    fs.write_if_changed(&dir.join(SHARES), &shares.to_string())
        .map(|_| ())
}

/// Sets or clears a CFS bandwidth limit `(quota, period)`.
pub fn set_bandwidth(fs: &Fs, dir: &Path, limit: Option<(Duration, Duration)>) -> Result<()> {
    match limit {
        Some((quota, period)) => {
            // Quota first to -1 so the period can change without violating the old quota.
            fs.write_if_changed(&dir.join(CFS_QUOTA_US), "-1")?;
            fs.write_if_changed(&dir.join(CFS_PERIOD_US), &period.as_micros().to_string())?;
            fs.write_if_changed(&dir.join(CFS_QUOTA_US), &quota.as_micros().to_string())?;
        }
        None => {
            fs.write_if_changed(&dir.join(CFS_QUOTA_US), "-1")?;
        }
    }
    Ok(())
}

/// RT group bandwidth: microseconds of `SCHED_FIFO`/`SCHED_RR` run time per period, on each
/// hart (present only with `CONFIG_RT_GROUP_SCHED`; 0 forbids RT threads in the group, -1 in
/// the root means unlimited).
pub const RT_RUNTIME_US: &str = "cpu.rt_runtime_us";
/// RT group bandwidth period in microseconds.
pub const RT_PERIOD_US: &str = "cpu.rt_period_us";

/// The RT bandwidth `(runtime_us, period_us)` of a group, `None` if the kernel has no RT group
/// scheduling (or the group is gone).
pub fn rt_bandwidth(fs: &Fs, dir: &Path) -> Option<(i64, u64)> {
    let runtime = fs
        .read(&dir.join(RT_RUNTIME_US))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let period = fs.read(&dir.join(RT_PERIOD_US)).ok()?.trim().parse().ok()?;
    Some((runtime, period))
}

/// Lowers a group's RT bandwidth towards `(runtime_us, period_us)` without ever raising it, so
/// that the kernel's check (children's `runtime / period` summed within the parent's) holds at
/// every step. A period change first shrinks the runtime to 1 us (0 would be refused while RT
/// threads are inside); [`grow_rt`] then sets the target once the parents allow it.
pub fn shrink_rt(fs: &Fs, dir: &Path, runtime_us: u64, period_us: u64) -> Result<()> {
    let Some((cur_runtime, cur_period)) = rt_bandwidth(fs, dir) else {
        return Ok(());
    };
    let mut cur_runtime = cur_runtime.max(0) as u64;
    if cur_period != period_us {
        if cur_runtime > 1 {
            fs.write(&dir.join(RT_RUNTIME_US), "1")?;
            cur_runtime = 1;
        }
        fs.write(&dir.join(RT_PERIOD_US), &period_us.to_string())?;
    }
    if runtime_us < cur_runtime {
        fs.write(&dir.join(RT_RUNTIME_US), &runtime_us.to_string())?;
    }
    Ok(())
}

/// Sets a group's RT bandwidth to `(runtime_us, period_us)`, after [`shrink_rt`] and after the
/// parents have room.
pub fn grow_rt(fs: &Fs, dir: &Path, runtime_us: u64, period_us: u64) -> Result<()> {
    fs.write_if_changed(&dir.join(RT_PERIOD_US), &period_us.to_string())?;
    fs.write_if_changed(&dir.join(RT_RUNTIME_US), &runtime_us.to_string())?;
    Ok(())
}
