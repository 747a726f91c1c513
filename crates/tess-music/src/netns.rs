//! A second "host" for the SLABS emulator: a network namespace joined to the root namespace by
//! a veth pair, as the paper's SLABS sat on its own gigabit LAN (seed 000, section 4).
//!
//! ```text
//!   root namespace (synthesizer)              namespace NAME (tess-slabs)
//!   +----------------------------+  veth    +-----------------------------+
//!   | NAME-h   10.213.77.1/30    |<-------->| NAME-d   10.213.77.2/30     |
//!   +----------------------------+          +-----------------------------+
//! ```
//!
//! Packets then cross a real (virtual) link with its own queueing and softirq processing rather
//! than the loopback shortcut. Created with iproute2 (`ip netns add`, `ip link add ... type veth
//! peer name ... netns ...`); [`NetnsPair`] deletes both on drop. Where that is not permitted
//! (no CAP_NET_ADMIN), [`Link::veth_or_loopback`] falls back to 127.0.0.1.
//!
//! The emulator joins the namespace with `setns(2)` ([`enter`]) before it creates its socket
//! (`tess-slabs --netns NAME`), or is started with `ip netns exec NAME tess-slabs ...`.
//! `scripts/slabs-netns.sh` does the same from a shell.
//!
//! Worked example: `NetnsPair::create("slabs", [10, 213, 77])` gives interfaces `slabs-h` and
//! `slabs-d`; the synthesizer binds `10.213.77.1:9701`, the emulator (in `slabs`) sends there.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;

/// The default /30 prefix of the pair: host `.1`, device `.2`.
pub const DEFAULT_PREFIX: [u8; 3] = [10, 213, 77];

/// Error creating or entering a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// An `ip` command failed.
    #[error("`ip {args}` failed: {stderr}")]
    Ip {
        /// The arguments.
        args: String,
        /// What `ip` printed.
        stderr: String,
    },
    /// `ip` could not be run at all.
    #[error("cannot run `ip` (install iproute2): {0}")]
    Spawn(#[source] std::io::Error),
    /// The name is unusable for interface names (at most 13 characters, `[A-Za-z0-9_-]`).
    #[error("network namespace name {0:?} must be 1-13 characters of [A-Za-z0-9_-]")]
    Name(String),
    /// `setns` failed.
    #[error("cannot enter network namespace {path}: {source}")]
    Enter {
        /// `/var/run/netns/NAME`.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

fn ip(args: &[&str]) -> Result<(), NetnsError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(NetnsError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetnsError::Ip {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// A namespace with a veth pair to the root namespace; removed on drop.
#[derive(Debug)]
pub struct NetnsPair {
    /// Namespace name.
    pub name: String,
    /// Interface in the root namespace.
    pub host_if: String,
    /// Interface inside the namespace.
    pub device_if: String,
    /// Address of `host_if` (the synthesizer binds here).
    pub host_addr: Ipv4Addr,
    /// Address of `device_if` (the emulator's).
    pub device_addr: Ipv4Addr,
}

impl NetnsPair {
    /// Creates namespace `name` with the veth pair `name-h` / `name-d` on `prefix.1/30` and
    /// `prefix.2/30`. A stale namespace or interface of the same name is removed first.
    pub fn create(name: &str, prefix: [u8; 3]) -> Result<NetnsPair, NetnsError> {
        if name.is_empty()
            || name.len() > 13
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(NetnsError::Name(name.to_string()));
        }
        let pair = NetnsPair {
            name: name.to_string(),
            host_if: format!("{name}-h"),
            device_if: format!("{name}-d"),
            host_addr: Ipv4Addr::new(prefix[0], prefix[1], prefix[2], 1),
            device_addr: Ipv4Addr::new(prefix[0], prefix[1], prefix[2], 2),
        };
        pair.remove();
        let host_cidr = format!("{}/30", pair.host_addr);
        let dev_cidr = format!("{}/30", pair.device_addr);
        let steps: [&[&str]; 7] = [
            &["netns", "add", name],
            &[
                "link",
                "add",
                &pair.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &pair.device_if,
                "netns",
                name,
            ],
            &["addr", "add", &host_cidr, "dev", &pair.host_if],
            &["link", "set", &pair.host_if, "up"],
            &["-n", name, "addr", "add", &dev_cidr, "dev", &pair.device_if],
            &["-n", name, "link", "set", &pair.device_if, "up"],
            &["-n", name, "link", "set", "lo", "up"],
        ];
        for args in steps {
            if let Err(e) = ip(args) {
                pair.remove();
                return Err(e);
            }
        }
        Ok(pair)
    }

    /// Steers the receive processing of what the emulator sends (the root-namespace end's
    /// receive queues) to `harts` with RPS (`rps_cpus`), so that the kernel's network work for
    /// the synthesizer runs on the synthesizer's own harts rather than on the hart that sent
    /// the packet (the emulator's, shared with interference), where it waits behind any
    /// higher-priority task. The setting goes away with the interface.
    pub fn steer_receive(&self, harts: &tess_sched::HartSet) -> std::io::Result<usize> {
        let queues = std::path::Path::new("/sys/class/net")
            .join(&self.host_if)
            .join("queues");
        let mut steered = 0;
        for entry in std::fs::read_dir(&queues)? {
            let queue = entry?.path();
            let is_rx = queue
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("rx-"));
            if is_rx {
                std::fs::write(queue.join("rps_cpus"), harts.to_hex_mask())?;
                steered += 1;
            }
        }
        Ok(steered)
    }

    fn remove(&self) {
        // Deleting one end of a veth pair deletes both; deleting the namespace deletes the end
        // inside it. Errors mean "was not there".
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Where the emulator runs relative to the synthesizer.
#[derive(Debug)]
pub enum Link {
    /// In its own namespace across a veth pair.
    Veth(NetnsPair),
    /// Both on 127.0.0.1.
    Loopback,
}

impl Link {
    /// A veth pair in namespace `name` if it can be made, else loopback (with the reason).
    pub fn veth_or_loopback(name: &str) -> (Link, Option<NetnsError>) {
        match NetnsPair::create(name, DEFAULT_PREFIX) {
            Ok(p) => (Link::Veth(p), None),
            Err(e) => (Link::Loopback, Some(e)),
        }
    }

    /// The address the synthesizer binds to.
    pub fn host_ip(&self) -> IpAddr {
        match self {
            Link::Veth(p) => IpAddr::V4(p.host_addr),
            Link::Loopback => IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }

    /// The namespace the emulator must enter, if any.
    pub fn netns(&self) -> Option<&str> {
        match self {
            Link::Veth(p) => Some(&p.name),
            Link::Loopback => None,
        }
    }

    /// Short description for reports.
    pub fn describe(&self) -> String {
        match self {
            Link::Veth(p) => format!(
                "veth pair {} ({}) <-> {} ({}) in netns {}",
                p.host_if, p.host_addr, p.device_if, p.device_addr, p.name
            ),
            Link::Loopback => "loopback 127.0.0.1".into(),
        }
    }
}

/// Moves the calling thread into network namespace `name` (`/var/run/netns/NAME`). Sockets the
/// thread creates afterwards live there; call it before spawning other threads.
pub fn enter(name: &str) -> Result<(), NetnsError> {
    let path = PathBuf::from("/var/run/netns").join(name);
    let f = std::fs::File::open(&path).map_err(|source| NetnsError::Enter {
        path: path.clone(),
        source,
    })?;
    // SAFETY: `f` is an open file descriptor for the lifetime of the call; setns reads no
    // memory of ours.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(NetnsError::Enter {
            path,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{Endpoint, Peer, Wait};

    #[test]
    fn bad_names_are_refused_before_running_ip() {
        assert!(matches!(
            NetnsPair::create("a-name-far-too-long", DEFAULT_PREFIX),
            Err(NetnsError::Name(_))
        ));
        assert!(matches!(
            NetnsPair::create("x y", DEFAULT_PREFIX),
            Err(NetnsError::Name(_))
        ));
    }

    #[test]
    fn veth_pair_carries_a_datagram_or_falls_back() {
        let (link, why) = Link::veth_or_loopback("tmtest0");
        if let Link::Veth(p) = &link {
            // Receive processing steered to hart 0: the mask is written, and packets still flow.
            assert_eq!(p.steer_receive(&tess_sched::HartSet::single(0)).unwrap(), 1);
            let mask = std::fs::read_to_string(format!(
                "/sys/class/net/{}/queues/rx-0/rps_cpus",
                p.host_if
            ))
            .unwrap();
            assert_eq!(mask.trim().trim_start_matches(['0', ',']), "1", "{mask}");
        }
        let host = Endpoint::bind((link.host_ip(), 0).into()).unwrap();
        let to_host = Peer::from_socket_addr(host.local_addr());
        let ns = link.netns().map(str::to_string);
        // Send from inside the namespace (a fresh thread, so the test thread stays put).
        std::thread::spawn(move || {
            if let Some(ns) = ns {
                enter(&ns).unwrap();
            }
            let dev = Endpoint::bind("0.0.0.0:0".parse().unwrap()).unwrap();
            dev.send_to(b"ping", &to_host).unwrap();
        })
        .join()
        .unwrap();
        let mut buf = [0u8; 16];
        let r = loop {
            if let Some(r) = host.recv(&mut buf, Wait::Block).unwrap() {
                break r;
            }
        };
        assert_eq!(&buf[..r.len], b"ping");
        if let Link::Veth(p) = &link {
            let from = r.peer.to_socket_addr().unwrap();
            assert_eq!(from.ip(), IpAddr::V4(p.device_addr));
        } else {
            eprintln!("loopback fallback: {why:?}");
        }
    }
}
