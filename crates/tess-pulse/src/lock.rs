//! Synchronization for Pulse code: a spin lock for scheduler state, and the Pulse lock
//! (`pulse_lock_*`), a mutex for application threads with priority inheritance.
//!
//! # Why Pulse needs its own locks (seed 004 section 4.2)
//!
//! A user-level thread preempted while it holds an ordinary mutex keeps it while it waits in
//! a run queue; a thread on the same hart that then blocks on that mutex in the kernel blocks
//! the whole hart, and with one hart nothing ever runs the holder again. So:
//!
//! - [`SpinLock`] is held only with ticks off (scheduler context, or Pulse internals), so its
//!   holder is never preempted at user level and a waiter spins for a bounded time;
//! - [`RawLock`] (C: `pulse_lock_t`) from an application thread parks the waiter with Pulse
//!   (the hart runs other threads) and hands the lock directly to the chosen waiter on release.
//!   While a thread waits, the holder *inherits* the waiter's deadline if it is earlier (the
//!   holder's `inherited_ns`), so an EDF scheduler runs the holder before medium-deadline
//!   threads and the waiter is not delayed by them (priority inversion). Inheritance is one
//!   level deep: a holder that itself waits passes nothing on. From scheduler context the same
//!   lock is a plain spin lock (Listing 2's `push_lock`/`pop_lock`); a lock is used either by
//!   schedulers or by threads, never both.
//!
//! With a C scheduler that has no `wake` callback, a blocked waiter cannot be handed back, so
//! the lock waits by yielding instead (correct, but without inheritance).

use crate::arch::pulse_ticks_off;
use crate::hart::{self, HartState, Reason};
use crate::thread::{PulseThread, ThreadState, NO_DEADLINE};
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// A spin lock for data touched with ticks off (scheduler queues, Pulse's lists).
#[derive(Debug, Default)]
pub struct SpinLock<T> {
    word: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reachable through a guard, and one guard exists at a time.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the value.
unsafe impl<T: Send> Send for SpinLock<T> {}

/// Access to a [`SpinLock`]'s value; unlocks on drop.
#[derive(Debug)]
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

fn spin_acquire(word: &AtomicU32) {
    let mut spins = 0u32;
    while word
        .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins % 256 == 0 {
            // The holder's kernel thread may have been descheduled (two harts sharing a CPU
            // during an adaptation): let it run.
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

impl<T> SpinLock<T> {
    /// A new unlocked lock.
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            word: AtomicU32::new(0),
            value: UnsafeCell::new(value),
        }
    }

    /// Spins until the lock is ours. Call with ticks off (scheduler callbacks always are).
    pub fn lock(&self) -> SpinGuard<'_, T> {
        spin_acquire(&self.word);
        SpinGuard { lock: self }
    }

    /// The lock if it is free now.
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        self.word
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| SpinGuard { lock: self })
    }
}

impl<'a, T> SpinGuard<'a, T> {
    /// Keeps the lock held past the guard: the returned word must be stored 0 (released) by
    /// whoever takes over, e.g. after a context switch.
    pub(crate) fn into_raw(self) -> &'a AtomicU32 {
        let w = &self.lock.word;
        std::mem::forget(self);
        w
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: we hold the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: we hold the lock exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.word.store(0, Ordering::Release);
    }
}

/// The Pulse lock (C: `pulse_lock_t`, 32 bytes, zero-initialized = unlocked). Module docs.
#[repr(C)]
#[derive(Debug)]
pub struct RawLock {
    /// 0 free; a thread pointer (even) for an application owner; odd for a scheduler or
    /// foreign owner.
    owner: AtomicUsize,
    guard: AtomicU32,
    _pad: u32,
    head: UnsafeCell<*mut PulseThread>,
    _reserved: u64,
}

impl Default for RawLock {
    fn default() -> Self {
        RawLock::new()
    }
}

// SAFETY: `head` is only touched under `guard`; the rest is atomic.
unsafe impl Sync for RawLock {}
// SAFETY: as above.
unsafe impl Send for RawLock {}

const FOREIGN_OWNER: usize = 1;

impl RawLock {
    /// A new unlocked lock.
    pub const fn new() -> RawLock {
        RawLock {
            owner: AtomicUsize::new(0),
            guard: AtomicU32::new(0),
            _pad: 0,
            head: UnsafeCell::new(std::ptr::null_mut()),
            _reserved: 0,
        }
    }

    fn try_take(&self, token: usize) -> bool {
        self.owner
            .compare_exchange(0, token, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether the lock is held.
    pub fn is_locked(&self) -> bool {
        self.owner.load(Ordering::Acquire) != 0
    }

    /// Acquires the lock (module docs for what waiting means in each context).
    pub fn lock(&self) {
        // SAFETY: only touches this kernel thread's hart.
        let h = unsafe { pulse_ticks_off().as_ref() };
        let Some(h) = h else {
            self.spin_lock(FOREIGN_OWNER);
            return;
        };
        let me = h.current.load(Ordering::Relaxed);
        if me.is_null() {
            // Scheduler context: ticks stay off.
            self.spin_lock(h as *const HartState as usize | 1);
            return;
        }
        self.lock_as_thread(h, me);
    }

    fn spin_lock(&self, token: usize) {
        let mut spins = 0u32;
        while !self.try_take(token) {
            spins += 1;
            if spins % 256 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn lock_as_thread(&self, mut h: &HartState, me: *mut PulseThread) {
        loop {
            if self.try_take(me as usize) {
                note_held(me, self, true);
                hart::ticks_on();
                return;
            }
            if !h.shared().callbacks.wakes() {
                hart::ticks_on();
                hart::yield_now();
                // SAFETY: only touches this kernel thread's hart; we are a Pulse thread.
                h = unsafe { &*pulse_ticks_off() };
                continue;
            }
            spin_acquire(&self.guard);
            if self.try_take(me as usize) {
                self.guard.store(0, Ordering::Release);
                note_held(me, self, true);
                hart::ticks_on();
                return;
            }
            // SAFETY: under the guard; `me` is the running thread, not in any list.
            unsafe {
                (*me).next = std::ptr::null_mut();
                let mut link: *mut *mut PulseThread = self.head.get();
                while !(*link).is_null() {
                    link = std::ptr::addr_of_mut!((**link).next);
                }
                *link = me;
                (*me)
                    .waiting_on
                    .store(self as *const _ as *mut _, Ordering::Relaxed);
                (*me)
                    .state
                    .store(ThreadState::Blocked as u8, Ordering::Relaxed);
            }
            self.inherit_to_owner(me);
            // SAFETY: ticks are off; the guard is released once our context is saved, so the
            // releaser cannot resume us before that.
            unsafe { hart::suspend_current(h, Reason::Block, Some(&self.guard)) };
            // Resumed by the releaser, which made us the owner.
            debug_assert_eq!(self.owner.load(Ordering::Relaxed), me as usize);
            note_held(me, self, true);
            return;
        }
    }

    /// The owner inherits `waiter`'s deadline if earlier (under the guard).
    fn inherit_to_owner(&self, waiter: *mut PulseThread) {
        let owner = self.owner.load(Ordering::Acquire);
        if owner == 0 || owner & 1 == 1 {
            return;
        }
        // SAFETY: the owner holds this lock, so it is live (a thread must release its locks
        // before it returns) and cannot release it while we hold the guard.
        unsafe {
            let d = (*waiter).effective_deadline_ns();
            (*(owner as *mut PulseThread))
                .inherited_ns
                .fetch_min(d, Ordering::AcqRel);
        }
    }

    /// The earliest effective deadline among the waiters (under the guard).
    fn earliest_waiter(&self) -> u64 {
        let mut best = NO_DEADLINE;
        // SAFETY: under the guard; waiters are parked threads owned by this list.
        unsafe {
            let mut t = *self.head.get();
            while !t.is_null() {
                best = best.min((*t).effective_deadline_ns());
                t = (*t).next;
            }
        }
        best
    }

    /// Releases the lock: the earliest-deadline waiter (the oldest among equals) becomes the
    /// owner and is handed to the scheduler.
    pub fn unlock(&self) {
        // SAFETY: only touches this kernel thread's hart.
        let h = unsafe { pulse_ticks_off().as_ref() };
        let me = h.map_or(std::ptr::null_mut(), |h| h.current.load(Ordering::Relaxed));
        let (Some(h), false) = (h, me.is_null()) else {
            // Scheduler or foreign context: a spin lock.
            self.owner.store(0, Ordering::Release);
            return;
        };
        spin_acquire(&self.guard);
        // SAFETY: under the guard.
        let next = unsafe { self.pop_earliest() };
        if next.is_null() {
            self.owner.store(0, Ordering::Release);
        } else {
            self.owner.store(next as usize, Ordering::Release);
            // SAFETY: next was parked here and is ours now.
            unsafe {
                (*next)
                    .waiting_on
                    .store(std::ptr::null_mut(), Ordering::Relaxed);
                (*next)
                    .inherited_ns
                    .fetch_min(self.earliest_waiter(), Ordering::AcqRel);
            }
        }
        self.guard.store(0, Ordering::Release);
        note_held(me, self, false);
        recompute_inheritance(me);
        let mut preempt = false;
        if !next.is_null() {
            preempt = h.shared().make_runnable(next);
        }
        hart::ticks_on();
        if preempt {
            hart::yield_now();
        }
    }

    /// Unlinks the waiter with the earliest effective deadline (first among equals).
    ///
    /// # Safety
    /// Caller holds the guard.
    unsafe fn pop_earliest(&self) -> *mut PulseThread {
        // SAFETY: under the guard (caller).
        unsafe {
            let mut best_link: *mut *mut PulseThread = std::ptr::null_mut();
            let mut best = u64::MAX;
            let mut link: *mut *mut PulseThread = self.head.get();
            while !(*link).is_null() {
                let d = (**link).effective_deadline_ns();
                if best_link.is_null() || d < best {
                    best = d;
                    best_link = link;
                }
                link = std::ptr::addr_of_mut!((**link).next);
            }
            if best_link.is_null() {
                return std::ptr::null_mut();
            }
            let t = *best_link;
            *best_link = (*t).next;
            (*t).next = std::ptr::null_mut();
            t
        }
    }
}

/// Adds or removes `lock` from the locks `t` holds (only `t` itself calls this).
fn note_held(t: *mut PulseThread, lock: &RawLock, held: bool) {
    // SAFETY: t is the running thread (or was just made owner and is not running yet, in
    // which case only the releaser touches it); `held` is only edited by its owner.
    let slots = unsafe { &mut (*t).held };
    let p = lock as *const RawLock;
    if held {
        if let Some(s) = slots.iter_mut().find(|s| s.is_null()) {
            *s = p;
        }
    } else if let Some(s) = slots.iter_mut().find(|s| **s == p) {
        *s = std::ptr::null();
    }
}

/// After a release, the releaser inherits only from waiters of locks it still holds.
fn recompute_inheritance(t: *mut PulseThread) {
    let mut d = NO_DEADLINE;
    // SAFETY: t is the running thread; the locks it holds are live while held.
    unsafe {
        for &l in (*t).held.iter().filter(|l| !l.is_null()) {
            spin_acquire(&(*l).guard);
            d = d.min((*l).earliest_waiter());
            (*l).guard.store(0, Ordering::Release);
        }
        (*t).inherited_ns.store(d, Ordering::Release);
    }
}

/// A Pulse lock around a value (the Rust face of `pulse_lock_t`).
#[derive(Debug, Default)]
pub struct PulseMutex<T> {
    raw: RawLock,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reachable only through a guard, one at a time.
unsafe impl<T: Send> Sync for PulseMutex<T> {}
// SAFETY: moving the mutex moves the value.
unsafe impl<T: Send> Send for PulseMutex<T> {}

/// Access to a [`PulseMutex`]'s value.
#[derive(Debug)]
pub struct PulseMutexGuard<'a, T> {
    m: &'a PulseMutex<T>,
}

impl<T> PulseMutex<T> {
    /// A new unlocked mutex.
    pub const fn new(value: T) -> PulseMutex<T> {
        PulseMutex {
            raw: RawLock::new(),
            value: UnsafeCell::new(value),
        }
    }

    /// Locks (a Pulse thread waiting here lets its hart run others).
    pub fn lock(&self) -> PulseMutexGuard<'_, T> {
        self.raw.lock();
        PulseMutexGuard { m: self }
    }
}

impl<T> Deref for PulseMutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: we hold the lock.
        unsafe { &*self.m.value.get() }
    }
}

impl<T> DerefMut for PulseMutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: we hold the lock exclusively.
        unsafe { &mut *self.m.value.get() }
    }
}

impl<T> Drop for PulseMutexGuard<'_, T> {
    fn drop(&mut self) {
        self.m.raw.unlock();
    }
}
