//! Parsing and printing of durations (`10ms`, `2.5ms`, `500us`) and sizes (`512M`, `2G`).

use std::time::Duration;

/// A malformed duration or size.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    /// Not `<number><unit>`.
    #[error("invalid duration {0:?}: expected a number with a unit, e.g. 10ms, 2.5ms, 500us, 1s")]
    Duration(String),
    /// Not `<number>[K|M|G|T]`.
    #[error("invalid size {0:?}: expected bytes with an optional binary suffix, e.g. 512M, 2G")]
    Size(String),
    /// Not `BUDGET/PERIOD`.
    #[error("invalid reservation {0:?}: expected BUDGET/PERIOD, e.g. 2ms/10ms")]
    Reservation(String),
}

/// Parses a duration with a unit: `ns`, `us` (or `µs`), `ms`, `s`. Fractions are allowed
/// (`2.5ms`); the result is rounded to whole nanoseconds.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let err = || UnitError::Duration(text.to_string());
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(err)?;
    let (num, unit) = t.split_at(split);
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(err());
    }
    let scale: f64 = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return Err(err()),
    };
    let value: f64 = num.parse().map_err(|_| err())?;
    let ns = (value * scale).round();
    if !ns.is_finite() || ns > 1e18 {
        return Err(err());
    }
    Ok(Duration::from_nanos(ns as u64))
}

/// Prints a duration in the largest unit that represents it exactly (`10ms`, `2500us`).
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0ms".to_string()
    } else if ns.is_multiple_of(1_000_000_000) {
        format!("{}s", ns / 1_000_000_000)
    } else if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

/// Parses a size in bytes with an optional binary suffix `K`, `M`, `G`, `T` (also `KiB`...).
pub fn parse_bytes(text: &str) -> Result<u64, UnitError> {
    let err = || UnitError::Size(text.to_string());
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(err());
    }
    let scale: f64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "K" | "KB" | "KIB" => 1024.0,
        "M" | "MB" | "MIB" => 1024.0 * 1024.0,
        "G" | "GB" | "GIB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "TB" | "TIB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(err()),
    };
    let value: f64 = num.parse().map_err(|_| err())?;
    let bytes = (value * scale).round();
    if !bytes.is_finite() || bytes > 9.0e18 {
        return Err(err());
    }
    Ok(bytes as u64)
}

/// Prints a size with the largest exact binary suffix.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    for (suffix, scale) in UNITS {
        if b >= scale && b.is_multiple_of(scale) {
            return format!("{}{suffix}", b / scale);
        }
    }
    format!("{b}")
}

/// Parses a reservation `BUDGET/PERIOD` (the `qres_wrap` pair), e.g. `2ms/10ms`.
pub fn parse_reservation(text: &str) -> Result<(Duration, Duration), UnitError> {
    let (b, p) = text
        .split_once('/')
        .ok_or_else(|| UnitError::Reservation(text.to_string()))?;
    let budget = parse_duration(b).map_err(|_| UnitError::Reservation(text.to_string()))?;
    let period = parse_duration(p).map_err(|_| UnitError::Reservation(text.to_string()))?;
    Ok((budget, period))
}

/// Serde helper: a `Duration` as integer nanoseconds.
pub mod serde_ns {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Serialises as nanoseconds.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Deserialises from nanoseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_nanos(u64::deserialize(d)?))
    }
}

/// Serde helper: an `Option<Duration>` as optional integer nanoseconds.
pub mod serde_opt_ns {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Serialises as optional nanoseconds.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    /// Deserialises from optional nanoseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(
            parse_duration("2.5ms").unwrap(),
            Duration::from_micros(2500)
        );
        assert_eq!(parse_duration("500us").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_duration("500µs").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_duration(" 1s ").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("100ns").unwrap(), Duration::from_nanos(100));
        for bad in ["", "10", "ms", "1.2.3ms", "10 parsecs", "-1ms", "1e3ms"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn durations_print_exactly() {
        assert_eq!(format_duration(Duration::from_millis(10)), "10ms");
        assert_eq!(format_duration(Duration::from_micros(2500)), "2500us");
        assert_eq!(format_duration(Duration::from_secs(2)), "2s");
        assert_eq!(format_duration(Duration::from_nanos(1500)), "1500ns");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("2G").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("1.5K").unwrap(), 1536);
        assert_eq!(parse_bytes("64kib").unwrap(), 65536);
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("M").is_err());
        assert_eq!(format_bytes(512 << 20), "512M");
        assert_eq!(format_bytes(1000), "1000");
    }

    #[test]
    fn reservations() {
        assert_eq!(
            parse_reservation("2ms/10ms").unwrap(),
            (Duration::from_millis(2), Duration::from_millis(10))
        );
        assert!(parse_reservation("2ms").is_err());
        assert!(parse_reservation("2ms/x").is_err());
    }
}
