//! POTA, PerfOrmance-To-Allocation (seed 004 section 5.2; Sironi, Sciuto, Santambrogio, "A
//! performance-aware quality of service-driven scheduler for multicore processors", SIGBED
//! Review 2014): a feedback controller that gives a cell just enough CPU for its target rate.
//!
//! Model, with `t(k)` the cell's throughput (units per second, from its heartbeats) measured over
//! the decision period ending at step `k`, and `r(k)` its CPU share during the next period:
//!
//! ```text
//!   t(k+1) = a t(k) + b r(k)                               (a: workload memory, b: scalability)
//! ```
//!
//! `a` and `b` are estimated online by recursive least squares with forgetting factor `lambda`
//! (regressor `phi = [t(k), r(k)]`, output `t(k+1)`):
//!
//! ```text
//!   K     = P phi / (lambda + phi' P phi)
//!   theta = theta + K (t(k+1) - phi' theta)
//!   P     = (P - K phi' P) / lambda
//! ```
//!
//! The PI controller, with `e(k) = target - t(k)` and pole `p` in (0, 1):
//!
//! ```text
//!   r^(k) = r(k-1) + (1-p)/b e(k) - a (1-p)/b e(k-1)
//! ```
//!
//! With the true `a` and `b` the closed loop obeys `e(k+1) = (a+p) e(k) - a p e(k-1)`, poles `a`
//! and `p`: the error decays like `p^k` (for `a = 0`, exactly `e(k+1) = p e(k)`). A small `p`
//! reacts fast and follows noise; a large one is smooth and slow (docs/broker.md).
//!
//! The applied share is `r^` clamped to the cell's floor and ceiling, and left unchanged when it
//! moves by less than `min_step` (hysteresis: no transaction for noise). The controller is in
//! velocity form and always continues from the share actually applied, so a clamped step does
//! not wind up.
//!
//! Four additions keep the model and the law as they are and make the controller hold a target
//! rather than hover on it (docs/broker.md, "Holding a target"):
//!
//! - the law's error is taken against a **setpoint with headroom**, `target (1 + h)`, `h =
//!   max(margin, z s)` capped at `max_margin`, `s` the running RMS of the model's relative
//!   one-step prediction error (the noise the controller cannot foresee);
//! - the share is **raised with `pole` and lowered with `lower_pole`** (slower): a period below
//!   target is a miss, one above it only costs reserve;
//! - the model's **first guess is the first measurement** (`a = 0`, `b = t / r`), and a period
//!   predicted more than [`PHASE_CHANGE`] off **restarts** the model on the same kind of guess,
//!   with `a` held near 0 and `b` free, so the next step uses the new phase's gain;
//! - a period predicted within [`DEAD_ZONE`] is **not learned from**, so the estimates do not
//!   drift under feedback (where the share and the rate move together and cannot tell `a`
//!   from `b`).
//!
//! Worked example: target 30 fps, `a = 0`, `b = 100` fps per hart (the cell would do 100 fps on a
//! whole hart), `p = 0.5`, currently `r = 0.2` and measured 20 fps: `e = 10`, `r^ = 0.2 + 0.5 /
//! 100 * 10 = 0.25`, next measurement 25 fps, `e = 5`, `r^ = 0.275`, ... halving the error each
//! period towards `r = 0.3`.

/// How a POTA controller behaves.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PotaConfig {
    /// Closed-loop pole `p`, in (0, 1), used when the law raises the share.
    pub pole: f64,
    /// Pole used when the law lowers the share, in [`pole`](Self::pole), 1): giving CPU back
    /// is slower than taking it, because a period below target is a miss and one above it only
    /// costs reserve.
    pub lower_pole: f64,
    /// Smallest share ever applied (harts; 0.1 = a tenth of one hart).
    pub floor: f64,
    /// Largest share ever applied.
    pub ceiling: f64,
    /// Changes smaller than this are not applied (hysteresis), in harts.
    pub min_step: f64,
    /// A lowering smaller than this fraction of the share in force is not applied (hysteresis
    /// on the way down only): every change of a window is a transaction and a re-split of the
    /// cell's budget among its threads, and a cell can stall for a period after one, so the
    /// share is given back in fewer, larger steps. 0: only `min_step`.
    pub lower_step: f64,
    /// RLS forgetting factor `lambda` in (0, 1]: how fast old samples are forgotten.
    pub forgetting: f64,
    /// Setpoint headroom always kept above the target, as a fraction of it (0.1: aim at 110%).
    pub margin: f64,
    /// Headroom per unit of measured noise: the setpoint is `target (1 + max(margin, z s))`,
    /// `s` the running RMS of the model's relative one-step prediction error
    /// (0: no noise-based headroom).
    pub noise_z: f64,
    /// Largest headroom, as a fraction of the target.
    pub max_margin: f64,
}

impl Default for PotaConfig {
    fn default() -> Self {
        PotaConfig {
            pole: 0.5,
            lower_pole: 0.8,
            floor: 0.05,
            ceiling: 1.0,
            min_step: 0.01,
            lower_step: 0.05,
            forgetting: 0.9,
            margin: 0.05,
            noise_z: 2.0,
            max_margin: 0.5,
        }
    }
}

impl PotaConfig {
    /// The paper's controller as written: one pole both ways, setpoint exactly at the target.
    pub fn plain(pole: f64) -> PotaConfig {
        PotaConfig {
            pole,
            lower_pole: pole,
            lower_step: 0.0,
            margin: 0.0,
            noise_z: 0.0,
            max_margin: 0.0,
            ..PotaConfig::default()
        }
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.pole > 0.0 && self.pole < 1.0) {
            return Err(format!("pole {} is not in (0, 1)", self.pole));
        }
        if !(self.lower_pole >= self.pole && self.lower_pole < 1.0) {
            return Err(format!(
                "lower pole {} is not in [pole {}, 1)",
                self.lower_pole, self.pole
            ));
        }
        if !(self.floor >= 0.0 && self.floor <= self.ceiling && self.ceiling.is_finite()) {
            return Err(format!(
                "floor {} and ceiling {} do not satisfy 0 <= floor <= ceiling",
                self.floor, self.ceiling
            ));
        }
        if !(self.min_step >= 0.0 && self.min_step.is_finite()) {
            return Err(format!(
                "min_step {} is not a non-negative number",
                self.min_step
            ));
        }
        if !(self.lower_step >= 0.0 && self.lower_step < 1.0) {
            return Err(format!("lower step {} is not in [0, 1)", self.lower_step));
        }
        if !(self.forgetting > 0.0 && self.forgetting <= 1.0) {
            return Err(format!("forgetting {} is not in (0, 1]", self.forgetting));
        }
        if !(self.margin >= 0.0
            && self.noise_z >= 0.0
            && self.noise_z.is_finite()
            && self.max_margin >= self.margin
            && self.max_margin <= 10.0)
        {
            return Err(format!(
                "margin {}, noise z {}, max margin {}: need 0 <= margin <= max margin <= 10, z >= 0",
                self.margin, self.noise_z, self.max_margin
            ));
        }
        Ok(())
    }
}

/// Recursive least squares for `y = theta' phi` with two parameters.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Rls2 {
    /// Current estimate `[a, b]`.
    pub theta: [f64; 2],
    /// Covariance.
    p: [[f64; 2]; 2],
    lambda: f64,
}

/// The covariance is reset to this scale when it grows past [`P_MAX`] (no excitation under
/// forgetting makes it grow without bound: "covariance wind-up").
const P_INIT: f64 = 1e3;
const P_MAX: f64 = 1e6;
/// Variance of `a` after a restart on a one-point guess (`a = 0`): small, so that the next
/// periods' errors move `b`, the gain that changed, rather than `a` (the regressor of `a` is a
/// rate, tens to hundreds of times the share that multiplies `b`, so with equal variances an
/// update would move `a` almost alone). Forgetting lets it grow again if the cell has memory.
const P_A_RESTART: f64 = 1e-4;

impl Rls2 {
    /// Starts from `theta0` with a large covariance (little confidence).
    pub fn new(theta0: [f64; 2], lambda: f64) -> Rls2 {
        Rls2 {
            theta: theta0,
            p: [[P_INIT, 0.0], [0.0, P_INIT]],
            lambda,
        }
    }

    /// One sample: regressor `phi`, output `y`.
    pub fn update(&mut self, phi: [f64; 2], y: f64) {
        if !(phi.iter().all(|x| x.is_finite()) && y.is_finite()) {
            return;
        }
        let p = self.p;
        let pphi = [
            p[0][0] * phi[0] + p[0][1] * phi[1],
            p[1][0] * phi[0] + p[1][1] * phi[1],
        ];
        let denom = self.lambda + phi[0] * pphi[0] + phi[1] * pphi[1];
        if denom <= 0.0 || !denom.is_finite() {
            return;
        }
        let k = [pphi[0] / denom, pphi[1] / denom];
        let err = y - (self.theta[0] * phi[0] + self.theta[1] * phi[1]);
        self.theta = [self.theta[0] + k[0] * err, self.theta[1] + k[1] * err];
        // P = (P - K phi' P) / lambda; phi' P = pphi' because P is symmetric.
        let mut np = [[0.0; 2]; 2];
        for (i, row) in np.iter_mut().enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                *x = (p[i][j] - k[i] * pphi[j]) / self.lambda;
            }
        }
        // Keep it symmetric against rounding.
        let off = 0.5 * (np[0][1] + np[1][0]);
        np[0][1] = off;
        np[1][0] = off;
        if np[0][0] + np[1][1] > P_MAX || !np.iter().flatten().all(|x| x.is_finite()) {
            np = [[P_INIT, 0.0], [0.0, P_INIT]];
        }
        self.p = np;
    }

    /// Starts again from `theta`, confident in the first parameter (variance `p_first`) and
    /// not at all in the second (variance back to the initial scale): the plant's gain changed.
    pub fn restart(&mut self, theta: [f64; 2], p_first: f64) {
        self.theta = theta;
        self.p = [[p_first, 0.0], [0.0, P_INIT]];
    }
}

/// Why the share is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// First measurement: the model has nothing to learn from yet.
    Learning,
    /// Below target: more CPU.
    Raise,
    /// Above target: less CPU.
    Lower,
    /// The change would be smaller than the hysteresis step.
    Hold,
    /// Wants more than the ceiling (the target cannot be met within it).
    AtCeiling,
    /// Wants less than the floor.
    AtFloor,
    /// The measurement was not a finite non-negative rate: ignored.
    BadMeasurement,
}

/// One controller step's outcome.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Decision {
    /// The share to apply from now on (harts).
    pub share: f64,
    /// What the controller asked for before clamping and hysteresis.
    pub wanted: f64,
    /// Whether `share` differs from the previous share.
    pub changed: bool,
    /// Why.
    pub reason: Reason,
    /// Model estimate `a` used.
    pub a: f64,
    /// Model estimate `b` used.
    pub b: f64,
    /// `setpoint - measured`.
    pub error: f64,
    /// The rate aimed at: the target plus the headroom in force.
    pub setpoint: f64,
}

/// A POTA controller for one cell.
#[derive(Debug, Clone)]
pub struct Pota {
    cfg: PotaConfig,
    target: f64,
    rls: Rls2,
    share: f64,
    last_rate: Option<f64>,
    /// Running mean square of the model's relative one-step prediction error.
    noise: f64,
    /// Whether the estimates are learned online (off: fixed `a`, `b`, for tests).
    learn: bool,
}

/// Smallest `b` the controller divides by (fps per hart): an early or noisy estimate near zero
/// would otherwise ask for an absurd step.
const B_MIN: f64 = 1e-3;

/// Weight of the newest period in the running noise estimate (about the last ten periods).
const NOISE_WEIGHT: f64 = 0.1;
/// One period's prediction error counts at most this much of the target in the noise estimate,
/// so that one stall (a period with almost no progress) cannot by itself ask for the largest
/// headroom.
const NOISE_CLIP: f64 = 0.5;
/// A period the model predicted this well (relative) teaches it nothing it can tell from noise
/// (a 30 fps rate over 1 s moves by a frame, 3%, on its own): the RLS step is skipped (a dead
/// zone). Under feedback the share and the rate move together, so such steps cannot tell `a`
/// from `b` and would let them drift, `a` towards 1 and `b` towards 0, until the gain `(1-p)/b`
/// is large enough to throw the share from ceiling to floor.
pub const DEAD_ZONE: f64 = 0.05;
/// A period whose rate is this far (relative) from the model's prediction is a change of phase,
/// not noise: the model restarts from it at once instead of being pulled towards it by the RLS
/// step (which, with little excitation, would take several periods and blame `a` as much as
/// `b`).
pub const PHASE_CHANGE: f64 = 0.3;

impl Pota {
    /// A controller for `target` units per second, starting at `share` (clamped to the floor
    /// and ceiling) with the guess that the cell scales linearly: `a = 0`, `b = target /
    /// share`-ish, learned from the first measurements on.
    pub fn new(cfg: PotaConfig, target: f64, share: f64) -> Pota {
        let share = share.clamp(cfg.floor, cfg.ceiling);
        let b0 = if share > 0.0 {
            target / share.max(1e-3)
        } else {
            target
        };
        Pota {
            cfg,
            target,
            rls: Rls2::new([0.0, b0.max(B_MIN)], cfg.forgetting),
            share,
            last_rate: None,
            noise: 0.0,
            learn: true,
        }
    }

    /// A controller with fixed model parameters (no learning).
    pub fn with_model(cfg: PotaConfig, target: f64, share: f64, a: f64, b: f64) -> Pota {
        let mut p = Pota::new(cfg, target, share);
        p.rls.theta = [a, b];
        p.learn = false;
        p
    }

    /// Changes the target rate.
    pub fn set_target(&mut self, target: f64) {
        self.target = target;
    }

    /// Changes the floor and ceiling (a manifest applied again); the next step keeps to them.
    pub fn set_limits(&mut self, floor: f64, ceiling: f64) {
        self.cfg.floor = floor.min(ceiling);
        self.cfg.ceiling = ceiling;
    }

    /// The target rate.
    pub fn target(&self) -> f64 {
        self.target
    }

    /// The measured noise: RMS of the model's relative one-step prediction error.
    pub fn noise(&self) -> f64 {
        self.noise.sqrt()
    }

    /// The headroom in force, as a fraction of the target: `max(margin, z noise)`, at most
    /// `max_margin`.
    pub fn headroom(&self) -> f64 {
        (self.cfg.noise_z * self.noise())
            .max(self.cfg.margin)
            .min(self.cfg.max_margin)
    }

    /// The rate the controller aims at: `target (1 + headroom)`.
    pub fn setpoint(&self) -> f64 {
        self.target * (1.0 + self.headroom())
    }

    /// The share in force.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// The model estimates `[a, b]`.
    pub fn model(&self) -> [f64; 2] {
        self.rls.theta
    }

    /// The allocation actually in force changed outside the controller (the broker could not
    /// apply a decision, or someone resized the cell): continue from it.
    pub fn force_share(&mut self, share: f64) {
        self.share = share;
    }

    /// One decision period ended with `rate` units per second measured, produced under the
    /// share in force. Returns the share for the next period.
    pub fn step(&mut self, rate: f64) -> Decision {
        let hold = |reason, error| Decision {
            share: self.share,
            wanted: self.share,
            changed: false,
            reason,
            a: self.rls.theta[0],
            b: self.rls.theta[1],
            error,
            setpoint: self.setpoint(),
        };
        if !(rate.is_finite() && rate >= 0.0) {
            return hold(Reason::BadMeasurement, 0.0);
        }
        let Some(prev_rate) = self.last_rate else {
            self.last_rate = Some(rate);
            // No history for the PI law yet. The first measurement is the best guess of `b`
            // there is: the cell's rate per hart under the share in force (a linear cell,
            // `a = 0`); the prior `target / share` can be off by any factor.
            if self.learn && rate > 0.0 && self.share > 0.0 {
                self.rls.restart([0.0, rate / self.share], P_A_RESTART);
            }
            let error = self.setpoint() - rate;
            let b = self.rls.theta[1].max(B_MIN);
            let wanted = self.share + (1.0 - self.pole_for(error)) / b * error;
            return self.apply(wanted, error, Reason::Learning);
        };
        // The model's one-step prediction error, before it learns from this period: what the
        // controller could not foresee, i.e. the noise the headroom must cover.
        // Relative to the larger of prediction and measurement (a rate's noise scales with
        // the rate; bounded by 1 whatever the model says).
        let [a0, b0] = self.rls.theta;
        let predicted = a0 * prev_rate + b0 * self.share;
        let surprise = (rate - predicted) / predicted.max(rate).max(1e-9);
        if surprise.is_finite() {
            let s = surprise.clamp(-NOISE_CLIP, NOISE_CLIP);
            self.noise = (1.0 - NOISE_WEIGHT) * self.noise + NOISE_WEIGHT * s * s;
        }
        if self.learn {
            if surprise.abs() > PHASE_CHANGE && self.share > 0.0 {
                // A new phase (or a new regime of the cell): what was learned describes the old
                // one. Start again from the same one-point guess as the first period (a linear
                // cell through this period's rate: `a = 0`, `b = t(k) / r(k-1)`), so the next
                // step aims at the setpoint under the new gain at once.
                self.rls
                    .restart([0.0, (rate / self.share).max(B_MIN)], P_A_RESTART);
            } else if surprise.abs() > DEAD_ZONE {
                self.rls.update([prev_rate, self.share], rate);
            }
        }
        // Keep the estimates physical: throughput has at most "memory" below 1 (a stable
        // workload) and grows with CPU (b > 0).
        let a = self.rls.theta[0].clamp(0.0, 0.95);
        let b = self.rls.theta[1].max(B_MIN);
        let setpoint = self.setpoint();
        let error = setpoint - rate;
        let last_error = setpoint - prev_rate;
        // The paper's law with the pole of the direction it moves in.
        let pole = self.pole_for(error - a * last_error);
        let gain = (1.0 - pole) / b;
        let wanted = self.share + gain * error - a * gain * last_error;
        self.last_rate = Some(rate);
        let reason = if wanted > self.share {
            Reason::Raise
        } else {
            Reason::Lower
        };
        self.apply(wanted, error, reason)
    }

    /// The pole for a step whose sign is that of `drive` (the PI law's bracket, `e(k) - a
    /// e(k-1)`): `pole` to raise, `lower_pole` to lower.
    fn pole_for(&self, drive: f64) -> f64 {
        if drive >= 0.0 {
            self.cfg.pole
        } else {
            self.cfg.lower_pole
        }
    }

    fn apply(&mut self, wanted: f64, error: f64, reason: Reason) -> Decision {
        let wanted = if wanted.is_finite() {
            wanted
        } else {
            self.share
        };
        let clamped = wanted.clamp(self.cfg.floor, self.cfg.ceiling);
        let reason = if wanted > self.cfg.ceiling {
            Reason::AtCeiling
        } else if wanted < self.cfg.floor {
            Reason::AtFloor
        } else {
            reason
        };
        let step = if clamped < self.share {
            self.cfg.min_step.max(self.cfg.lower_step * self.share)
        } else {
            self.cfg.min_step
        };
        let changed = (clamped - self.share).abs() >= step.max(f64::EPSILON);
        let reason = if !changed && matches!(reason, Reason::Raise | Reason::Lower) {
            Reason::Hold
        } else {
            reason
        };
        if changed {
            self.share = clamped;
        }
        Decision {
            share: self.share,
            wanted,
            changed,
            reason,
            a: self.rls.theta[0],
            b: self.rls.theta[1],
            error,
            setpoint: self.setpoint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plant of the model: `t(k+1) = a t(k) + b r(k)`.
    struct Plant {
        a: f64,
        b: f64,
        t: f64,
    }
    impl Plant {
        fn step(&mut self, r: f64) -> f64 {
            self.t = self.a * self.t + self.b * r;
            self.t
        }
    }

    /// Closes the loop for `periods` decision periods: the plant runs at the share in force,
    /// the controller sees the rate.
    fn run(pota: &mut Pota, plant: &mut Plant, periods: usize) {
        for _ in 0..periods {
            let rate = plant.step(pota.share());
            pota.step(rate);
        }
    }

    /// The paper's law as written (one pole, setpoint at the target), wide limits.
    fn cfg() -> PotaConfig {
        PotaConfig {
            floor: 0.0,
            ceiling: 10.0,
            min_step: 0.0,
            forgetting: 1.0,
            ..PotaConfig::plain(0.5)
        }
    }

    #[test]
    fn rls_identifies_a_and_b_from_exciting_input() {
        let mut rls = Rls2::new([0.0, 1.0], 1.0);
        let mut plant = Plant {
            a: 0.3,
            b: 50.0,
            t: 0.0,
        };
        let mut t = 0.0;
        for k in 0..500 {
            let r = 0.2 + 0.1 * ((k * 7 % 5) as f64);
            let next = plant.step(r);
            rls.update([t, r], next);
            t = next;
        }
        // The prior (theta0 with covariance 1e3) fades as 1/k without forgetting.
        assert!((rls.theta[0] - 0.3).abs() < 1e-4, "{:?}", rls.theta);
        assert!((rls.theta[1] - 50.0).abs() < 1e-2, "{:?}", rls.theta);
    }

    #[test]
    fn with_the_true_model_the_error_shrinks_by_the_pole_each_step() {
        // a = 0: the closed loop is exactly e(k+1) = p e(k).
        for pole in [0.2, 0.5, 0.8] {
            let c = PotaConfig {
                pole,
                lower_pole: pole,
                ..cfg()
            };
            let mut pota = Pota::with_model(c, 30.0, 0.1, 0.0, 100.0);
            let mut plant = Plant {
                a: 0.0,
                b: 100.0,
                t: 0.0,
            };
            let mut rate = plant.step(pota.share());
            let mut e_prev = 30.0 - rate;
            pota.step(rate); // first step (Learning) uses the same law with a = 0
            for _ in 0..15 {
                rate = plant.step(pota.share());
                let e = 30.0 - rate;
                assert!(
                    (e - pole * e_prev).abs() < 1e-9,
                    "pole {pole}: {e} vs {}",
                    pole * e_prev
                );
                e_prev = e;
                pota.step(rate);
            }
        }
    }

    #[test]
    fn with_memory_the_error_follows_the_two_pole_recurrence() {
        let (a, b, p) = (0.4, 80.0, 0.6);
        let c = PotaConfig {
            pole: p,
            lower_pole: p,
            ..cfg()
        };
        let mut pota = Pota::with_model(c, 30.0, 0.1, a, b);
        let mut plant = Plant { a, b, t: 10.0 };
        let mut errors = Vec::new();
        for _ in 0..20 {
            let rate = plant.step(pota.share());
            errors.push(30.0 - rate);
            pota.step(rate);
        }
        // From the second PI step on: e(k+1) = (a+p) e(k) - a p e(k-1).
        for k in 2..errors.len() - 1 {
            let predicted = (a + p) * errors[k] - a * p * errors[k - 1];
            assert!((errors[k + 1] - predicted).abs() < 1e-9, "step {k}");
        }
        assert!(errors.last().unwrap().abs() < 1e-3);
    }

    #[test]
    fn learning_converges_on_an_unknown_plant_and_after_a_phase_change() {
        let c = PotaConfig {
            forgetting: 0.8,
            ..cfg()
        };
        let mut pota = Pota::new(c, 30.0, 0.5);
        let mut plant = Plant {
            a: 0.2,
            b: 120.0,
            t: 0.0,
        };
        run(&mut pota, &mut plant, 40);
        assert!((plant.t - 30.0).abs() < 0.3, "light phase: {}", plant.t);
        // share for 30 fps: t = a t + b r -> r = 30 (1 - a) / b.
        assert!((pota.share() - 30.0 * 0.8 / 120.0).abs() < 0.01);
        plant.b = 40.0; // heavy phase: three times the CPU per frame
        run(&mut pota, &mut plant, 40);
        assert!((plant.t - 30.0).abs() < 0.3, "heavy phase: {}", plant.t);
        assert!((pota.share() - 30.0 * 0.8 / 40.0).abs() < 0.02);
    }

    #[test]
    fn an_unreachable_target_saturates_at_the_ceiling_and_a_tiny_one_at_the_floor() {
        let c = PotaConfig {
            floor: 0.1,
            ceiling: 0.5,
            ..cfg()
        };
        let mut pota = Pota::with_model(c, 1000.0, 0.2, 0.0, 100.0);
        let mut plant = Plant {
            a: 0.0,
            b: 100.0,
            t: 0.0,
        };
        let mut last = None;
        for _ in 0..10 {
            last = Some(pota.step(plant.step(pota.share())));
        }
        let d = last.unwrap();
        assert_eq!(d.share, 0.5);
        assert_eq!(d.reason, Reason::AtCeiling);
        assert!(d.wanted > 0.5);
        let mut pota = Pota::with_model(c, 1.0, 0.2, 0.0, 100.0);
        for _ in 0..10 {
            last = Some(pota.step(plant.step(pota.share())));
        }
        let d = last.unwrap();
        assert_eq!((d.share, d.reason), (0.1, Reason::AtFloor));
    }

    #[test]
    fn changes_below_the_hysteresis_step_are_not_applied() {
        let c = PotaConfig {
            min_step: 0.05,
            ..cfg()
        };
        let mut pota = Pota::with_model(c, 30.0, 0.3, 0.0, 100.0);
        // 29 fps: wants 0.3 + 0.5/100 = 0.305, within the step.
        let d = pota.step(29.0);
        assert!(!d.changed);
        assert_eq!(d.share, 0.3);
        let d = pota.step(29.0);
        assert_eq!(d.reason, Reason::Hold);
        // 10 fps: wants 0.4, applied.
        let d = pota.step(10.0);
        assert!(d.changed);
        assert!((d.share - 0.4).abs() < 1e-9);
    }

    #[test]
    fn bad_measurements_change_nothing() {
        let mut pota = Pota::new(cfg(), 30.0, 0.3);
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let d = pota.step(bad);
            assert_eq!(
                (d.share, d.changed, d.reason),
                (0.3, false, Reason::BadMeasurement)
            );
        }
        assert!(PotaConfig { pole: 1.0, ..cfg() }.validate().is_err());
        assert!(PotaConfig {
            floor: 2.0,
            ceiling: 1.0,
            ..cfg()
        }
        .validate()
        .is_err());
        assert!(cfg().validate().is_ok());
    }

    /// The bench-style controller: headroom, asymmetric poles.
    fn headroom_cfg() -> PotaConfig {
        PotaConfig {
            pole: 0.3,
            lower_pole: 0.7,
            margin: 0.1,
            noise_z: 2.0,
            max_margin: 0.5,
            ..cfg()
        }
    }

    #[test]
    fn the_setpoint_keeps_the_margin_above_the_target() {
        let mut pota = Pota::with_model(headroom_cfg(), 30.0, 0.1, 0.0, 100.0);
        let mut plant = Plant {
            a: 0.0,
            b: 100.0,
            t: 0.0,
        };
        for _ in 0..40 {
            let rate = plant.step(pota.share());
            let d = pota.step(rate);
            assert!(d.setpoint >= 33.0 - 1e-9);
        }
        // A noiseless plant the model predicts exactly: the headroom is the margin.
        assert!(pota.noise() < 1e-6, "{}", pota.noise());
        assert!((pota.headroom() - 0.1).abs() < 1e-9);
        assert!((plant.t - 33.0).abs() < 1e-3, "{}", plant.t);
        assert!((pota.share() - 0.33).abs() < 1e-5);
        // The plain law (the paper's) still aims at the target itself.
        assert_eq!(Pota::new(cfg(), 30.0, 0.3).setpoint(), 30.0);
    }

    #[test]
    fn measured_noise_raises_the_headroom_up_to_its_cap_and_it_decays_when_quiet() {
        let mut pota = Pota::with_model(headroom_cfg(), 30.0, 0.33, 0.0, 100.0);
        // The rate wobbles by +-20% around what the share gives.
        for k in 0..30 {
            let wobble = if k % 2 == 0 { 1.2 } else { 0.8 };
            pota.step(100.0 * pota.share() * wobble);
        }
        let noisy = pota.headroom();
        assert!(noisy > 0.3 && noisy <= 0.5, "headroom {noisy}");
        assert!(pota.setpoint() > 30.0 * 1.3);
        // A huge wobble is capped.
        for k in 0..30 {
            let wobble = if k % 2 == 0 { 3.0 } else { 0.1 };
            pota.step(100.0 * pota.share() * wobble);
        }
        assert_eq!(pota.headroom(), 0.5);
        // Quiet again: the headroom goes back to the margin.
        for _ in 0..200 {
            pota.step(100.0 * pota.share());
        }
        assert!((pota.headroom() - 0.1).abs() < 1e-3, "{}", pota.headroom());
    }

    #[test]
    fn the_share_is_raised_with_the_pole_and_lowered_with_the_lower_pole() {
        let c = PotaConfig {
            margin: 0.0,
            max_margin: 0.0,
            noise_z: 0.0,
            ..headroom_cfg()
        };
        // a = 0: below the setpoint e(k+1) = p e(k), above it e(k+1) = lower_pole e(k).
        let mut pota = Pota::with_model(c, 30.0, 0.1, 0.0, 100.0);
        let d = pota.step(10.0); // 20 below
        assert!((d.share - (0.1 + 0.7 / 100.0 * 20.0)).abs() < 1e-12);
        let mut pota = Pota::with_model(c, 30.0, 0.9, 0.0, 100.0);
        let d = pota.step(90.0); // 60 above
        assert!((d.share - (0.9 - 0.3 / 100.0 * 60.0)).abs() < 1e-12);
        // And through the PI step (not only the first): the error ratio is the pole used.
        let mut plant = Plant {
            a: 0.0,
            b: 100.0,
            t: 0.0,
        };
        let mut pota = Pota::with_model(c, 30.0, 0.9, 0.0, 100.0);
        let mut e_prev = 30.0 - plant.step(pota.share());
        pota.step(plant.t);
        for _ in 0..5 {
            let e = 30.0 - plant.step(pota.share());
            assert!((e - 0.7 * e_prev).abs() < 1e-9, "{e} vs {e_prev}");
            e_prev = e;
            pota.step(plant.t);
        }
        assert!(PotaConfig {
            lower_pole: 0.2,
            ..headroom_cfg()
        }
        .validate()
        .is_err());
        assert!(headroom_cfg().validate().is_ok());
    }

    #[test]
    fn the_first_guess_of_b_is_the_first_measurement() {
        // Starts at 1.8 harts on a cell that does 150 fps per hart: 270 fps measured. The
        // guess target / share (16.7) would ask for 1.8 - 0.5 / 16.7 * 240 < 0: the floor.
        let c = PotaConfig {
            floor: 0.05,
            ..cfg()
        };
        let mut pota = Pota::new(c, 30.0, 1.8);
        let d = pota.step(270.0);
        assert_eq!(d.reason, Reason::Learning);
        assert!((pota.model()[1] - 150.0).abs() < 1e-9);
        assert!((d.share - (1.8 - 0.5 / 150.0 * 240.0)).abs() < 1e-9);
    }

    #[test]
    fn a_phase_change_restarts_the_model_on_the_new_gain() {
        let c = PotaConfig {
            forgetting: 0.9,
            ..headroom_cfg()
        };
        let mut pota = Pota::new(c, 30.0, 0.5);
        let mut plant = Plant {
            a: 0.0,
            b: 120.0,
            t: 0.0,
        };
        run(&mut pota, &mut plant, 30);
        let before = pota.share();
        assert!((plant.t - pota.setpoint()).abs() < 0.5);
        // Heavy phase: a third of the rate per hart. One period shows it, and the model
        // restarts on it: b = t / r exactly, a = 0.
        plant.b = 40.0;
        let rate = plant.step(pota.share());
        let d = pota.step(rate);
        let [a, b] = pota.model();
        assert_eq!(a, 0.0);
        assert!((b - 40.0).abs() < 1e-9, "b {b}");
        // The step from there uses the new gain with the raising pole.
        let want = before + 0.7 / 40.0 * (d.setpoint - rate);
        assert!((d.share - want).abs() < 1e-9, "{} vs {want}", d.share);
        run(&mut pota, &mut plant, 20);
        // The surprise raised the headroom, which decays again: the rate follows the setpoint
        // down, always above the margin.
        assert!(pota.headroom() > 0.1);
        assert!(
            plant.t > 33.0 && (plant.t - pota.setpoint()).abs() < 2.0,
            "{}",
            plant.t
        );
    }

    #[test]
    fn periods_predicted_within_the_dead_zone_do_not_move_the_model() {
        let c = PotaConfig {
            forgetting: 0.9,
            ..headroom_cfg()
        };
        let mut pota = Pota::new(c, 30.0, 0.3);
        pota.step(30.0); // b = 100
        let model = pota.model();
        // The rate wobbles by 2% around what the model predicts: nothing to learn.
        for k in 0..50 {
            let wobble = if k % 2 == 0 { 1.02 } else { 0.98 };
            pota.step(100.0 * pota.share() * wobble);
        }
        assert_eq!(pota.model(), model);
    }

    #[test]
    fn small_lowerings_wait_for_the_lower_step_and_raises_do_not() {
        let c = PotaConfig {
            lower_step: 0.1,
            ..cfg()
        };
        let mut pota = Pota::with_model(c, 30.0, 1.0, 0.0, 100.0);
        // 40 fps: wants 1.0 - 0.5 / 100 * 10 = 0.95, 5% down: held.
        let d = pota.step(40.0);
        assert_eq!((d.share, d.changed), (1.0, false));
        // 60 fps: wants 0.85, 15% down: applied.
        let d = pota.step(60.0);
        assert!(d.changed && (d.share - 0.85).abs() < 1e-9, "{d:?}");
        // 28 fps: wants a 1% raise: applied (only min_step, 0, applies upwards).
        let d = pota.step(28.0);
        assert!(d.changed && d.share > 0.85);
    }
}
