//! `tess~conv NAME`: convolves its signal with the impulse response held in array `NAME` (seed
//! 001 §3.1), with no latency, through the `tess-conv` library: non-uniform partitions chosen
//! for the least mean load. Not a Pd vanilla class: tess's own, named with the `tess~` prefix.
//!
//! The response is read when DSP starts; `set NAME` picks another array from the next start.
//! The long levels run as the engine was opened ([`crate::engine::EngineOptions`]): by default
//! synchronously in the block that completes their input (exact, and bursty: a block that
//! starts a long level costs more than the others, for a long response more than a block's
//! deadline); with preemptive workers ([`tess_conv::Mode::Preemptive`], `tess-pd play` and
//! `device` with `--conv preemptive`) on threads below the engine's priority that every block
//! preempts, each step due one period of its level later (seed 001 section 3.3); or
//! time-distributed (`--conv time-distributed`): each step cut into sub-tasks (FFTs, ranges of
//! partitions) spread over the blocks of the level's period, with partitions chosen for the
//! heaviest block. Time-distributed, the object is a parallel plug-in (seed 001 section 2.2):
//! each long level is a part of its own ([`PdObject::parallel_parts`], one
//! [`tess_conv::LevelTask`] each, [`tess_conv::Mode::Scheduled`]), a task of the engine's
//! scheduler that runs its level's share of the block on any hart, alongside the rest of the
//! graph, before the object's own node (level 0 and the output). A step that misses is counted
//! (`Engine::conv_late`).

use super::{sarg, BackgroundTask, Cx, DspEnv, PdObject, Port};
use crate::atom::{Atom, Msg};
use crate::shared::LongLevels;
use tess_conv::{Convolver, CostModel, LevelTask, Mode, Objective, Plan, WhenLate};

/// Largest partition the plan may use.
const MAX_PARTITION: usize = 65_536;
/// Largest partition in the background ([`LongLevels::Background`]).
const MAX_BACKGROUND_PARTITION: usize = 16_384;

/// `tess~conv NAME`.
pub struct TessConv {
    name: String,
    conv: Option<Convolver>,
    /// The engine's count of late steps.
    late: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    /// The engine's sample rate (from the last DSP start).
    sample_rate: f32,
}

impl std::fmt::Debug for TessConv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TessConv")
            .field("name", &self.name)
            .field("ir_len", &self.conv.as_ref().map_or(0, |c| c.plan().ir_len))
            .finish()
    }
}

impl PdObject for TessConv {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Signal], vec![Port::Signal])
    }
    fn message(&mut self, inlet: usize, msg: &Msg, _cx: &mut Cx<'_>) {
        if (inlet, msg.selector.as_str()) == (0, "set") {
            self.name = sarg(&msg.args, 0);
        }
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn prepare(&mut self, env: &DspEnv<'_>) {
        self.conv = None;
        self.sample_rate = env.sample_rate;
        let Some(array) = env.shared.array(&self.name) else {
            return;
        };
        let ir = array.read().unwrap_or_else(|e| e.into_inner()).clone();
        let (mode, when_late) = match &env.shared.long_levels {
            LongLevels::Preemptive(w) => (Mode::Preemptive(w.pool.clone()), w.when_late),
            // The graph runs every share before the object: never late, never waited for.
            LongLevels::TimeDistributed => (Mode::Scheduled, WhenLate::Drop),
            LongLevels::Background => (Mode::Background, WhenLate::Drop),
            LongLevels::Synchronous => (Mode::Synchronous, WhenLate::Wait),
        };
        // Time-distributed levels must fit their largest indivisible piece (an FFT) into one
        // block, so their partitions are chosen for the heaviest block, the others' for the
        // mean (tess_conv::Objective).
        let objective = match mode {
            Mode::TimeDistributed | Mode::Scheduled => Objective::WorstCallback,
            _ => Objective::MeanLoad,
        };
        // In the background a piece delays the next block by up to one FFT of the largest
        // level: keep that FFT short (2 x 16,384 points: 86 us by the cost
        // model `tess bench convolution` measured here).
        let max_partition = match mode {
            Mode::Background => MAX_BACKGROUND_PARTITION,
            _ => MAX_PARTITION,
        };
        // An empty array, or a block the library cannot take: silence, as a missing array.
        let Ok(plan) = Plan::optimal(
            env.block,
            ir.len(),
            max_partition,
            &CostModel::default(),
            objective,
        ) else {
            return;
        };
        self.conv = Convolver::new(&ir, &plan, mode, when_late).ok();
        self.late = Some(env.shared.conv_late.clone());
    }
    fn perform(&mut self, ins: &[&[f32]], outs: &mut [&mut [f32]]) {
        match &mut self.conv {
            Some(c) => {
                let late = c.process(ins[0], outs[0]);
                if late > 0 {
                    if let Some(count) = &self.late {
                        count.fetch_add(u64::from(late), std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
            None => outs[0].fill(0.0),
        }
    }
    fn cost_hint_ns(&self) -> u32 {
        // about a nanosecond per 256 response samples per block, plus level 0 (see the
        // library's cost example); once handed out (to the graph as parts, or to its
        // background work), the long levels are not this node's
        match &self.conv {
            Some(c) if c.long_levels_taken() => {
                CostModel::default().level_ns(&c.plan().levels[0]) as u32 + 200
            }
            Some(c) => 500 + (c.plan().ir_len / 256) as u32,
            None => 500,
        }
    }
    fn background_tasks(&mut self) -> Vec<Box<dyn BackgroundTask>> {
        let Some(c) = self
            .conv
            .as_mut()
            .filter(|c| matches!(c.mode(), Mode::Background))
        else {
            return Vec::new();
        };
        let rate = self.sample_rate;
        c.take_level_tasks()
            .into_iter()
            .map(|task| {
                // due one period of the level after its input is complete
                let due_within_ns = (task.level().size as f64 / f64::from(rate) * 1e9) as u64;
                Box::new(LevelInBackground {
                    task,
                    due_within_ns,
                }) as Box<dyn BackgroundTask>
            })
            .collect()
    }
    fn parallel_parts(&mut self) -> Vec<Box<dyn PdObject>> {
        let Some(c) = self
            .conv
            .as_mut()
            .filter(|c| matches!(c.mode(), Mode::Scheduled))
        else {
            return Vec::new();
        };
        c.take_level_tasks()
            .into_iter()
            .map(|task| Box::new(LevelPart::new(task)) as Box<dyn PdObject>)
            .collect()
    }
}

/// One long level of a `tess~conv` in the background: a piece at a time in the harts' idle
/// time ([`LevelTask::run_piece`]).
#[derive(Debug)]
struct LevelInBackground {
    task: LevelTask,
    due_within_ns: u64,
}

impl BackgroundTask for LevelInBackground {
    fn run_piece(&mut self) -> bool {
        self.task.run_piece()
    }
    fn due_within_ns(&self) -> u64 {
        self.due_within_ns
    }
    fn piece_ns_hint(&self) -> u64 {
        self.task.longest_piece_ns(&CostModel::default()) as u64
    }
    fn probe(&self) -> super::WorkProbe {
        let probe = self.task.probe();
        Box::new(move || probe.in_flight())
    }
}

/// One long level of a time-distributed `tess~conv`, as a node of the graph: runs the level's
/// share of each block ([`LevelTask::run`]).
#[derive(Debug)]
struct LevelPart {
    task: LevelTask,
    cost_ns: u32,
}

impl LevelPart {
    fn new(task: LevelTask) -> LevelPart {
        // The level's whole step spread evenly over the blocks of its period.
        let per_block = CostModel::default().level_ns(&task.level()) / task.slots().max(1) as f64;
        LevelPart {
            task,
            cost_ns: per_block.clamp(1.0, f64::from(u32::MAX)) as u32,
        }
    }
}

impl PdObject for LevelPart {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (Vec::new(), Vec::new())
    }
    fn is_dsp(&self) -> bool {
        true
    }
    fn perform(&mut self, _ins: &[&[f32]], _outs: &mut [&mut [f32]]) {
        self.task.run();
    }
    fn cost_hint_ns(&self) -> u32 {
        self.cost_ns
    }
}

/// Creates `tess~conv`.
pub fn create(class: &str, args: &[Atom]) -> Option<Box<dyn PdObject>> {
    (class == "tess~conv").then(|| {
        Box::new(TessConv {
            name: sarg(args, 0),
            conv: None,
            late: None,
            sample_rate: 44_100.0,
        }) as Box<dyn PdObject>
    })
}
