//! The tess Resource Allocation Broker (seed 004 section 5).
//!
//! Policies are pure modules, tested against closed-form behaviour: [`pota`] (a feedback
//! controller per cell, section 5.2) and [`pacora`] (convex multi-resource allocation, section
//! 5.3). The service that reads heartbeats and applies decisions through tessd is the
//! `tess-broker` binary (docs/broker.md).

pub mod config;
pub mod pacora;
pub mod pota;
pub mod service;
pub mod share;
pub mod status;
