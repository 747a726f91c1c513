//! Workloads the benchmarks run inside cells: `tess work spin | probe | load | sort | ...`.

use clap::{Args, Subcommand, ValueEnum};
use std::time::Duration;
use tess_bench::Summary;
use tess_sched::{attr, clock, Policy};

/// Internal workloads.
#[derive(Subcommand, Debug)]
pub enum WorkCmd {
    /// A CPU-bound kernel counting work units done in a measurement window.
    Spin(SpinArgs),
    /// A periodic task measuring how late it wakes.
    Probe(ProbeArgs),
    /// Many CPU-bound threads, until killed.
    Load(LoadArgs),
    /// The synthetic application of seed 001 section 5.3: independent instances of a sorting
    /// algorithm, one thread each, until killed.
    Sort(SortArgs),
    /// Sleep until killed (a process that holds a cell's threads).
    Idle,
    /// Register NAME with the nameserver and echo every client's messages upper-cased.
    Echo(EchoArgs),
    /// Connect to NAME, send messages, check the echoes, print round-trip times as JSON.
    Ping(PingArgs),
    /// Spin as SCHED_IDLE until killed: uses only time nothing else wants, so that a hart never
    /// idles (an idle vCPU is descheduled by the hypervisor and runs slower when it resumes).
    Filler,
    /// Busy and idle threads measuring the CPU share the whole process receives (`tess bench
    /// reserve`); prints JSON.
    Share(super::reserve::ShareArgs),
}

/// `spin`.
#[derive(Args, Debug)]
pub struct SpinArgs {
    /// CLOCK_MONOTONIC time (ns) at which measurement starts.
    #[arg(long)]
    pub start_ns: u64,
    /// Measurement window in milliseconds.
    #[arg(long)]
    pub window_ms: u64,
}

/// Probe policies.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum ProbePolicy {
    /// SCHED_OTHER.
    Other,
    /// SCHED_FIFO 99.
    Fifo99,
    /// Whatever policy the probe started with (the cell's, when run in one).
    Keep,
}

/// `probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Wake-up period in microseconds.
    #[arg(long, default_value_t = 1000)]
    pub period_us: u64,
    /// Wake-ups to measure.
    #[arg(long)]
    pub count: usize,
    /// Scheduling policy.
    #[arg(long, value_enum, default_value = "other")]
    pub policy: ProbePolicy,
    /// Pin the probe to this hart (as `taskset` would) before it starts.
    #[arg(long)]
    pub hart: Option<usize>,
    /// Lock all memory (`mlockall`) before measuring, as real-time programs do.
    #[arg(long)]
    pub mlock: bool,
    /// Wake-ups done and discarded before the measured ones (caches, page tables, the
    /// scheduler's view of the task settle).
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
}

/// `echo`.
#[derive(Args, Debug)]
pub struct EchoArgs {
    /// Service name.
    pub name: String,
    /// Admit this uid (repeatable).
    #[arg(long)]
    pub allow_uid: Vec<u32>,
    /// Admit processes in this cell (repeatable).
    #[arg(long)]
    pub allow_cell: Vec<String>,
    /// Admit anyone.
    #[arg(long)]
    pub anyone: bool,
    /// Serve this many clients, then exit (default: forever).
    #[arg(long)]
    pub clients: Option<usize>,
}

/// `ping`.
#[derive(Args, Debug)]
pub struct PingArgs {
    /// Service name.
    pub name: String,
    /// Messages to send.
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
}

/// `load`.
#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Number of CPU-bound threads.
    #[arg(long, default_value_t = 128)]
    pub threads: usize,
}

/// `sort`.
#[derive(Args, Debug)]
pub struct SortArgs {
    /// Number of sorting threads (one per hart of the cell, as in the paper).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Keys per sort (u32): the default, 1 Mi keys (4 MiB), is larger than a core's private
    /// caches, so the sorts also take memory bandwidth and shared cache.
    #[arg(long, default_value_t = 1 << 20)]
    pub keys: usize,
}

/// One unit of CPU-bound work (an xorshift chain the optimizer cannot remove).
#[inline(never)]
pub(crate) fn unit(mut x: u64) -> u64 {
    for _ in 0..256 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

/// Runs a workload.
pub fn run(cmd: WorkCmd) -> anyhow::Result<i32> {
    match cmd {
        WorkCmd::Spin(a) => {
            let end = a.start_ns + a.window_ms * 1_000_000;
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            while clock::now_ns() < a.start_ns {
                x = unit(x);
            }
            let mut units = 0u64;
            let me = std::process::id() as i32;
            let cpu0 = tess_sched::proc::thread_cpu_ns(me, me).unwrap_or(0);
            let t0 = clock::now_ns();
            let mut now = t0;
            while now < end {
                x = unit(x);
                units += 1;
                now = clock::now_ns();
            }
            let secs = (now - t0) as f64 / 1e9;
            let cpu_ns = tess_sched::proc::thread_cpu_ns(me, me)
                .unwrap_or(0)
                .saturating_sub(cpu0);
            println!(
                "{}",
                serde_json::json!({"units": units, "seconds": secs, "rate": units as f64 / secs, "cpu_ns": cpu_ns, "sink": x & 1})
            );
            Ok(0)
        }
        WorkCmd::Probe(a) => {
            let policy = match a.policy {
                ProbePolicy::Other => Some(Policy::OTHER),
                ProbePolicy::Fifo99 => Some(Policy::Fifo { priority: 99 }),
                ProbePolicy::Keep => None,
            };
            if let Some(h) = a.hart {
                tess_sched::affinity::set_affinity(0, &tess_sched::HartSet::single(h))?;
            }
            if let Some(policy) = policy {
                attr::set_policy(0, policy, 0)?;
            }
            if a.mlock {
                // SAFETY: mlockall only changes how this process's pages are kept resident.
                let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
                anyhow::ensure!(rc == 0, "mlockall: {}", std::io::Error::last_os_error());
            }
            let period = clock::ns(Duration::from_micros(a.period_us));
            let mut samples = Vec::with_capacity(a.count);
            let mut next = clock::now_ns() + period;
            for i in 0..a.warmup + a.count {
                clock::sleep_until_ns(next);
                let late = clock::now_ns().saturating_sub(next);
                if i >= a.warmup {
                    samples.push(late);
                }
                next += period;
                let now = clock::now_ns();
                if next < now {
                    next = now + period;
                }
            }
            let s = Summary::of_ns_as_us(&samples);
            println!("{}", serde_json::to_string(&s)?);
            Ok(0)
        }
        WorkCmd::Load(a) => {
            for i in 0..a.threads {
                std::thread::spawn(move || {
                    let mut x = i as u64 + 1;
                    loop {
                        x = unit(x);
                        std::hint::black_box(x);
                    }
                });
            }
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        WorkCmd::Sort(a) => {
            anyhow::ensure!(
                a.threads > 0 && a.keys > 0,
                "--threads and --keys must be positive"
            );
            for i in 0..a.threads {
                let keys = a.keys;
                std::thread::spawn(move || {
                    let mut v = vec![0u32; keys];
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
                    loop {
                        for k in v.iter_mut() {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            *k = x as u32;
                        }
                        v.sort_unstable();
                        std::hint::black_box(&v);
                    }
                });
            }
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        WorkCmd::Echo(a) => {
            let access = tess_proto::ns::Access {
                cells: a.allow_cell,
                uids: a.allow_uid,
                anyone: a.anyone,
            };
            let mut svc = tess_proto::ns::Service::register(
                &a.name,
                access,
                &tess_channel::ChannelOptions::default(),
            )?;
            println!("ready");
            use std::io::Write;
            std::io::stdout().flush()?;
            let mut handles = Vec::new();
            let mut served = 0;
            while a.clients.is_none_or(|n| served < n) {
                let inc = svc.accept()?;
                served += 1;
                eprintln!(
                    "echo: client pid {} uid {} cell {:?}",
                    inc.client.pid, inc.client.uid, inc.client.cell
                );
                handles.push(std::thread::spawn(move || {
                    let mut ep = inc.endpoint;
                    let mut buf = vec![0u8; ep.max_message_size()];
                    while let Ok(n) = ep.recv(&mut buf) {
                        buf[..n].make_ascii_uppercase();
                        if ep.send(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }));
            }
            for h in handles {
                let _ = h.join();
            }
            Ok(0)
        }
        WorkCmd::Ping(a) => {
            let (mut ep, service) = tess_proto::ns::connect(&a.name)?;
            let mut buf = vec![0u8; ep.max_message_size()];
            let mut rtt = Vec::with_capacity(a.count);
            for i in 0..a.count {
                let msg = format!("ping {i}");
                let t0 = clock::now_ns();
                ep.send(msg.as_bytes())?;
                let n = ep.recv(&mut buf)?;
                rtt.push(clock::now_ns() - t0);
                anyhow::ensure!(
                    buf[..n] == *msg.to_uppercase().as_bytes(),
                    "bad echo {:?}",
                    String::from_utf8_lossy(&buf[..n])
                );
            }
            let s = Summary::of_ns_as_us(&rtt);
            println!(
                "{}",
                serde_json::json!({"count": a.count, "service_pid": service.service.pid, "rtt_us": s})
            );
            Ok(0)
        }
        WorkCmd::Filler => {
            attr::set_policy(0, Policy::Idle, 0)?;
            let mut x = 1u64;
            loop {
                x = unit(x);
                std::hint::black_box(x);
            }
        }
        WorkCmd::Share(a) => super::reserve::work(a),
        WorkCmd::Idle => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
    }
}
