//! `tess bench graph`: the parallel graph engine against itself on one hart and against Pd 0.53
//! (seed 001 section 2.2; issue 15).
//!
//! Figures (baselines in the same run):
//! - `speedup_2_harts`: per-block time of a wide patch (64 independent `osc~ -> vcf~ -> env~`
//!   voices mixed into `dac~`) on 1 hart (Pd's serial order) over 2 harts with work stealing;
//!   `speedup_2_harts_global` the same with the global queue. Goal >= 1.8.
//! - `speedup_ceiling_2_harts`: what the 2 harts give this work with no scheduling: the
//!   patch's voices as two independent halves, each a serial engine on its own hart, started
//!   together each block, a block lasting until both are done; serial median over that median.
//!   `parallel_efficiency` = `speedup_2_harts` / the ceiling: how much of what the machine
//!   gives at the time of the run the scheduler delivers.
//! - `deep_chain_ratio`: a 256-object chain with no parallelism, 2 harts over 1 hart (must not
//!   be slower: <= 1 within noise).
//! - `global_vs_stealing.global_us` / `.stealing_us`: per-block scheduling overhead on 2 harts,
//!   measured on 64 trivial voices (`sig~ -> *~`): parallel block time minus half the serial
//!   block time (a perfect split over the 2 harts).
//! - `pd_realtime_ratio`: voices one hart sustains in real time at 64-sample blocks, ours over
//!   Pd 0.53's: in five rounds, the wall time our engine takes to compute 20 s of the wide
//!   patch against Pd's (`pd -batch`: a 21 s run minus a 1 s run, so Pd's start-up does not
//!   count against it), back to back; the median of the rounds' ratios, with
//!   `pd_realtime_ratio_min` and `_max`. `voices_1_hart`, `voices_2_harts` (work stealing) and
//!   `pd_voices_1_hart` from the rounds' median times.
//! - `conv_speedup_2_harts`: parallel plug-ins in the same scheduler: four `tess~conv`
//!   reverbs (a 3 s response) with time-distributed long levels, each level's sub-tasks a task
//!   of the graph of its own; per-block median on 1 hart over 2 harts with work stealing.
//!   `conv_max_us_1_hart` and `conv_max_us_2_harts` alongside (the heaviest block).

use crate::engine::{Config, Engine, EngineOptions};
use crate::sched::{Executor, Strategy};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tess_bench::{Report, Summary, Table};

/// Options.
#[derive(Debug, Clone)]
pub struct GraphBenchOptions {
    /// Fewer blocks: a smoke run.
    pub quick: bool,
    /// First CPU to pin hart 0 to (hart 1 on the next).
    pub first_cpu: usize,
    /// Voices in the wide patch.
    pub voices: usize,
    /// Run the harts (and Pd) `SCHED_FIFO` at this priority, as an audio cell would; None:
    /// ordinary threads (then other load on the machine shows in every figure).
    pub rt_priority: Option<i32>,
}

impl Default for GraphBenchOptions {
    fn default() -> Self {
        GraphBenchOptions {
            quick: false,
            first_cpu: 0,
            voices: 64,
            rt_priority: Some(50),
        }
    }
}

const SR: f32 = 44100.0;
const BLOCK: usize = 64;

/// The wide patch: `voices` voices of `osc~ -> vcf~ -> env~`, mixed into `dac~`.
pub fn voices_patch(voices: usize) -> String {
    voices_slice_patch(0..voices)
}

/// Voices `range` of the wide patch (each voice's pitch is set by its number), mixed into a
/// `dac~` of their own.
fn voices_slice_patch(range: std::ops::Range<usize>) -> String {
    let mut s = String::from("#N canvas 0 0 800 600 12;\n#X obj 10 500 dac~ 1 2;\n");
    let mut c = String::new();
    for (k, v) in range.enumerate() {
        let b = 1 + k * 7;
        let f = 100.0 + 7.0 * v as f64;
        let _ = write!(
            s,
            "#X obj 10 10 osc~ {f};\n#X obj 100 10 phasor~ 0.3;\n#X obj 100 30 *~ 2000;\n#X obj 100 50 +~ 300;\n#X obj 10 70 vcf~ 5;\n#X obj 10 90 *~ 0.01;\n#X obj 100 90 env~ 1024;\n"
        );
        let _ = write!(
            c,
            "#X connect {b} 0 {} 0;\n#X connect {} 0 {} 0;\n#X connect {} 0 {} 0;\n#X connect {} 0 {} 1;\n#X connect {} 0 {} 0;\n#X connect {} 0 0 0;\n#X connect {} 0 0 1;\n#X connect {} 0 {} 0;\n",
            b + 4,
            b + 1,
            b + 2,
            b + 2,
            b + 3,
            b + 3,
            b + 4,
            b + 4,
            b + 5,
            b + 5,
            b + 5,
            b + 4,
            b + 6
        );
    }
    s + &c
}

/// The patch of seed 001's isolation experiment (section 5.3, Table 2): "eight building blocks
/// regularly found in computer music: a sine-wave generator, a step sequencer, and six classic
/// audio effects", parallel to one another, each applied to the input (`adc~ 1`) and sent to
/// its own output (`dac~` channels 1-8):
/// 1. sine generator (`osc~ 440`);
/// 2. step sequencer: a `metro` counter steps the input's gain through eight levels (`line~`
///    ramps of 5 ms);
/// 3. echo with feedback (`delwrite~`/`delread~`, 250 ms, gain 0.5);
/// 4. low-pass filter (`lop~ 800`);
/// 5. sweeping resonant filter, a wah (`vcf~` whose centre a `phasor~` moves);
/// 6. tremolo (`osc~ 5` on the gain);
/// 7. distortion (`*~ 8` into `clip~ -0.5 0.5`);
/// 8. ring modulator (`osc~ 300` times the input).
pub fn effects_patch() -> String {
    let objects = [
        "adc~ 1",                       // 0
        "osc~ 440",                     // 1
        "*~ 0.2",                       // 2
        "dac~ 1 2 3 4 5 6 7 8",         // 3
        "loadbang",                     // 4
        "metro 125",                    // 5
        "f",                            // 6
        "+ 1",                          // 7
        "expr (\\$f1 % 8) * 0.1 + 0.2", // 8
        "pack f 5",                     // 9
        "line~",                        // 10
        "*~",                           // 11
        "+~",                           // 12
        "delwrite~ echo 1000",          // 13
        "delread~ echo 250",            // 14
        "*~ 0.5",                       // 15
        "lop~ 800",                     // 16
        "phasor~ 0.5",                  // 17
        "*~ 1500",                      // 18
        "+~ 300",                       // 19
        "vcf~ 4",                       // 20
        "osc~ 5",                       // 21
        "*~ 0.5",                       // 22
        "+~ 0.5",                       // 23
        "*~",                           // 24
        "*~ 8",                         // 25
        "clip~ -0.5 0.5",               // 26
        "osc~ 300",                     // 27
        "*~",                           // 28
    ];
    let connections: [(usize, usize, usize, usize); 35] = [
        (1, 0, 2, 0),
        (2, 0, 3, 0),
        (4, 0, 5, 0),
        (5, 0, 6, 0),
        (6, 0, 7, 0),
        (7, 0, 6, 1),
        (6, 0, 8, 0),
        (8, 0, 9, 0),
        (9, 0, 10, 0),
        (10, 0, 11, 1),
        (0, 0, 11, 0),
        (11, 0, 3, 1),
        (0, 0, 12, 0),
        (15, 0, 12, 1),
        (12, 0, 13, 0),
        (14, 0, 15, 0),
        (12, 0, 3, 2),
        (0, 0, 16, 0),
        (16, 0, 3, 3),
        (17, 0, 18, 0),
        (18, 0, 19, 0),
        (19, 0, 20, 1),
        (0, 0, 20, 0),
        (20, 0, 3, 4),
        (21, 0, 22, 0),
        (22, 0, 23, 0),
        (23, 0, 24, 1),
        (0, 0, 24, 0),
        (24, 0, 3, 5),
        (0, 0, 25, 0),
        (25, 0, 26, 0),
        (26, 0, 3, 6),
        (0, 0, 28, 0),
        (27, 0, 28, 1),
        (28, 0, 3, 7),
    ];
    let mut s = String::from("#N canvas 0 0 900 600 12;\n");
    for (i, o) in objects.iter().enumerate() {
        let _ = writeln!(
            s,
            "#X obj {} {} {o};",
            10 + 100 * (i % 8),
            10 + 40 * (i / 8)
        );
    }
    for (a, o, b, i) in connections {
        let _ = writeln!(s, "#X connect {a} {o} {b} {i};");
    }
    s
}

/// A chain of `n` filters with no parallelism.
pub fn chain_patch(n: usize) -> String {
    let mut s = String::from("#N canvas 0 0 800 600 12;\n#X obj 10 10 osc~ 220;\n");
    let mut c = String::new();
    for k in 1..=n {
        let o = if k % 2 == 0 { "lop~ 5000" } else { "hip~ 20" };
        let _ = writeln!(s, "#X obj 10 10 {o};");
        let _ = writeln!(c, "#X connect {} 0 {k} 0;", k - 1);
    }
    let _ = writeln!(s, "#X obj 10 10 dac~ 1;");
    let _ = writeln!(c, "#X connect {n} 0 {} 0;", n + 1);
    s + &c
}

/// 64 trivial voices (`sig~ -> *~`), for scheduling overhead.
pub fn trivial_patch(voices: usize) -> String {
    let mut s = String::from("#N canvas 0 0 800 600 12;\n#X obj 10 500 dac~ 1;\n");
    let mut c = String::new();
    for v in 0..voices {
        let b = 1 + 2 * v;
        let _ = writeln!(s, "#X obj 10 10 sig~ {v};\n#X obj 10 30 *~ 0.5;");
        let _ = writeln!(
            c,
            "#X connect {b} 0 {} 0;\n#X connect {} 0 0 0;",
            b + 1,
            b + 1
        );
    }
    s + &c
}

/// `count` reverbs: one `noise~` into `count` `tess~conv ir` (the response read from `ir.wav`
/// beside the patch by `soundfiler`), mixed into `dac~`. Time-distributed, each reverb's long
/// levels are parts of the graph of their own (a parallel plug-in).
pub fn reverbs_patch(count: usize) -> String {
    let mut s = String::from(
        "#N canvas 0 0 450 300 12;\n#X obj 10 10 loadbang;\n#X msg 10 30 read -resize ir.wav ir;\n\
         #X obj 10 50 soundfiler;\n#X obj 200 10 array define ir 1;\n#X obj 10 100 noise~;\n\
         #X obj 10 200 dac~ 1;\n#X connect 0 0 1 0;\n#X connect 1 0 2 0;\n",
    );
    for k in 0..count {
        let id = 6 + k;
        let _ = writeln!(s, "#X obj {} 150 tess~conv ir;", 10 + 90 * k);
        let _ = writeln!(s, "#X connect 4 0 {id} 0;\n#X connect {id} 0 5 0;");
    }
    s
}

/// The response the reverbs convolve with: decaying noise, the same every run.
fn reverb_response(len: usize) -> Vec<f32> {
    let mut seed = 0x2545_f491u32;
    (0..len)
        .map(|i| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * (-6.9 * i as f32 / len as f32).exp()
        })
        .collect()
}

/// The reverbs of the parallel plug-in measurement: instances and response length (3 s at
/// 44.1 kHz). One reverb alone is too little work to split at 64-sample blocks here (about
/// 11 us a block for the paper's 11.9 s response; measured on 2 harts 0.91x of 1 hart: the
/// hand-over between harts costs more than the level's share).
const REVERBS: usize = 4;
const REVERB_IR: usize = 131_072;

/// `patch` opened at the bench's rate and block size.
fn open_engine(patch: &Path, options: &EngineOptions) -> anyhow::Result<Engine> {
    let config = Config {
        sample_rate: SR,
        block: BLOCK,
    };
    Ok(Engine::open_with(patch, config, options)?)
}

/// Per-block times (ns) of `blocks` blocks after `warm` warm-up blocks.
fn time_blocks(
    patch: &Path,
    options: &EngineOptions,
    exec: &mut Executor,
    warm: usize,
    blocks: usize,
) -> anyhow::Result<Vec<u64>> {
    let mut e = open_engine(patch, options)?;
    for _ in 0..warm {
        e.tick(exec);
    }
    let mut t = Vec::with_capacity(blocks);
    for _ in 0..blocks {
        let s = Instant::now();
        e.tick(exec);
        t.push(s.elapsed().as_nanos() as u64);
    }
    Ok(t)
}

/// How a configuration of the per-block measurement runs its patch.
#[derive(Clone, Copy)]
enum Run {
    /// One hart, Pd's order.
    Serial,
    /// The graph engine on 2 harts.
    Parallel(Strategy),
    /// The wide patch as two independent halves, one per hart ([`time_split_pair`]).
    SplitPair,
}

/// Per-block times (ns) of two independent engines run side by side, `halves[0]` on this
/// thread and `halves[1]` on a thread of its own on CPU `cpu + 1` (at `rt`, as the executor's
/// workers), `blocks` blocks after `warm`. A block's time runs from this thread telling the
/// other to start to this thread seeing that both are done: the work of the wide patch split
/// evenly over 2 harts with nothing passing between them but the start and the end of each
/// block, which any 2-hart schedule needs too. (Each half pays an engine's fixed cost per
/// block, and nothing mixes the halves: a schedule can come close to this, or pass it.)
fn time_split_pair(
    halves: [&Path; 2],
    cpu: usize,
    rt: Option<i32>,
    warm: usize,
    blocks: usize,
) -> anyhow::Result<Vec<u64>> {
    use crossbeam_utils::CachePadded;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    /// The block the other hart is to run (`STOP`: none, leave) and the last it finished,
    /// each on its own line.
    struct Pair {
        go: CachePadded<AtomicU64>,
        done: CachePadded<AtomicU64>,
    }
    const STOP: u64 = u64::MAX;
    use crate::sched::wait_a_little;
    /// Sends the other hart away however this thread leaves (an error, a panic).
    struct StopOnDrop(Arc<Pair>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.go.store(STOP, Ordering::Release);
        }
    }
    let mut mine = open_engine(halves[0], &EngineOptions::default())?;
    let mut theirs = open_engine(halves[1], &EngineOptions::default())?;
    let pair = Arc::new(Pair {
        go: CachePadded::new(AtomicU64::new(0)),
        done: CachePadded::new(AtomicU64::new(0)),
    });
    let other = pair.clone();
    let run_theirs = move || {
        let mut exec = Executor::serial();
        let mut seen = 0;
        let mut spins = 0;
        loop {
            let go = other.go.load(Ordering::Acquire);
            if go == seen {
                spins += 1;
                wait_a_little(spins);
                continue;
            }
            if go == STOP {
                return;
            }
            seen = go;
            spins = 0;
            theirs.tick(&mut exec);
            other.done.store(go, Ordering::Release);
        }
    };
    let worker =
        crate::sched::spawn_hart_thread("tess-pd-half".into(), Some(cpu + 1), rt, run_theirs);
    let stop = StopOnDrop(pair.clone());
    let mut exec = Executor::serial();
    let mut t = Vec::with_capacity(blocks);
    for block in 1..=(warm + blocks) as u64 {
        let s = Instant::now();
        pair.go.store(block, Ordering::Release);
        mine.tick(&mut exec);
        let mut spins = 0;
        while pair.done.load(Ordering::Acquire) != block {
            if worker.is_finished() {
                anyhow::bail!("the split pair's second hart stopped");
            }
            spins += 1;
            wait_a_little(spins);
        }
        if block > warm as u64 {
            t.push(s.elapsed().as_nanos() as u64);
        }
    }
    drop(stop);
    worker
        .join()
        .map_err(|_| anyhow::anyhow!("the split pair's second hart panicked"))?;
    Ok(t)
}

fn median_us(v: &[u64]) -> f64 {
    Summary::of_ns_as_us(v).median
}

fn mean_us(v: &[u64]) -> f64 {
    v.iter().sum::<u64>() as f64 / v.len().max(1) as f64 / 1000.0
}

/// Wall time of `pd -batch` computing `seconds` of `patch`.
fn pd_batch_seconds(patch: &Path, seconds: f64, rt: Option<i32>) -> anyhow::Result<f64> {
    let dir = patch.parent().unwrap_or(Path::new("."));
    let wrapper = dir.join("pd-timing.pd");
    let name = patch
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("patch");
    std::fs::write(
        &wrapper,
        format!(
            "#N canvas 0 0 400 300 12;\n#X obj 10 10 {name};\n#X obj 10 40 loadbang;\n#X obj 10 60 delay {};\n#X msg 10 80 \\; pd quit;\n#X connect 1 0 2 0;\n#X connect 2 0 3 0;\n",
            seconds * 1000.0
        ),
    )?;
    let mut cmd = match rt {
        Some(p) => {
            let mut c = std::process::Command::new("chrt");
            c.args(["-f", &p.to_string(), "pd"]);
            c
        }
        None => std::process::Command::new("pd"),
    };
    let start = Instant::now();
    let out = cmd
        .args([
            "-batch", "-noprefs", "-nosound", "-nomidi", "-r", "44100", "-send", "pd dsp 1",
            "-open",
        ])
        .arg(&wrapper)
        .output()
        .map_err(|e| {
            anyhow::anyhow!("running pd (Debian's puredata-core; scripts/setup installs it): {e}")
        })?;
    let wall = start.elapsed().as_secs_f64();
    anyhow::ensure!(
        out.status.success(),
        "pd -batch failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(wall)
}

/// Seconds our engine takes to compute `audio_s` seconds of `patch` on `exec`, block by block
/// after 100 untimed warm-up blocks on a freshly opened engine ([`time_blocks`]): the measure
/// of Pd's `-batch` wall time, less its start-up.
fn engine_seconds(patch: &Path, exec: &mut Executor, audio_s: f64) -> anyhow::Result<f64> {
    let blocks = (audio_s * f64::from(SR) / BLOCK as f64).round() as usize;
    let ns = time_blocks(patch, &EngineOptions::default(), exec, 100, blocks)?;
    Ok(ns.iter().sum::<u64>() as f64 / 1e9)
}

/// One round of the capacity comparison: the wall time of the same audio computed by our
/// engine on 1 hart, on 2 harts (work stealing), and by Pd (None if Pd could not be run).
struct CapacityRound {
    ours_1: f64,
    ours_2: f64,
    pd: Option<f64>,
}

/// The capacity comparison against Pd, in `rounds` rounds of `audio_s` seconds of the wide
/// patch each: our engine on 1 hart and on 2, and Pd's steady-state time for the same audio
/// (the wall time of a run of `1 + audio_s` seconds minus a run of 1 s, so that Pd's start-up,
/// patch load and DSP set-up cancel out), back to back, the order alternating from round to
/// round. Each round's sides run within a couple of seconds of each other, so a stretch of host
/// noise weighs on one round's ratio, not on every figure of one side; the figures are medians
/// over the rounds. Pd's error, if any, comes back beside the rounds.
fn capacity_rounds(
    wide: &Path,
    audio_s: f64,
    rounds: usize,
    mut par: impl FnMut() -> Executor,
    rt: Option<i32>,
) -> anyhow::Result<(Vec<CapacityRound>, Option<anyhow::Error>)> {
    let mut out = Vec::with_capacity(rounds);
    let mut pd_error = None;
    let pd = |pd_error: &mut Option<anyhow::Error>| -> Option<f64> {
        if pd_error.is_some() {
            return None;
        }
        let run = || -> anyhow::Result<f64> {
            let short = pd_batch_seconds(wide, 1.0, rt)?;
            let long = pd_batch_seconds(wide, 1.0 + audio_s, rt)?;
            anyhow::ensure!(
                long > short,
                "Pd's long run ({long:.3} s) was not slower than its short one ({short:.3} s)"
            );
            Ok(long - short)
        };
        run().map_err(|e| *pd_error = Some(e)).ok()
    };
    for round in 0..rounds {
        let pd_first = round % 2 == 1;
        let pd_before = if pd_first { pd(&mut pd_error) } else { None };
        let ours_1 = engine_seconds(wide, &mut Executor::serial(), audio_s)?;
        let ours_2 = engine_seconds(wide, &mut par(), audio_s)?;
        let pd_s = if pd_first {
            pd_before
        } else {
            pd(&mut pd_error)
        };
        out.push(CapacityRound {
            ours_1,
            ours_2,
            pd: pd_s,
        });
    }
    Ok((out, pd_error))
}

fn write_patch(dir: &Path, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, text)?;
    Ok(p)
}

/// Runs the bench.
pub fn run(o: &GraphBenchOptions) -> anyhow::Result<Report> {
    let dir = std::env::temp_dir().join(format!("tess-pd-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // blocks per configuration, in `rounds` slices (see below), each after `warm` blocks
    let (warm, blocks, rounds) = if o.quick {
        (50, 500, 2)
    } else {
        (100, 6000, 12)
    };
    let wide = write_patch(&dir, "voices.pd", &voices_patch(o.voices))?;
    let half = o.voices / 2;
    let half_a = write_patch(&dir, "half-a.pd", &voices_slice_patch(0..half))?;
    let half_b = write_patch(&dir, "half-b.pd", &voices_slice_patch(half..o.voices))?;
    let halves = [half_a.as_path(), half_b.as_path()];
    let deep = write_patch(&dir, "chain.pd", &chain_patch(256))?;
    let triv = write_patch(&dir, "trivial.pd", &trivial_patch(64))?;
    crate::render::write_wav(
        &dir.join("ir.wav"),
        &[reverb_response(REVERB_IR)],
        SR as u32,
    )?;
    let reverbs = write_patch(&dir, "reverbs.pd", &reverbs_patch(REVERBS))?;
    let cpu = o.first_cpu;
    let serial = Executor::serial;
    let rt = o.rt_priority;
    let par = |s: Strategy| {
        let e = Executor::new(s, 2).pinned(cpu);
        match rt {
            Some(p) => e.realtime(p),
            None => e,
        }
    };
    crate::sched::pin_to(cpu);
    let rt_note = match rt.map(crate::sched::set_fifo) {
        Some(Err(e)) => format!("SCHED_FIFO refused ({e}): harts ran as ordinary threads"),
        Some(Ok(())) => format!("harts and pd ran SCHED_FIFO {}", rt.unwrap_or(0)),
        None => "harts ran as ordinary threads".into(),
    };

    let plain = EngineOptions::default();
    let time_distributed = EngineOptions {
        long_levels: crate::shared::LongLevels::TimeDistributed,
    };
    let reverb_label = format!("{REVERBS} reverbs (tess~conv, time-distributed)");
    // Every configuration, measured in interleaved rounds: each round opens every
    // configuration's engine and executor afresh (an idle executor's harts spin, so only one
    // lives at a time) and times a slice of its blocks, the order rotating from round to
    // round. A stretch of host noise (this 2-vCPU guest has them: a serial baseline of 53 to
    // 74 us in consecutive runs) then falls on every configuration alike instead of on
    // whichever ran at the time, and the ratios compare like with like.
    let configs: Vec<(String, &Path, &EngineOptions, Run)> = vec![
        ("wide, 1 hart (Pd order)".into(), &wide, &plain, Run::Serial),
        (
            "wide, 2 independent halves, 1 hart each (ceiling)".into(),
            &wide,
            &plain,
            Run::SplitPair,
        ),
        (
            "wide, 2 harts, global queue".into(),
            &wide,
            &plain,
            Run::Parallel(Strategy::GlobalQueue),
        ),
        (
            "wide, 2 harts, work stealing".into(),
            &wide,
            &plain,
            Run::Parallel(Strategy::WorkStealing),
        ),
        ("deep chain, 1 hart".into(), &deep, &plain, Run::Serial),
        (
            "deep chain, 2 harts, work stealing".into(),
            &deep,
            &plain,
            Run::Parallel(Strategy::WorkStealing),
        ),
        ("trivial, 1 hart".into(), &triv, &plain, Run::Serial),
        (
            "trivial, 2 harts, global queue".into(),
            &triv,
            &plain,
            Run::Parallel(Strategy::GlobalQueue),
        ),
        (
            "trivial, 2 harts, work stealing".into(),
            &triv,
            &plain,
            Run::Parallel(Strategy::WorkStealing),
        ),
        (
            format!("{reverb_label}, 1 hart"),
            &reverbs,
            &time_distributed,
            Run::Serial,
        ),
        (
            format!("{reverb_label}, 2 harts, work stealing"),
            &reverbs,
            &time_distributed,
            Run::Parallel(Strategy::WorkStealing),
        ),
    ];
    let mut samples: Vec<Vec<u64>> = vec![Vec::with_capacity(blocks); configs.len()];
    let mut per_hart: Vec<Vec<u64>> = vec![Vec::new(); configs.len()];
    let mut task_count = vec![0; configs.len()];
    for round in 0..rounds {
        for i in 0..configs.len() {
            let c = (round + i) % configs.len();
            let (_, patch, options, run) = &configs[c];
            let mut ex = match *run {
                Run::Serial => serial(),
                Run::Parallel(s) => par(s),
                Run::SplitPair => {
                    let t = time_split_pair(halves, cpu, rt, warm, blocks / rounds)?;
                    samples[c].extend(t);
                    continue;
                }
            };
            let t = time_blocks(patch, options, &mut ex, warm, blocks / rounds)?;
            samples[c].extend(t);
            let counts = ex.tasks_per_hart();
            let sums = &mut per_hart[c];
            sums.resize(counts.len().max(sums.len()), 0);
            for (sum, n) in sums.iter_mut().zip(counts) {
                *sum += n;
            }
            task_count[c] = ex.task_count();
        }
    }
    let rows: Vec<_> = configs
        .iter()
        .enumerate()
        .map(|(c, (label, ..))| {
            let s = Summary::of_ns_as_us(&samples[c]);
            let share = match per_hart[c].as_slice() {
                [a, b, ..] if a + b > 0 => format!("{:.0}%", 100.0 * *b as f64 / (a + b) as f64),
                _ => "-".into(),
            };
            (
                label.clone(),
                s.median,
                s.p99,
                s.max,
                mean_us(&samples[c]),
                task_count[c],
                share,
            )
        })
        .collect();
    let [wide_1, wide_pair, wide_g, wide_s, deep_1, deep_s, triv_1, triv_g, triv_s, rev_1, rev_s]: [Vec<u64>;
        11] = samples
        .try_into()
        .map_err(|_| anyhow::anyhow!("one sample set per configuration"))?;

    let mut r = Report::new("graph");
    let mut t = Table::new(
        "per-block time (us), 44.1 kHz, 64-sample blocks (deadline 1451 us)",
        &[
            "configuration",
            "median",
            "p99",
            "max",
            "mean",
            "tasks",
            "hart 1 ran",
        ],
    );
    for (l, med, p99, max, mean, tasks, share) in &rows {
        t.row(&[
            l.clone(),
            format!("{med:.1}"),
            format!("{p99:.1}"),
            format!("{max:.1}"),
            format!("{mean:.1}"),
            tasks.to_string(),
            share.clone(),
        ]);
    }
    r.table(t);
    let speedup = median_us(&wide_1) / median_us(&wide_s);
    let speedup_g = median_us(&wide_1) / median_us(&wide_g);
    let ceiling = median_us(&wide_1) / median_us(&wide_pair);
    r.figure("speedup_2_harts", speedup);
    r.figure("speedup_2_harts_global", speedup_g);
    r.figure("speedup_ceiling_2_harts", ceiling);
    r.figure("parallel_efficiency", speedup / ceiling);
    r.target(
        "speedup_2_harts >= 1.8",
        speedup >= 1.8,
        format!("{speedup:.2} (ceiling {ceiling:.2})"),
    );
    // A parallel plug-in: the reverbs' long levels are tasks of the same scheduler.
    let conv_speedup = median_us(&rev_1) / median_us(&rev_s);
    r.figure("conv_speedup_2_harts", conv_speedup);
    r.figure("conv_max_us_1_hart", Summary::of_ns_as_us(&rev_1).max);
    r.figure("conv_max_us_2_harts", Summary::of_ns_as_us(&rev_s).max);
    let deep_ratio = median_us(&deep_s) / median_us(&deep_1);
    r.figure("deep_chain_ratio", deep_ratio);
    r.target(
        "deep chain on 2 harts not slower than 1 (ratio <= 1.05)",
        deep_ratio <= 1.05,
        format!("{deep_ratio:.3}"),
    );
    // What a strategy costs beyond a perfect split of the serial work over the 2 harts: on a
    // patch with almost no DSP work that is the scheduling itself (the plain difference from
    // the serial block would go negative as soon as the split gains more than it costs).
    let ideal_2 = median_us(&triv_1) / 2.0;
    let g_over = median_us(&triv_g) - ideal_2;
    let s_over = median_us(&triv_s) - ideal_2;
    r.figure("global_vs_stealing.global_us", g_over);
    r.figure("global_vs_stealing.stealing_us", s_over);

    // Real-time capacity: ours and Pd's from the wall time of the same audio, in interleaved
    // rounds (see `capacity_rounds`).
    let (audio_s, cap_rounds) = if o.quick { (2.0, 2) } else { (20.0, 5) };
    let (caps, pd_error) = capacity_rounds(
        &wide,
        audio_s,
        cap_rounds,
        || par(Strategy::WorkStealing),
        rt,
    )?;
    let voices_for = |secs: f64| o.voices as f64 * audio_s / secs;
    let median = |v: Vec<f64>| Summary::of(&v).median;
    let voices_1 = voices_for(median(caps.iter().map(|c| c.ours_1).collect()));
    let voices_2 = voices_for(median(caps.iter().map(|c| c.ours_2).collect()));
    r.figure("voices_1_hart", voices_1);
    r.figure("voices_2_harts", voices_2);
    let mut t = Table::new(
        format!(
            "real-time capacity on one hart, {}-voice patch: wall time (s) for {audio_s} s of audio, per round",
            o.voices
        ),
        &["round", "ours, 1 hart", "ours, 2 harts", "Pd 0.53", "ours / Pd (1 hart)"],
    );
    let mut ratios = Vec::new();
    for (k, c) in caps.iter().enumerate() {
        let ratio = c.pd.map(|pd| pd / c.ours_1);
        ratios.extend(ratio);
        t.row(&[
            (k + 1).to_string(),
            format!("{:.3}", c.ours_1),
            format!("{:.3}", c.ours_2),
            c.pd.map_or("-".into(), |pd| format!("{pd:.3}")),
            ratio.map_or("-".into(), |x| format!("{x:.2}")),
        ]);
    }
    r.table(t);
    match pd_error {
        None => {
            let pd_s = median(caps.iter().filter_map(|c| c.pd).collect());
            r.figure("pd_voices_1_hart", voices_for(pd_s));
            let Summary {
                median: ratio,
                min: lo,
                max: hi,
                ..
            } = Summary::of(&ratios);
            r.figure("pd_realtime_ratio", ratio);
            r.figure("pd_realtime_ratio_min", lo);
            r.figure("pd_realtime_ratio_max", hi);
            r.target(
                "pd_realtime_ratio >= 1 (ours >= Pd on one hart)",
                ratio >= 1.0,
                format!("{ratio:.2} (rounds {lo:.2} to {hi:.2})"),
            );
            r.note(format!(
                "capacity: {cap_rounds} rounds, each our engine on 1 hart and on 2 (work stealing) computing {audio_s} s of the {}-voice patch after 100 warm-up blocks, and pd -batch's wall time for {} s minus that for 1 s (start-up, load and DSP set-up cancel out), back to back in alternating order; pd_realtime_ratio is the median over the rounds of Pd's time over ours, voices_* the voices each side would sustain in real time at the median time",
                o.voices,
                1.0 + audio_s
            ));
        }
        Some(e) => {
            r.note(format!("pd_realtime_ratio not measured: {e}"));
        }
    }
    r.note(format!(
        "each configuration ran {blocks} blocks in {rounds} slices, interleaved with the others (the order rotating each round), each slice on a freshly opened engine after {warm} warm-up blocks"
    ));
    r.note(format!(
        "harts pinned to CPUs {cpu} and {}; {rt_note}; timings are noisy on a shared 2-vCPU guest",
        cpu + 1
    ));
    if rt.is_some() {
        // back to an ordinary thread for whatever the caller does next
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: valid sched_param for the call; pid 0 is this thread.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block of the Table 2 patch reaches its output: fed a sine on `adc~ 1` for half a
    /// second, each of the eight `dac~` channels carries sound, and all of it is finite.
    #[test]
    fn the_effects_patch_sends_each_block_to_its_own_output() {
        let d = tempfile::tempdir().unwrap();
        let patch = write_patch(d.path(), "effects.pd", &effects_patch()).unwrap();
        let mut e = Engine::open(&patch, crate::device::config()).unwrap();
        assert_eq!(e.channels(), 8);
        let mut exec = Executor::serial();
        let mut energy = [0f64; 8];
        let mut out = [0f32; crate::device::FRAMES];
        for k in 0..700 {
            let input: Vec<f32> = (0..crate::device::FRAMES)
                .map(|i| (((k * 32 + i) as f32) * 0.0314).sin() * 0.5)
                .collect();
            e.write_input(0, &input);
            e.tick(&mut exec);
            for (ch, en) in energy.iter_mut().enumerate() {
                e.read_output(ch, &mut out);
                assert!(out.iter().all(|x| x.is_finite()), "channel {ch}");
                *en += out.iter().map(|&x| f64::from(x * x)).sum::<f64>();
            }
        }
        for (ch, en) in energy.iter().enumerate() {
            assert!(*en > 1.0, "dac~ channel {} is silent: {energy:?}", ch + 1);
        }
    }
}

/// Options of [`conv_in_engine`].
#[derive(Debug, Clone)]
pub struct ConvEngineOptions {
    /// CPU the engine (and its convolution workers) run on.
    pub cpu: usize,
    /// The engine's `SCHED_FIFO` priority (the workers run below it).
    pub rt_priority: i32,
    /// Impulse response length, samples.
    pub ir_len: usize,
    /// Engine block, samples.
    pub block: usize,
    /// Seconds each mode plays.
    pub seconds: f64,
}

/// `tess~conv` inside the engine, its long levels run synchronously, preemptively and in the
/// background (seed 001 section 3.3 in the engine): one patch (`noise~ -> tess~conv ir ->
/// dac~`, the response read from a WAV file by `soundfiler`) played in real time at 44.1 kHz
/// on one CPU, once per mode; adds a table and the figures
/// `engine_misses_{sync,preemptive,background}`, `engine_p999_us_*`, `engine_max_us_*` and
/// `engine_conv_late_{preemptive,background}` (steps finished too late) and
/// `engine_piece_overruns_background` (background pieces that ended after a release) to `r`.
pub fn conv_in_engine(o: &ConvEngineOptions, r: &mut Report) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("tess-pd-conv-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = conv_in_engine_in(o, &dir, r);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The long-level modes the engine plays, in order.
const MODES: [&str; 3] = ["sync", "preemptive", "background"];

fn conv_in_engine_in(o: &ConvEngineOptions, dir: &Path, r: &mut Report) -> anyhow::Result<()> {
    use crate::engine::EngineOptions;
    // a decaying noise response, the same every run (a small LCG)
    let mut seed = 0x2545_f491u32;
    let ir: Vec<f32> = (0..o.ir_len)
        .map(|i| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * (-(i as f32) / 100_000.0).exp()
        })
        .collect();
    crate::render::write_wav(&dir.join("ir.wav"), &[ir], 44_100)?;
    let patch = write_patch(
        dir,
        "conv.pd",
        "#N canvas 0 0 450 300 12;\n#X obj 10 10 loadbang;\n#X msg 10 30 read -resize ir.wav ir;\n\
         #X obj 10 50 soundfiler;\n#X obj 200 10 array define ir 1;\n#X obj 10 100 noise~;\n\
         #X obj 10 130 tess~conv ir;\n#X obj 10 170 dac~ 1;\n#X connect 0 0 1 0;\n\
         #X connect 1 0 2 0;\n#X connect 4 0 5 0;\n#X connect 5 0 6 0;\n",
    )?;
    let cfg = Config {
        sample_rate: 44_100.0,
        block: o.block,
    };
    let o2 = o.clone();
    // One thread on the CPU, real time: the workers it starts inherit the CPU, so they get
    // only the time the engine leaves (the paper's single-hart setting).
    let reports = std::thread::spawn(move || -> anyhow::Result<Vec<crate::play::PlayReport>> {
        crate::sched::pin_to(o2.cpu);
        crate::sched::set_fifo(o2.rt_priority)
            .map_err(|e| anyhow::anyhow!("SCHED_FIFO {}: {e}", o2.rt_priority))?;
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mut out = Vec::new();
        for mode in MODES {
            let options = EngineOptions {
                long_levels: match mode {
                    "preemptive" => crate::shared::LongLevels::Preemptive(
                        crate::engine::conv_workers(o2.rt_priority)?,
                    ),
                    "background" => crate::shared::LongLevels::Background,
                    _ => crate::shared::LongLevels::Synchronous,
                },
            };
            out.push(crate::play::play(
                &patch,
                cfg,
                &options,
                o2.seconds,
                &mut Executor::serial(),
                &stop,
                &mut Default::default(),
            )?);
        }
        Ok(out)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the engine thread panicked"))??;
    let mut t = Table::new(
        format!(
            "tess~conv in the engine: a {}-sample response at {}-sample blocks, 44.1 kHz, one CPU ({} s per mode)",
            o.ir_len, o.block, o.seconds
        ),
        &[
            "long levels",
            "blocks",
            "misses",
            "p99 us",
            "p99.9 us",
            "max us",
            "late steps",
            "pieces past release",
        ],
    );
    for (mode, p) in MODES.iter().zip(&reports) {
        t.row(&[
            mode.to_string(),
            p.blocks.to_string(),
            p.misses.to_string(),
            format!("{:.0}", p.p99_us),
            format!("{:.0}", p.p999_us),
            format!("{:.0}", p.max_us),
            p.conv_late.to_string(),
            if *mode == "background" {
                p.piece_overruns.to_string()
            } else {
                "-".to_string()
            },
        ]);
        r.figure(format!("engine_misses_{mode}"), p.misses as f64)
            .figure(format!("engine_p999_us_{mode}"), p.p999_us)
            .figure(format!("engine_max_us_{mode}"), p.max_us);
    }
    r.figure("engine_conv_late_preemptive", reports[1].conv_late as f64);
    r.figure("engine_conv_late_background", reports[2].conv_late as f64);
    r.figure(
        "engine_piece_overruns_background",
        reports[2].piece_overruns as f64,
    );
    r.table(t);
    r.note(format!(
        "engine: `tess-pd play` of noise~ -> tess~conv -> dac~ on CPU {} at SCHED_FIFO {}; \
         sync runs each long level in the block that completes its input, preemptive on 12 \
         workers at SCHED_FIFO {} and below on the same CPU, each step due one period of its \
         level later; background with the same timing, run in pieces by the engine's own \
         thread between blocks (no other thread; partitions up to 16,384)",
        o.cpu,
        o.rt_priority,
        o.rt_priority - 1
    ));
    Ok(())
}
