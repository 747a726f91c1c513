//! `tess-pd`: run Pure Data patches with tess's parallel graph engine.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use tess_pd::engine::Config;
use tess_pd::sched::{Executor, Strategy};

/// Runs Pd 0.53 patches (vanilla objects; see `tess-pd objects`) block by block, on one or
/// more harts.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Render a patch offline: the dac~ channels as a 32-bit float WAV.
    ///
    /// Example: tess-pd render synth.pd --seconds 2 --rate 48000 --block 64 --out synth.wav
    Render {
        /// The patch (.pd); abstractions are looked up in its folder.
        patch: PathBuf,
        /// Seconds to render.
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Sample rate in Hz.
        #[arg(long, default_value_t = 44100)]
        rate: u32,
        /// Block size in samples (power of two, 16-1024).
        #[arg(long, default_value_t = 64)]
        block: usize,
        /// Output WAV file.
        #[arg(long)]
        out: PathBuf,
        /// Scheduling strategy.
        #[arg(long, value_enum, default_value = "serial")]
        strategy: Strategy,
        /// Harts (threads) for the parallel strategies.
        #[arg(long, default_value_t = 1)]
        harts: usize,
    },
    /// List the objects this engine implements.
    Objects,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Render {
            patch,
            seconds,
            rate,
            block,
            out,
            strategy,
            harts,
        } => {
            anyhow::ensure!(seconds > 0.0, "--seconds must be positive");
            let mut exec = Executor::new(strategy, harts);
            let cfg = Config {
                sample_rate: rate as f32,
                block,
            };
            let chans = tess_pd::render::render(&patch, cfg, seconds, &mut exec)
                .with_context(|| format!("rendering {}", patch.display()))?;
            tess_pd::render::write_wav(&out, &chans, rate)?;
            eprintln!(
                "wrote {} ({} channels, {} samples)",
                out.display(),
                chans.len(),
                chans.first().map(Vec::len).unwrap_or(0)
            );
        }
        Cmd::Objects => {
            for c in tess_pd::objects::CLASSES {
                println!("{c}");
            }
        }
    }
    Ok(())
}
