//! PACORA's allocation solved by a primal-dual interior-point method written for its shape:
//! Newton's method on the convex constraints themselves, not a conic lifting (Boyd and
//! Vandenberghe, "Convex Optimization", 2004, section 11.7; a slack for the nonlinear
//! constraint as in Vanderbei and Shanno, "An interior-point algorithm for nonconvex nonlinear
//! programming", 1999; the predictor-corrector step of Mehrotra, SIAM J. Optim. 2(4), 1992).
//!
//! Each resource is scaled to capacity 1 (`b_pr = a_pr / A_r`), the penalty's `max` becomes an
//! epigraph variable `pi_p`, and its nonlinear bound gets a slack `t_p`:
//!
//! ```text
//!   minimise   sum_p pi_p
//!   subject to g_p(b_p) - pi_p + t_p = 0    g_p(b) = c_p + sum_{i<=j} W_pij / sqrt(b_i b_j)
//!              t_p >= 0, pi_p >= 0           c_p = s_p (tau0_p - d_p)
//!              b_pr >= 0                     W_pij = s_p w_pij / sqrt(A_i A_j)
//!              sum_p b_pr = 1                (one row per resource r)
//! ```
//!
//! Glossary: multipliers `lambda_b` (of `b >= 0`), `lambda_pi` (of `pi >= 0`), `lambda_g` (of
//! `t >= 0`); `nu_r` the price of resource `r` (penalty per unit of scaled capacity); `mu` the
//! mean of the products `lambda * slack`, driven to 0; `sigma` the centring weight of a step.
//!
//! **Before iterating.** Capacity is an equality: no response time grows with more resource
//! (`w >= 0`), so what an optimum of `sum_p b_pr <= 1` leaves over can go to any cell without
//! raising the penalty, and both forms have the same optimal value. A resource `r` that no
//! positive `W_pij` of cell `p` involves is worth nothing to `p` (a zero weight, or a zero
//! slope), so `b_pr = 0` at an optimum: those variables are fixed at 0 and left out, and a
//! resource nobody values is split evenly and left out. Every remaining `b_pr` stays positive
//! at the optimum (its cell's response time grows without bound as it shrinks), which keeps
//! the iteration away from degenerate corners.
//!
//! **A step.** With `t` and the multipliers eliminated, each Newton step solves `B dx + E' nu
//! = -q, E dx = -r_pri`: `B` is block diagonal with one dense `(resources + 1)`-square block
//! `B_p` per cell (its allocations and `pi_p`: `lambda_g` times the Hessian of `g_p`, plus
//! `lambda_g / t_p` times `(grad g_p, -1)` squared, plus `lambda_b / b` and `lambda_pi / pi` on
//! the diagonal), and `E` sums each resource over the cells: the cells are coupled only
//! through the `resources` capacity rows. Eliminating `pi_p` leaves `K_p`, `resources` square,
//! whose inverse is `(B_p^-1)_bb`; the Schur complement `S = sum_p K_p^-1` (`resources`
//! square) gives the prices, `S nu = r_pri - sum_p K_p^-1 q_p`, and every cell's step follows,
//! `db_p = -K_p^-1 (q_p + nu)`. A step costs `cells (resources^3 + ...)` for the blocks plus
//! `resources^3` for `S`: linear in cells, cubic in resources, and it allocates nothing. The
//! predictor (`sigma = 0`) and the corrector share the factors.
//!
//! **Step length.** A step goes at most 0.99 of the way to the boundary of every linear bound
//! (`b`, `pi`, the multipliers, `t` as linearised) and, for a cell whose deadline still has
//! slack (`t_p >= pi_p`), also of the true slack `pi_p - g_p(b_p)`: `g` is convex, so the
//! linearised slack overestimates it, and near a deadline (the kink of `max`) it can
//! overestimate it a lot; the exact step to 1% of the slack is a root of a concave function of
//! the step, found by regula falsi. After the step the curvature residual of `g - pi + t = 0`
//! goes into `t` for such a cell and into `pi` for a cell over its deadline, so the iterate
//! satisfies the slack equation again and keeps a precise small slack.
//!
//! **It stops on a certificate, not a heuristic.** For any `lambda >= 0` and `nu`, with `r`
//! the gradient of the Lagrangian at `x` (feasible: `b` on the capacity rows, `pi_p = max(0,
//! g_p(b_p))`) and the optimum `x*` inside the box `0 <= b <= 1`, convexity gives `p* >= L(x,
//! lambda, nu) + min_{z in box} r'(z - x)`. The solver evaluates this bound at the iterate's
//! prices `nu`, with the multipliers that make it tightest per cell (`lambda_pi = 1 -
//! lambda_g`, the best `lambda_g` in `[0, 1]`: a piecewise-linear minimum), so the bound does
//! not inherit the rounding of the iterate's own multipliers. `penalty - p*` over `max(1,
//! penalty)` is [`Solution::duality_gap`]; the solve stops below 1e-9.
//!
//! Worked example (the second test in `pacora::tests`): two cells, one resource of capacity
//! 3, `tau0 = 0, d = 0, s = 1`, weights 1 and 4. The optimum equalises the marginal penalties
//! `w_p / a_p^2` at the price: `a = (1, 2)`, penalty `1/1 + 4/2 = 3` (the even split `(1.5,
//! 1.5)` costs 3.33), price 1 per unit of the resource (`nu = 3` per unit of scaled capacity).

#![allow(clippy::needless_range_loop)] // the loops index several parallel arrays by cell and resource

use super::model::{pairs, weight_count, Problem};
use super::{Solution, SolveError};

/// Stop once the certified gap is below this, relative to `max(1, penalty)`.
const GAP_TOLERANCE: f64 = 1e-9;

/// If the iteration stalls or runs out of steps, the best point seen is still returned if its
/// certified gap is below this (it is feasible and provably this close); else the solve fails.
const ACCEPT_TOLERANCE: f64 = 1e-6;

/// Newton steps before giving up.
const MAX_ITERATIONS: u32 = 100;

/// Fraction of the way to the boundary a step may go.
const TO_BOUNDARY: f64 = 0.99;

/// A step shorter than this is a stall.
const MIN_STEP: f64 = 1e-12;

/// The solver's memory, sized on the first solve and reused: nothing is allocated inside the
/// iteration, and a later solve of a problem no larger allocates only its [`Solution`].
#[derive(Debug, Default)]
pub struct Workspace {
    /// Resources.
    n: usize,
    /// Cells.
    cells: usize,
    /// The pairs `(i, j)` of [`pairs`].
    pair_i: Vec<usize>,
    pair_j: Vec<usize>,
    /// Per cell `c_p`.
    offset: Vec<f64>,
    /// Per cell and pair `W_pij` (`cells * pairs`).
    weight: Vec<f64>,
    /// Per cell and resource: does a positive `W_pij` involve it (`cells * n`)? The others
    /// are fixed.
    active: Vec<bool>,
    /// Number of active allocations (for `mu`).
    active_count: usize,
    /// Per resource: does any cell value it? If not its row is left out of the prices.
    valued: Vec<bool>,
    /// The iterate: scaled allocations (`cells * n`), epigraph variables, slacks,
    /// multipliers, prices.
    b: Vec<f64>,
    pi: Vec<f64>,
    t: Vec<f64>,
    lam_b: Vec<f64>,
    lam_pi: Vec<f64>,
    lam_g: Vec<f64>,
    nu: Vec<f64>,
    /// At `b`: `g_p`, its gradient (`cells * n`) and Hessian (`cells * n * n`), `1 / b`.
    g: Vec<f64>,
    grad: Vec<f64>,
    hess: Vec<f64>,
    inv_b: Vec<f64>,
    /// Per cell `K_p^-1` (`cells * n * n`); `lambda_g / t`, `1 / beta` (the eliminated
    /// `pi_p` pivot), `1 / t` and `1 / pi`.
    kinv: Vec<f64>,
    coupling: Vec<f64>,
    inv_beta: Vec<f64>,
    inv_t: Vec<f64>,
    inv_pi: Vec<f64>,
    /// Cholesky factor of the Schur complement (`n * n`) and the prices it solves for.
    schur: Vec<f64>,
    nu_new: Vec<f64>,
    /// A step: `dx` (`cells * (n + 1)`, allocations then `pi`), `dt`, multiplier steps.
    dx: Vec<f64>,
    dt: Vec<f64>,
    dlam_b: Vec<f64>,
    dlam_pi: Vec<f64>,
    dlam_g: Vec<f64>,
    /// The predictor's step, kept for the corrector.
    dx_aff: Vec<f64>,
    dt_aff: Vec<f64>,
    dlam_b_aff: Vec<f64>,
    dlam_pi_aff: Vec<f64>,
    dlam_g_aff: Vec<f64>,
    /// Per cell: is its deadline's slack the larger of `t`, `pi` at the start of the step?
    slack_side: Vec<bool>,
    /// The trial point of a step and its evaluation.
    trial_b: Vec<f64>,
    trial_g: Vec<f64>,
    trial_grad: Vec<f64>,
    trial_hess: Vec<f64>,
    trial_inv_b: Vec<f64>,
    /// Scratch: one cell's right-hand side, `1 / sqrt(b)` (`n` each).
    rhs: Vec<f64>,
    root: Vec<f64>,
    /// The allocations with the smallest certified gap so far.
    best_b: Vec<f64>,
}

/// Solves `problem` with a fresh [`Workspace`].
pub fn solve(problem: &Problem) -> Result<Solution, SolveError> {
    Workspace::new().solve(problem)
}

impl Workspace {
    /// An empty workspace; the first solve sizes it.
    pub fn new() -> Workspace {
        Workspace::default()
    }

    /// Solves `problem` to a certified relative gap of 1e-9. The allocation returned never
    /// exceeds a capacity and is never negative.
    pub fn solve(&mut self, problem: &Problem) -> Result<Solution, SolveError> {
        problem.validate().map_err(SolveError::Invalid)?;
        if problem.cells.is_empty() {
            return Ok(Solution {
                alloc: Vec::new(),
                penalty: 0.0,
                duality_gap: 0.0,
                iterations: 0,
            });
        }
        self.load(problem);
        // One copy of the iteration per common resource count, so the compiler knows every
        // inner loop's length (`0`: any count, read at run time).
        let (gap, iterations) = match self.n {
            1 => self.iterate::<1>(),
            2 => self.iterate::<2>(),
            3 => self.iterate::<3>(),
            4 => self.iterate::<4>(),
            _ => self.iterate::<0>(),
        };
        if gap.is_nan() || gap > ACCEPT_TOLERANCE {
            return Err(SolveError::NotSolved(format!(
                "interior point stopped after {iterations} steps with a certified gap of {gap:.1e}"
            )));
        }
        let alloc = self.allocation(problem);
        Ok(Solution {
            penalty: problem.total_penalty(&alloc),
            alloc,
            duality_gap: gap,
            iterations,
        })
    }

    /// Runs the interior point from the start; leaves the best allocation in `best_b` and
    /// returns its certified gap and the number of steps taken.
    fn iterate<const N: usize>(&mut self) -> (f64, u32) {
        self.start::<N>();
        let mut best = f64::INFINITY;
        let mut iterations = 0;
        loop {
            let gap = self.certified_gap::<N>();
            if gap < best {
                best = gap;
                self.best_b.copy_from_slice(&self.b);
            }
            if gap <= GAP_TOLERANCE || iterations == MAX_ITERATIONS || !self.factor::<N>() {
                return (best, iterations);
            }
            let mu = self.complementarity::<N>();
            self.direction::<N>(0.0, false);
            self.keep_as_predictor();
            let alpha = self.max_step::<N>(true);
            let sigma = (self.complementarity_after::<N>(alpha) / mu)
                .clamp(0.0, 1.0)
                .powi(3);
            self.direction::<N>(sigma * mu, true);
            let alpha = self.limit_true_slack::<N>(TO_BOUNDARY * self.max_step::<N>(false));
            iterations += 1;
            if alpha < MIN_STEP {
                return (best, iterations);
            }
            self.take_step::<N>(alpha);
        }
    }

    /// Sizes the buffers (allocating only if the problem is larger than any before), scales
    /// the problem and finds the active allocations.
    fn load(&mut self, problem: &Problem) {
        let n = problem.resources();
        let cells = problem.cells.len();
        let np = weight_count(n);
        self.n = n;
        self.cells = cells;
        fill(&mut self.pair_i, 0, 0);
        fill(&mut self.pair_j, 0, 0);
        for (i, j) in pairs(n) {
            self.pair_i.push(i);
            self.pair_j.push(j);
        }
        fill(&mut self.offset, cells, 0.0);
        fill(&mut self.weight, cells * np, 0.0);
        fill(&mut self.active, cells * n, false);
        fill(&mut self.valued, n, false);
        fill(&mut self.slack_side, cells, false);
        self.active_count = 0;
        for (p, cell) in problem.cells.iter().enumerate() {
            let s = cell.slope;
            self.offset[p] = s * (cell.model.tau0 - cell.deadline);
            for (q, (&w, (i, j))) in cell.model.w.iter().zip(pairs(n)).enumerate() {
                let scale = (problem.capacity[i] * problem.capacity[j]).sqrt();
                let weight = s * w / scale;
                self.weight[p * np + q] = weight;
                if weight > 0.0 {
                    self.active[p * n + i] = true;
                    self.active[p * n + j] = true;
                    self.valued[i] = true;
                    self.valued[j] = true;
                }
            }
        }
        self.active_count = self.active.iter().filter(|a| **a).count();
        for v in [
            &mut self.b,
            &mut self.lam_b,
            &mut self.grad,
            &mut self.inv_b,
            &mut self.dlam_b,
            &mut self.dlam_b_aff,
            &mut self.best_b,
            &mut self.trial_b,
            &mut self.trial_grad,
            &mut self.trial_inv_b,
        ] {
            fill(v, cells * n, 0.0);
        }
        for v in [
            &mut self.pi,
            &mut self.t,
            &mut self.lam_pi,
            &mut self.lam_g,
            &mut self.g,
            &mut self.coupling,
            &mut self.inv_beta,
            &mut self.inv_t,
            &mut self.inv_pi,
            &mut self.dt,
            &mut self.dlam_pi,
            &mut self.dlam_g,
            &mut self.dt_aff,
            &mut self.dlam_pi_aff,
            &mut self.dlam_g_aff,
            &mut self.trial_g,
        ] {
            fill(v, cells, 0.0);
        }
        for v in [
            &mut self.nu,
            &mut self.nu_new,
            &mut self.rhs,
            &mut self.root,
        ] {
            fill(v, n, 0.0);
        }
        fill(&mut self.schur, n * n, 0.0);
        fill(&mut self.hess, cells * n * n, 0.0);
        fill(&mut self.trial_hess, cells * n * n, 0.0);
        fill(&mut self.kinv, cells * n * n, 0.0);
        fill(&mut self.dx, cells * (n + 1), 0.0);
        fill(&mut self.dx_aff, cells * (n + 1), 0.0);
    }

    /// The starting point: every valued resource split evenly among the cells that value it
    /// (on the capacity rows, strictly inside `b > 0`), a resource nobody values among all;
    /// `pi_p` above both its bounds by `1 + |g_p|` with `t_p = pi_p - g_p`; the two
    /// multipliers of each `pi_p` at 1/2 (so `1 - lambda_g - lambda_pi = 0`); the allocations'
    /// multipliers at the mean of those products; prices that zero the mean of the active
    /// allocations' dual residuals.
    fn start<const N: usize>(&mut self) {
        let (n, cells) = (dim::<N>(self.n), self.cells);
        for r in 0..n {
            let sharing = (0..cells).filter(|&p| self.active[p * n + r]).count();
            for p in 0..cells {
                self.b[p * n + r] = if !self.valued[r] {
                    1.0 / cells as f64
                } else if self.active[p * n + r] {
                    1.0 / sharing as f64
                } else {
                    0.0
                };
            }
        }
        self.evaluate::<N>();
        let mut mu = 0.0;
        for p in 0..cells {
            let g = self.g[p];
            let margin = 1.0 + g.abs();
            self.pi[p] = g.max(0.0) + margin;
            self.t[p] = self.pi[p] - g;
            self.lam_g[p] = 0.5;
            self.lam_pi[p] = 0.5;
            mu += 0.5 * (self.t[p] + self.pi[p]);
        }
        mu /= (2 * cells) as f64;
        for i in 0..cells * n {
            self.lam_b[i] = if self.active[i] {
                mu * self.inv_b[i]
            } else {
                0.0
            };
        }
        for r in 0..n {
            let (mut sum, mut count) = (0.0, 0);
            for p in (0..cells).filter(|&p| self.active[p * n + r]) {
                sum += self.lam_b[p * n + r] - self.lam_g[p] * self.grad[p * n + r];
                count += 1;
            }
            self.nu[r] = if count > 0 { sum / count as f64 } else { 0.0 };
        }
    }

    /// `g_p`, its gradient and Hessian, and `1 / b` at the iterate, for every cell.
    fn evaluate<const N: usize>(&mut self) {
        let n = dim::<N>(self.n);
        let np = self.pair_i.len();
        for p in 0..self.cells {
            self.g[p] = eval_cell::<N>(
                self.offset[p],
                &self.weight[p * np..(p + 1) * np],
                &self.pair_i,
                &self.pair_j,
                &self.b[p * n..(p + 1) * n],
                &mut self.root,
                &mut self.inv_b[p * n..(p + 1) * n],
                &mut self.grad[p * n..(p + 1) * n],
                &mut self.hess[p * n * n..(p + 1) * n * n],
            );
        }
    }

    /// `mu`: the mean of `lambda * slack` over the pairs of the active allocations and of the
    /// epigraphs.
    fn complementarity<const N: usize>(&self) -> f64 {
        let mut sum = 0.0;
        for p in 0..self.cells {
            sum += self.lam_g[p] * self.t[p] + self.lam_pi[p] * self.pi[p];
        }
        // Inactive allocations have a zero multiplier, so they add nothing.
        for (l, b) in self.lam_b.iter().zip(&self.b) {
            sum += l * b;
        }
        sum / (2 * self.cells + self.active_count) as f64
    }

    /// `mu` after a step `alpha` along the predictor.
    fn complementarity_after<const N: usize>(&self, alpha: f64) -> f64 {
        let n = dim::<N>(self.n);
        let k = n + 1;
        let mut sum = 0.0;
        for p in 0..self.cells {
            let d = &self.dx_aff[p * k..(p + 1) * k];
            sum +=
                (self.lam_g[p] + alpha * self.dlam_g_aff[p]) * (self.t[p] + alpha * self.dt_aff[p]);
            sum += (self.lam_pi[p] + alpha * self.dlam_pi_aff[p]) * (self.pi[p] + alpha * d[n]);
            for r in 0..n {
                let i = p * n + r;
                if self.active[i] {
                    sum +=
                        (self.lam_b[i] + alpha * self.dlam_b_aff[i]) * (self.b[i] + alpha * d[r]);
                }
            }
        }
        sum / (2 * self.cells + self.active_count) as f64
    }

    /// The certified gap of the iterate's allocation relative to `max(1, penalty)` (module
    /// docs). Per cell, the bound as a function of `lambda_g` in `[0, 1]` is convex and
    /// piecewise linear, so its minimum is at 0, 1 or a kink (`lambda_g dg/db_r + nu_r = 0`).
    fn certified_gap<const N: usize>(&self) -> f64 {
        let (n, cells) = (dim::<N>(self.n), self.cells);
        let mut penalty = 0.0;
        let mut gap = 0.0;
        for r in 0..n {
            let used: f64 = (0..cells).map(|p| self.b[p * n + r]).sum();
            gap -= self.nu[r] * (used - 1.0);
        }
        for p in 0..cells {
            let g = self.g[p];
            penalty += g.max(0.0);
            let b = &self.b[p * n..(p + 1) * n];
            let grad = &self.grad[p * n..(p + 1) * n];
            // lambda_g (pi - g) + lambda_pi pi with pi = max(0, g), plus per resource
            // lambda_b b + max over the box of -r_b (z - b) with the best lambda_b >= 0.
            let share = |lam: f64| {
                let mut h = lam * (-g).max(0.0) + (1.0 - lam) * g.max(0.0);
                for r in 0..n {
                    let u = lam * grad[r] + self.nu[r];
                    h += (u * b[r]).max(-u * (1.0 - b[r]));
                }
                h
            };
            let mut least = share(0.0).min(share(1.0));
            for r in 0..n {
                if grad[r] != 0.0 {
                    let kink = -self.nu[r] / grad[r];
                    if kink > 0.0 && kink < 1.0 {
                        least = least.min(share(kink));
                    }
                }
            }
            gap += least;
        }
        gap / penalty.max(1.0)
    }

    /// Builds every cell's `K_p` (`B_p` with `pi_p` eliminated: `lambda_g H_p + lambda_b / b +
    /// gamma_p grad g_p grad g_p'`, fixed allocations as identity rows), inverts it through
    /// its Cholesky factor, zeroes the fixed rows and columns of the inverse, and factors the
    /// Schur complement `S = sum_p K_p^-1` (a resource nobody values gets a unit row). False
    /// if a matrix is not positive definite in floating point (the iterate is then as good as
    /// it gets).
    fn factor<const N: usize>(&mut self) -> bool {
        let n = dim::<N>(self.n);
        self.schur.fill(0.0);
        for p in 0..self.cells {
            let lam_g = self.lam_g[p];
            let (inv_t, inv_pi) = (1.0 / self.t[p], 1.0 / self.pi[p]);
            // B_p's pi row is [-c grad', beta], c = lambda_g / t, beta = c + lambda_pi / pi;
            // eliminating it leaves gamma = c - c^2 / beta = c (lambda_pi / pi) / beta.
            let c = lam_g * inv_t;
            let d = self.lam_pi[p] * inv_pi;
            let inv_beta = 1.0 / (c + d);
            let gamma = c * d * inv_beta;
            self.coupling[p] = c;
            self.inv_beta[p] = inv_beta;
            self.inv_t[p] = inv_t;
            self.inv_pi[p] = inv_pi;
            let active = &self.active[p * n..(p + 1) * n];
            let grad = &self.grad[p * n..(p + 1) * n];
            let hess = &self.hess[p * n * n..(p + 1) * n * n];
            let m = &mut self.kinv[p * n * n..(p + 1) * n * n];
            for i in 0..n {
                for j in 0..=i {
                    m[i * n + j] = if active[i] && active[j] {
                        lam_g * hess[i * n + j] + gamma * grad[i] * grad[j]
                    } else {
                        0.0
                    };
                }
                m[i * n + i] += if active[i] {
                    self.lam_b[p * n + i] * self.inv_b[p * n + i]
                } else {
                    1.0
                };
            }
            if !invert_spd::<N>(m, n) {
                return false;
            }
            for i in 0..n {
                for j in 0..n {
                    if !(active[i] && active[j]) {
                        m[i * n + j] = 0.0;
                    }
                }
            }
            for (s, k) in self.schur.iter_mut().zip(m.iter()) {
                *s += k;
            }
        }
        for r in 0..n {
            if !self.valued[r] {
                self.schur[r * n + r] = 1.0;
            }
        }
        cholesky::<N>(&mut self.schur, n)
    }

    /// The Newton step towards `lambda * slack = sigma_mu` (less the predictor's second-order
    /// term if `corrector`), into `dx`, `dt`, `nu_new` and the `dlam_*`.
    fn direction<const N: usize>(&mut self, sigma_mu: f64, corrector: bool) {
        let n = dim::<N>(self.n);
        let k = n + 1;
        // nu_new = r_pri - sum_p K_p^-1 q_p.
        for r in 0..n {
            self.nu_new[r] = (0..self.cells).map(|p| self.b[p * n + r]).sum::<f64>() - 1.0;
        }
        for p in 0..self.cells {
            let (tau_g, tau_pi) = self.targets(p, sigma_mu, corrector);
            let (lam_g, inv_t) = (self.lam_g[p], self.inv_t[p]);
            // The slack equation's residual (rounding only: every iterate satisfies it)
            // enters as a shifted target.
            let r_g = self.g[p] - self.pi[p] + self.t[p];
            let shifted = (tau_g + lam_g * r_g) * inv_t;
            let q_pi = 1.0 - shifted - tau_pi * self.inv_pi[p];
            let fold = shifted + self.coupling[p] * q_pi * self.inv_beta[p];
            let grad = &self.grad[p * n..(p + 1) * n];
            let aff = &self.dx_aff[p * k..(p + 1) * k];
            let q = &mut self.rhs[..n];
            for r in 0..n {
                let i = p * n + r;
                q[r] = if self.active[i] {
                    let mut tau_b = sigma_mu;
                    if corrector {
                        tau_b -= aff[r] * self.dlam_b_aff[i];
                    }
                    fold * grad[r] - tau_b * self.inv_b[i]
                } else {
                    0.0
                };
            }
            let kinv = &self.kinv[p * n * n..(p + 1) * n * n];
            let d = &mut self.dx[p * k..(p + 1) * k];
            for r in 0..n {
                let y = dot(&kinv[r * n..(r + 1) * n], q);
                d[r] = y;
                self.nu_new[r] -= y;
            }
            d[n] = q_pi;
        }
        cholesky_solve::<N>(&self.schur, n, &mut self.nu_new[..n]);
        for p in 0..self.cells {
            let (tau_g, tau_pi) = self.targets(p, sigma_mu, corrector);
            let kinv = &self.kinv[p * n * n..(p + 1) * n * n];
            let grad = &self.grad[p * n..(p + 1) * n];
            let hess = &self.hess[p * n * n..(p + 1) * n * n];
            let d = &mut self.dx[p * k..(p + 1) * k];
            // db = -(y + K^-1 nu), dpi = (c grad' db - q_pi) / beta.
            for r in 0..n {
                d[r] = -d[r] - dot(&kinv[r * n..(r + 1) * n], &self.nu_new[..n]);
            }
            let slope = dot(grad, &d[..n]);
            d[n] = (self.coupling[p] * slope - d[n]) * self.inv_beta[p];
            let r_g = self.g[p] - self.pi[p] + self.t[p];
            let dt = d[n] - slope - r_g;
            self.dt[p] = dt;
            // Each multiplier step follows from its linearised complementarity, `dlam = (tau -
            // lam dslack) / slack - lam`, or equally from the linearised dual residual; the
            // first divides by the slack, so where the slack is the smaller of its pair (it
            // is heading to 0) the second is the one that keeps its digits.
            let (lam_g, lam_pi) = (self.lam_g[p], self.lam_pi[p]);
            // Dual residual of pi_p: 1 - lambda_g - lambda_pi.
            let r_pi = 1.0 - lam_g - lam_pi;
            let dlam_g = if self.pi[p] >= self.t[p] {
                let dlam_pi = (tau_pi - lam_pi * d[n]) * self.inv_pi[p] - lam_pi;
                self.dlam_pi[p] = dlam_pi;
                r_pi - dlam_pi
            } else {
                let dlam_g = (tau_g - lam_g * dt) * self.inv_t[p] - lam_g;
                self.dlam_pi[p] = r_pi - dlam_g;
                dlam_g
            };
            self.dlam_g[p] = dlam_g;
            let aff = &self.dx_aff[p * k..(p + 1) * k];
            for r in 0..n {
                let i = p * n + r;
                if !self.active[i] {
                    self.dlam_b[i] = 0.0;
                    continue;
                }
                let (b, lam, price) = (self.b[i], self.lam_b[i], self.nu[r]);
                self.dlam_b[i] = if lam < b * (price.abs() + lam_g * grad[r].abs()) {
                    let mut tau_b = sigma_mu;
                    if corrector {
                        tau_b -= aff[r] * self.dlam_b_aff[i];
                    }
                    (tau_b - lam * d[r]) * self.inv_b[i] - lam
                } else {
                    // Dual residual of b_pr: lambda_g dg/db_r - lambda_b + nu_r.
                    let r_b = lam_g * grad[r] - lam + price;
                    let curvature = dot(&hess[r * n..(r + 1) * n], &d[..n]);
                    r_b + dlam_g * grad[r] + lam_g * curvature + (self.nu_new[r] - price)
                };
            }
        }
    }

    /// The complementarity targets of cell `p`'s slack `t_p` and of `pi_p`: `sigma_mu`, less
    /// the predictor's product of steps if `corrector`.
    fn targets(&self, p: usize, sigma_mu: f64, corrector: bool) -> (f64, f64) {
        if corrector {
            let dpi = self.dx_aff[p * (self.n + 1) + self.n];
            (
                sigma_mu - self.dt_aff[p] * self.dlam_g_aff[p],
                sigma_mu - dpi * self.dlam_pi_aff[p],
            )
        } else {
            (sigma_mu, sigma_mu)
        }
    }

    /// Moves the step just computed into the predictor's buffers (no copy: swaps).
    fn keep_as_predictor(&mut self) {
        std::mem::swap(&mut self.dx, &mut self.dx_aff);
        std::mem::swap(&mut self.dt, &mut self.dt_aff);
        std::mem::swap(&mut self.dlam_b, &mut self.dlam_b_aff);
        std::mem::swap(&mut self.dlam_pi, &mut self.dlam_pi_aff);
        std::mem::swap(&mut self.dlam_g, &mut self.dlam_g_aff);
    }

    /// The largest step, at most 1, along the predictor (`affine`) or the step that keeps
    /// every linear bound non-negative (`t` linearised).
    fn max_step<const N: usize>(&self, affine: bool) -> f64 {
        let n = dim::<N>(self.n);
        let k = n + 1;
        let (dx, dt, dlam_b, dlam_pi, dlam_g) = if affine {
            (
                &self.dx_aff,
                &self.dt_aff,
                &self.dlam_b_aff,
                &self.dlam_pi_aff,
                &self.dlam_g_aff,
            )
        } else {
            (
                &self.dx,
                &self.dt,
                &self.dlam_b,
                &self.dlam_pi,
                &self.dlam_g,
            )
        };
        let mut alpha = 1.0f64;
        let mut limit = |v: f64, dv: f64| {
            if v + alpha * dv < 0.0 {
                alpha = -v / dv;
            }
        };
        for p in 0..self.cells {
            let d = &dx[p * k..(p + 1) * k];
            limit(self.t[p], dt[p]);
            limit(self.pi[p], d[n]);
            limit(self.lam_g[p], dlam_g[p]);
            limit(self.lam_pi[p], dlam_pi[p]);
            for r in 0..n {
                let i = p * n + r;
                if self.active[i] {
                    limit(self.b[i], d[r]);
                    limit(self.lam_b[i], dlam_b[i]);
                }
            }
        }
        alpha
    }

    /// Shortens `alpha` so that no cell whose deadline still has slack (`t_p >= pi_p`) loses
    /// more than 99% of its true slack `pi_p - g_p(b_p)` (module docs). The true slack along
    /// the step is concave with a positive value at 0, so where it ends below the floor the
    /// largest admissible step is the root of one function, found by regula falsi (Illinois)
    /// to 0.1%.
    fn limit_true_slack<const N: usize>(&mut self, mut alpha: f64) -> f64 {
        let n = dim::<N>(self.n);
        let k = n + 1;
        for p in 0..self.cells {
            self.slack_side[p] = self.t[p] >= self.pi[p];
            let side = self.slack_side[p];
            let floor = (1.0 - TO_BOUNDARY) * self.t[p];
            // Below the rounding error of g (a sum of terms that cancel at a deadline), the
            // true slack is noise: leave such a cell to the linearised bound.
            let noise = 1e-13 * (self.offset[p].abs() + (self.g[p] - self.offset[p]).abs());
            if side && floor <= noise {
                continue;
            }
            let slack_at = |ws: &mut Self, a: f64| -> f64 {
                let b = &mut ws.trial_b[p * n..(p + 1) * n];
                for r in 0..n {
                    b[r] = ws.b[p * n + r] + a * ws.dx[p * k + r];
                }
                let np = ws.pair_i.len();
                let g = value_cell::<N>(
                    ws.offset[p],
                    &ws.weight[p * np..(p + 1) * np],
                    &ws.pair_i,
                    &ws.pair_j,
                    b,
                );
                let pi = ws.pi[p] + a * ws.dx[p * k + n];
                if side {
                    pi - g - floor
                } else {
                    PI_SLACK_FRACTION * pi - (g - pi + ws.t[p] + a * ws.dt[p])
                }
            };
            let at_alpha = slack_at(self, alpha);
            if at_alpha >= 0.0 {
                continue;
            }
            let f0 = if side {
                self.t[p] - floor
            } else {
                PI_SLACK_FRACTION * self.pi[p]
            };
            let (mut lo, mut f_lo) = (0.0, f0);
            let (mut hi, mut f_hi) = (alpha, at_alpha);
            let mut last = 0i8;
            for _ in 0..40 {
                let mid = (lo * f_hi - hi * f_lo) / (f_hi - f_lo);
                let f = slack_at(self, mid);
                if f >= 0.0 {
                    (lo, f_lo) = (mid, f);
                    if last == 1 {
                        f_hi *= 0.5;
                    }
                    last = 1;
                } else {
                    (hi, f_hi) = (mid, f);
                    if last == -1 {
                        f_lo *= 0.5;
                    }
                    last = -1;
                }
                if hi - lo <= 1e-3 * hi {
                    break;
                }
            }
            alpha = lo;
        }
        alpha
    }

    /// Moves the iterate by `alpha` times the step, evaluates the cells there, and moves the
    /// residual the step's curvature left in `g - pi + t = 0` into `t` for a cell whose
    /// deadline had slack, into `pi` for one over its deadline (whichever stays positive).
    fn take_step<const N: usize>(&mut self, alpha: f64) {
        let n = dim::<N>(self.n);
        let k = n + 1;
        for p in 0..self.cells {
            let d = &self.dx[p * k..(p + 1) * k];
            for r in 0..n {
                let i = p * n + r;
                self.b[i] += alpha * d[r];
                self.lam_b[i] += alpha * self.dlam_b[i];
            }
            self.pi[p] += alpha * d[n];
            self.t[p] += alpha * self.dt[p];
            self.lam_g[p] += alpha * self.dlam_g[p];
            self.lam_pi[p] += alpha * self.dlam_pi[p];
        }
        for (nu, new) in self.nu.iter_mut().zip(&self.nu_new) {
            *nu += alpha * (new - *nu);
        }
        self.evaluate::<N>();
        for p in 0..self.cells {
            let r = self.g[p] - self.pi[p] + self.t[p];
            let into_t = if self.slack_side[p] {
                self.t[p] - r > 0.0
            } else {
                self.pi[p] + r <= 0.0
            };
            if into_t {
                self.t[p] -= r;
            } else {
                self.pi[p] += r;
            }
        }
    }

    /// The best iterate as an allocation in the problem's units, each resource's column
    /// scaled down if rounding took its sum (added as [`Problem::infeasibility`] adds it) over
    /// the capacity.
    fn allocation(&self, problem: &Problem) -> Vec<Vec<f64>> {
        let n = self.n;
        let mut alloc: Vec<Vec<f64>> = (0..self.cells)
            .map(|p| {
                (0..n)
                    .map(|r| (self.best_b[p * n + r] * problem.capacity[r]).max(0.0))
                    .collect()
            })
            .collect();
        for (r, &cap) in problem.capacity.iter().enumerate() {
            loop {
                let used: f64 = alloc.iter().map(|a| a[r]).sum();
                if used <= cap {
                    break;
                }
                let shrink = cap / used * (1.0 - 4.0 * f64::EPSILON);
                for a in alloc.iter_mut() {
                    a[r] *= shrink;
                }
            }
        }
        alloc
    }
}

/// For a cell on the penalty's side of its deadline (`t < pi`), [`Workspace::limit_true_slack`]
/// keeps `g - pi + t` (how far the nonlinear constraint is from the step's linearisation) at
/// most this fraction of `pi` (0.5: chosen on the property test's random problems; it was an
/// environment knob while it was tuned).
const PI_SLACK_FRACTION: f64 = 0.5;

/// The resource count: `N` if the code was instantiated for it, else `n` (`N = 0`).
#[inline(always)]
fn dim<const N: usize>(n: usize) -> usize {
    if N == 0 {
        n
    } else {
        N
    }
}

/// `v.clear()` then `v.resize(len, value)`: allocates only if `len` exceeds the capacity.
fn fill<T: Clone>(v: &mut Vec<T>, len: usize, value: T) {
    v.clear();
    v.resize(len, value);
}

#[inline(always)]
fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `g(b) = offset + sum_q weight_q / sqrt(b_i b_j)`; its gradient into `grad`, its Hessian
/// into `hess` (`n * n`, row-major), `1 / b` into `inv_b` (0 where `b` is 0: a fixed
/// allocation no positive weight involves). Zero weights contribute nothing.
#[allow(clippy::too_many_arguments)] // one cell's slices of the workspace, borrowed apart
#[inline(always)]
fn eval_cell<const N: usize>(
    offset: f64,
    weight: &[f64],
    pair_i: &[usize],
    pair_j: &[usize],
    b: &[f64],
    root: &mut [f64],
    inv_b: &mut [f64],
    grad: &mut [f64],
    hess: &mut [f64],
) -> f64 {
    let n = dim::<N>(b.len());
    for r in 0..n {
        root[r] = if b[r] > 0.0 { 1.0 / b[r].sqrt() } else { 0.0 };
        inv_b[r] = root[r] * root[r];
    }
    grad[..n].fill(0.0);
    hess[..n * n].fill(0.0);
    let mut g = offset;
    for ((&w, &i), &j) in weight.iter().zip(pair_i).zip(pair_j) {
        if w == 0.0 {
            continue;
        }
        let t = w * root[i] * root[j];
        g += t;
        if i == j {
            // d/db (w / b) = -w / b^2, d2/db2 = 2 w / b^3.
            grad[i] -= t * inv_b[i];
            hess[i * n + i] += 2.0 * t * inv_b[i] * inv_b[i];
        } else {
            // w b_i^-1/2 b_j^-1/2: d/db_i = -t / (2 b_i), d2/db_i2 = 3t / (4 b_i^2),
            // d2/db_i db_j = t / (4 b_i b_j).
            grad[i] -= 0.5 * t * inv_b[i];
            grad[j] -= 0.5 * t * inv_b[j];
            hess[i * n + i] += 0.75 * t * inv_b[i] * inv_b[i];
            hess[j * n + j] += 0.75 * t * inv_b[j] * inv_b[j];
            let cross = 0.25 * t * inv_b[i] * inv_b[j];
            hess[i * n + j] += cross;
            hess[j * n + i] += cross;
        }
    }
    g
}

/// `g(b)` alone (see [`eval_cell`]); infinite if a weighted allocation is not positive.
#[inline(always)]
fn value_cell<const N: usize>(
    offset: f64,
    weight: &[f64],
    pair_i: &[usize],
    pair_j: &[usize],
    b: &[f64],
) -> f64 {
    let mut g = offset;
    for ((&w, &i), &j) in weight.iter().zip(pair_i).zip(pair_j) {
        if w != 0.0 {
            let product = b[i] * b[j];
            g += if product > 0.0 {
                w / product.sqrt()
            } else {
                f64::INFINITY
            };
        }
    }
    g
}

/// In-place Cholesky factorisation `M = L L'` of the `n x n` matrix `m` (row-major; reads the
/// lower triangle, writes `L` there with `1 / L_ii` on the diagonal, so solves multiply).
/// False if `m` is not positive definite.
#[inline(always)]
fn cholesky<const N: usize>(m: &mut [f64], n: usize) -> bool {
    let n = dim::<N>(n);
    for j in 0..n {
        let mut d = m[j * n + j];
        for c in 0..j {
            d -= m[j * n + c] * m[j * n + c];
        }
        if d.is_nan() || d <= 0.0 {
            return false;
        }
        let inv = 1.0 / d.sqrt();
        m[j * n + j] = inv;
        for i in j + 1..n {
            let mut s = m[i * n + j];
            for c in 0..j {
                s -= m[i * n + c] * m[j * n + c];
            }
            m[i * n + j] = s * inv;
        }
    }
    true
}

/// Replaces the `n x n` symmetric positive definite `m` (lower triangle read) by its inverse
/// (full), through `m = L L'`, `M = L^-1` in place, `m^-1 = M' M`. False if `m` is not
/// positive definite.
#[inline(always)]
fn invert_spd<const N: usize>(m: &mut [f64], n: usize) -> bool {
    let n = dim::<N>(n);
    if !cholesky::<N>(m, n) {
        return false;
    }
    // Column by column, left to right: M_jj = 1 / L_jj (already stored), M_ij = -(sum_{k=j}^{i-1}
    // L_ik M_kj) / L_ii; each L_ij is read before it is overwritten by M_ij.
    for j in 0..n {
        for i in j + 1..n {
            let mut s = 0.0;
            for k in j..i {
                s += m[i * n + k] * m[k * n + j];
            }
            m[i * n + j] = -s * m[i * n + i];
        }
    }
    // (M' M)_ij = sum_{k >= j} M_ki M_kj for i <= j, row by row into the upper triangle and
    // the diagonal: entry (i, j) reads M below the diagonal and M_jj, none of which an earlier
    // entry has overwritten. Then mirrored into the lower triangle.
    for i in 0..n {
        for j in i..n {
            let mut s = 0.0;
            for k in j..n {
                s += m[k * n + i] * m[k * n + j];
            }
            m[i * n + j] = s;
        }
    }
    for i in 0..n {
        for j in 0..i {
            m[i * n + j] = m[j * n + i];
        }
    }
    true
}

/// Solves `L L' x = v` in place with the factor from [`cholesky`].
#[inline(always)]
fn cholesky_solve<const N: usize>(l: &[f64], n: usize, v: &mut [f64]) {
    let n = dim::<N>(n);
    for i in 0..n {
        let mut s = v[i];
        for c in 0..i {
            s -= l[i * n + c] * v[c];
        }
        v[i] = s * l[i * n + i];
    }
    for i in (0..n).rev() {
        let mut s = v[i];
        for c in i + 1..n {
            s -= l[c * n + i] * v[c];
        }
        v[i] = s * l[i * n + i];
    }
}

#[cfg(test)]
mod tests {
    use super::super::{example_problem, socp, CellDemand, ResponseModel};
    use super::*;
    use proptest::prelude::*;

    /// `|ours - Clarabel's lower bound| / max(1, |Clarabel's lower bound|)` on the total
    /// penalty. Ours is feasible (every caller checks it), so it is at least the optimum, which
    /// is at least the bound, and a distance from below means a wrong bound or penalty. The
    /// bound is Clarabel's dual objective: the penalty of Clarabel's allocation is no
    /// certificate, as it can be far above Clarabel's own objective (see [`socp::solve`]).
    fn gap_to_clarabel(p: &Problem, ours: &Solution) -> f64 {
        let reference = socp::solve(p).expect("Clarabel solves every valid problem");
        let lower = reference.penalty - reference.duality_gap * reference.penalty.abs().max(1.0);
        (ours.penalty - lower).abs() / lower.abs().max(1.0)
    }

    fn cell(tau0: f64, w: Vec<f64>, deadline: f64, slope: f64) -> CellDemand {
        let resources = (1..=4).find(|&n| weight_count(n) == w.len()).unwrap();
        CellDemand {
            model: ResponseModel { tau0, w, resources },
            deadline,
            slope,
        }
    }

    #[test]
    fn the_example_problem_matches_clarabel() {
        let p = example_problem(12);
        let s = solve(&p).unwrap();
        assert!(gap_to_clarabel(&p, &s) < 1e-6, "{s:?}");
        assert!(s.duality_gap <= GAP_TOLERANCE, "{s:?}");
        assert!(p.infeasibility(&s.alloc) <= 0.0);
    }

    #[test]
    fn zero_penalty_when_every_deadline_is_met_with_room_to_spare() {
        let p = Problem {
            cells: vec![
                cell(1.0, vec![1.0, 0.5, 2.0], 50.0, 1.0),
                cell(0.5, vec![0.0, 1.0, 0.0], 40.0, 3.0),
            ],
            capacity: vec![4.0, 4.0],
        };
        let s = solve(&p).unwrap();
        assert!(s.penalty.abs() < 1e-9, "{s:?}");
        assert!(p.infeasibility(&s.alloc) <= 0.0);
    }

    #[test]
    fn a_cell_without_weights_pays_its_constant_penalty_and_needs_nothing() {
        // The first cell's response time is tau0 = 5 whatever it gets: penalty (5 - 2) * 2.
        let p = Problem {
            cells: vec![
                cell(5.0, vec![0.0, 0.0, 0.0], 2.0, 2.0),
                cell(0.0, vec![4.0, 0.0, 1.0], 1.0, 1.0),
            ],
            capacity: vec![2.0, 3.0],
        };
        let s = solve(&p).unwrap();
        assert!(gap_to_clarabel(&p, &s) < 1e-6, "{s:?}");
        assert!(s.penalty >= 6.0 - 1e-12, "{s:?}");
        // Everything useful goes to the second cell.
        assert!(s.alloc[0].iter().all(|&a| a < 1e-6), "{s:?}");
        assert!(p.infeasibility(&s.alloc) <= 0.0);
    }

    #[test]
    fn a_cell_with_no_slope_is_never_penalised() {
        let p = Problem {
            cells: vec![
                cell(9.0, vec![3.0], 0.0, 0.0),
                cell(0.0, vec![2.0], 0.5, 1.0),
            ],
            capacity: vec![1.0],
        };
        let s = solve(&p).unwrap();
        // The second cell takes all of it: penalty 2 / 1 - 0.5.
        assert!((s.penalty - 1.5).abs() < 1e-6, "{s:?}");
        assert!(p.infeasibility(&s.alloc) <= 0.0);
    }

    #[test]
    fn invalid_and_empty_problems() {
        let mut p = example_problem(3);
        p.cells[1].slope = f64::NAN;
        assert!(matches!(solve(&p), Err(SolveError::Invalid(_))));
        let mut p = example_problem(3);
        p.cells[0].model.w.pop();
        assert!(matches!(solve(&p), Err(SolveError::Invalid(_))));
        let p = Problem {
            cells: vec![],
            capacity: vec![1.0, 2.0],
        };
        let s = solve(&p).unwrap();
        assert!(s.alloc.is_empty() && s.penalty == 0.0);
    }

    #[test]
    fn a_workspace_reused_across_sizes_gives_what_a_fresh_one_does() {
        let mut ws = Workspace::new();
        let small = example_problem(3);
        let large = example_problem(16);
        let one = Problem {
            cells: vec![cell(1.0, vec![4.0], 2.0, 1.0)],
            capacity: vec![2.0],
        };
        for p in [&small, &large, &one, &small, &large] {
            assert_eq!(ws.solve(p).unwrap(), solve(p).unwrap());
        }
    }

    /// Valid problems: 1-16 cells, 1-3 resources, about a third of the weights zero, some
    /// slopes zero, deadlines from easy to impossible, capacities over two decades.
    fn problems() -> impl Strategy<Value = Problem> {
        (1usize..=3, 1usize..=16).prop_flat_map(|(n, cells)| {
            let weight = prop_oneof![1 => Just(0.0), 2 => 0.01f64..10.0];
            let one = (
                0.0f64..5.0,
                prop::collection::vec(weight, weight_count(n)),
                0.0f64..20.0,
                prop_oneof![1 => Just(0.0), 6 => 0.01f64..5.0],
            )
                .prop_map(|(tau0, w, deadline, slope)| cell(tau0, w, deadline, slope));
            (
                prop::collection::vec(one, cells),
                prop::collection::vec(-1.0f64..1.3, n),
            )
                .prop_map(|(cells, exponent)| Problem {
                    cells,
                    capacity: exponent.iter().map(|e| 10f64.powf(*e)).collect(),
                })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn random_problems_reach_clarabel_s_optimum_feasibly(p in problems()) {
            let s = solve(&p).unwrap();
            prop_assert!(p.infeasibility(&s.alloc) <= 0.0, "{s:?}");
            prop_assert!(s.alloc.iter().flatten().all(|a| *a >= 0.0));
            prop_assert!(s.duality_gap <= ACCEPT_TOLERANCE, "{s:?}");
            let gap = gap_to_clarabel(&p, &s);
            prop_assert!(gap < 1e-4, "gap {gap:e}: {s:?}");
            // Certified: no feasible allocation is better by more than the certificate.
            let even: Vec<Vec<f64>> = p
                .cells
                .iter()
                .map(|_| p.capacity.iter().map(|c| c / p.cells.len() as f64).collect())
                .collect();
            prop_assert!(s.penalty <= p.total_penalty(&even) + 1e-9 * s.penalty.max(1.0));
        }
    }

    /// A case a search of random problems turned up while the solver was written: two
    /// resources, cells that value only some of them, a cell without slope.
    #[test]
    fn a_case_with_cells_that_value_one_resource_each() {
        let p = Problem {
            cells: vec![
                cell(
                    1.4121693144400111,
                    vec![3.521804614199642, 0.0, 0.0],
                    6.722963341900968,
                    4.570288044785078,
                ),
                cell(
                    2.949574488164858,
                    vec![0.0, 0.4880252918714354, 7.215979395924518],
                    17.354694217127257,
                    0.4723887469095223,
                ),
                cell(
                    0.9918467526177899,
                    vec![3.0130743442110814, 4.151730037658685, 1.9474267032795551],
                    8.001930157576892,
                    2.871156375414287,
                ),
                cell(
                    4.8990001370298595,
                    vec![0.0, 8.299017298597304, 5.568192496676841],
                    3.90477024813652,
                    0.13917988605622264,
                ),
                cell(
                    2.6323553169301634,
                    vec![1.7046375274297754, 0.0, 6.404459540752781],
                    16.09504954645545,
                    1.502065098808089,
                ),
                cell(
                    3.0759067921405867,
                    vec![0.0, 1.2143045100306065, 4.73387983706062],
                    13.961353108885776,
                    3.676364604400988,
                ),
                cell(
                    4.20281561371367,
                    vec![0.0, 5.259951849302765, 0.2386688650859501],
                    13.351419930248477,
                    3.782036539963782,
                ),
                cell(
                    3.2471212329394414,
                    vec![4.806239509277183, 9.439373623004572, 0.0],
                    11.75354435146199,
                    0.0,
                ),
            ],
            capacity: vec![15.237313846474999, 18.230247373512338],
        };
        let s = solve(&p).unwrap();
        assert!(gap_to_clarabel(&p, &s) < 1e-4, "{s:?}");
        assert!(s.duality_gap <= ACCEPT_TOLERANCE, "{s:?}");
        assert!(p.infeasibility(&s.alloc) <= 0.0);
    }
}
