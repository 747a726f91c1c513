//! A cell's CPU share, the quantity POTA controls (seed 004 section 5.2: "r is the fraction of
//! compute resources the application can use"), in harts: a time-triggered cell's
//! `active / period` times its harts, an event-triggered cell's `budget / period` times its
//! harts. Other policies are not brokered (a dedicated cell owns whole harts; a best-effort cell
//! has no guarantee to move).

use std::time::Duration;
use tess_core::spec::Policy;
use tess_proto::CellUpdate;

/// The granularity of a window or budget the broker asks for.
pub const QUANTUM: Duration = Duration::from_micros(10);
/// The longest window or budget asked for, as a fraction of the period (tessd's admission
/// keeps headroom anyway; this keeps a request from ever being the whole period).
pub const MAX_FRACTION: f64 = 0.95;

/// The cell's share in harts, if its policy is one the broker controls.
pub fn share_of(policy: &Policy, harts: usize) -> Option<f64> {
    let (slice, period) = match policy {
        Policy::TimeTriggered { period, active, .. } => (*active, *period),
        Policy::EventTriggered { period, budget } => (*budget, *period),
        _ => return None,
    };
    Some(slice.as_secs_f64() / period.as_secs_f64() * harts as f64)
}

/// The change that gives the cell `share` harts in its current period, or `None` for a policy
/// the broker does not control.
pub fn update_for(policy: &Policy, harts: usize, share: f64) -> Option<CellUpdate> {
    let period = match policy {
        Policy::TimeTriggered { period, .. } | Policy::EventTriggered { period, .. } => *period,
        _ => return None,
    };
    let fraction = (share / harts.max(1) as f64).clamp(0.0, MAX_FRACTION);
    let q = QUANTUM.as_nanos() as f64;
    let slice_ns = ((period.as_nanos() as f64 * fraction / q).round() * q).max(q);
    let slice = Duration::from_nanos(slice_ns as u64);
    let mut u = CellUpdate::default();
    match policy {
        Policy::TimeTriggered { .. } => u.active = Some(slice),
        _ => u.budget = Some(slice),
    }
    Some(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_round_trip_through_windows_and_budgets() {
        let ms = Duration::from_millis;
        let tt = Policy::TimeTriggered {
            period: ms(10),
            active: ms(4),
            offset: None,
        };
        assert!((share_of(&tt, 2).unwrap() - 0.8).abs() < 1e-12);
        let u = update_for(&tt, 2, 1.0).unwrap();
        assert_eq!(u.active, Some(ms(5)));
        assert_eq!(u.budget, None);
        let et = Policy::EventTriggered {
            period: ms(10),
            budget: ms(2),
        };
        assert!((share_of(&et, 1).unwrap() - 0.2).abs() < 1e-12);
        assert_eq!(
            update_for(&et, 1, 0.333).unwrap().budget,
            Some(Duration::from_micros(3330))
        );
        // Never the whole period, never zero.
        assert_eq!(
            update_for(&et, 1, 5.0).unwrap().budget,
            Some(Duration::from_micros(9500))
        );
        assert_eq!(update_for(&et, 1, 0.0).unwrap().budget, Some(QUANTUM));
        assert_eq!(share_of(&Policy::Dedicated, 1), None);
        assert!(update_for(&Policy::BestEffort { weight: 1 }, 1, 0.5).is_none());
    }
}
