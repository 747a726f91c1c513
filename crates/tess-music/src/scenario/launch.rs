//! How the scenario runner starts its processes: a [`CommandSpec`] per process and a
//! [`Launcher`] that turns it into a running child, plainly or "inside cell X".

use std::ffi::OsString;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// What a process is for; a launcher maps roles to cells (Table 1 of seed 000).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    /// The Migrator Synthesizer (cell A of the paper).
    Synth,
    /// The SLABS emulator (the device; not in the paper's machine).
    Emulator,
    /// Video player `index`: 0 is the paper's time-triggered cell D, 1 the event-triggered cell E.
    Video {
        /// 0-based.
        index: usize,
    },
    /// Best-effort EP process `index` (cells G, H, I).
    BestEffort {
        /// 0-based.
        index: usize,
    },
    /// The rogue neighbour of scenario E: a swarm that raises itself to SCHED_FIFO 99 and spins.
    Rogue,
    /// A SCHED_IDLE spinner that keeps the synthesizer's hart from idling in the plain-Linux
    /// baselines (the preparation a dedicated cell's hart gets).
    Spinner,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Synth => write!(f, "synth"),
            Role::Emulator => write!(f, "emulator"),
            Role::Video { index } => write!(f, "video{index}"),
            Role::BestEffort { index } => write!(f, "ep{index}"),
            Role::Rogue => write!(f, "rogue"),
            Role::Spinner => write!(f, "idle-spinner"),
        }
    }
}

/// A command to start: program, arguments, and files for its standard output and error.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// Executable.
    pub program: PathBuf,
    /// Arguments.
    pub args: Vec<OsString>,
    /// Standard output goes here (the runner reads JSON reports from it); `None`: discarded.
    pub stdout: Option<PathBuf>,
    /// Standard error goes here; `None`: discarded.
    pub stderr: Option<PathBuf>,
}

impl CommandSpec {
    /// The command line as one string, for logs.
    pub fn display(&self) -> String {
        std::iter::once(self.program.as_os_str())
            .chain(self.args.iter().map(OsString::as_os_str))
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A `std::process::Command` for it, with standard input closed and outputs redirected.
    pub fn to_command(&self) -> std::io::Result<Command> {
        let mut c = Command::new(&self.program);
        c.args(&self.args).stdin(Stdio::null());
        c.stdout(match &self.stdout {
            Some(p) => Stdio::from(File::create(p)?),
            None => Stdio::null(),
        });
        c.stderr(match &self.stderr {
            Some(p) => Stdio::from(File::create(p)?),
            None => Stdio::null(),
        });
        Ok(c)
    }
}

/// Starts the processes of a scenario.
///
/// The runner stops processes with SIGINT (synthesizer) and SIGTERM (interference) sent to the
/// child's pid, so a launcher that wraps the command (`tess run --cell A -- ...`) must forward
/// those signals, or better exec the command in place after placing itself in the cell.
pub trait Launcher {
    /// Starts `cmd` for `role`.
    fn spawn(&self, role: &Role, cmd: &CommandSpec) -> std::io::Result<Child>;
}

/// Plain Linux: every process is started as is (its own arguments set pinning and policy).
#[derive(Debug, Default, Clone, Copy)]
pub struct PlainLauncher;

impl Launcher for PlainLauncher {
    fn spawn(&self, _role: &Role, cmd: &CommandSpec) -> std::io::Result<Child> {
        cmd.to_command()?.spawn()
    }
}

impl<F> Launcher for F
where
    F: Fn(&Role, &CommandSpec) -> std::io::Result<Child>,
{
    fn spawn(&self, role: &Role, cmd: &CommandSpec) -> std::io::Result<Child> {
        self(role, cmd)
    }
}

/// A child that is stopped (SIGTERM, then SIGKILL after `grace`) when dropped.
#[derive(Debug)]
pub struct Guard {
    /// Role, for messages.
    pub role: Role,
    child: Option<Child>,
}

impl Guard {
    /// Guards `child`.
    pub fn new(role: Role, child: Child) -> Guard {
        Guard {
            role,
            child: Some(child),
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` to the child.
    pub fn signal(&self, signal: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill has no memory-safety preconditions; the pid is our own child, not
            // yet reaped, so it cannot have been reused.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
    }

    /// Whether the child has exited (reaping it if so).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits up to `timeout` for the child to exit; kills it after that.
    pub fn wait_timeout(
        &mut self,
        timeout: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let end = std::time::Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                self.child = None;
                return Some(s);
            }
            if std::time::Instant::now() >= end {
                self.stop(std::time::Duration::ZERO);
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; reaps the child.
    pub fn stop(&mut self, grace: std::time::Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        // SAFETY: as in `signal`: our own, unreaped child.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let end = std::time::Instant::now() + grace;
        while std::time::Instant::now() < end {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop(std::time::Duration::from_secs(1));
    }
}
