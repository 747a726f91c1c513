//! Non-negative least squares, `min ||A x - y||^2` subject to `x >= 0`, by the active-set
//! method of Lawson and Hanson ("Solving Least Squares Problems", 1974, chapter 23), on the
//! normal equations: PACORA's fits have a handful of columns (7 for three resources) and tens of
//! rows, so the Gram matrix `A'A` is tiny and a Cholesky solve of the passive set is the
//! cheapest exact step.

/// The largest number of columns supported.
pub const MAX_COLS: usize = 16;

/// Solves `min ||A x - y||` with `x >= 0` given the Gram matrix `g = A'A` (row-major, `n x n`)
/// and `c = A'y`. Returns `x`, or `None` if the problem is degenerate beyond repair.
pub fn nnls_gram(g: &[f64], c: &[f64], n: usize) -> Option<Vec<f64>> {
    assert!(n <= MAX_COLS && g.len() == n * n && c.len() == n);
    let mut x = vec![0.0; n];
    let mut passive = vec![false; n];
    let tol = 1e-12 * (1.0 + c.iter().map(|v| v.abs()).fold(0.0, f64::max));
    for _outer in 0..3 * n + 10 {
        // Gradient of -1/2 ||Ax - y||^2: w = c - G x.
        let w: Vec<f64> = (0..n)
            .map(|i| c[i] - (0..n).map(|j| g[i * n + j] * x[j]).sum::<f64>())
            .collect();
        let Some((best, &wmax)) = w
            .iter()
            .enumerate()
            .filter(|(i, _)| !passive[*i])
            .max_by(|a, b| a.1.total_cmp(b.1))
        else {
            return Some(x);
        };
        if wmax <= tol {
            return Some(x);
        }
        passive[best] = true;
        // Inner loop: solve on the passive set, step back while it leaves the feasible region.
        for _inner in 0..3 * n + 10 {
            let z = solve_passive(g, c, n, &passive)?;
            if passive.iter().zip(&z).all(|(&p, &zi)| !p || zi > 0.0) {
                x = z;
                break;
            }
            let mut alpha = f64::INFINITY;
            for i in 0..n {
                if passive[i] && z[i] <= 0.0 {
                    let denom = x[i] - z[i];
                    if denom > 0.0 {
                        alpha = alpha.min(x[i] / denom);
                    }
                }
            }
            if !alpha.is_finite() {
                alpha = 0.0;
            }
            for i in 0..n {
                x[i] += alpha * (z[i] - x[i]);
                if passive[i] && x[i] <= 1e-15 {
                    passive[i] = false;
                    x[i] = 0.0;
                }
            }
        }
    }
    Some(x)
}

/// Solves the normal equations restricted to the passive columns (others zero) by Cholesky.
fn solve_passive(g: &[f64], c: &[f64], n: usize, passive: &[bool]) -> Option<Vec<f64>> {
    let idx: Vec<usize> = (0..n).filter(|&i| passive[i]).collect();
    let k = idx.len();
    let mut l = [0.0f64; MAX_COLS * MAX_COLS];
    // A small ridge keeps collinear columns (the same allocation sampled twice) solvable.
    let ridge = 1e-12 * (0..n).map(|i| g[i * n + i]).fold(0.0, f64::max).max(1e-300);
    for i in 0..k {
        for j in 0..=i {
            let mut s = g[idx[i] * n + idx[j]];
            for m in 0..j {
                s -= l[i * MAX_COLS + m] * l[j * MAX_COLS + m];
            }
            if i == j {
                let d = s + ridge;
                if d <= 0.0 {
                    return None;
                }
                l[i * MAX_COLS + i] = d.sqrt();
            } else {
                l[i * MAX_COLS + j] = s / l[j * MAX_COLS + j];
            }
        }
    }
    let mut y = [0.0f64; MAX_COLS];
    for i in 0..k {
        let mut s = c[idx[i]];
        for m in 0..i {
            s -= l[i * MAX_COLS + m] * y[m];
        }
        y[i] = s / l[i * MAX_COLS + i];
    }
    let mut z = vec![0.0; n];
    for i in (0..k).rev() {
        let mut s = y[i];
        for m in i + 1..k {
            s -= l[m * MAX_COLS + i] * z[idx[m]];
        }
        z[idx[i]] = s / l[i * MAX_COLS + i];
    }
    Some(z)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gram(a: &[Vec<f64>], y: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let n = a[0].len();
        let mut g = vec![0.0; n * n];
        let mut c = vec![0.0; n];
        for (row, yi) in a.iter().zip(y) {
            for i in 0..n {
                c[i] += row[i] * yi;
                for j in 0..n {
                    g[i * n + j] += row[i] * row[j];
                }
            }
        }
        (g, c)
    }

    #[test]
    fn an_exact_non_negative_solution_is_recovered() {
        let a: Vec<Vec<f64>> = (0..10)
            .map(|k| {
                let k = k as f64;
                vec![1.0, k, (k * 0.7).sin() + 2.0]
            })
            .collect();
        let truth = [0.5, 2.0, 3.0];
        let y: Vec<f64> = a
            .iter()
            .map(|r| r.iter().zip(&truth).map(|(x, t)| x * t).sum())
            .collect();
        let (g, c) = gram(&a, &y);
        let x = nnls_gram(&g, &c, 3).unwrap();
        for (xi, ti) in x.iter().zip(&truth) {
            assert!((xi - ti).abs() < 1e-8, "{x:?}");
        }
    }

    #[test]
    fn a_negative_unconstrained_coefficient_is_clamped_to_zero_optimally() {
        // y = 1 - 1 * k: the unconstrained fit wants a negative slope.
        let a: Vec<Vec<f64>> = (0..5).map(|k| vec![1.0, k as f64]).collect();
        let y: Vec<f64> = (0..5).map(|k| 1.0 - k as f64).collect();
        let (g, c) = gram(&a, &y);
        let x = nnls_gram(&g, &c, 2).unwrap();
        assert_eq!(x[1], 0.0);
        // With the slope at zero, the best intercept is the mean of y = -1, so also zero.
        assert_eq!(x[0], 0.0);
        let y: Vec<f64> = (0..5).map(|k| 5.0 - k as f64).collect();
        let (g, c) = gram(&a, &y);
        let x = nnls_gram(&g, &c, 2).unwrap();
        assert!((x[0] - 3.0).abs() < 1e-9 && x[1] == 0.0, "{x:?}");
    }
}
