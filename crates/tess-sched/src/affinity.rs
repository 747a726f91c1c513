//! Per-thread CPU affinity (`sched_setaffinity(2)`).

use crate::HartSet;

fn to_cpu_set(harts: &HartSet) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for h in harts.iter() {
        if h < libc::CPU_SETSIZE as usize {
            // SAFETY: `h` is below CPU_SETSIZE, so the bit lies inside `set`.
            unsafe { libc::CPU_SET(h, &mut set) };
        }
    }
    set
}

/// Pins thread `tid` (0 = the calling thread) to `harts`.
pub fn set_affinity(tid: i32, harts: &HartSet) -> std::io::Result<()> {
    let set = to_cpu_set(harts);
    // SAFETY: `set` is a valid cpu_set_t and we pass its exact size.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reads the affinity of thread `tid` (0 = the calling thread).
pub fn get_affinity(tid: i32) -> std::io::Result<HartSet> {
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most size_of::<cpu_set_t>() bytes into `set`.
    let rc =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `h` is below CPU_SETSIZE, so the bit lies inside `set`.
        .filter(|&h| unsafe { libc::CPU_ISSET(h, &set) })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_affinity_round_trips() {
        let before = get_affinity(0).unwrap();
        assert!(!before.is_empty());
        let one = HartSet::single(before.first().unwrap());
        std::thread::spawn(move || {
            set_affinity(0, &one).unwrap();
            assert_eq!(get_affinity(0).unwrap(), one);
        })
        .join()
        .unwrap();
    }
}
