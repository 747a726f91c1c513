//! Bench (placeholder).
