//! `tess bench pacora`: how fast PACORA fits a response-time model and solves the allocation
//! (seed 004 section 5.3: 4 us to fit, 350 us to solve; issue 14 goals: fit under 5 us, solve
//! under 50 us for 12 cells x 3 resources, within 1e-4 of Clarabel's optimum).
//!
//! The problem is `tess_broker::pacora::example_problem(12)`: twelve cells over three resources
//! with capacities that make their penalties trade off. Each fit is a non-negative least-squares
//! fit of one cell's model to 20 samples of (allocation, response time).

use super::Common;
use tess_bench::{Report, Summary, Table};
use tess_broker::pacora::{example_problem, socp, ResponseModel, Sample};
use tess_heartbeat::clock::now_ns;

/// Runs the benchmark.
pub fn run(c: &Common) -> anyhow::Result<Report> {
    let cells = 12;
    let problem = example_problem(cells);
    let solves = if c.quick { 20 } else { 300 };
    let fits = if c.quick { 200 } else { 20_000 };
    let mut solve_us = Vec::with_capacity(solves);
    let mut last = None;
    for _ in 0..solves {
        let t0 = now_ns();
        let s = socp::solve(&problem)?;
        solve_us.push((now_ns() - t0) as f64 / 1e3);
        last = Some(s);
    }
    let sol = last.expect("at least one solve");
    // Samples of one cell's model under varied allocations, as the broker would collect them.
    let truth = &problem.cells[0].model;
    let samples: Vec<Sample> = (0..20)
        .map(|k| {
            let f = |x: usize| 0.3 + ((k * (x + 3) * 7) % 11) as f64 / 5.0;
            let alloc = vec![f(0), f(1), f(2)];
            Sample {
                tau: truth.eval(&alloc) * (1.0 + 0.01 * ((k % 3) as f64 - 1.0)),
                alloc,
            }
        })
        .collect();
    let mut fit_us = Vec::with_capacity(fits / 100);
    let mut fitted = None;
    for _ in 0..fits / 100 {
        let t0 = now_ns();
        for _ in 0..100 {
            fitted = std::hint::black_box(ResponseModel::fit(3, &samples));
        }
        fit_us.push((now_ns() - t0) as f64 / 1e3 / 100.0);
    }
    let fitted = fitted.ok_or_else(|| anyhow::anyhow!("the fit failed"))?;
    let fit_err = samples
        .iter()
        .map(|s| ((fitted.eval(&s.alloc) - s.tau) / s.tau).abs())
        .fold(0.0, f64::max);
    let solve = Summary::of(&solve_us);
    let fit = Summary::of(&fit_us);
    let even: Vec<Vec<f64>> = (0..cells)
        .map(|_| problem.capacity.iter().map(|c| c / cells as f64).collect())
        .collect();
    let mut r = Report::new("pacora");
    let mut t = Table::new(
        format!("PACORA, {cells} cells x 3 resources (us)"),
        &["step", "median", "p99", "max", "paper"],
    );
    t.row(&[
        "solve (Clarabel SOCP)".to_string(),
        format!("{:.1}", solve.median),
        format!("{:.1}", solve.p99),
        format!("{:.1}", solve.max),
        "350".into(),
    ]);
    t.row(&[
        "fit (NNLS, 20 samples, 7 coefficients)".to_string(),
        format!("{:.2}", fit.median),
        format!("{:.2}", fit.p99),
        format!("{:.2}", fit.max),
        "4".into(),
    ]);
    r.table(t);
    r.figure("solve_us", solve.median);
    r.figure("clarabel_solve_us", solve.median);
    r.figure("fit_us", fit.median);
    r.figure("optimality_gap", sol.duality_gap);
    r.figure("total_penalty", sol.penalty);
    r.figure("even_split_penalty", problem.total_penalty(&even));
    r.figure("fit_max_rel_error", fit_err);
    r.target(
        "solve under 50 us",
        solve.median < 50.0,
        format!("{:.1} us", solve.median),
    );
    r.target(
        "fit under 5 us",
        fit.median < 5.0,
        format!("{:.2} us", fit.median),
    );
    r.target(
        "within 1e-4 of the optimum",
        sol.duality_gap < 1e-4,
        format!("{:.1e}", sol.duality_gap),
    );
    r.note(format!(
        "no specialised solver yet: solve_us is Clarabel's (the same figure as clarabel_solve_us), and optimality_gap is Clarabel's own relative primal-dual gap ({} iterations)",
        sol.iterations
    ));
    r.note(format!(
        "the optimum's total penalty {:.3} vs {:.3} for an even split",
        sol.penalty,
        problem.total_penalty(&even)
    ));
    Ok(r)
}
