//! `tess-rogue`: the rogue neighbour of scenario E (issue 11 part 3): software that, buggy or
//! hostile, raises itself to `SCHED_FIFO` 99 and spins, in a swarm of processes.
//!
//! Each member asks for `SCHED_FIFO` 99 (allowed on plain Linux for root; refused inside a tess
//! cell, whose cpu group has no real-time runtime) and then spins whatever it got, until its
//! time is up or it is told to stop. The leader starts the other members as child processes
//! (re-running this program with `--member`), stops them by pid on SIGTERM/SIGINT, and prints
//! one line per member saying what the kernel granted. Children die with the leader
//! (`PR_SET_PDEATHSIG`), and every member stops by itself after `--seconds` even if no signal
//! can reach it, so a forgotten swarm cannot hold a machine.

use anyhow::{Context, Result};
use clap::Parser;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tess_music::rt;
use tess_sched::{attr, Policy};

/// A swarm of processes that raise themselves to SCHED_FIFO 99 and spin (scenario E's rogue
/// neighbour). Run it as root on plain Linux and it takes every hart it lands on; run it in a
/// tess cell and it is confined to the cell's harts and share.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// Processes in the swarm, the leader included.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    swarm: u32,
    /// Real-time priority each member asks for.
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u32).range(1..=99))]
    priority: u32,
    /// Every member stops by itself after this many seconds.
    #[arg(long, default_value_t = 120.0)]
    seconds: f64,
    /// Internal: run as a member started by the leader.
    #[arg(long, hide = true)]
    member: bool,
}

/// Asks for `SCHED_FIFO` at `priority` and says what the kernel answered.
fn escalate(priority: u32) -> String {
    match attr::set_policy(0, Policy::Fifo { priority }, 0) {
        Ok(()) => format!("SCHED_FIFO {priority} granted"),
        Err(e) => format!("SCHED_FIFO {priority} refused ({e}); spinning under its cell's policy"),
    }
}

/// Spins until stopped or out of time.
fn spin(until: Instant) {
    let mut x = 0u64;
    while !rt::STOP.load(Ordering::Relaxed) && Instant::now() < until {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    rt::install_signal_handlers().context("installing signal handlers")?;
    let until = Instant::now() + Duration::from_secs_f64(cli.seconds);
    if cli.member {
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory of ours.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        eprintln!(
            "tess-rogue[{}]: {}",
            std::process::id(),
            escalate(cli.priority)
        );
        spin(until);
        return Ok(());
    }
    let exe = std::env::current_exe().context("finding my own executable")?;
    let mut members: Vec<Child> = Vec::new();
    for _ in 1..cli.swarm {
        let child = Command::new(&exe)
            .args(["--member", "--priority", &cli.priority.to_string()])
            .args(["--seconds", &cli.seconds.to_string()])
            .stdin(Stdio::null())
            .spawn();
        match child {
            Ok(c) => members.push(c),
            // A pids limit (a tess cell's `pids`) stops the swarm from growing: say so, go on.
            Err(e) => {
                eprintln!(
                    "tess-rogue: could not start member {}: {e}",
                    members.len() + 2
                );
                break;
            }
        }
    }
    eprintln!(
        "tess-rogue[{}] (leader of {}): {}",
        std::process::id(),
        members.len() + 1,
        escalate(cli.priority)
    );
    spin(until);
    for m in &members {
        // SAFETY: kill has no memory preconditions; each pid is our own unreaped child.
        unsafe { libc::kill(m.id() as libc::pid_t, libc::SIGTERM) };
    }
    for mut m in members {
        let _ = m.wait();
    }
    Ok(())
}
