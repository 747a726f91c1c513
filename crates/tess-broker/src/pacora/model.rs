//! PACORA's response-time functions and penalties (seed 004 section 5.3; Bird and Smith,
//! "PACORA: Performance-aware convex optimization for resource allocation", HotPar 2011).
//!
//! ```text
//!   tau(a) = tau0 + sum_{i <= j} w_ij / sqrt(a_i a_j)      w_ij >= 0, tau0 >= 0
//!   pi(tau) = max(0, (tau - d) s)                          deadline d, slope s
//! ```
//!
//! The paper sums over all ordered pairs `(i, j)`; `w_ij / sqrt(a_i a_j)` and `w_ji / sqrt(a_j
//! a_i)` are the same function, so this module keeps one weight per unordered pair. With `n`
//! resources there are `n (n + 1) / 2` weights (6 for three resources), in the order of
//! [`pairs`].
//!
//! Fitting is linear in the unknowns: each sample `(a, tau)` is one row `[1, 1/sqrt(a_i a_j)
//! ...] . [tau0, w...] = tau` of a least-squares problem whose solution must be non-negative
//! (a negative weight would make tau non-convex, or growing with more resource), solved by
//! [`super::nnls`].
//!
//! Worked example, one resource: `tau0 = 2 ms`, `w = 8 ms·harts`: one hart gives 10 ms, two
//! give 6 ms; with `d = 8 ms` and `s = 1` the penalty is 2 at one hart and 0 at two.

use super::nnls::{nnls_gram, MAX_COLS};

/// The unordered resource pairs `(i, j)`, `i <= j`, in weight order.
pub fn pairs(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).flat_map(move |i| (i..n).map(move |j| (i, j)))
}

/// Number of weights for `n` resources.
pub const fn weight_count(n: usize) -> usize {
    n * (n + 1) / 2
}

/// A response-time function.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ResponseModel {
    /// Response time with unlimited resources.
    pub tau0: f64,
    /// One weight per pair of [`pairs`] of `resources`.
    pub w: Vec<f64>,
    /// Number of resource types.
    pub resources: usize,
}

/// One observation: the allocation in force and the response time measured under it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Allocation per resource (all positive).
    pub alloc: Vec<f64>,
    /// Measured response time.
    pub tau: f64,
}

impl ResponseModel {
    /// The response time under allocation `a`.
    pub fn eval(&self, a: &[f64]) -> f64 {
        self.tau0
            + pairs(self.resources)
                .zip(&self.w)
                .filter(|(_, &w)| w > 0.0)
                .map(|((i, j), w)| w / (a[i] * a[j]).sqrt())
                .sum::<f64>()
    }

    /// Fits a model to `samples` by non-negative least squares. `None` if there are no valid
    /// samples or the fit fails.
    pub fn fit(resources: usize, samples: &[Sample]) -> Option<ResponseModel> {
        let n = 1 + weight_count(resources);
        if n > MAX_COLS {
            return None;
        }
        let mut g = [0.0f64; MAX_COLS * MAX_COLS];
        let mut c = [0.0f64; MAX_COLS];
        let mut row = [0.0f64; MAX_COLS];
        let mut used = 0;
        for s in samples {
            if s.alloc.len() != resources
                || !s.tau.is_finite()
                || !s.alloc.iter().all(|x| x.is_finite() && *x > 0.0)
            {
                continue;
            }
            row[0] = 1.0;
            for (k, (i, j)) in pairs(resources).enumerate() {
                row[1 + k] = 1.0 / (s.alloc[i] * s.alloc[j]).sqrt();
            }
            for i in 0..n {
                c[i] += row[i] * s.tau;
                for j in 0..n {
                    g[i * n + j] += row[i] * row[j];
                }
            }
            used += 1;
        }
        if used == 0 {
            return None;
        }
        let x = nnls_gram(&g[..n * n], &c[..n], n)?;
        Some(ResponseModel {
            tau0: x[0],
            w: x[1..].to_vec(),
            resources,
        })
    }
}

/// A cell in the allocation problem: its response-time function and its penalty.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CellDemand {
    /// Response-time function.
    pub model: ResponseModel,
    /// Deadline `d` (same unit as the response time).
    pub deadline: f64,
    /// Slope `s`: penalty per unit of response time over the deadline.
    pub slope: f64,
}

impl CellDemand {
    /// The penalty under allocation `a`.
    pub fn penalty(&self, a: &[f64]) -> f64 {
        ((self.model.eval(a) - self.deadline) * self.slope).max(0.0)
    }
}

/// The whole problem: minimise the total penalty subject to each resource's capacity.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    /// The cells.
    pub cells: Vec<CellDemand>,
    /// Capacity of each resource type.
    pub capacity: Vec<f64>,
}

impl Problem {
    /// Number of resource types.
    pub fn resources(&self) -> usize {
        self.capacity.len()
    }

    /// Total penalty of an allocation (`alloc[p][r]`).
    pub fn total_penalty(&self, alloc: &[Vec<f64>]) -> f64 {
        self.cells
            .iter()
            .zip(alloc)
            .map(|(c, a)| c.penalty(a))
            .sum()
    }

    /// How far an allocation exceeds the capacities or goes negative (0: feasible).
    pub fn infeasibility(&self, alloc: &[Vec<f64>]) -> f64 {
        let mut worst = 0.0f64;
        for r in 0..self.resources() {
            let used: f64 = alloc.iter().map(|a| a[r]).sum();
            worst = worst.max(used - self.capacity[r]);
            for a in alloc {
                worst = worst.max(-a[r]);
            }
        }
        worst
    }

    /// Checks the problem's numbers.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.resources();
        if n == 0 || self.capacity.iter().any(|c| !(c.is_finite() && *c > 0.0)) {
            return Err("every capacity must be a positive number".into());
        }
        for (k, c) in self.cells.iter().enumerate() {
            if c.model.resources != n || c.model.w.len() != weight_count(n) {
                return Err(format!(
                    "cell {k}: model for {} resources",
                    c.model.resources
                ));
            }
            let nums = [c.model.tau0, c.deadline, c.slope];
            if nums
                .iter()
                .chain(&c.model.w)
                .any(|x| !(x.is_finite() && *x >= 0.0))
            {
                return Err(format!("cell {k}: negative or non-finite parameter"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worked_example_holds() {
        let m = ResponseModel {
            tau0: 2.0,
            w: vec![8.0],
            resources: 1,
        };
        assert_eq!(m.eval(&[1.0]), 10.0);
        assert_eq!(m.eval(&[2.0]), 6.0);
        let c = CellDemand {
            model: m,
            deadline: 8.0,
            slope: 1.0,
        };
        assert_eq!((c.penalty(&[1.0]), c.penalty(&[2.0])), (2.0, 0.0));
    }

    #[test]
    fn a_fit_recovers_the_model_that_made_the_samples() {
        let truth = ResponseModel {
            tau0: 1.5,
            w: vec![4.0, 0.0, 1.0, 2.0, 0.5, 0.0],
            resources: 3,
        };
        let samples: Vec<Sample> = (0..20)
            .map(|k| {
                let f = |x: usize| 0.3 + ((k * (x + 3) * 7) % 11) as f64 / 5.0;
                let alloc = vec![f(0), f(1), f(2)];
                Sample {
                    tau: truth.eval(&alloc),
                    alloc,
                }
            })
            .collect();
        let fit = ResponseModel::fit(3, &samples).unwrap();
        assert!((fit.tau0 - truth.tau0).abs() < 1e-6, "{fit:?}");
        for (a, b) in fit.w.iter().zip(&truth.w) {
            assert!((a - b).abs() < 1e-6, "{fit:?}");
        }
    }

    #[test]
    fn a_fit_never_returns_negative_weights() {
        // Response time that grows with the resource: the best non-negative fit is flat.
        let samples: Vec<Sample> = (1..10)
            .map(|k| Sample {
                alloc: vec![k as f64],
                tau: k as f64,
            })
            .collect();
        let fit = ResponseModel::fit(1, &samples).unwrap();
        assert!(fit.tau0 >= 0.0 && fit.w[0] >= 0.0, "{fit:?}");
        assert!(ResponseModel::fit(1, &[]).is_none());
    }
}
