//! `tessd`: the tess daemon.

use anyhow::{Context, Result};
use clap::Parser;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tessd::config::{CgroupChoice, Config, DEFAULT_CONFIG};
use tessd::daemon::Daemon;
use tessd::engine::Engine;

/// The tess daemon: divides this machine into cells with guaranteed harts, CPU time, memory and
/// task limits, and serves the `tess` command over a Unix socket.
///
/// One instance runs per machine, as root. Cells persist in the state directory; restarting the
/// daemon (even after SIGKILL) restores every cell exactly as last committed.
#[derive(Parser, Debug)]
#[command(
    version,
    after_help = "Files:\n  /etc/tess/tessd.toml   configuration (see docs/tessd.md)\n  /run/tess/tessd.sock   API socket\n  /var/lib/tess/         state (state.db)"
)]
struct Args {
    /// Configuration file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// API socket path.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// State directory.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// cgroup hierarchy to drive.
    #[arg(long, value_enum)]
    cgroup: Option<CgroupChoice>,
    /// Name of tess's cgroup subtree.
    #[arg(long, value_name = "NAME")]
    group: Option<String>,
    /// Harts to manage, e.g. 0-3 (default: all online).
    #[arg(long, value_name = "LIST")]
    harts: Option<String>,
    /// Fraction of each hart left to the system (0.05 = 5%).
    #[arg(long, value_name = "FRACTION")]
    headroom: Option<f64>,
    /// Do not steer IRQs off dedicated harts.
    #[arg(long)]
    no_steer_irqs: bool,
    /// Do not raise sched_rt_runtime_us (SCHED_DEADLINE then gets what the kernel allows).
    #[arg(long)]
    no_raise_kernel_limit: bool,
    /// Remove every tess cgroup and restore saved kernel settings, keep the cells' definitions,
    /// and exit. Starting tessd again recreates them.
    #[arg(long)]
    teardown: bool,
    /// Like --teardown, and also forget every cell.
    #[arg(long)]
    reset: bool,
    /// Forget one cell's definition without touching the kernel, and exit (for a state that no
    /// longer fits the machine).
    #[arg(long, value_name = "CELL")]
    forget: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9464 (also
    /// `metrics-listen` in tessd.toml; see docs/observability.md).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Log filter (error, warn, info, debug, trace), also RUST_LOG.
    #[arg(long, default_value = "info")]
    log: String,
}

fn main() {
    let mut argv = std::env::args();
    if argv.nth(1).as_deref() == Some(tessd::idle::SPIN_ARG) {
        let hart = argv.next().and_then(|h| h.parse().ok()).unwrap_or(0);
        tessd::idle::spin(hart);
    }
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&args.log)),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(args) {
        eprintln!("tessd: {e:#}");
        std::process::exit(1);
    }
}

fn config_from(args: &Args) -> Result<Config> {
    let (path, explicit) = match &args.config {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(DEFAULT_CONFIG), false),
    };
    let mut c = Config::load(&path, explicit)?;
    if let Some(v) = &args.socket {
        c.socket = v.clone();
    }
    if let Some(v) = &args.state_dir {
        c.state_dir = v.clone();
    }
    if let Some(v) = args.cgroup {
        c.cgroup = v;
    }
    if let Some(v) = &args.group {
        tess_core::spec::validate_name(v)
            .map_err(|_| anyhow::anyhow!("--group {v:?} is not a valid cgroup name"))?;
        c.group = v.clone();
    }
    if let Some(v) = &args.harts {
        c.harts = Some(v.parse().map_err(|e| anyhow::anyhow!("--harts: {e}"))?);
    }
    if let Some(v) = args.headroom {
        anyhow::ensure!(
            (0.0..0.5).contains(&v),
            "--headroom {v} must be in [0, 0.5)"
        );
        c.headroom = v;
    }
    if args.no_steer_irqs {
        c.steer_irqs = false;
    }
    if args.no_raise_kernel_limit {
        c.raise_kernel_limit = false;
    }
    if let Some(a) = args.metrics_listen {
        c.metrics_listen = Some(a);
    }
    Ok(c)
}

/// Holds an exclusive lock on `state_dir/tessd.lock` for the life of the process.
fn lock_state(dir: &std::path::Path) -> Result<std::fs::File> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("tessd.lock");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        anyhow::bail!(
            "another tessd (pid {}) is using {}",
            holder.trim(),
            dir.display()
        );
    }
    use std::io::{Seek, Write};
    f.set_len(0)?;
    f.seek(std::io::SeekFrom::Start(0))?;
    write!(f, "{}", std::process::id())?;
    Ok(f)
}

/// The daemon's CFS nice value (see `run`).
const DAEMON_NICE: libc::c_int = -10;

fn run(args: Args) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!(
            "tessd must run as root: it manages cgroups, scheduling policies and IRQ affinity"
        );
    }
    let config = config_from(&args)?;
    let _lock = lock_state(&config.state_dir)?;
    if let Some(name) = &args.forget {
        if Engine::forget(&config, name)? {
            eprintln!("tessd: forgot cell {name}");
        } else {
            anyhow::bail!("no cell named {name} in {}", config.state_dir.display());
        }
        return Ok(());
    }
    if args.teardown || args.reset {
        Engine::teardown(&config, args.reset)?;
        eprintln!(
            "tessd: removed tess's cgroups and restored kernel settings{}",
            if args.reset {
                "; forgot every cell"
            } else {
                ""
            }
        );
        return Ok(());
    }
    // Spinner children are never waited for: let the kernel reap them.
    // SAFETY: installing SIG_IGN for SIGCHLD has no memory-safety implications.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_IGN);
    }
    // Signals are taken synchronously by one thread, so block them everywhere first.
    // SAFETY: sigset manipulation on a local set.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    // A change to a cell waits on the daemon, so the daemon must not wait behind the batch work
    // it shares the system harts with: its threads (which inherit this) run at nice -10. They
    // sleep almost always; the spinners it starts set their own policy.
    // SAFETY: setpriority on the calling thread (who = 0) has no memory-safety implications.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, DAEMON_NICE) } != 0 {
        tracing::warn!(
            "could not raise the daemon's priority: {}",
            std::io::Error::last_os_error()
        );
    }
    // The daemon's own threads must never sit on a dedicated hart: they start in the root and the
    // first sweep moves them to the system group.
    let interval = Duration::from_millis(config.sweep_interval_ms);
    let follow =
        (config.follow_interval_ms > 0).then(|| Duration::from_millis(config.follow_interval_ms));
    let socket = config.socket.clone();
    let metrics_listen = config.metrics_listen;
    let daemon = Arc::new(Daemon::new(Engine::start(config)?));
    // Runtimes publish their misses and response times here (crate tess-stats); observers
    // read them. Shared like /tmp, so that every user's runtimes can publish.
    let stats_dir = tess_stats::default_dir();
    if let Err(e) = tess_stats::ensure_dir(&stats_dir) {
        tracing::warn!("runtimes cannot publish their statistics: {e}");
    }
    let listener = tessd::server::bind(&socket)?;
    tracing::info!("listening on {}", socket.display());

    {
        let daemon = daemon.clone();
        std::thread::Builder::new()
            .name("tessd-housekeep".into())
            .spawn(move || {
                // Threads waiting to wake on their hart are retried every 5 ms; budgets follow
                // the working threads every `follow`; everything else runs every `interval`.
                let fast = Duration::from_millis(5);
                let mut last_full = std::time::Instant::now();
                let mut last_follow = std::time::Instant::now();
                loop {
                    std::thread::sleep(fast.min(interval));
                    if last_full.elapsed() >= interval {
                        daemon.background(|e| e.housekeep());
                        // Spinners may have been restarted: readers see their new pids.
                        daemon.refresh();
                        // Pages of runtimes killed before they could remove them.
                        tess_stats::sweep_stale(&stats_dir);
                        last_full = std::time::Instant::now();
                    } else {
                        daemon.background(|e| {
                            if e.has_pending() {
                                e.retry_pending();
                            }
                        });
                    }
                    if follow.is_some_and(|f| last_follow.elapsed() >= f) {
                        daemon.background(|e| e.follow_demand());
                        last_follow = std::time::Instant::now();
                    }
                }
            })?;
    }
    match tessd::procmon::ProcMonitor::open() {
        Ok(mon) => {
            let daemon = daemon.clone();
            std::thread::Builder::new().name("tessd-procmon".into()).spawn(move || loop {
                let forks = match mon.next_forks() {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::warn!("process events stopped: {e}; new threads are placed by the periodic sweep");
                        return;
                    }
                };
                for f in forks {
                    daemon.background(|e| {
                        if let Some(cell) = e.tracked_cell_of(f.creator()) {
                            tracing::debug!(creator = f.creator(), child = f.child_tid, cell, "new task in a reserved cell");
                            e.on_fork(&cell);
                        }
                    });
                }
            })?;
        }
        Err(e) => {
            tracing::warn!("no process events ({e}); new threads are placed by the periodic sweep")
        }
    }
    {
        let daemon = daemon.clone();
        std::thread::Builder::new()
            .name("tessd-api".into())
            .spawn(move || tessd::server::serve(listener, daemon))?;
    }
    if let Some(addr) = metrics_listen {
        tessd::metrics::serve(addr, socket.clone())?;
    }
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` holds the blocked signals; `sig` receives the one taken.
    unsafe { libc::sigwait(&set, &mut sig) };
    tracing::info!(signal = sig, "shutting down; cells stay in place");
    let _ = std::fs::remove_file(&socket);
    Ok(())
}
