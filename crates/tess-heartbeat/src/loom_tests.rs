//! Loom model checks of the seqlock in [`crate::layout`]: a reader never accepts a torn beat,
//! with one writer or two writers meeting on one slot.

use crate::layout::{publish, read, Slot};
use loom::sync::Arc;

#[test]
fn loom_a_reader_sees_a_whole_beat_or_none() {
    loom::model(|| {
        let slot = Arc::new(Slot::default());
        let w = slot.clone();
        let t = loom::thread::spawn(move || assert!(publish(&w, 0, 100, 7)));
        if let Some(b) = read(&slot, 0) {
            assert_eq!((b.ts_ns, b.value), (100, 7));
        }
        t.join().unwrap();
        assert_eq!(read(&slot, 0).map(|b| b.value), Some(7));
    });
}

#[test]
fn loom_a_rewritten_slot_never_reads_as_a_mix() {
    loom::model(|| {
        let slot = Arc::new(Slot::default());
        assert!(publish(&slot, 0, 100, 7));
        let w = slot.clone();
        // The ring wrapped: beat 4 (of a 4-slot ring) overwrites beat 0.
        let t = loom::thread::spawn(move || assert!(publish(&w, 4, 200, 9)));
        if let Some(b) = read(&slot, 0) {
            assert_eq!((b.ts_ns, b.value), (100, 7));
        }
        if let Some(b) = read(&slot, 4) {
            assert_eq!((b.ts_ns, b.value), (200, 9));
        }
        t.join().unwrap();
    });
}

#[test]
fn loom_two_writers_on_one_slot_leave_it_whole_or_unreadable() {
    loom::model(|| {
        let slot = Arc::new(Slot::default());
        let (a, b) = (slot.clone(), slot.clone());
        let ta = loom::thread::spawn(move || publish(&a, 0, 100, 1));
        let tb = loom::thread::spawn(move || publish(&b, 4, 200, 2));
        let (wa, wb) = (ta.join().unwrap(), tb.join().unwrap());
        assert!(wa || wb, "one of two writers always gets the slot");
        if let Some(x) = read(&slot, 0) {
            assert_eq!((x.ts_ns, x.value), (100, 1));
        }
        if let Some(x) = read(&slot, 4) {
            assert_eq!((x.ts_ns, x.value), (200, 2));
        }
    });
}
