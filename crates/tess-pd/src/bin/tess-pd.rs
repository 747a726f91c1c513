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
        #[command(flatten)]
        exec: ExecArgs,
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
        #[command(flatten)]
        exec: ExecArgs,
        #[command(flatten)]
        rt: RtArgs,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        control: ControlArgs,
    },
    /// Serve the Ethernet audio device of seed 001: 10 in / 10 out channels at 44.1 kHz, a
    /// 1296-byte UDP packet of 32 frames every 725.6 us, each answered with the patch's output
    /// before the next is due. The packet's channels feed `adc~ 1`..`adc~ 10`; `dac~ 1`..`dac~ 10`
    /// go back (wire format: crates/tess-pd/README.md, "The Ethernet audio device"). Runs until
    /// --seconds pass from the first packet, or SIGINT/SIGTERM; then prints what it served.
    ///
    /// Example: tess run --cell pd -- tess-pd device effects.pd --listen 127.0.0.1:9700
    Device {
        /// The patch (.pd).
        patch: PathBuf,
        /// Address to receive the device's packets on.
        #[arg(long, value_name = "ADDR:PORT")]
        listen: std::net::SocketAddr,
        /// Bind the socket in the tess network service of this name (e.g. `net`) instead of
        /// in the kernel directly: the service gives the flow its reservation (tess-netd).
        #[arg(long, value_name = "NAME")]
        net_service: Option<String>,
        /// Stop this many seconds after the first packet (default: at SIGINT/SIGTERM).
        #[arg(long)]
        seconds: Option<f64>,
        #[command(flatten)]
        exec: ExecArgs,
        #[command(flatten)]
        rt: RtArgs,
        #[command(flatten)]
        control: ControlArgs,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Play a patch through JACK (jackd2, or PipeWire's JACK): one input port per channel the
    /// patch's adc~ objects read (in_N), one output port per dac~ channel (out_N), a JACK MIDI
    /// input port (midi_in) for notein, ctlin and the other MIDI objects, the patch run in
    /// JACK's process callback at JACK's sample rate, several engine blocks per JACK period
    /// when the period is longer (a MIDI event reaches the block that holds its frame).
    /// Runs until --seconds pass or SIGINT/SIGTERM, then prints the periods, xruns and the
    /// callback's time against the period.
    ///
    /// Example: tess run --cell audio -- tess-pd jack synth.pd --connect-out system:playback_1 --connect-out system:playback_2
    Jack {
        /// The patch (.pd).
        patch: PathBuf,
        /// Seconds to play (default: until SIGINT/SIGTERM).
        #[arg(long)]
        seconds: Option<f64>,
        /// The JACK client's name.
        #[arg(long, default_value = "tess-pd")]
        client_name: String,
        /// Engine block in samples (default 64, or JACK's period when smaller); must divide
        /// JACK's period.
        #[arg(long)]
        block: Option<usize>,
        /// Connect output port N (out_N) to this port; give it once per output, in order.
        #[arg(long = "connect-out", value_name = "PORT")]
        connect_out: Vec<String>,
        /// Connect this port to input port N (in_N); give it once per input, in order.
        #[arg(long = "connect-in", value_name = "PORT")]
        connect_in: Vec<String>,
        /// Connect this JACK MIDI port to midi_in (e.g. a controller's port from a2jmidid);
        /// may be given more than once.
        #[arg(long = "connect-midi", value_name = "PORT")]
        connect_midi: Vec<String>,
        /// Where tess~conv runs its long levels: `sync`, `time-distributed` (sub-tasks of the
        /// engine's scheduler spread over each level's period) or `background` (due a period
        /// later, run in pieces by the executor's other harts between blocks: needs --harts 2
        /// or more, or a cell; JACK's process thread runs only blocks). `preemptive` is refused:
        /// JACK sets the process thread's priority, and the workers need theirs below it.
        #[arg(long, value_enum, default_value = "sync")]
        conv: ConvMode,
        #[command(flatten)]
        control: ControlArgs,
        #[command(flatten)]
        exec: ExecArgs,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// List the objects this engine implements.
    Objects,
}

/// How the patch is scheduled (every command that runs one).
#[derive(clap::Args, Debug)]
struct ExecArgs {
    /// Scheduling strategy.
    #[arg(long, value_enum, default_value = "serial")]
    strategy: Strategy,
    /// Harts for the parallel strategies: a number (threads of the engine's own, pinned one
    /// per CPU), or `cell`: the harts of the tess cell the process runs in, through the tess
    /// runtime: placed by tessd, and followed when `tess cell resize` changes them (the graph
    /// is split again between two blocks). Run it as `tess run --cell NAME -- tess-pd play
    /// --strategy work-stealing --harts cell ...`. With `jack`, JACK's process thread is the
    /// engine's first hart and the cell's harts run the others.
    #[arg(long, default_value = "1", value_parser = parse_harts)]
    harts: Harts,
}

/// See [`ExecArgs::harts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Harts {
    Threads(usize),
    Cell,
}

fn parse_harts(s: &str) -> Result<Harts, String> {
    match s {
        "cell" => Ok(Harts::Cell),
        n => match n.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(Harts::Threads(n)),
            _ => Err(format!(
                "expected a number of harts (1 or more) or `cell`, not {n:?}"
            )),
        },
    }
}

impl ExecArgs {
    /// Runs `program` with this executor: on the engine's own threads, or as vhart 0 of the
    /// tess runtime of the cell the process runs in (`--harts cell`, `tess_pd::cell`).
    fn run<R: Send + 'static>(
        &self,
        program: impl FnOnce(&mut Executor) -> anyhow::Result<R> + Send + 'static,
    ) -> anyhow::Result<R> {
        if self.harts == Harts::Cell && self.strategy == Strategy::Serial {
            anyhow::bail!(
                "--harts cell runs the graph on the cell's harts: give a parallel --strategy \
                 (work-stealing or global-queue); serial runs on one thread"
            );
        }
        match self.harts {
            Harts::Threads(n) => program(&mut Executor::new(self.strategy, n)),
            Harts::Cell => tess_pd::cell::run_on_harts(
                tess_runtime::Runtime::builder(),
                self.strategy,
                program,
            )
            .context(
                "--harts cell: running on the cell's harts (run tess-pd with tess run --cell NAME)",
            )?,
        }
    }
}

/// Real-time priority and where `tess~conv`'s long levels run (play, device).
#[derive(clap::Args, Debug)]
struct RtArgs {
    /// Run the engine's harts at SCHED_FIFO this priority (1-99; needs root or CAP_SYS_NICE).
    /// In a tess dedicated cell the harts are the engine's alone, so a real-time priority only
    /// keeps the kernel's own best-effort threads from delaying a block.
    #[arg(long, value_name = "PRIO", value_parser = clap::value_parser!(i32).range(1..=99))]
    rt_priority: Option<i32>,
    /// Where tess~conv runs its long levels: `sync` in the block that completes their input
    /// (exact; a long response makes that block late), `time-distributed` cut into sub-tasks
    /// spread over the blocks of each level's period (no extra threads; partitions chosen for
    /// the heaviest block), `preemptive` on workers below the engine's priority that every
    /// block preempts, each step due one period of its level later (seed 001 section 3.3;
    /// needs --rt-priority 13 or more), `background` the same timing on the engine's own harts:
    /// each step run in pieces in the time they have between blocks, set aside at the next
    /// piece boundary when a block arrives (no threads or priorities of its own, so it runs
    /// in a cell). All four render the same samples when on time.
    #[arg(long, value_enum, default_value = "sync")]
    conv: ConvMode,
}

/// See [`RtArgs::conv`].
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ConvMode {
    Sync,
    TimeDistributed,
    Preemptive,
    Background,
}

impl RtArgs {
    /// On a cell's harts (`--harts cell`) tessd sets the harts' scheduling: a priority, and
    /// the preemptive workers that need one, are refused there (before the runtime starts).
    fn check_for(&self, exec: &ExecArgs) -> anyhow::Result<()> {
        if exec.harts == Harts::Cell
            && (self.rt_priority.is_some() || self.conv == ConvMode::Preemptive)
        {
            anyhow::bail!(
                "--harts cell: the cell's policy sets its harts' scheduling (tess cell create \
                 --policy ...); --rt-priority and --conv preemptive are for the engine's own \
                 threads (--conv time-distributed and background run on the engine's harts)"
            );
        }
        Ok(())
    }

    /// Starts the convolution workers if asked, then makes the calling thread and `exec`'s
    /// harts real time; returns the engine options.
    fn apply(&self, exec: &mut Executor) -> anyhow::Result<tess_pd::engine::EngineOptions> {
        use tess_pd::shared::LongLevels;
        let long_levels = match (self.conv, self.rt_priority) {
            (ConvMode::Sync, _) => LongLevels::Synchronous,
            (ConvMode::TimeDistributed, _) => LongLevels::TimeDistributed,
            (ConvMode::Background, _) => LongLevels::Background,
            (ConvMode::Preemptive, None) => anyhow::bail!(
                "--conv preemptive needs --rt-priority: the workers run below the engine's \
                 SCHED_FIFO priority, so that every block preempts them"
            ),
            (ConvMode::Preemptive, Some(p)) => {
                LongLevels::Preemptive(tess_pd::engine::conv_workers(p)?)
            }
        };
        if let Some(p) = self.rt_priority {
            *exec = std::mem::replace(exec, Executor::serial()).realtime(p);
            tess_pd::sched::set_fifo(p).with_context(|| {
                format!("--rt-priority {p}: cannot run at SCHED_FIFO (needs root or CAP_SYS_NICE)")
            })?;
        }
        Ok(tess_pd::engine::EngineOptions { long_levels })
    }
}

/// Control input (play, device, jack).
#[derive(clap::Args, Debug)]
struct ControlArgs {
    /// Take MIDI from UDP datagrams on this address (e.g. 127.0.0.1:9000): each datagram is
    /// raw MIDI bytes (running status allowed), given to `notein`/`ctlin` before the next
    /// block.
    #[arg(long, value_name = "ADDR:PORT")]
    midi_udp: Option<std::net::SocketAddr>,
    /// Take OSC from UDP datagrams on this address: `/NAME args` goes to receiver NAME (as
    /// `; NAME args` would), `/midi` with MIDI or blob arguments to notein/ctlin; bundles are
    /// delivered at once (crates/tess-pd/README.md, "Control input").
    #[arg(long, value_name = "ADDR:PORT")]
    osc_udp: Option<std::net::SocketAddr>,
}

impl ControlArgs {
    /// Binds the sockets asked for, with an error naming the option.
    fn bind(&self) -> anyhow::Result<tess_pd::play::ControlIn> {
        let open = |a: Option<std::net::SocketAddr>, option: &str| {
            a.map(|a| {
                tess_pd::play::control_socket(a)
                    .with_context(|| format!("{option}: cannot listen on {a}"))
            })
            .transpose()
        };
        Ok(tess_pd::play::ControlIn {
            midi: open(self.midi_udp, "--midi-udp")?,
            osc: open(self.osc_udp, "--osc-udp")?,
            osc_stats: Default::default(),
        })
    }
}

/// A `--seconds` value: positive and finite.
fn check_seconds(s: f64) -> anyhow::Result<()> {
    anyhow::ensure!(s > 0.0 && s.is_finite(), "--seconds must be positive");
    Ok(())
}

/// Reports late convolution steps, if there were any.
fn print_conv_late(late: u64) {
    if late > 0 {
        println!("tess~conv: {late} long steps missed their deadline (each silenced its level for a period or two)");
    }
}

/// Reports background pieces that delayed a block, if there were any.
fn print_piece_overruns(overruns: u64) {
    if overruns > 0 {
        println!(
            "background: {overruns} pieces ended after the block they were started before was due"
        );
    }
}

/// Prints what the OSC input did, if it was on.
fn print_osc(osc: &Option<tess_pd::osc::OscStats>) {
    if let Some(o) = osc {
        println!(
            "OSC: {} messages delivered, {} malformed datagrams, {} unsupported messages{}",
            o.delivered,
            o.malformed,
            o.unsupported,
            o.first_error
                .as_deref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        );
    }
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Render {
            patch,
            seconds,
            rate,
            block,
            out,
            exec,
        } => {
            check_seconds(seconds)?;
            let cfg = Config {
                sample_rate: rate as f32,
                block,
            };
            let p = patch.clone();
            let chans = exec.run(move |exec| {
                tess_pd::render::render(&p, cfg, seconds, exec)
                    .with_context(|| format!("rendering {}", p.display()))
            })?;
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
            exec,
            rt,
            json,
            control,
        } => {
            check_seconds(seconds)?;
            let cfg = Config {
                sample_rate: rate as f32,
                block,
            };
            let mut control = control.bind()?;
            rt.check_for(&exec)?;
            let r = exec.run(move |exec| {
                let stop = std::sync::atomic::AtomicBool::new(false);
                let options = rt.apply(exec)?;
                tess_pd::play::play(&patch, cfg, &options, seconds, exec, &stop, &mut control)
                    .with_context(|| format!("playing {}", patch.display()))
            })?;
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
                print_conv_late(r.conv_late);
                print_piece_overruns(r.piece_overruns);
                print_osc(&r.osc);
                if r.splits.len() > 1 {
                    let s: Vec<String> = r.splits.iter().map(usize::to_string).collect();
                    println!(
                        "the cell was resized: graph split for {} harts",
                        s.join(", then ")
                    );
                }
            }
        }
        Cmd::Device {
            patch,
            listen,
            net_service,
            seconds,
            exec,
            rt,
            control,
            json,
        } => {
            use tess_pd::device;
            let mut control = control.bind()?;
            seconds.map(check_seconds).transpose()?;
            tess_sched::rt::install_signal_handlers()?;
            rt.check_for(&exec)?;
            let r = exec.run(move |exec| {
                let options = rt.apply(exec)?;
                let mut engine =
                    tess_pd::engine::Engine::open_with(&patch, device::config(), &options)
                        .with_context(|| format!("loading {}", patch.display()))?;
                let mut link =
                    device::Link::bind(listen, net_service.as_deref()).with_context(|| {
                        match &net_service {
                            Some(n) => format!("binding {listen} in network service {n}"),
                            None => format!("binding {listen}"),
                        }
                    })?;
                eprintln!(
                    "tess-pd: serving the audio device on {} ({} in / {} out channels of the patch)",
                    link.local_addr()?,
                    engine.input_channels().min(device::CHANNELS),
                    engine.channels().min(device::CHANNELS)
                );
                Ok(device::serve(
                    &mut engine,
                    exec,
                    &mut link,
                    &tess_sched::rt::STOP,
                    seconds.map(std::time::Duration::from_secs_f64),
                    &mut control,
                )?)
            })?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{} packets answered, {} sequence gaps, {} malformed datagrams dropped{}",
                    r.answered,
                    r.gaps,
                    r.malformed,
                    r.first_malformed
                        .as_deref()
                        .map(|e| format!(" (first: {e})"))
                        .unwrap_or_default()
                );
                println!(
                    "arrival to answer sent, us: p50 {:.1}  p99 {:.1}  max {:.1}",
                    r.turnaround_p50_us, r.turnaround_p99_us, r.turnaround_max_us
                );
                print_conv_late(r.conv_late);
                print_piece_overruns(r.piece_overruns);
                print_osc(&r.osc);
            }
        }
        Cmd::Jack {
            patch,
            seconds,
            client_name,
            block,
            connect_out,
            connect_in,
            connect_midi,
            conv,
            control,
            exec,
            json,
        } => {
            seconds.map(check_seconds).transpose()?;
            let long_levels = match conv {
                ConvMode::Sync => tess_pd::shared::LongLevels::Synchronous,
                ConvMode::TimeDistributed => tess_pd::shared::LongLevels::TimeDistributed,
                ConvMode::Background if exec.harts == Harts::Threads(1) => anyhow::bail!(
                    "jack --conv background: JACK's process thread runs only blocks, so the long \
                     levels need other harts to run on (--harts 2 or more, or --harts cell)"
                ),
                ConvMode::Background => tess_pd::shared::LongLevels::Background,
                ConvMode::Preemptive => anyhow::bail!(
                    "jack --conv preemptive: JACK sets its process thread's priority, and the \
                     workers need theirs below it; use --conv time-distributed or background"
                ),
            };
            tess_sched::rt::install_signal_handlers()?;
            let opts = tess_pd::jack_io::JackOptions {
                client_name,
                block,
                connect_outputs: connect_out,
                connect_inputs: connect_in,
                connect_midi,
                control: control.bind()?,
                long_levels,
            };
            let r = exec.run(move |exec| {
                // JACK's process callback takes the executor over.
                let exec = std::mem::replace(exec, Executor::serial());
                tess_pd::jack_io::play(&patch, exec, opts, seconds, &tess_sched::rt::STOP)
                    .with_context(|| format!("playing {} through JACK", patch.display()))
            })?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{}: {} periods of {} samples at {} Hz ({:.0} us), engine block {}; {} xruns; {} MIDI events",
                    r.client_name,
                    r.periods,
                    r.buffer_size,
                    r.sample_rate,
                    r.period_us,
                    r.block,
                    r.xruns,
                    r.midi_events
                );
                println!(
                    "process callback, us: p50 {:.1}  p99 {:.1}  max {:.1} (deadline {:.0})",
                    r.callback_p50_us, r.callback_p99_us, r.callback_max_us, r.period_us
                );
                print_conv_late(r.conv_late);
                print_osc(&r.osc);
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
