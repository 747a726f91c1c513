//! A convolver: one input, one output, one impulse response, processed block by block with no
//! latency. Level 0 runs inside [`Convolver::process`]; the long levels run as the [`Mode`]
//! says: all at once (offline), spread over the callbacks of their period, spread the same way
//! but as [`LevelTask`]s a host's own scheduler runs (on any of its threads), or on a
//! [`Pool`]'s lower-priority workers.

use crate::level::{LevelJob, Schedule};
use crate::plan::Plan;
use crate::pool::{JobCell, Pool};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How the long levels (all but level 0) run.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Each long level's whole step runs in the callback that completes its input block:
    /// exact and simple, for offline rendering; its callbacks vary wildly in cost.
    Synchronous,
    /// Seed 001 section 3.3 approach 2: each step is cut into sub-tasks (forward FFT, ranges of
    /// partitions, inverse FFT) spread over the callbacks of the level's period. An FFT cannot
    /// be cut, so the largest FFT bounds how many instances fit a callback.
    TimeDistributed,
    /// [`Mode::TimeDistributed`]'s sub-tasks as a parallel plug-in (seed 001 section 2.2): each
    /// long level's share of a callback is a [`LevelTask`] (from
    /// [`Convolver::take_level_tasks`]) that the host runs once per callback, on any thread,
    /// before that callback's [`Convolver::process`] (a graph engine makes the task a
    /// predecessor of the convolver's node). The levels' shares then run in parallel with each
    /// other and with the rest of the host's work. A step whose shares did not all run by its
    /// deadline is late (counted; its level is silent for a period, as [`WhenLate::Drop`]),
    /// never waited for ([`WhenLate`] does not apply). Until the tasks are taken, no share runs.
    Scheduled,
    /// Seed 001 section 3.3 approach 1 without threads of its own: each step is due one period
    /// after its input is complete, as in [`Mode::Preemptive`], and runs in pieces (the
    /// forward FFT, a range of partitions, the inverse FFT) through
    /// [`LevelTask::run_piece`], which the host calls in whatever time its threads have
    /// between blocks, and stops calling when the next block arrives: the long levels run at
    /// a lower priority than the blocks, preempted at the next piece boundary. With
    /// [`WhenLate::Wait`] `process` waits for a step that is not done: only for a host that
    /// runs the pieces on another thread that never waits for this one (or runs them all
    /// before each callback, when nothing is ever waited for); otherwise it hangs.
    Background,
    /// Seed 001 section 3.3 approach 1: each step runs on the pool's worker for its level, at
    /// a lower priority than the audio thread, preempted whenever a block arrives. The result
    /// is due one period later. The convolver holds the pool (several convolvers may share
    /// one).
    Preemptive(Arc<Pool>),
}

/// What happens when a preemptive step is not done by its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenLate {
    /// Count it; the level's part is silence until a step is on time again (one or two
    /// periods), and the input of the skipped period is missing from its tail (real time: an
    /// audible drop, and no worse).
    Drop,
    /// Wait for the worker (offline rendering and tests: exact output, no deadline).
    Wait,
}

/// Why a convolver cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ConvError {
    /// The plan's response length differs from the response given.
    #[error("the plan is for a {plan}-sample response, the response has {ir} samples")]
    Length {
        /// The plan's.
        plan: usize,
        /// The response's.
        ir: usize,
    },
    /// A plan whose levels do not follow the layout (built by hand, not by [`Plan`]'s
    /// constructors).
    #[error("the plan {0} does not follow the layout of Plan::with_sizes")]
    Layout(String),
    /// The pool has fewer workers than the plan has long levels.
    #[error("the plan has {levels} long levels, the worker pool serves {pool}")]
    PoolTooSmall {
        /// Long levels in the plan.
        levels: usize,
        /// Workers in the pool.
        pool: usize,
    },
}

/// The audio-side state of a long level.
struct LongLevel {
    cell: Arc<JobCell>,
    /// Output of the step being played, read `block` samples per callback.
    playing: Vec<f32>,
    /// Output of the last collected step, played from the next period on.
    next: Vec<f32>,
    /// The last step whose result was collected.
    collected: u64,
    schedule: Schedule,
    /// Callbacks per period (`size / block`).
    slots: usize,
}

/// A zero-latency non-uniform partitioned convolver.
pub struct Convolver {
    plan: Plan,
    mode: Mode,
    when_late: WhenLate,
    first: LevelJob,
    long: Vec<LongLevel>,
    /// Callbacks so far (shared with the [`LevelTask`]s in [`Mode::Scheduled`]: the callback a
    /// task runs its share of is the next one to be processed).
    callback: Arc<AtomicU64>,
    late: u64,
    /// The level tasks were handed out ([`Mode::Scheduled`], [`Mode::Background`]).
    tasks_taken: bool,
}

impl std::fmt::Debug for Convolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Convolver")
            .field("plan", &self.plan.to_string())
            .field("callback", &self.callback.load(Ordering::Relaxed))
            .field("late", &self.late)
            .finish()
    }
}

impl Convolver {
    /// Prepares `ir` cut as `plan` says (transforms every partition: allocate here, not in the
    /// audio callback).
    pub fn new(
        ir: &[f32],
        plan: &Plan,
        mode: Mode,
        when_late: WhenLate,
    ) -> Result<Convolver, ConvError> {
        if plan.ir_len != ir.len() {
            return Err(ConvError::Length {
                plan: plan.ir_len,
                ir: ir.len(),
            });
        }
        let sizes: Vec<usize> = plan.levels.iter().skip(1).map(|l| l.size).collect();
        if plan.levels.first().map(|l| l.size) != Some(plan.block)
            || Plan::with_sizes(plan.block, plan.ir_len, &sizes).as_ref() != Ok(plan)
        {
            return Err(ConvError::Layout(plan.to_string()));
        }
        if let Mode::Preemptive(pool) = &mode {
            if pool.levels() < plan.levels.len() - 1 {
                return Err(ConvError::PoolTooSmall {
                    levels: plan.levels.len() - 1,
                    pool: pool.levels(),
                });
            }
        }
        let first = LevelJob::new(plan.levels[0], ir);
        let long = plan.levels[1..]
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let cell = Arc::new(JobCell::new(LevelJob::new(l, ir)));
                if let Mode::Preemptive(pool) = &mode {
                    pool.register(i + 1, cell.clone());
                }
                let slots = l.size / plan.block;
                LongLevel {
                    cell,
                    playing: vec![0.0; l.size],
                    next: vec![0.0; l.size],
                    collected: 0,
                    schedule: Schedule::new(i + 1, slots, l.partitions),
                    slots,
                }
            })
            .collect();
        Ok(Convolver {
            plan: plan.clone(),
            mode,
            when_late,
            first,
            long,
            callback: Arc::new(AtomicU64::new(0)),
            late: 0,
            tasks_taken: false,
        })
    }

    /// The long levels' tasks, one per long level (shortest first), in [`Mode::Scheduled`]
    /// and [`Mode::Background`]; empty in any other mode, or if they were already taken.
    /// Scheduled, each must run once per callback ([`LevelTask::run`]), before that callback's
    /// [`Convolver::process`] and after the previous one's (the host orders them: a task's
    /// stores are then visible to `process` and back). In the background, a task's pieces
    /// ([`LevelTask::run_piece`]) may run at any time, concurrently with `process`, one
    /// thread at a time per task.
    pub fn take_level_tasks(&mut self) -> Vec<LevelTask> {
        if !matches!(self.mode, Mode::Scheduled | Mode::Background) || self.tasks_taken {
            return Vec::new();
        }
        self.tasks_taken = true;
        self.long
            .iter()
            .map(|lv| LevelTask {
                cell: lv.cell.clone(),
                schedule: lv.schedule,
                slots: lv.slots,
                callback: self.callback.clone(),
                piece: Piece::Forward,
                chunk: partitions_per_piece(&lv.cell.level),
                next_callback: self.callback.load(Ordering::Relaxed),
                broken: None,
            })
            .collect()
    }

    /// The long levels' tasks were handed out ([`Convolver::take_level_tasks`] gave at least
    /// one): [`Convolver::process`] runs level 0 only, and the tasks do the rest.
    pub fn long_levels_taken(&self) -> bool {
        self.tasks_taken && !self.long.is_empty()
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// How the long levels run.
    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    /// Steps whose result was not ready in time, so far.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Convolves one block: `input` and `output` are `plan().block` samples. Returns how many
    /// long steps were late in this callback (always 0 when the steps run in the callbacks:
    /// synchronous or time-distributed; preemptive or in the background only with
    /// [`WhenLate::Drop`]; scheduled when a level's task skipped a share).
    pub fn process(&mut self, input: &[f32], output: &mut [f32]) -> u32 {
        let b = self.plan.block;
        assert_eq!(input.len(), b, "input block");
        assert_eq!(output.len(), b, "output block");
        // Level 0: the newest 2 blocks of input, transformed now; its output is this block's.
        let first = &mut self.first;
        first.input.copy_within(b.., 0);
        first.input[b..].copy_from_slice(input);
        first.run();
        output.copy_from_slice(&first.out);

        let t = self.callback.load(Ordering::Relaxed);
        let mut late = 0;
        for (i, lv) in self.long.iter_mut().enumerate() {
            late += long_level_callback(lv, i + 1, t, b, input, output, &self.mode, self.when_late);
        }
        // Release: a level task that reads the new count sees this callback's input and posts.
        self.callback.store(t + 1, Ordering::Release);
        self.late += u64::from(late);
        late
    }
}

/// One callback of long level `k`.
///
/// Timeline, for a level of `slots` callbacks per period: the input of period `p` is complete
/// in its last callback, which starts step `p + 1` (steps are numbered from 1). The step has
/// one whole period: the last callback of period `p + 1` collects its result into `next`, and
/// period `p + 2` plays it, which is where a response segment starting at `2 size` belongs.
#[allow(clippy::too_many_arguments)]
fn long_level_callback(
    lv: &mut LongLevel,
    k: usize,
    t: u64,
    b: usize,
    input: &[f32],
    output: &mut [f32],
    mode: &Mode,
    when_late: WhenLate,
) -> u32 {
    let slots = lv.slots as u64;
    let slot = (t % slots) as usize;
    let period = t / slots;
    let mut late = 0;
    if slot == 0 {
        std::mem::swap(&mut lv.playing, &mut lv.next);
        lv.cell.halves.begin_period(period);
    }
    lv.cell.halves.write(period, slot * b, input);
    if let Mode::TimeDistributed = mode {
        // SAFETY: time-distributed cells are never registered with a pool and their tasks are
        // never handed out: this thread owns them.
        unsafe { time_distributed_share(&lv.cell, &lv.schedule, Some(slot), period) };
    }
    if lv.schedule.is_last(slot) {
        late += collect(lv, period, mode, when_late);
        if lv.cell.is_idle() {
            // SAFETY: idle: the audio thread owns the job until it bumps `posted`.
            let job = unsafe { lv.cell.job() };
            job.period = period;
            // A step is numbered by the period it runs in (not counted): after a late step
            // that started nothing, the numbers skip, and a time-distributed share can tell
            // from `posted` alone whether the step in flight is this period's.
            let step = period + 1;
            match mode {
                Mode::Synchronous => {
                    job.gather(&lv.cell.halves);
                    job.run();
                    lv.cell.done.store(step, Ordering::Relaxed);
                    lv.cell.posted.store(step, Ordering::Relaxed);
                }
                // Owned by this thread throughout; done when its last sub-task has run.
                Mode::TimeDistributed => lv.cell.posted.store(step, Ordering::Relaxed),
                // Handed to the level's task (its shares or its background pieces), which
                // owns the job until it stores `done`.
                Mode::Scheduled | Mode::Background => lv.cell.posted.store(step, Ordering::Release),
                Mode::Preemptive(pool) => {
                    lv.cell.posted.store(step, Ordering::Release);
                    pool.wake(k);
                }
            }
        }
    }
    for (o, p) in output.iter_mut().zip(&lv.playing[slot * b..(slot + 1) * b]) {
        *o += p;
    }
    late
}

/// Moves the result of the step in flight into `next`; returns 1 if it is not done (its part
/// of the next period is silence, and no new step starts this period).
///
/// A step is collected only in the last callback of the period after the one that started it;
/// a late step that finishes afterwards belongs to a period already played (as silence), so its
/// result is discarded. One late step thus silences its level for one or two periods, and the
/// input of the period it skipped is missing from that level's tail (see `LevelJob::forward`).
fn collect(lv: &mut LongLevel, period: u64, mode: &Mode, when_late: WhenLate) -> u32 {
    let posted = lv.cell.posted.load(Ordering::Relaxed);
    if posted == lv.collected {
        lv.next.fill(0.0);
        return 0;
    }
    if steps_run_elsewhere(mode) && when_late == WhenLate::Wait {
        while !lv.cell.is_idle() {
            // Sleep, not yield: a worker below this thread's SCHED_FIFO priority on the same
            // hart never runs while this thread only yields.
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
    if !lv.cell.is_idle() {
        lv.next.fill(0.0);
        return 1;
    }
    // SAFETY: the job is idle (done == posted): the audio thread owns it.
    let job = unsafe { lv.cell.job() };
    // The usual case swaps buffers; zeroing `next` is only for a period with no result.
    if job.period + 1 == period {
        std::mem::swap(&mut job.out, &mut lv.next);
    } else {
        lv.next.fill(0.0);
    }
    lv.collected = posted;
    0
}

/// Whether a step runs outside the callbacks, due a period after it was posted.
fn steps_run_elsewhere(mode: &Mode) -> bool {
    matches!(mode, Mode::Preemptive(_) | Mode::Background)
}

/// This callback's share of a time-distributed step: the step started at the end of the
/// previous period runs over the `slots` callbacks of this one. The slot numbering of the
/// [`Schedule`] begins at the callback after the step's input was complete.
///
/// # Safety
/// The calling thread is the only one that runs this level's shares (the convolver's own
/// thread in [`Mode::TimeDistributed`], the one [`LevelTask`] otherwise): while a step is in
/// flight (`done != posted`) the job is its own under the cell's protocol, since `process`
/// touches the job only when it is idle and only this thread stores `done`.
///
/// `slot` is `None` in a period whose step lost a share: only an older step is given back.
unsafe fn time_distributed_share(
    cell: &JobCell,
    schedule: &Schedule,
    slot: Option<usize>,
    period: u64,
) {
    let posted = cell.posted.load(Ordering::Acquire);
    let done = cell.done.load(Ordering::Relaxed);
    if done != posted && posted < period {
        // A step whose shares did not all run in its period (a host that skipped callbacks):
        // `collect` already counted it late; give the job back so a new step can start.
        cell.done.store(posted, Ordering::Release);
        return;
    }
    // A step is running in period p if it was posted at the end of period p - 1.
    let Some(slot) = slot else { return };
    if period == 0 || posted != period || done == posted {
        return;
    }
    // SAFETY: a step is in flight, so the caller owns the job (its contract); one reference.
    let job = unsafe { cell.job() };
    if slot == schedule.forward_slot {
        job.gather(&cell.halves);
        job.forward();
    }
    let (p0, p1) = schedule.partitions_in(slot);
    job.mac(p0, p1);
    if schedule.is_last(slot) {
        job.inverse();
        // Release: hands the job (and its output) back to `process`.
        cell.done.store(posted, Ordering::Release);
    }
}

/// One long level's time-distributed share of each callback, for a host's scheduler to run
/// ([`Mode::Scheduled`]): the forward FFT, a range of partitions, the inverse FFT, as
/// [`Mode::TimeDistributed`] spreads them, run wherever and whenever the host likes between
/// two callbacks' `process`.
pub struct LevelTask {
    cell: Arc<JobCell>,
    schedule: Schedule,
    slots: usize,
    callback: Arc<AtomicU64>,
    /// In the background: the next piece of the step in flight (a step is posted only when
    /// the last is done, and `Inverse` leaves `Forward` for the next).
    piece: Piece,
    /// Partitions multiplied in one piece.
    chunk: usize,
    /// Scheduled: the callback whose share is due next, and a period in which a share was
    /// skipped (its step is late, never handed back as done).
    next_callback: u64,
    broken: Option<u64>,
}

/// Whether a level's step is in flight ([`LevelTask::probe`]).
#[derive(Clone)]
pub struct StepProbe(Arc<JobCell>);

impl StepProbe {
    /// Whether the level has a step posted and not yet done: its task's
    /// [`LevelTask::run_piece`] would run something. A snapshot: the answer may change as
    /// soon as it is given.
    pub fn in_flight(&self) -> bool {
        self.0.posted.load(Ordering::Relaxed) != self.0.done.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for StepProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepProbe")
            .field("level", &self.0.level)
            .finish()
    }
}

/// The next piece of a background step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    Forward,
    /// Partitions from this one on.
    Mac(usize),
    Inverse,
}

/// Partitions in one background piece: about one FFT's worth of multiply-adds, so that no
/// piece is much longer than the one that cannot be cut (the FFT), which bounds how late a
/// piece makes the next block.
fn partitions_per_piece(level: &crate::Level) -> usize {
    let model = crate::CostModel::default();
    (model.fft_ns(level) / model.mac_partition_ns(level))
        .ceil()
        .max(1.0) as usize
}

impl std::fmt::Debug for LevelTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LevelTask")
            .field("level", &self.cell.level)
            .field("slots", &self.slots)
            .finish()
    }
}

impl LevelTask {
    /// Runs this level's share of the next callback (see [`Convolver::take_level_tasks`] for
    /// when).
    pub fn run(&mut self) {
        // Acquire: pairs with `process`'s release of the count (its input and its post).
        let t = self.callback.load(Ordering::Acquire);
        let slots = self.slots as u64;
        let (slot, period) = ((t % slots) as usize, t / slots);
        // A callback of this period went by without its share (the host skipped this task):
        // the step in flight lacks a part of its work, so it must not be handed back as done.
        // Its remaining shares are skipped; `collect` counts it late at the period's end and
        // the next period gives the job back (the abandon path of the shares).
        if t > self.next_callback && slot > 0 {
            self.broken = Some(period);
        }
        self.next_callback = t + 1;
        let slot = (self.broken != Some(period)).then_some(slot);
        // SAFETY: this task is the only one for its cell (handed out once, not `Clone`;
        // `&mut self` keeps it on one thread at a time), so it alone runs the level's shares.
        unsafe { time_distributed_share(&self.cell, &self.schedule, slot, period) };
    }

    /// In the background ([`Mode::Background`]): runs the next piece of the step in flight, if
    /// one is; returns whether it ran anything. Call it whenever a thread of the host is
    /// idle, from one thread at a time per task, and stop calling it when the next block is
    /// due: no piece is much longer than one FFT of the level.
    pub fn run_piece(&mut self) -> bool {
        // Acquire: pairs with `process`'s release of `posted` (the job and its period).
        let posted = self.cell.posted.load(Ordering::Acquire);
        if posted == self.cell.done.load(Ordering::Relaxed) {
            return false;
        }
        // SAFETY: a step is in flight (posted != done), so this task owns the job under the
        // cell's protocol; `&mut self` keeps the task on one thread; one reference.
        let job = unsafe { self.cell.job() };
        let parts = self.cell.level.partitions;
        self.piece = match self.piece {
            Piece::Forward => {
                job.gather(&self.cell.halves);
                job.forward();
                Piece::Mac(0)
            }
            Piece::Mac(p0) => {
                let p1 = (p0 + self.chunk).min(parts);
                job.mac(p0, p1);
                if p1 == parts {
                    Piece::Inverse
                } else {
                    Piece::Mac(p1)
                }
            }
            Piece::Inverse => {
                job.inverse();
                // Release: hands the job (and its output) back to `process`.
                self.cell.done.store(posted, Ordering::Release);
                Piece::Forward
            }
        };
        true
    }

    /// A handle that tells, from any thread and without owning the task, whether a step is
    /// in flight: idle harts look before they claim the task (a claim is a write that every
    /// idle hart would otherwise make on every spin).
    pub fn probe(&self) -> StepProbe {
        StepProbe(self.cell.clone())
    }

    /// How long the longest piece of a background step ([`LevelTask::run_piece`]) takes by
    /// `model`, ns: an FFT of the level, or a range of partitions (cut to about as much).
    pub fn longest_piece_ns(&self, model: &crate::CostModel) -> f64 {
        let level = &self.cell.level;
        let partitions = self.chunk.min(level.partitions) as f64;
        model
            .fft_ns(level)
            .max(partitions * model.mac_partition_ns(level))
    }

    /// The level this task computes.
    pub fn level(&self) -> crate::Level {
        self.cell.level
    }

    /// Callbacks per period of the level: its step is spread over this many runs.
    pub fn slots(&self) -> usize {
        self.slots
    }
}

impl Drop for Convolver {
    fn drop(&mut self) {
        if let Mode::Preemptive(pool) = &self.mode {
            for (i, lv) in self.long.iter().enumerate() {
                pool.unregister(i + 1, &lv.cell);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PoolOptions;

    fn signal(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    fn wait_idle(c: &Convolver) {
        for lv in &c.long {
            while !lv.cell.is_idle() {
                std::thread::sleep(std::time::Duration::from_micros(10));
            }
        }
    }

    /// A worker held back for two periods: one late step is counted; the level is silent for
    /// the two periods whose results were not ready in time; the input of the period whose step
    /// never ran is missing from the level's tail, and everything else is exact (the delay line
    /// stayed aligned and the stale result was not played). The expected output is the direct
    /// convolution sum with exactly those parts taken out.
    #[test]
    fn a_late_step_costs_its_level_two_periods_and_one_input_block_nothing_more() {
        let ir = signal(2000, 1);
        let plan = Plan::with_sizes(32, ir.len(), &[128]).unwrap(); // level 1: 4 callbacks a period
        let (n1, off1) = (plan.levels[1].size, plan.levels[1].offset);
        let pool = Arc::new(
            Pool::new(PoolOptions {
                hart: None,
                top_priority: None,
                levels: 1,
            })
            .unwrap(),
        );
        let mut c =
            Convolver::new(&ir, &plan, Mode::Preemptive(pool.clone()), WhenLate::Drop).unwrap();
        let x = signal(32 * 400, 2);
        // Held from callback 80 to 88 (inclusive): the step started at the end of level period 20 is not
        // done by the end of 21 (late), so no step starts for period 21's input.
        let (stall_from, stall_to) = (80, 88);
        let mut guard = None;
        let mut y = vec![0.0f32; x.len()];
        for (t, (block, out)) in x.chunks_exact(32).zip(y.chunks_exact_mut(32)).enumerate() {
            if t == stall_from {
                guard = Some(pool.hold(1));
            }
            c.process(block, out);
            if t == stall_to {
                // Released once period 22 has begun: the late step reads its window after
                // the older half started to be refilled.
                guard = None;
            }
            if guard.is_none() {
                wait_idle(&c);
            }
        }
        assert_eq!(c.late(), 1);
        // In overlap-save, output period r gets from partition j the spectrum of input window
        // r - 2 - j. Window 20's step ran after its older half was being refilled (silence
        // instead), window 21's never ran; periods 22 and 23 had no result in time.
        let (lost, silent) = ([20u64, 21], [22u64, 23]);
        for n in 0..x.len() {
            let period = (n / n1) as u64;
            let kept = |k: usize| {
                if k < off1 {
                    return true;
                }
                let window = period as i64 - 2 - ((k - off1) / n1) as i64;
                !silent.contains(&period) && !lost.iter().any(|&w| w as i64 == window)
            };
            let want: f64 = (0..ir.len().min(n + 1))
                .filter(|&k| kept(k))
                .map(|k| f64::from(x[n - k]) * f64::from(ir[k]))
                .sum();
            assert!(
                (f64::from(y[n]) - want).abs() < 1e-3,
                "sample {n} (level period {period}): {} vs {want}",
                y[n]
            );
        }
    }
}
