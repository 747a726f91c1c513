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
    /// Play a patch in real time: each block is released on the clock and must be done before
    /// the next one is due (block / rate, 1.33 ms at 64 samples and 48 kHz). Prints the misses
    /// and the response-time tail; publishes both to `tess top` and Prometheus while it plays
    /// (the `pd` runtime of the cell it runs in). No audio device is used.
    ///
    /// Example: tess run --cell pd -- tess-pd play synth.pd --seconds 30 --harts 2 --strategy dynamic
    Play {
        /// The patch (.pd).
        patch: PathBuf,
        /// Seconds to play.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Sample rate in Hz.
        #[arg(long, default_value_t = 48000)]
        rate: u32,
        /// Block size in samples (power of two, 16-1024).
        #[arg(long, default_value_t = 64)]
        block: usize,
        /// Scheduling strategy.
        #[arg(long, value_enum, default_value = "serial")]
        strategy: Strategy,
        /// Harts (threads) for the parallel strategies.
        #[arg(long, default_value_t = 1)]
        harts: usize,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Take MIDI from UDP datagrams on this address (e.g. 127.0.0.1:9000): each datagram
        /// is raw MIDI bytes (running status allowed), given to `notein`/`ctlin` before the
        /// next block.
        #[arg(long, value_name = "ADDR:PORT")]
        midi_udp: Option<std::net::SocketAddr>,
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
        Cmd::Play {
            patch,
            seconds,
            rate,
            block,
            strategy,
            harts,
            json,
            midi_udp,
        } => {
            anyhow::ensure!(
                seconds > 0.0 && seconds.is_finite(),
                "--seconds must be positive"
            );
            let mut exec = Executor::new(strategy, harts);
            let cfg = Config {
                sample_rate: rate as f32,
                block,
            };
            let stop = std::sync::atomic::AtomicBool::new(false);
            let midi = match midi_udp {
                Some(addr) => {
                    let sock = std::net::UdpSocket::bind(addr)
                        .with_context(|| format!("--midi-udp: cannot listen on {addr}"))?;
                    sock.set_nonblocking(true)?;
                    Some(sock)
                }
                None => None,
            };
            let r = tess_pd::play::play(&patch, cfg, seconds, &mut exec, &stop, midi.as_ref())
                .with_context(|| format!("playing {}", patch.display()))?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{} blocks of {:.0} us: {} misses ({} late, {} skipped)",
                    r.blocks, r.period_us, r.misses, r.late, r.skipped
                );
                println!(
                    "response (release to done), us: p50 {:.0}  p99 {:.0}  p99.9 {:.0}  max {:.0}; compute p50 {:.0}",
                    r.p50_us, r.p99_us, r.p999_us, r.max_us, r.compute_p50_us
                );
            }
        }
        Cmd::Objects => {
            for c in tess_pd::objects::CLASSES {
                println!("{c}");
            }
        }
    }
    Ok(())
}
