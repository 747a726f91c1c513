//! Processes and threads as `/proc` shows them.

use std::path::Path;

/// The whole text of a kernel-generated file (procfs, cgroupfs, sysfs) that is open as `f`,
/// read from offset 0 with `pread`.
///
/// Each read at offset 0 makes the kernel generate the text afresh, so an open file can be read
/// again and again (`tess_observe::kernel::Files` keeps them open between scrapes). Not
/// `fs::read_to_string`: that first asks for the size and position (two more system calls) and
/// these files report a size of 0 anyway. The kernel generates such a text into a buffer and
/// hands out as much as is asked for, so a short read is the end.
pub fn read_generated(f: &std::fs::File) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        match f.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len < buf.len() {
                    break;
                }
                buf.resize(len * 2, 0);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Opens `path` and reads it with [`read_generated`].
pub fn read_kernel_file(path: &Path) -> std::io::Result<String> {
    read_generated(&std::fs::File::open(path)?)
}

/// Thread ids of process `pid` (its `/proc/PID/task` entries). Empty if the process is gone.
pub fn threads_of(pid: i32) -> Vec<i32> {
    threads_in(Path::new("/proc"), pid)
}

fn threads_in(proc_root: &Path, pid: i32) -> Vec<i32> {
    let dir = proc_root.join(pid.to_string()).join("task");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut tids: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids
}

/// Whether a process or thread with this id exists now.
pub fn exists(tid: i32) -> bool {
    Path::new("/proc").join(tid.to_string()).exists()
}

/// The thread-group (process) id of thread `tid`, from `/proc/TID/status`.
pub fn tgid_of(tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:")?.trim().parse().ok())
}

/// Real uid of process `pid`, from `/proc/PID/status`.
pub fn uid_of(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix("Uid:")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// The hart thread `tid` last ran on (field 39 of `/proc/TID/stat`). A sleeping thread stays
/// on its last hart until it wakes, even after its affinity changed.
pub fn last_hart(tid: i32) -> Option<usize> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields resume after its closing ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(36)?.parse().ok()
}

/// CPU time of thread `tid` in nanoseconds, from `/proc/TID/schedstat` (the kernel resolves a
/// thread id there even though `/proc` lists only processes).
pub fn task_cpu_ns(tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Whether thread `tid` is runnable now (state `R` in `/proc/TID/stat`): running, waiting for a
/// hart, or throttled by its reservation.
pub fn task_runnable(tid: i32) -> Option<bool> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; the state follows its closing ')'.
    let state = s[s.rfind(')')? + 1..].split_whitespace().next()?;
    Some(state == "R")
}

/// Per-thread CPU time (user + system) in nanoseconds, from `/proc/PID/task/TID/schedstat`.
pub fn thread_cpu_ns(pid: i32, tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_files_read_whole_and_fresh() {
        let d = tempfile::tempdir().unwrap();
        let long = d.path().join("long");
        std::fs::write(&long, "x".repeat(10_000)).unwrap();
        assert_eq!(read_kernel_file(&long).unwrap().len(), 10_000);
        // This thread's own counters: the harness runs each test on a thread of its own, and
        // `/proc/self` would name the process's main thread, which sleeps meanwhile.
        let f = std::fs::File::open("/proc/thread-self/schedstat").unwrap();
        let a: u64 = read_generated(&f)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(20) {}
        let b: u64 = read_generated(&f)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            b > a,
            "{a} then {b}: the same open file reads fresh counters"
        );
    }

    #[test]
    fn own_threads_are_listed() {
        let me = std::process::id() as i32;
        let tids = threads_of(me);
        assert!(tids.contains(&crate::gettid()));
        assert_eq!(tgid_of(crate::gettid()), Some(me));
        assert!(thread_cpu_ns(me, crate::gettid()).is_some());
        assert!(task_cpu_ns(crate::gettid()).is_some());
        assert_eq!(task_runnable(crate::gettid()), Some(true), "we are running");
        assert_eq!(last_hart(crate::gettid()), Some(crate::current_hart()));
    }

    #[test]
    fn missing_process_has_no_threads() {
        assert!(threads_of(1 << 23).is_empty());
        assert!(!exists(1 << 23));
    }
}
