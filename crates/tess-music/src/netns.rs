//! A second "host" for the SLABS emulator, and the cable between: the paper's SLABS sat on its
//! own gigabit LAN (seed 000, section 4). Three network namespaces joined by two veth pairs:
//!
//! ```text
//!   namespace NAME (device)       namespace NAME-w (the wire)              root namespace (host)
//!   +---------------------+ veth  +----------------------------------+ veth  +------------------+
//!   | NAME-e 10.213.78.2  |<----->| NAME-f 10.213.78.1  forwarding   |<----->| NAME-h           |
//!   | tess-slabs          |       |   NAME-d 10.213.77.2  tbf + tap  |       | 10.213.77.1      |
//!   +---------------------+       +----------------------------------+       | tess-migrator    |
//!                                                                            +------------------+
//! ```
//!
//! The wire namespace forwards between the two and is where a cable's properties live: its
//! host-facing interface can pace what the device sends ([`NetnsPair::pace_device`]: a
//! token-bucket queue whose timer releases each packet), a packet socket there sees each packet
//! leave for the host (`tess_music::net::WireTap`), and its receive processing can run on the
//! synthesizer's harts ([`NetnsPair::steer_receive`]). Then the cable's timer and its softirq
//! run where a real network adapter's interrupt would be steered, on the host's receiving hart,
//! and the device's own process only keeps the queue filled: the link paces the device's
//! packets as hardware does, whatever else runs on the device's hart.
//!
//! Created with iproute2 (`ip netns add`, `ip link add ... type veth peer name ... netns ...`,
//! `ip route`); [`NetnsPair`] deletes everything on drop. Where that is not permitted (no
//! CAP_NET_ADMIN), [`Link::veth_or_loopback`] falls back to 127.0.0.1.
//!
//! The emulator joins the device namespace with `setns(2)` ([`enter`]) before it creates its
//! socket (`tess-slabs --netns NAME`), or is started with `ip netns exec NAME tess-slabs ...`.
//!
//! Worked example: `NetnsPair::create("slabs", [10, 213, 77])` gives namespaces `slabs` and
//! `slabs-w` and interfaces `slabs-e`, `slabs-f`, `slabs-d` and `slabs-h`; the synthesizer
//! binds `10.213.77.1:9701`, the emulator (in `slabs`, address 10.213.78.2) sends there.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;

/// The default /30 prefix of the host's side of the cable: host `.1`, the wire `.2`. The
/// device's side is the next /24 up (`10.213.78.0/30`: the wire `.1`, the device `.2`).
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
    /// A `tc` command failed (the kernel lacks the `tbf` queueing discipline, say).
    #[error("`tc {args}` failed: {stderr}")]
    Tc {
        /// The arguments.
        args: String,
        /// What `tc` printed.
        stderr: String,
    },
    /// A setting inside the wire namespace could not be written.
    #[error("cannot set {what} in network namespace {ns}: {stderr}")]
    Setting {
        /// What (a sysctl, an interface's RPS mask).
        what: String,
        /// The namespace.
        ns: String,
        /// What the shell printed.
        stderr: String,
    },
    /// `ip` or `tc` could not be run at all.
    #[error("cannot run `ip` or `tc` (install iproute2): {0}")]
    Spawn(#[source] std::io::Error),
    /// The name is unusable for interface names (at most 13 characters, `[A-Za-z0-9_-]`).
    #[error("network namespace name {0:?} must be 1-13 characters of [A-Za-z0-9_-]")]
    Name(String),
    /// Another interface of the root namespace already routes one of the pair's two /24s (a
    /// pair of another name, or a leftover of a killed run).
    #[error(
        "{net}/24 is already routed through interface {iface} (another cable, or one a killed \
         run left behind: `ip link del {iface}` removes it)"
    )]
    PrefixInUse {
        /// The network, `a.b.c.0`.
        net: Ipv4Addr,
        /// The interface that routes it.
        iface: String,
    },
    /// Every candidate prefix is in use.
    #[error("no free 10.213.x.0/24 pair for a cable: {0}")]
    NoFreePrefix(Box<NetnsError>),
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
    iproute2("ip", args).map_err(|(args, stderr)| NetnsError::Ip { args, stderr })
}

fn tc(args: &[&str]) -> Result<(), NetnsError> {
    iproute2("tc", args).map_err(|(args, stderr)| NetnsError::Tc { args, stderr })
}

/// Runs an iproute2 tool; on failure, its arguments and what it printed.
fn iproute2(tool: &str, args: &[&str]) -> Result<(), (String, String)> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|e| (args.join(" "), format!("cannot run {tool}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err((
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// Writes `value` to `file` (a path under `/proc/sys` or `/sys`) inside namespace `ns`, where
/// `ip netns exec` mounts that namespace's view of both.
fn write_in(ns: &str, file: &str, value: &str) -> Result<(), NetnsError> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "sh",
            "-c",
            "echo \"$1\" > \"$2\"",
            "sh",
        ])
        .args([value, file])
        .output()
        .map_err(NetnsError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetnsError::Setting {
            what: file.to_string(),
            ns: ns.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// The device's namespace, the wire's namespace between it and the root namespace, and the
/// two veth pairs; removed on drop.
#[derive(Debug)]
pub struct NetnsPair {
    /// The device's namespace.
    pub name: String,
    /// The wire's namespace (`NAME-w`).
    pub wire: String,
    /// Interface in the root namespace.
    pub host_if: String,
    /// The wire's interface facing the host (its egress is the cable's queue).
    pub wire_host_if: String,
    /// The wire's interface facing the device.
    pub wire_device_if: String,
    /// Interface inside the device's namespace.
    pub device_if: String,
    /// Address of `host_if` (the synthesizer binds here).
    pub host_addr: Ipv4Addr,
    /// Address of `device_if` (the emulator's).
    pub device_addr: Ipv4Addr,
}

impl NetnsPair {
    /// Creates the device's namespace `name`, the wire's namespace `name-w` and the veth pairs
    /// `name-h` / `name-d` (on `prefix.1/30` and `prefix.2/30`) and `name-f` / `name-e` (the
    /// next /24 up), with routes through the wire. A stale namespace or interface of the same
    /// names is removed first.
    pub fn create(name: &str, prefix: [u8; 3]) -> Result<NetnsPair, NetnsError> {
        check_name(name)?;
        NetnsPair::layout(name, prefix).remove();
        NetnsPair::create_fresh(name, prefix)
    }

    /// The names and addresses of pair `name` on `prefix`, nothing created.
    fn layout(name: &str, prefix: [u8; 3]) -> NetnsPair {
        let inner = [prefix[0], prefix[1], prefix[2].wrapping_add(1)];
        NetnsPair {
            name: name.to_string(),
            wire: format!("{name}-w"),
            host_if: format!("{name}-h"),
            wire_host_if: format!("{name}-d"),
            wire_device_if: format!("{name}-f"),
            device_if: format!("{name}-e"),
            host_addr: Ipv4Addr::new(prefix[0], prefix[1], prefix[2], 1),
            device_addr: Ipv4Addr::new(inner[0], inner[1], inner[2], 2),
        }
    }

    /// [`create`](Self::create) once any stale pair of the name is gone.
    fn create_fresh(name: &str, prefix: [u8; 3]) -> Result<NetnsPair, NetnsError> {
        let inner = [prefix[0], prefix[1], prefix[2].wrapping_add(1)];
        let wire_near_device = Ipv4Addr::new(inner[0], inner[1], inner[2], 1);
        let pair = NetnsPair::layout(name, prefix);
        for net in [prefix, inner] {
            if let Some(iface) = route_through(net) {
                return Err(NetnsError::PrefixInUse {
                    net: Ipv4Addr::new(net[0], net[1], net[2], 0),
                    iface,
                });
            }
        }
        let wire_near_host = Ipv4Addr::new(prefix[0], prefix[1], prefix[2], 2);
        let host_cidr = format!("{}/30", pair.host_addr);
        let wire_host_cidr = format!("{wire_near_host}/30");
        let wire_device_cidr = format!("{wire_near_device}/30");
        let dev_cidr = format!("{}/30", pair.device_addr);
        let device_net = format!("{}.{}.{}.0/30", inner[0], inner[1], inner[2]);
        let (wire_host, wire_device) = (wire_near_host.to_string(), wire_near_device.to_string());
        let (n, w) = (name, pair.wire.as_str());
        let steps: [&[&str]; 16] = [
            &["netns", "add", n],
            &["netns", "add", w],
            &[
                "link",
                "add",
                &pair.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &pair.wire_host_if,
                "netns",
                w,
            ],
            &["addr", "add", &host_cidr, "dev", &pair.host_if],
            &["link", "set", &pair.host_if, "up"],
            &[
                "-n",
                w,
                "addr",
                "add",
                &wire_host_cidr,
                "dev",
                &pair.wire_host_if,
            ],
            &["-n", w, "link", "set", &pair.wire_host_if, "up"],
            &[
                "-n",
                w,
                "link",
                "add",
                &pair.wire_device_if,
                "type",
                "veth",
                "peer",
                "name",
                &pair.device_if,
                "netns",
                n,
            ],
            &[
                "-n",
                w,
                "addr",
                "add",
                &wire_device_cidr,
                "dev",
                &pair.wire_device_if,
            ],
            &["-n", w, "link", "set", &pair.wire_device_if, "up"],
            &["-n", w, "link", "set", "lo", "up"],
            &["-n", n, "addr", "add", &dev_cidr, "dev", &pair.device_if],
            &["-n", n, "link", "set", &pair.device_if, "up"],
            &["-n", n, "link", "set", "lo", "up"],
            &["-n", n, "route", "add", "default", "via", &wire_device],
            &[
                "route",
                "add",
                &device_net,
                "via",
                &wire_host,
                "dev",
                &pair.host_if,
            ],
        ];
        let made = steps
            .iter()
            .try_for_each(|args| ip(args))
            .and_then(|()| write_in(w, "/proc/sys/net/ipv4/ip_forward", "1"));
        if let Err(e) = made {
            pair.remove();
            return Err(e);
        }
        Ok(pair)
    }

    /// [`create`](Self::create) on the first prefix from [`DEFAULT_PREFIX`] up (`10.213.77`,
    /// `10.213.79`, ...: a pair takes two /24s) that nothing in the root namespace routes yet,
    /// so that cables of different names, and a leftover of a killed run, do not collide. Two
    /// creators racing for one prefix: the loser's `ip` fails with "File exists" and it moves on.
    pub fn create_on_free_prefix(name: &str) -> Result<NetnsPair, NetnsError> {
        check_name(name)?;
        // A stale pair of this name goes first (and with it the prefix it held), once.
        NetnsPair::layout(name, DEFAULT_PREFIX).remove();
        let [a, b, first] = DEFAULT_PREFIX;
        let mut last = None;
        for c in (first..=253).step_by(2) {
            match NetnsPair::create_fresh(name, [a, b, c]) {
                Err(e @ NetnsError::PrefixInUse { .. }) => last = Some(e),
                Err(NetnsError::Ip { args, stderr }) if stderr.contains("File exists") => {
                    last = Some(NetnsError::Ip { args, stderr })
                }
                other => return other,
            }
        }
        Err(NetnsError::NoFreePrefix(Box::new(
            last.expect("at least one prefix tried"),
        )))
    }

    /// Runs the wire's receive processing of what the device sends (the device-facing
    /// interface's receive queues) on `harts` with RPS (`rps_cpus`): the forwarding, the cable's
    /// queue and its timer then run there, as a network adapter's interrupt steered to the
    /// synthesizer's hart would, instead of on the hart that sent the packet (the emulator's,
    /// shared with interference), where they wait behind any higher-priority task. Returns the
    /// number of receive queues steered. The setting goes away with the interface.
    pub fn steer_receive(&self, harts: &tess_sched::HartSet) -> Result<usize, NetnsError> {
        // veth has one receive queue unless created with more.
        let file = format!(
            "/sys/class/net/{}/queues/rx-0/rps_cpus",
            self.wire_device_if
        );
        write_in(&self.wire, &file, &harts.to_hex_mask())?;
        Ok(1)
    }

    /// Makes the cable release what the device sends at `rate` bytes per second with a bucket
    /// of `burst` bytes: a token-bucket queue on the wire's host-facing interface (`tc qdisc
    /// replace dev NAME-d root tbf` in `NAME-w`), whose timer sends each packet from interrupt
    /// context on the hart that runs the wire (see [`steer_receive`](Self::steer_receive)),
    /// whatever the device's hart is running (`tess_music::emulator::Pace::Link`; the rate and
    /// burst come from `emulator::link_rate`). The queue holds up to 512 KiB. It goes away with
    /// the namespace.
    pub fn pace_device(&self, rate: u64, burst: u64) -> Result<(), NetnsError> {
        let (rate, burst) = (format!("{rate}bps"), burst.to_string());
        tc(&[
            "-n",
            &self.wire,
            "qdisc",
            "replace",
            "dev",
            &self.wire_host_if,
            "root",
            "tbf",
            "rate",
            &rate,
            "burst",
            &burst,
            "limit",
            "524288",
        ])
    }

    fn remove(&self) {
        // Deleting one end of a veth pair deletes both; deleting a namespace deletes the ends
        // inside it, and the root namespace's route goes with its interface. Errors mean "was
        // not there".
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.wire]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Refuses a name unusable for interface names (`NAME-h` must fit in 15 characters).
fn check_name(name: &str) -> Result<(), NetnsError> {
    let ok = !name.is_empty()
        && name.len() <= 13
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(NetnsError::Name(name.to_string()))
    }
}

/// The interface of the root namespace whose route covers any address of `net.0/24`, if one
/// does (read from `/proc/net/route`: destination and mask in hexadecimal, in network byte
/// order read as a native integer). Unreadable (no procfs): none, and `ip` reports any clash.
fn route_through(net: [u8; 3]) -> Option<String> {
    let table = std::fs::read_to_string("/proc/net/route").ok()?;
    routes_covering(&table, net)
}

/// [`route_through`] over the text of a `/proc/net/route`.
fn routes_covering(table: &str, net: [u8; 3]) -> Option<String> {
    let ours = u32::from_be_bytes([net[0], net[1], net[2], 0]);
    let ours_mask = 0xffff_ff00u32;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (iface, dest, mask) = (f.first()?, f.get(1)?, f.get(7)?);
        // The file prints the kernel's network-order words as host-order integers.
        let word = |hex: &str| {
            u32::from_str_radix(hex, 16)
                .ok()
                .map(|w| u32::from_be_bytes(w.to_ne_bytes()))
        };
        let (dest, mask) = (word(dest)?, word(mask)?);
        // Default routes (mask 0) cover everything and are not a collision.
        let overlap = mask != 0 && (dest & mask & ours_mask) == (ours & mask & ours_mask);
        overlap.then(|| iface.to_string())
    })
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
        match NetnsPair::create_on_free_prefix(name) {
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
                "{} ({}) <-> wire netns {} <-> {} ({}) in netns {}",
                p.host_if, p.host_addr, p.wire, p.device_if, p.device_addr, p.name
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
    fn a_route_covering_either_half_of_a_prefix_is_a_collision() {
        // x86's /proc/net/route: 10.213.77.0/30 on tess-netb-h, 10.213.78.0/30 via it, a
        // default route via 10.0.0.1 on eth0.
        let word = |b: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(b));
        let line = |iface: &str, dest: [u8; 4], mask: [u8; 4]| {
            format!(
                "{iface}\t{}\t00000000\t0001\t0\t0\t0\t{}\t0\t0\t0",
                word(dest),
                word(mask)
            )
        };
        let table = [
            "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT"
                .to_string(),
            line("eth0", [0, 0, 0, 0], [0, 0, 0, 0]),
            line("tess-netb-h", [10, 213, 77, 0], [255, 255, 255, 252]),
            line("tess-netb-h", [10, 213, 78, 0], [255, 255, 255, 252]),
        ]
        .join("\n");
        assert_eq!(
            routes_covering(&table, [10, 213, 77]).as_deref(),
            Some("tess-netb-h")
        );
        assert_eq!(
            routes_covering(&table, [10, 213, 78]).as_deref(),
            Some("tess-netb-h")
        );
        assert_eq!(routes_covering(&table, [10, 213, 79]), None);
        // A wider route (10.213.0.0/16) covers every /24 inside it.
        let wide = format!(
            "{table}\n{}",
            line("br0", [10, 213, 0, 0], [255, 255, 0, 0])
        );
        assert_eq!(
            routes_covering(&wide, [10, 213, 79]).as_deref(),
            Some("br0")
        );
    }

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
            // The wire's receive processing steered to hart 0: the mask is written, and packets
            // still flow through the wire.
            assert_eq!(p.steer_receive(&tess_sched::HartSet::single(0)).unwrap(), 1);
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
