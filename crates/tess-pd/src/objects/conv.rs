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
//! time-distributed (`--conv time-distributed`, [`tess_conv::Mode::TimeDistributed`]): each
//! step cut into sub-tasks (FFTs, ranges of partitions) run in the engine's own blocks over
//! the level's period, with partitions chosen for the heaviest block. A step that misses is
//! counted (`Engine::conv_late`).

use super::{sarg, Cx, DspEnv, PdObject, Port};
use crate::atom::{Atom, Msg};
use crate::shared::LongLevels;
use tess_conv::{Convolver, CostModel, Mode, Objective, Plan, WhenLate};

/// Largest partition the plan may use.
const MAX_PARTITION: usize = 65_536;

/// `tess~conv NAME`.
pub struct TessConv {
    name: String,
    conv: Option<Convolver>,
    ir_len: usize,
    /// The engine's count of late steps.
    late: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl std::fmt::Debug for TessConv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TessConv")
            .field("name", &self.name)
            .field("ir_len", &self.ir_len)
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
        self.ir_len = 0;
        let Some(array) = env.shared.array(&self.name) else {
            return;
        };
        let ir = array.read().unwrap_or_else(|e| e.into_inner()).clone();
        let (mode, when_late) = match &env.shared.long_levels {
            LongLevels::Preemptive(w) => (Mode::Preemptive(w.pool.clone()), w.when_late),
            LongLevels::TimeDistributed => (Mode::TimeDistributed, WhenLate::Wait),
            LongLevels::Synchronous => (Mode::Synchronous, WhenLate::Wait),
        };
        // Time-distributed levels must fit their largest indivisible piece (an FFT) into one
        // block, so their partitions are chosen for the heaviest block, the others' for the
        // mean (tess_conv::Objective).
        let objective = match mode {
            Mode::TimeDistributed => Objective::WorstCallback,
            _ => Objective::MeanLoad,
        };
        // An empty array, or a block the library cannot take: silence, as a missing array.
        let Ok(plan) = Plan::optimal(
            env.block,
            ir.len(),
            MAX_PARTITION,
            &CostModel::default(),
            objective,
        ) else {
            return;
        };
        self.conv = Convolver::new(&ir, &plan, mode, when_late).ok();
        self.ir_len = ir.len();
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
        // library's cost example)
        500 + (self.ir_len / 256) as u32
    }
}

/// Creates `tess~conv`.
pub fn create(class: &str, args: &[Atom]) -> Option<Box<dyn PdObject>> {
    (class == "tess~conv").then(|| {
        Box::new(TessConv {
            name: sarg(args, 0),
            conv: None,
            ir_len: 0,
            late: None,
        }) as Box<dyn PdObject>
    })
}
