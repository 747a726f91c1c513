//! The bench's cells and processes: a tessd session that deletes what it made, and a launcher
//! that starts each role inside its cell with `tess run --cell`.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tess_core::spec::{CellSpec, HartRequest, IdleMode, Policy};
use tess_music::scenario::launch::CommandSpec;
use tess_music::scenario::{Launcher, Role};
use tess_sched::HartSet;

/// Cell of the network service.
pub const SERVICE: &str = "net-svc";
/// Cell of the synthesizer.
pub const SYNTH: &str = "net-synth";
/// Cell of the abusive client.
pub const ABUSE: &str = "net-abuse";

/// One package of the SLABS protocol (32 frames at 44.1 kHz).
pub const PACKAGE: Duration = Duration::from_nanos(725_624);

/// A connection to tessd that deletes the cells it created when dropped.
pub use tess_proto::CellSession as Session;

fn cell(name: &str, policy: Policy, harts: HartSet) -> CellSpec {
    CellSpec {
        name: name.into(),
        policy,
        harts: HartRequest::Ids(harts),
        memory_max: None,
        pids_max: None,
        pinned: false,
        idle: None,
        broker: Default::default(),
    }
}

/// The synthesizer's reservation: 250 us every package (compute, about 15 us for 24 voices,
/// and a wake-up per packet; split between its two threads).
pub const SYNTH_RES: (Duration, Duration) = (Duration::from_micros(250), PACKAGE);

/// The three cells: the service owns `service_harts` (dedicated, busy-polling, like
/// Tessellation's non-multiplexed service cell); the synthesizer (event-triggered) and the
/// abusive client (best effort: whatever the others leave) share `shared` with the emulator
/// (test equipment outside the cells).
pub fn cells(service_harts: &HartSet, shared: &HartSet) -> Vec<CellSpec> {
    let mut svc = cell(SERVICE, Policy::Dedicated, service_harts.clone());
    svc.pinned = true;
    // The service busy-polls: it keeps its hart busy by itself.
    svc.idle = Some(IdleMode::Halt);
    let one = HartSet::single(shared.first().expect("a shared hart"));
    let et = |(budget, period): (Duration, Duration)| Policy::EventTriggered { period, budget };
    // The synthesizer sleeps between packets: its shared hart must not halt, or each packet
    // waits for the hypervisor to wake the vCPU (without the abuser's load the music pair
    // alone missed more deadlines than with it).
    let mut synth = cell(SYNTH, et(SYNTH_RES), one.clone());
    synth.idle = Some(IdleMode::Spin);
    vec![
        svc,
        synth,
        cell(ABUSE, Policy::BestEffort { weight: 100 }, one),
    ]
}

/// Starts `program args` inside `cell` through `tess run`, which becomes the program (signals
/// reach it directly).
pub fn spawn_in_cell(
    tess: &Path,
    cell: &str,
    program: &Path,
    args: &[String],
    stdout: Stdio,
    stderr: Stdio,
) -> io::Result<Child> {
    Command::new(tess)
        .args(["run", "--cell", cell, "--"])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
}

/// Starts the synthesizer and the emulator in their cells; the synthesizer through the
/// network service when `net_service` is set.
#[derive(Debug)]
pub struct CellLauncher {
    /// The `tess` executable.
    pub tess: PathBuf,
    /// Network service for the synthesizer, if any.
    pub net_service: Option<String>,
}

impl Launcher for CellLauncher {
    fn spawn(&self, role: &Role, cmd: &CommandSpec) -> io::Result<Child> {
        let cell = match role {
            Role::Synth => SYNTH,
            // Test equipment: started as is (its arguments pin it).
            Role::Emulator => return tess_music::scenario::PlainLauncher.spawn(role, cmd),
            _ => ABUSE,
        };
        let mut args: Vec<String> = cmd
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if let (Role::Synth, Some(n)) = (role, &self.net_service) {
            args.extend(["--net-service".to_string(), n.clone()]);
        }
        let out = |p: &Option<PathBuf>| -> io::Result<Stdio> {
            Ok(match p {
                Some(p) => Stdio::from(std::fs::File::create(p)?),
                None => Stdio::null(),
            })
        };
        spawn_in_cell(
            &self.tess,
            cell,
            &cmd.program,
            &args,
            out(&cmd.stdout)?,
            out(&cmd.stderr)?,
        )
    }
}

/// A child killed (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct Guard(pub Option<Child>);

impl Guard {
    /// SIGTERM, wait up to `grace`, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.0.take()?;
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        unsafe {
            libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
        }
        let end = Instant::now() + grace;
        while Instant::now() < end {
            if let Ok(Some(s)) = c.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        c.wait().ok()
    }

    /// Whether the child has exited.
    pub fn exited(&mut self) -> bool {
        self.0
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// Waits until `path` exists or the child exits or `limit` passes.
pub fn wait_ready(path: &Path, child: &mut Guard, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if path.exists() {
            return true;
        }
        if child.exited() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}
