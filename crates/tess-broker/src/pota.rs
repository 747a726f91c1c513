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
//! Worked example: target 30 fps, `a = 0`, `b = 100` fps per hart (the cell would do 100 fps on a
//! whole hart), `p = 0.5`, currently `r = 0.2` and measured 20 fps: `e = 10`, `r^ = 0.2 + 0.5 /
//! 100 * 10 = 0.25`, next measurement 25 fps, `e = 5`, `r^ = 0.275`, ... halving the error each
//! period towards `r = 0.3`.

/// How a POTA controller behaves.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PotaConfig {
    /// Closed-loop pole `p`, in (0, 1).
    pub pole: f64,
    /// Smallest share ever applied (harts; 0.1 = a tenth of one hart).
    pub floor: f64,
    /// Largest share ever applied.
    pub ceiling: f64,
    /// Changes smaller than this are not applied (hysteresis), in harts.
    pub min_step: f64,
    /// RLS forgetting factor `lambda` in (0, 1]: how fast old samples are forgotten.
    pub forgetting: f64,
}

impl Default for PotaConfig {
    fn default() -> Self {
        PotaConfig {
            pole: 0.5,
            floor: 0.05,
            ceiling: 1.0,
            min_step: 0.01,
            forgetting: 0.9,
        }
    }
}

impl PotaConfig {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.pole > 0.0 && self.pole < 1.0) {
            return Err(format!("pole {} is not in (0, 1)", self.pole));
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
        if !(self.forgetting > 0.0 && self.forgetting <= 1.0) {
            return Err(format!("forgetting {} is not in (0, 1]", self.forgetting));
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
    /// `target - measured`.
    pub error: f64,
}

/// A POTA controller for one cell.
#[derive(Debug, Clone)]
pub struct Pota {
    cfg: PotaConfig,
    target: f64,
    rls: Rls2,
    share: f64,
    last_rate: Option<f64>,
    last_error: f64,
    /// Whether the estimates are learned online (off: fixed `a`, `b`, for tests).
    learn: bool,
}

/// Smallest `b` the controller divides by (fps per hart): an early or noisy estimate near zero
/// would otherwise ask for an absurd step.
const B_MIN: f64 = 1e-3;

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
            last_error: 0.0,
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

    /// The target rate.
    pub fn target(&self) -> f64 {
        self.target
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
        };
        if !(rate.is_finite() && rate >= 0.0) {
            return hold(Reason::BadMeasurement, 0.0);
        }
        let error = self.target - rate;
        let Some(prev_rate) = self.last_rate else {
            self.last_rate = Some(rate);
            self.last_error = error;
            // A first step from the linear guess: no history for the PI law yet.
            let b = self.rls.theta[1].max(B_MIN);
            let wanted = self.share + (1.0 - self.cfg.pole) / b * error;
            return self.apply(wanted, error, Reason::Learning);
        };
        if self.learn {
            self.rls.update([prev_rate, self.share], rate);
        }
        // Keep the estimates physical: throughput has at most "memory" below 1 (a stable
        // workload) and grows with CPU (b > 0).
        let a = self.rls.theta[0].clamp(0.0, 0.95);
        let b = self.rls.theta[1].max(B_MIN);
        let gain = (1.0 - self.cfg.pole) / b;
        let wanted = self.share + gain * error - a * gain * self.last_error;
        self.last_rate = Some(rate);
        self.last_error = error;
        let reason = if wanted > self.share {
            Reason::Raise
        } else {
            Reason::Lower
        };
        self.apply(wanted, error, reason)
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
        let changed = (clamped - self.share).abs() >= self.cfg.min_step.max(f64::EPSILON);
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

    fn cfg() -> PotaConfig {
        PotaConfig {
            pole: 0.5,
            floor: 0.0,
            ceiling: 10.0,
            min_step: 0.0,
            forgetting: 1.0,
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
            let c = PotaConfig { pole, ..cfg() };
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
        let c = PotaConfig { pole: p, ..cfg() };
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
        for _ in 0..40 {
            let rate = plant.step(pota.share());
            pota.step(rate);
        }
        assert!((plant.t - 30.0).abs() < 0.3, "light phase: {}", plant.t);
        // share for 30 fps: t = a t + b r -> r = 30 (1 - a) / b.
        assert!((pota.share() - 30.0 * 0.8 / 120.0).abs() < 0.01);
        plant.b = 40.0; // heavy phase: three times the CPU per frame
        for _ in 0..40 {
            let rate = plant.step(pota.share());
            pota.step(rate);
        }
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
}
