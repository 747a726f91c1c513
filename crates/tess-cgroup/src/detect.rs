//! Finding the cgroup hierarchies the host mounts, from `/proc/self/mountinfo`.

use crate::fs::CgroupError;
use crate::Version;
use std::path::{Path, PathBuf};

/// Mount points of the hierarchies tess can use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hierarchies {
    /// v1 `cpuset` hierarchy.
    pub v1_cpuset: Option<PathBuf>,
    /// v1 `cpu` hierarchy (often co-mounted with `cpuacct`).
    pub v1_cpu: Option<PathBuf>,
    /// v1 `memory` hierarchy.
    pub v1_memory: Option<PathBuf>,
    /// v1 `pids` hierarchy.
    pub v1_pids: Option<PathBuf>,
    /// The unified (v2) hierarchy, if mounted.
    pub v2: Option<PathBuf>,
    /// Controllers the v2 root offers (`cgroup.controllers`).
    pub v2_controllers: Vec<String>,
}

impl Hierarchies {
    /// Which version to drive: v1 when it has both `cpuset` and `cpu` (hybrid hosts keep the CPU
    /// controllers there), otherwise v2 when its root offers both.
    pub fn preferred(&self) -> Result<Version, CgroupError> {
        if self.v1_cpuset.is_some() && self.v1_cpu.is_some() {
            return Ok(Version::V1);
        }
        if self.v2.is_some()
            && self.v2_controllers.iter().any(|c| c == "cpuset")
            && self.v2_controllers.iter().any(|c| c == "cpu")
        {
            return Ok(Version::V2);
        }
        Err(CgroupError::Unsupported(format!(
            "need the cpuset and cpu controllers on cgroup v1 or v2; found v1 cpuset={}, cpu={}, v2 {}",
            self.v1_cpuset.as_ref().map_or("-".into(), |p| p.display().to_string()),
            self.v1_cpu.as_ref().map_or("-".into(), |p| p.display().to_string()),
            match &self.v2 {
                Some(p) => format!("at {} with controllers [{}]", p.display(), self.v2_controllers.join(" ")),
                None => "not mounted".into(),
            }
        )))
    }
}

/// Parses mountinfo text. Each line: `id parent major:minor root mountpoint opts ... - fstype
/// source superopts`.
pub fn parse_mountinfo(text: &str) -> Hierarchies {
    let mut h = Hierarchies::default();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split_whitespace().collect();
        let rfields: Vec<&str> = right.split_whitespace().collect();
        if fields.len() < 5 || rfields.is_empty() {
            continue;
        }
        let mount_point = PathBuf::from(unescape(fields[4]));
        match rfields[0] {
            "cgroup2" if h.v2.is_none() => {
                h.v2 = Some(mount_point);
            }
            "cgroup" => {
                let opts = rfields.get(2).copied().unwrap_or("");
                for o in opts.split(',') {
                    let slot = match o {
                        "cpuset" => &mut h.v1_cpuset,
                        "cpu" => &mut h.v1_cpu,
                        "memory" => &mut h.v1_memory,
                        "pids" => &mut h.v1_pids,
                        _ => continue,
                    };
                    if slot.is_none() {
                        *slot = Some(mount_point.clone());
                    }
                }
            }
            _ => {}
        }
    }
    h
}

/// mountinfo escapes spaces and similar as `\040`.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// Detects the host's hierarchies.
pub fn detect() -> Result<Hierarchies, CgroupError> {
    detect_from(Path::new("/proc/self/mountinfo"))
}

/// Detects from a given mountinfo file (and reads the v2 controller list under its mount).
pub fn detect_from(mountinfo: &Path) -> Result<Hierarchies, CgroupError> {
    let text = std::fs::read_to_string(mountinfo).map_err(|source| CgroupError::Read {
        path: mountinfo.to_path_buf(),
        source,
    })?;
    let mut h = parse_mountinfo(&text);
    if let Some(v2) = &h.v2 {
        if let Ok(c) = std::fs::read_to_string(v2.join("cgroup.controllers")) {
            h.v2_controllers = c.split_whitespace().map(String::from).collect();
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 24 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:29 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
34 30 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
36 30 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const UNIFIED: &str = "\
25 21 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    #[test]
    fn hybrid_prefers_v1() {
        let mut h = parse_mountinfo(HYBRID);
        assert_eq!(
            h.v1_cpuset.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpuset"))
        );
        assert_eq!(h.v1_cpu.as_deref(), Some(Path::new("/sys/fs/cgroup/cpu")));
        assert_eq!(h.v2.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        assert_eq!(h.preferred().unwrap(), Version::V1);
        h.v1_cpu = None;
        assert!(h.preferred().is_err());
    }

    #[test]
    fn unified_uses_v2_when_it_has_the_controllers() {
        let mut h = parse_mountinfo(UNIFIED);
        assert_eq!(h.v2.as_deref(), Some(Path::new("/sys/fs/cgroup")));
        assert!(h.preferred().is_err(), "no controllers listed yet");
        h.v2_controllers = "cpuset cpu io memory pids"
            .split(' ')
            .map(String::from)
            .collect();
        assert_eq!(h.preferred().unwrap(), Version::V2);
    }

    #[test]
    fn comounted_cpu_cpuacct() {
        let h = parse_mountinfo(
            "31 30 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
        );
        assert_eq!(
            h.v1_cpu.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpu,cpuacct"))
        );
    }

    #[test]
    fn cells_in_cgroup_paths() {
        use crate::cell_in_path;
        assert_eq!(
            cell_in_path("/tess/cells/synth", "tess").as_deref(),
            Some("synth")
        );
        assert_eq!(
            cell_in_path("/tess.part-1/ctl", "tess").as_deref(),
            Some("ctl")
        );
        assert_eq!(cell_in_path("/tess/system", "tess"), None);
        assert_eq!(cell_in_path("/tess/cells/a/b", "tess"), None);
        assert_eq!(cell_in_path("/other/cells/a", "tess"), None);
        assert_eq!(cell_in_path("/", "tess"), None);
        assert_eq!(cell_in_path("/tess/part-1/ctl", "tess"), None);
        assert_eq!(cell_in_path("/tess.part-1", "tess"), None);
        assert_eq!(cell_in_path("/tess-other/cells/a", "tess"), None);
    }

    #[test]
    fn escaped_mount_points() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
    }

    #[test]
    fn this_host_is_detectable() {
        // Whatever this machine mounts, parsing its mountinfo must not fail.
        let h = detect().unwrap();
        let _ = h.preferred();
    }
}
