//! The hostile-peer fuzzer (see `tess_channel::fuzzing`): the real endpoint against a forked
//! peer that scribbles on the shared segment at random.
//!
//! `cargo run --release -p tess-channel --example hostile -- [--secs N] [--seed S] [--harts P,C]`
//! (the 10-minute run: `--secs 600`). Exits 0 after N seconds without a crash, a hang (the
//! watchdog aborts after 30 s without progress) or an unpromised error.

use std::time::Duration;
use tess_channel::fuzzing::{hostile, HostileOptions};

fn main() -> anyhow::Result<()> {
    let mut opts = HostileOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))
        };
        match a.as_str() {
            "--secs" => opts.duration = Duration::from_secs(value()?.parse()?),
            "--seed" => opts.seed = value()?.parse()?,
            "--harts" => {
                let v = value()?;
                let (p, c) = v
                    .split_once(',')
                    .ok_or_else(|| anyhow::anyhow!("--harts wants P,C, got {v:?}"))?;
                opts.hart = p.trim().parse()?;
                opts.child_hart = c.trim().parse()?;
            }
            "--help" | "-h" => {
                println!(
                    "hostile [--secs N (20)] [--seed S] [--harts P,C (0,1)]: the real channel \
                     endpoint against a peer that scribbles on the shared segment at random"
                );
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other:?} (use --secs, --seed, --harts)"),
        }
    }
    let report = hostile(&opts)?;
    println!("{report}");
    Ok(())
}
