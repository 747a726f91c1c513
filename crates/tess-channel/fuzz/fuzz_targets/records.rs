//! The record parser that ships (the consumer's `peek`, through the same memory shim) on
//! arbitrary ring contents. The first two bytes choose the maximum message size; the rest,
//! cut to a power of two, is the ring (`tess_channel::fuzzing::drain_ring`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 + 64 {
        return;
    }
    let max = u16::from_le_bytes([data[0], data[1]]) as usize;
    let ring = &data[2..];
    let cap = 1usize << ring.len().ilog2();
    let _ = tess_channel::fuzzing::drain_ring(&ring[..cap], max);
});
