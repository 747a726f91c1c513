//! Audio in and out through JACK (Debian's `jackd2`, or PipeWire's JACK API): the patch runs
//! inside JACK's real-time process callback, as Pd's JACK backend does, with one input port per
//! `adc~` channel and one output port per `dac~` channel.
//!
//! JACK calls the process callback once per period of `nframes` samples (its buffer size, a
//! power of two); the engine runs `nframes / block` blocks in it, so the engine's block must
//! divide JACK's buffer size (the default block is 64 samples, or the buffer size when that is
//! smaller). There is no extra buffering, so the engine adds no latency of its own: a block's
//! output is JACK's output of the same period. `libjack` is loaded when the client starts (the
//! `jack` crate's `dynamic_loading`), so `tess-pd` runs its other commands on machines without
//! a JACK server or library, and PipeWire's `pw-jack` can stand in for JACK.
//!
//! MIDI comes in on a JACK MIDI port, `midi_in` (from a controller through `a2jmidid` or
//! PipeWire, or any JACK MIDI client), to `notein`, `ctlin` and the other MIDI objects. Each
//! event goes to the engine just before the block that holds its frame, so a note lands within
//! a block of when it was played, not at the next period.
//!
//! Every period is timed (callback start to end) and JACK's xrun notifications are counted;
//! the report says how close the engine came to JACK's deadline, one period.

use crate::engine::{Config, Engine, EngineError};
use crate::sched::Executor;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why JACK play could not run.
#[derive(Debug, thiserror::Error)]
pub enum JackError {
    /// The JACK client could not open (no server, no libjack, ...).
    #[error("cannot open a JACK client (is a JACK server running? `jackd -d dummy` needs no sound card): {0}")]
    Client(jack::Error),
    /// A JACK call failed.
    #[error("JACK: {what}: {source}")]
    Jack {
        /// What was being done.
        what: String,
        /// Cause.
        #[source]
        source: jack::Error,
    },
    /// JACK's buffer size does not fit the engine's block.
    #[error("JACK's buffer size {buffer} is not a multiple of the engine's {block}-sample block (pick --block {buffer} or smaller, a power of two)")]
    Block {
        /// JACK's period.
        buffer: usize,
        /// The engine's block.
        block: usize,
    },
    /// The patch did not load.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What to do.
#[derive(Debug, Default)]
pub struct JackOptions {
    /// The client's name (JACK may add a suffix when it is taken).
    pub client_name: String,
    /// Samples per engine block (`None`: 64, or JACK's buffer size when smaller).
    pub block: Option<usize>,
    /// Connect the output ports to these ports in order (e.g. `system:playback_1`).
    pub connect_outputs: Vec<String>,
    /// Connect these ports to the input ports in order (e.g. `system:capture_1`).
    pub connect_inputs: Vec<String>,
    /// Connect these JACK MIDI ports to the `midi_in` port (e.g. `a2j:nanoPAD2 [20] (capture):
    /// nanoPAD2 MIDI 1`).
    pub connect_midi: Vec<String>,
    /// MIDI and OSC control input, polled at the start of every period (two non-blocking
    /// `recv` calls, a few microseconds, when on).
    pub control: crate::play::ControlIn,
    /// Where `tess~conv` runs its long levels. JACK's process thread runs only blocks, so in
    /// the background they run on the executor's other harts alone, which start a piece only
    /// if it is expected to end before the next callback (seven eighths of a period after
    /// this one was woken).
    pub long_levels: crate::shared::LongLevels,
}

/// What a JACK run measured.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct JackReport {
    /// The client's name as JACK registered it.
    pub client_name: String,
    /// JACK's sample rate, Hz.
    pub sample_rate: usize,
    /// JACK's period, samples.
    pub buffer_size: usize,
    /// The engine's block, samples.
    pub block: usize,
    /// Process callbacks run.
    pub periods: u64,
    /// xruns JACK reported while the client was active.
    pub xruns: u64,
    /// Callback time (start to end), us: median.
    pub callback_p50_us: f64,
    /// 99th percentile.
    pub callback_p99_us: f64,
    /// Largest.
    pub callback_max_us: f64,
    /// One period, us: the callback's deadline.
    pub period_us: f64,
    /// MIDI events that came in on `midi_in`.
    pub midi_events: u64,
    /// What the OSC input delivered and dropped (with `--osc-udp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub osc: Option<crate::osc::OscStats>,
    /// The harts the graph was split for, in order ([`Executor::splits`]; none for the
    /// serial strategy).
    pub splits: Vec<usize>,
    /// `tess~conv` long steps that missed their deadline.
    pub conv_late: u64,
}

/// The real-time side: the engine, its executor and the ports, owned by JACK's process thread.
struct Process {
    engine: Engine,
    exec: Executor,
    ins: Vec<jack::Port<jack::AudioIn>>,
    outs: Vec<jack::Port<jack::AudioOut>>,
    midi: jack::Port<jack::MidiIn>,
    midi_events: u64,
    block: usize,
    control: crate::play::ControlIn,
    /// Callback times in ns, preallocated (no allocation in the callback); full: not recorded.
    times: Vec<u64>,
    periods: u64,
}

impl jack::ProcessHandler for Process {
    fn process(&mut self, _: &jack::Client, ps: &jack::ProcessScope) -> jack::Control {
        let t0 = Instant::now();
        // The next callback comes about a period after this one was woken; this one may have
        // been woken late, so the workers' background pieces stop an eighth of a period
        // earlier. Said now, so that they do not sit on the last due time (past) meanwhile.
        let n = ps.n_frames() as usize;
        let period_ns = n as f64 / f64::from(self.engine.config().sample_rate) * 1e9;
        self.exec
            .expect_next_block(tess_sched::clock::now_ns() + (period_ns * 7.0 / 8.0) as u64);
        if !n.is_multiple_of(self.block) {
            // JACK changed its buffer size to one the block does not divide: silence, not noise
            for o in &mut self.outs {
                o.as_mut_slice(ps).fill(0.0);
            }
            return jack::Control::Continue;
        }
        self.control.poll(&mut self.engine);
        let mut events = self.midi.iter(ps).peekable();
        for off in (0..n).step_by(self.block) {
            // the events up to the end of this block, in JACK's order (by frame)
            while let Some(ev) = events.next_if(|ev| (ev.time as usize) < off + self.block) {
                self.engine.midi_in(ev.bytes);
                self.midi_events += 1;
            }
            for (ch, p) in self.ins.iter().enumerate() {
                self.engine
                    .write_input(ch, &p.as_slice(ps)[off..off + self.block]);
            }
            self.engine.tick(&mut self.exec);
            for (ch, p) in self.outs.iter_mut().enumerate() {
                self.engine
                    .read_output(ch, &mut p.as_mut_slice(ps)[off..off + self.block]);
            }
        }
        self.periods += 1;
        if self.times.len() < self.times.capacity() {
            self.times.push(t0.elapsed().as_nanos() as u64);
        }
        jack::Control::Continue
    }
}

/// Counts JACK's xruns.
struct Notifications {
    xruns: Arc<AtomicU64>,
}

impl jack::NotificationHandler for Notifications {
    fn xrun(&mut self, _: &jack::Client) -> jack::Control {
        self.xruns.fetch_add(1, Ordering::Relaxed);
        jack::Control::Continue
    }
}

/// Plays `patch` through JACK until `stop` is set or `seconds` pass.
///
/// With an executor on a tess runtime's harts ([`crate::cell::run_on_harts`]) JACK's process
/// thread is the executor's hart 0 and the runtime's other harts its workers; the calling
/// thread (the runtime's vhart 0) waits here and reads tessd's messages, and the process
/// thread splits the graph again at its next block after a resize (that block does the
/// splitting's work too, so it may be late once). The play ends when the runtime stops.
pub fn play(
    patch: &Path,
    mut exec: Executor,
    opts: JackOptions,
    seconds: Option<f64>,
    stop: &AtomicBool,
) -> Result<JackReport, JackError> {
    let (client, _status) =
        jack::Client::new(&opts.client_name, jack::ClientOptions::NO_START_SERVER)
            .map_err(JackError::Client)?;
    let rate = client.sample_rate();
    let buffer = client.buffer_size() as usize;
    let block = opts.block.unwrap_or(64.min(buffer));
    if block == 0 || !buffer.is_multiple_of(block) {
        return Err(JackError::Block { buffer, block });
    }
    let mut engine = Engine::open_with(
        patch,
        Config {
            sample_rate: rate as f32,
            block,
        },
        &crate::engine::EngineOptions {
            long_levels: opts.long_levels.clone(),
        },
    )?;
    let jerr = |what: String| move |source| JackError::Jack { what, source };
    // an input port per channel some adc~ reads: none for a patch without adc~
    let ins = (0..engine.input_channels_read())
        .map(|c| {
            client
                .register_port(&format!("in_{}", c + 1), jack::AudioIn::default())
                .map_err(jerr(format!("registering input port in_{}", c + 1)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let outs = (0..engine.channels())
        .map(|c| {
            client
                .register_port(&format!("out_{}", c + 1), jack::AudioOut::default())
                .map_err(jerr(format!("registering output port out_{}", c + 1)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let midi = client
        .register_port("midi_in", jack::MidiIn::default())
        .map_err(jerr("registering MIDI input port midi_in".into()))?;
    let midi_name = midi.name().unwrap_or_default();
    let names_in: Vec<String> = ins.iter().filter_map(|p| p.name().ok()).collect();
    let names_out: Vec<String> = outs.iter().filter_map(|p| p.name().ok()).collect();
    // The first block splits the graph into tasks and starts the executor's threads: do it
    // here, not in JACK's real-time callback.
    engine.tick(&mut exec);
    let runtime = exec.runtime();
    let xruns = Arc::new(AtomicU64::new(0));
    let process = Process {
        engine,
        exec,
        ins,
        outs,
        midi,
        midi_events: 0,
        block,
        control: opts.control,
        times: Vec::with_capacity(1 << 20),
        periods: 0,
    };
    let client_name = client.name().to_string();
    let active = client
        .activate_async(
            Notifications {
                xruns: xruns.clone(),
            },
            process,
        )
        .map_err(jerr("activating the client".into()))?;
    for (from, to) in names_out.iter().zip(&opts.connect_outputs) {
        active
            .as_client()
            .connect_ports_by_name(from, to)
            .map_err(jerr(format!("connecting {from} to {to}")))?;
    }
    for (from, to) in opts.connect_inputs.iter().zip(&names_in) {
        active
            .as_client()
            .connect_ports_by_name(from, to)
            .map_err(jerr(format!("connecting {from} to {to}")))?;
    }
    for from in &opts.connect_midi {
        active
            .as_client()
            .connect_ports_by_name(from, &midi_name)
            .map_err(jerr(format!("connecting {from} to {midi_name}")))?;
    }
    let until = seconds.map(|s| Instant::now() + Duration::from_secs_f64(s));
    while !stop.load(Ordering::Relaxed) && until.is_none_or(|u| Instant::now() < u) {
        if let Some(rt) = &runtime {
            // This thread is the runtime's vhart 0: the only one that can complete a shrink
            // to one hart (JACK's thread is not a runtime hart).
            rt.checkpoint();
            if rt.is_stopping() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, _, process) = active
        .deactivate()
        .map_err(jerr("deactivating the client".into()))?;
    let mut times = process.times;
    times.sort_unstable();
    Ok(JackReport {
        client_name,
        sample_rate: rate as usize,
        buffer_size: buffer,
        block,
        periods: process.periods,
        xruns: xruns.load(Ordering::Relaxed),
        callback_p50_us: crate::play::percentile(&times, 0.5),
        callback_p99_us: crate::play::percentile(&times, 0.99),
        callback_max_us: crate::play::percentile(&times, 1.0),
        period_us: buffer as f64 * 1e6 / rate as f64,
        midi_events: process.midi_events,
        osc: process.control.osc_report(),
        splits: process.exec.splits().to_vec(),
        conv_late: process.engine.conv_late(),
    })
}
