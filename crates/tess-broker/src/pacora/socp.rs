//! PACORA as a second-order-cone program for Clarabel (Goulart and Chen, "Clarabel: An
//! interior-point solver for conic programs with quadratic objectives", 2024).
//!
//! Variables per cell `p`: allocations `a_pr`, penalty `pi_p`, for each pair with a positive
//! weight an upper bound `u_pij >= 1/sqrt(a_pi a_pj)`, and for each off-diagonal pair a lower
//! bound `g_pij <= sqrt(a_pi a_pj)` (the geometric mean). With `x y >= z^2, x, y >= 0` written as
//! the cone `||(2z, x - y)|| <= x + y`:
//!
//! ```text
//!   minimise   sum_p pi_p
//!   subject to pi_p >= 0
//!              pi_p >= s_p (tau0_p + sum w_pij u_pij - d_p)
//!              u_pii a_pi >= 1                        (u >= 1/a)
//!              a_pi a_pj >= g_pij^2, u_pij g_pij >= 1  (u >= 1/sqrt(a_i a_j))
//!              sum_p a_pr <= A_r,  a_pr >= 0
//! ```
//!
//! Clarabel's form is `A x + s = b, s in K`, so each row below is written as `s = b - A x`.

use super::model::{pairs, Problem};
use super::{Solution, SolveError};
use clarabel::algebra::CscMatrix;
use clarabel::solver::{
    DefaultSettingsBuilder, DefaultSolver, IPSolver, SolverStatus, SupportedConeT,
};

struct Builder {
    rows: usize,
    i: Vec<usize>,
    j: Vec<usize>,
    v: Vec<f64>,
    b: Vec<f64>,
}

impl Builder {
    /// Adds the row `s = b - sum coef * x_var`.
    fn row(&mut self, terms: &[(usize, f64)], b: f64) {
        for &(var, coef) in terms {
            if coef != 0.0 {
                self.i.push(self.rows);
                self.j.push(var);
                self.v.push(coef);
            }
        }
        self.b.push(b);
        self.rows += 1;
    }

    /// Adds the cone rows for `x y >= z^2` where each of x, y, z is `(var, scale)` or a
    /// constant (`var = None`).
    fn hyperbolic(&mut self, x: usize, y: usize, z: Option<(usize, f64)>, z_const: f64) {
        // s0 = x + y
        self.row(&[(x, -1.0), (y, -1.0)], 0.0);
        // s1 = 2 z
        match z {
            Some((var, scale)) => self.row(&[(var, -2.0 * scale)], 0.0),
            None => self.row(&[], 2.0 * z_const),
        }
        // s2 = x - y
        self.row(&[(x, -1.0), (y, 1.0)], 0.0);
    }
}

/// Solves the problem with Clarabel to its default tolerances (gap 1e-8 relative).
/// [`Solution::duality_gap`] is `penalty` less Clarabel's dual objective (a lower bound on the
/// optimum, up to Clarabel's dual residual), relative to `max(1, penalty)`. It can be far
/// larger than Clarabel's own gap (see the end of this function), and slightly negative if the
/// allocation is over a capacity by Clarabel's primal residual.
pub fn solve(problem: &Problem) -> Result<Solution, SolveError> {
    problem.validate().map_err(SolveError::Invalid)?;
    let n = problem.resources();
    let cells = problem.cells.len();
    // Variable layout: [a (cells*n) | pi (cells) | per cell: u per weighted pair, g per
    // weighted off-diagonal pair].
    let a_var = |p: usize, r: usize| p * n + r;
    let pi_var = |p: usize| cells * n + p;
    let mut next = cells * n + cells;
    let mut b = Builder {
        rows: 0,
        i: vec![],
        j: vec![],
        v: vec![],
        b: vec![],
    };
    // Non-negative rows first (one NonnegativeCone), then the 3-dimensional cones.
    let mut cone_terms: Vec<(usize, usize)> = Vec::new(); // u * other >= 1, other = a_i or g
    let mut geo: Vec<(usize, usize, usize)> = Vec::new(); // (g, a_i, a_j)
    for (p, cell) in problem.cells.iter().enumerate() {
        b.row(&[(pi_var(p), -1.0)], 0.0); // s = pi >= 0
        let mut terms = vec![(pi_var(p), -1.0)];
        for ((i, j), &w) in pairs(n).zip(&cell.model.w) {
            // A term that costs nothing (zero weight or zero slope) is left out: its cone would
            // only keep the allocation positive, an infimum the solver cannot attain.
            if w <= 0.0 || cell.slope <= 0.0 {
                continue;
            }
            let u = next;
            next += 1;
            terms.push((u, cell.slope * w));
            if i == j {
                cone_terms.push((u, a_var(p, i)));
            } else {
                let g = next;
                next += 1;
                geo.push((g, a_var(p, i), a_var(p, j)));
                cone_terms.push((u, g));
            }
        }
        // s = s_p (d - tau0) + pi - s_p sum w u >= 0
        b.row(&terms, cell.slope * (cell.deadline - cell.model.tau0));
        for r in 0..n {
            b.row(&[(a_var(p, r), -1.0)], 0.0); // s = a >= 0
        }
    }
    for r in 0..n {
        // s = A_r - sum_p a_pr >= 0
        let terms: Vec<(usize, f64)> = (0..cells).map(|p| (a_var(p, r), 1.0)).collect();
        b.row(&terms, problem.capacity[r]);
    }
    let nonneg = b.rows;
    let mut cones = vec![SupportedConeT::NonnegativeConeT(nonneg)];
    for &(u, other) in &cone_terms {
        b.hyperbolic(u, other, None, 1.0);
        cones.push(SupportedConeT::SecondOrderConeT(3));
    }
    for &(g, ai, aj) in &geo {
        b.hyperbolic(ai, aj, Some((g, 1.0)), 0.0);
        cones.push(SupportedConeT::SecondOrderConeT(3));
    }
    let nvar = next;
    let a = CscMatrix::new_from_triplets(b.rows, nvar, b.i, b.j, b.v);
    let p = CscMatrix::zeros((nvar, nvar));
    let mut q = vec![0.0; nvar];
    for c in 0..cells {
        q[pi_var(c)] = 1.0;
    }
    let settings = DefaultSettingsBuilder::default()
        .verbose(false)
        .build()
        .map_err(|e| SolveError::Invalid(e.to_string()))?;
    let mut solver = DefaultSolver::new(&p, &q, &a, &b.b, &cones, settings)
        .map_err(|e| SolveError::Invalid(format!("{e:?}")))?;
    solver.solve();
    match solver.solution.status {
        SolverStatus::Solved | SolverStatus::AlmostSolved => {}
        other => return Err(SolveError::NotSolved(format!("{other:?}"))),
    }
    let x = &solver.solution.x;
    let alloc: Vec<Vec<f64>> = (0..cells)
        .map(|c| (0..n).map(|r| x[a_var(c, r)].max(0.0)).collect())
        .collect();
    // The gap is measured from the penalty of the allocation returned to Clarabel's dual
    // objective, the lower bound it certifies, not from its primal objective `sum pi`: a cone
    // `||(2, u - a)|| <= u + a` (`u a >= 1`) met to within an absolute residual `e` leaves `u a`
    // short of 1 by about `e u / 2`, and Clarabel's tolerances are relative to the problem's
    // scale, which includes `u ~ 1 / a`. So a small allocation's `u` can claim a response time
    // its `a` does not give, and a steep penalty (a small allocation at its deadline's kink)
    // multiplies the difference: one random problem had `sum pi` and the dual objective 2e-9
    // apart, and the penalty of the allocation 5.5e-4 above both.
    let penalty = problem.total_penalty(&alloc);
    let gap = (penalty - solver.solution.obj_val_dual) / penalty.abs().max(1.0);
    Ok(Solution {
        penalty,
        alloc,
        duality_gap: gap,
        iterations: solver.solution.iterations,
    })
}
