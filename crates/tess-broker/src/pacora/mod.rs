//! PACORA, Performance-Aware Convex Optimization for Resource Allocation (seed 004 section
//! 5.3): response-time models fitted from heartbeats ([`model`], [`nnls`]) and the allocation
//! that minimises the total penalty under each resource's capacity, solved exactly by a
//! primal-dual interior-point method written for the problem's block structure
//! ([`interior_point`]), and as a second-order-cone program by Clarabel ([`socp`]), the
//! reference it is checked against.

pub mod interior_point;
pub mod model;
pub mod nnls;
pub mod policy;
pub mod socp;

pub use model::{CellDemand, Problem, ResponseModel, Sample};

/// An allocation and the total penalty it incurs.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Solution {
    /// `alloc[p][r]`: resource `r` given to cell `p`.
    pub alloc: Vec<Vec<f64>>,
    /// Total penalty (evaluated on `alloc`, not the solver's own objective).
    pub penalty: f64,
    /// The solver's own certificate of how far from the optimum `penalty` can be, relative to
    /// `max(1, penalty)`: `penalty` less Clarabel's dual objective (see [`socp::solve`]), or the
    /// interior point's certified gap (see [`interior_point`]).
    pub duality_gap: f64,
    /// Interior-point iterations taken.
    pub iterations: u32,
}

/// Why a solve failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SolveError {
    /// The problem's numbers are invalid.
    #[error("invalid problem: {0}")]
    Invalid(String),
    /// The solver did not reach a solution.
    #[error("the solver stopped without a solution: {0}")]
    NotSolved(String),
}

/// A reproducible test problem: `cells` cells over three resources (harts, CPU bandwidth
/// share, network Mbit/s), varied weights and deadlines, capacities that make the penalties
/// trade off (not every deadline can be met). Used by the tests and `tess bench pacora`.
pub fn example_problem(cells: usize) -> Problem {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let cells = (0..cells)
        .map(|_| {
            let w: Vec<f64> = (0..6)
                .map(|k| {
                    if rnd() < 0.3 && k != 0 {
                        0.0
                    } else {
                        0.5 + 4.0 * rnd()
                    }
                })
                .collect();
            CellDemand {
                model: ResponseModel {
                    tau0: 1.0 + rnd(),
                    w,
                    resources: 3,
                },
                deadline: 6.0 + 10.0 * rnd(),
                slope: 0.5 + 2.0 * rnd(),
            }
        })
        .collect();
    Problem {
        cells,
        capacity: vec![8.0, 8.0, 8.0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cell_one_resource_matches_the_closed_form() {
        // tau = 1 + 4/a, d = 2, s = 1, capacity 2: all to the one cell, tau = 3, penalty 1.
        let p = Problem {
            cells: vec![CellDemand {
                model: ResponseModel {
                    tau0: 1.0,
                    w: vec![4.0],
                    resources: 1,
                },
                deadline: 2.0,
                slope: 1.0,
            }],
            capacity: vec![2.0],
        };
        let s = socp::solve(&p).unwrap();
        assert!((s.alloc[0][0] - 2.0).abs() < 1e-5, "{s:?}");
        assert!((s.penalty - 1.0).abs() < 1e-5);
    }

    #[test]
    fn two_cells_split_one_resource_where_marginal_penalties_meet() {
        // pi_k = s_k (w_k / a_k - d) with tau0 = 0, both over their deadlines: the optimum has
        // s_1 w_1 / a_1^2 = s_2 w_2 / a_2^2, i.e. a_k proportional to sqrt(s_k w_k).
        let cell = |w: f64, s: f64| CellDemand {
            model: ResponseModel {
                tau0: 0.0,
                w: vec![w],
                resources: 1,
            },
            deadline: 0.0,
            slope: s,
        };
        let p = Problem {
            cells: vec![cell(1.0, 1.0), cell(4.0, 1.0)],
            capacity: vec![3.0],
        };
        let s = socp::solve(&p).unwrap();
        // sqrt(1) : sqrt(4) = 1 : 2 of 3.
        assert!((s.alloc[0][0] - 1.0).abs() < 1e-4, "{s:?}");
        assert!((s.alloc[1][0] - 2.0).abs() < 1e-4, "{s:?}");
        assert!((s.penalty - (1.0 + 2.0)).abs() < 1e-4);
    }

    #[test]
    fn the_example_problem_solves_feasibly_and_beats_an_even_split() {
        let p = example_problem(12);
        let s = socp::solve(&p).unwrap();
        assert!(p.infeasibility(&s.alloc) < 1e-6);
        let even: Vec<Vec<f64>> = (0..12).map(|_| vec![8.0 / 12.0; 3]).collect();
        assert!(s.penalty <= p.total_penalty(&even) + 1e-9);
        assert!(
            s.penalty > 0.0,
            "the example should make penalties trade off"
        );
    }

    #[test]
    fn invalid_problems_are_refused() {
        let mut p = example_problem(2);
        p.capacity[0] = -1.0;
        assert!(matches!(socp::solve(&p), Err(SolveError::Invalid(_))));
    }
}
