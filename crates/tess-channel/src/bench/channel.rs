//! The channel's own measurements: round trips (busy-poll, blocking) and one-way throughput,
//! between this process and a forked peer on another hart.

use super::proc::spawn_pinned;
use super::BenchOptions;
use crate::{Channel, ChannelOptions, Endpoint, RecvError, Wait};
use anyhow::{bail, Context};
use tess_bench::Summary;
use tess_sched::clock::now_ns;

/// Largest message the benchmark sends.
pub(crate) const MAX_SIZE: usize = 4480;

/// A channel pair with side B opened before the fork (the child must not allocate).
fn pair(capacity: usize) -> anyhow::Result<(Endpoint, Endpoint)> {
    Channel::pair(&ChannelOptions {
        capacity,
        max_message_size: MAX_SIZE,
    })
    .context("creating the benchmark channel")
}

/// What the echo peer did with one message.
enum Echoed {
    /// Sent it back.
    Back,
    /// It was empty: the end.
    Stop,
    /// The channel failed (exit code for the peer).
    Failed(i32),
}

/// Sends back the next message, copying it once from the incoming ring into the outgoing one
/// (peek, reserve, copy ring to ring, commit, release).
#[inline]
fn echo_one(b: &mut Endpoint) -> Echoed {
    let (tx, rx) = b.halves();
    let m = match rx.peek() {
        Ok(m) => m,
        Err(_) => return Echoed::Failed(1),
    };
    if m.is_empty() {
        return Echoed::Stop;
    }
    match tx.reserve(m.len()) {
        Ok(mut slot) => {
            slot.copy_from(0, &m, 0, m.len());
            slot.commit();
        }
        Err(_) => return Echoed::Failed(2),
    }
    m.release();
    Echoed::Back
}

/// Echo peer: sends back every message until an empty one.
fn echo(b: &mut Endpoint) -> i32 {
    loop {
        match echo_one(b) {
            Echoed::Back => {}
            Echoed::Stop => return 0,
            Echoed::Failed(code) => return code,
        }
    }
}

/// The round trip's code alone: the same send, echo and receive as [`rtt`], with both ends in
/// this thread, so that no cache line crosses harts and no side waits. For each size, the
/// median over `batches` of the mean of 1,000 round trips (ns): the part of a round trip that
/// is the channel's own instructions, which the host's noise does not reach.
pub(crate) fn rtt_one_thread(
    o: &BenchOptions,
    sizes: &[usize],
    batches: usize,
) -> anyhow::Result<Vec<f64>> {
    const PER_BATCH: u64 = 1_000;
    let (mut a, mut b) = pair(o.capacity)?;
    a.set_wait(Wait::BusyPoll);
    b.set_wait(Wait::BusyPoll);
    // Demoting a message's lines out of the core that reads them next would only add misses
    // here (a CPU with `CLDEMOTE`); claiming the next lines is harmless and left on.
    a.halves().0.set_demote(false);
    b.halves().0.set_demote(false);
    let msg = vec![0x3cu8; MAX_SIZE];
    let mut back = vec![0u8; MAX_SIZE];
    let mut medians = Vec::new();
    for &size in sizes {
        let mut means = Vec::with_capacity(batches);
        for i in 0..batches + batches / 10 {
            let t0 = now_ns();
            for _ in 0..PER_BATCH {
                a.send(&msg[..size]).context("channel send")?;
                if !matches!(echo_one(&mut b), Echoed::Back) {
                    bail!("the in-thread echo failed");
                }
                let n = a.recv(&mut back).context("channel recv")?;
                if n != size {
                    bail!("echo returned {n} bytes for {size}");
                }
            }
            // The first tenth warms up.
            if i >= batches / 10 {
                means.push((now_ns() - t0) as f64 / PER_BATCH as f64);
            }
        }
        medians.push(Summary::of(&means).median);
    }
    Ok(medians)
}

/// Round trips of each size in `sizes` (`samples` each, after a warm-up), with both sides
/// waiting as `wait` says. Returns one sample vector (ns) per size.
pub(crate) fn rtt(
    o: &BenchOptions,
    sizes: &[usize],
    samples: usize,
    wait: Wait,
) -> anyhow::Result<Vec<Vec<u64>>> {
    let (mut a, mut b) = pair(o.capacity)?;
    a.set_wait(wait);
    b.set_wait(wait);
    let child = spawn_pinned(o.child_hart, || echo(&mut b))?;
    b.discard();
    let msg = vec![0x3cu8; MAX_SIZE];
    let mut back = vec![0u8; MAX_SIZE];
    let mut all = Vec::new();
    for &size in sizes {
        let mut out = Vec::with_capacity(samples);
        for i in 0..o.warmup + samples {
            let t0 = now_ns();
            a.send(&msg[..size]).context("channel send")?;
            let n = a.recv(&mut back).context("channel recv")?;
            let dt = now_ns() - t0;
            if n != size {
                bail!("echo returned {n} bytes for {size}");
            }
            if i >= o.warmup {
                out.push(dt);
            }
        }
        all.push(out);
    }
    a.send(&[]).context("stopping the echo peer")?;
    child.wait("channel echo")?;
    Ok(all)
}

/// One-way throughput of `size`-byte messages for about `duration_ns`: the producer sends
/// batches of `batch` (one publishing store each), the consumer takes batches (the channel
/// copies every message out into private memory) and reads the first byte of each. Returns (messages/s, bytes/s), timed until the consumer acknowledges the last.
pub(crate) fn throughput(
    o: &BenchOptions,
    size: usize,
    batch: usize,
    duration_ns: u64,
) -> anyhow::Result<(f64, f64)> {
    let (mut a, mut b) = pair(o.tput_capacity)?;
    a.set_wait(Wait::BusyPoll);
    b.set_wait(Wait::BusyPoll);
    let child = spawn_pinned(o.child_hart, || {
        let mut count: u64 = 0;
        let mut stop = false;
        while !stop {
            let r = b.recv_batch(256, |m| {
                if m.is_empty() {
                    stop = true;
                } else {
                    std::hint::black_box(m[0]);
                    count += 1;
                }
            });
            if r.is_err() {
                return 1;
            }
        }
        if b.send(&count.to_le_bytes()).is_err() {
            return 2;
        }
        0
    })?;
    b.discard();
    let msg = vec![0x77u8; size];
    let msgs: Vec<&[u8]> = vec![&msg[..]; batch];
    // Warm up briefly so that both sides are spinning before the clock starts.
    for _ in 0..1000 {
        a.send(&msg).context("channel send")?;
    }
    let mut sent: u64 = 0;
    let t0 = now_ns();
    loop {
        match a.try_send_batch(&msgs) {
            Ok(n) => sent += n as u64,
            Err(crate::TrySendError::Full) => std::hint::spin_loop(),
            Err(e) => return Err(e).context("channel batch send"),
        }
        if now_ns() - t0 >= duration_ns {
            break;
        }
    }
    a.send(&[]).context("channel send")?;
    let mut ack = [0u8; 8];
    match a.recv(&mut ack) {
        Ok(8) => {}
        Ok(n) => bail!("throughput peer acknowledged with {n} bytes"),
        Err(RecvError::Disconnected) => bail!("throughput peer died"),
        Err(e) => return Err(e).context("channel recv"),
    }
    let elapsed = (now_ns() - t0) as f64 / 1e9;
    let received = u64::from_le_bytes(ack);
    child.wait("channel throughput")?;
    let counted = received.saturating_sub(1000);
    if counted != sent {
        bail!("throughput peer received {counted} of {sent} messages");
    }
    let rate = sent as f64 / elapsed;
    Ok((rate, rate * size as f64))
}
