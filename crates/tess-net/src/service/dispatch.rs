//! Step 4 of the loop: moving a batch of packets of the chosen entity between a socket and a
//! channel, charging each to the scheduler.

use super::ops::notify;
use super::session::Sock;
use super::sys::realtime_ns;
use super::{Service, TxMeta};
use crate::sched::{EntityId, Phase, Pick};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use tess_channel::TryRecvError;
use tess_net_client::wire::{
    Header, Op, FLAG_KERNEL_STAMP, FLAG_TRUNCATED, FLAG_WANT_SENT, HEADER_LEN,
};
use tess_sched::clock;

/// A batch in progress: the entity, its phase, and the link time used so far.
struct Batch {
    entity: EntityId,
    /// The flow whose session the batch serves.
    flow: usize,
    phase: Phase,
    latency_ns: Option<u64>,
    /// Oldest arrival among the entity's other sessions (for its head between packets).
    others: Option<u64>,
    used_ns: f64,
    packets: usize,
}

impl Service {
    /// Serves the entity's oldest waiting packet and as many after it, from the same channel,
    /// as the scheduler keeps choosing within one quantum and one batch. Returns whether
    /// anything moved.
    pub(super) fn dispatch(&mut self, entity: EntityId, phase: Phase, now: u64) -> bool {
        // The session with the entity's oldest packet.
        let mut best: Option<(u64, usize, bool)> = None;
        let mut others = None;
        for (i, s) in self.sessions.iter().enumerate() {
            let Some(s) = s else { continue };
            if self.entity_of(s) != entity {
                continue;
            }
            if let Some((a, tx)) = s.head() {
                if best.is_none_or(|(b, _, _)| a < b) {
                    best = Some((a, i, tx));
                }
            }
        }
        let Some((_, i, tx)) = best else {
            // The entity's head vanished (a client hung up): nothing to serve this round.
            self.sched.set_head(entity, None);
            return false;
        };
        for (j, s) in self.sessions.iter().enumerate() {
            let Some(s) = s else { continue };
            if j != i && self.entity_of(s) == entity {
                if let Some((a, _)) = s.head() {
                    others = Some(others.map_or(a, |o: u64| o.min(a)));
                }
            }
        }
        let flow = self.sessions[i].as_ref().map(|s| s.flow).unwrap_or(0);
        let mut b = Batch {
            entity,
            flow,
            phase,
            latency_ns: self.flows.get(flow).latency_ns,
            others,
            used_ns: 0.0,
            packets: 0,
        };
        let is_udp = matches!(
            self.sessions[i].as_ref().map(|s| &s.sock),
            Some(Sock::Udp { .. })
        );
        match (tx, is_udp) {
            (true, true) => self.udp_send(i, &mut b, now),
            (false, true) => self.udp_recv(i, &mut b, now),
            (true, false) => self.tcp_write(i, &mut b, now),
            (false, false) => self.tcp_read(i, &mut b, now),
        }
        if b.packets == 0 {
            self.counters.empty_dispatches += 1;
        }
        if b.packets > 0 {
            self.counters.by_phase[match phase {
                Phase::Deadline => 0,
                Phase::Reservation => 1,
                Phase::Weight => 2,
            }] += b.packets as u64;
            self.counters.dispatches += 1;
            self.counters.packets += b.packets as u64;
            self.link_free_ns = self.link_free_ns.max(now) + b.used_ns.ceil() as u64;
        }
        // The entity's head now: whatever the session has left, or the others.
        let head = self.sessions[i]
            .as_ref()
            .and_then(|s| s.head())
            .map(|(a, _)| a);
        let head = match (head, b.others) {
            (Some(a), Some(o)) => Some(a.min(o)),
            (a, o) => a.or(o),
        };
        self.sched.set_head(entity, head);
        b.packets > 0
    }

    /// Charges one packet and says whether the batch may go on with another (same entity and
    /// phase chosen again, within the quantum). `next_arrival`: this session's next packet.
    fn charge(
        &mut self,
        b: &mut Batch,
        arrival: u64,
        bits: u64,
        now: u64,
        next_arrival: Option<u64>,
    ) -> bool {
        self.sched
            .set_head(b.entity, Some(b.others.map_or(arrival, |o| o.min(arrival))));
        self.sched.charge(b.entity, b.phase, bits);
        b.used_ns += self.sched.link().cost_ns(bits);
        b.packets += 1;
        let late = b
            .latency_ns
            .is_some_and(|d| now > arrival.saturating_add(d));
        let head = match (next_arrival, b.others) {
            (Some(a), Some(o)) => Some(a.min(o)),
            (a, o) => a.or(o),
        };
        self.sched.set_head(b.entity, head);
        if late {
            self.note_late(b.entity);
        }
        if let Some(p) = &self.flows.get(b.flow).published {
            p.record_bytes(now.saturating_sub(arrival), late, bits / 8);
        }
        if next_arrival.is_none()
            || b.used_ns >= clock::ns(self.cfg.quantum) as f64
            || b.packets >= self.cfg.batch
        {
            return false;
        }
        // Go on only if the scheduler would choose the same again, at the time the link is
        // free for it (pacing) or now.
        let t = if self.cfg.paced {
            now + b.used_ns as u64
        } else {
            now
        };
        self.sched.pick(t) == Pick::Serve(b.entity, b.phase)
    }

    fn note_late(&mut self, entity: EntityId) {
        for s in self.sessions.iter().flatten() {
            if self.flows.get(s.flow).entity == entity {
                let f = s.flow;
                self.flows.get_mut(f).totals.late += 1;
                return;
            }
        }
    }

    fn count(&mut self, i: usize, tx: bool, bytes: usize, reserved: bool) {
        let Some(flow) = self.sessions[i].as_ref().map(|s| s.flow) else {
            return;
        };
        let t = &mut self.flows.get_mut(flow).totals;
        if tx {
            t.tx_packets += 1;
            t.tx_bytes += bytes as u64;
        } else {
            t.rx_packets += 1;
            t.rx_bytes += bytes as u64;
        }
        if reserved {
            t.reserved_served += 1;
        }
    }

    fn drop_packets(&mut self, i: usize, n: u64) {
        if let Some(flow) = self.sessions[i].as_ref().map(|s| s.flow) {
            self.flows.get_mut(flow).totals.drops += n;
        }
    }

    /// Channel -> `sendmmsg`.
    fn udp_send(&mut self, i: usize, b: &mut Batch, now: u64) {
        let max = self.cfg.max_datagram;
        let mut n = 0;
        let mut too_big = 0u64;
        loop {
            let Some(s) = self.sessions[i].as_mut() else {
                return;
            };
            let opened = s.opened_ns;
            let mut slot = match s.ep.try_peek() {
                Ok(slot) => slot,
                Err(TryRecvError::Empty) => {
                    s.tx_head = None;
                    break;
                }
                Err(_) => {
                    s.closing = true;
                    s.tx_head = None;
                    break;
                }
            };
            let Ok(h) = Header::decode(slot.bytes()) else {
                // Left for the next round's head reading to discard.
                break;
            };
            if h.op != Op::Send {
                break;
            }
            let payload = &slot.bytes()[HEADER_LEN..];
            let Some(to) = h.addr.filter(|_| payload.len() <= max) else {
                slot.release();
                too_big += 1;
                continue;
            };
            let len = payload.len();
            self.tx_mmsg.slot_mut(n)[..len].copy_from_slice(payload);
            self.tx_mmsg.lens[n] = len;
            self.tx_mmsg.set_dest(n, &to);
            self.tx_meta[n] = TxMeta {
                cookie: (h.flags & FLAG_WANT_SENT != 0).then_some(h.value),
            };
            slot.release();
            n += 1;
            let arrival = h.stamp.clamp(opened, now);
            // The next send's arrival, if one waits.
            let next = self.peek_send_arrival(i, now);
            let phase = b.phase;
            if !self.charge(b, arrival, len as u64 * 8, now, next) {
                break;
            }
            debug_assert_eq!(phase, b.phase);
        }
        if too_big > 0 {
            self.drop_packets(i, too_big);
            if let Some(s) = self.sessions[i].as_mut() {
                let mut e = Header::new(Op::Error);
                e.status = libc::EMSGSIZE as u16;
                notify(s, &e, &[]);
            }
        }
        if n == 0 {
            return;
        }
        let Some(fd) = self.sessions[i].as_ref().and_then(|s| s.sock.fd()) else {
            return;
        };
        let sent = match self.tx_mmsg.send(fd, n) {
            Ok(k) => k,
            Err(e) => {
                // A datagram the kernel refused (e.g. no route): report, drop the batch.
                if let Some(s) = self.sessions[i].as_mut() {
                    let mut h = Header::new(Op::Error);
                    h.status = e.raw_os_error().unwrap_or(libc::EIO) as u16;
                    notify(s, &h, &[]);
                }
                0
            }
        };
        let t2 = realtime_ns();
        let reserved = b.phase.is_reserved();
        for k in 0..sent {
            let len = self.tx_mmsg.lens[k];
            self.count(i, true, len, reserved);
            if let Some(cookie) = self.tx_meta[k].cookie {
                let mut h = Header::new(Op::Sent);
                h.value = cookie;
                h.stamp = t2;
                if let Some(s) = self.sessions[i].as_mut() {
                    notify(s, &h, &[]);
                }
            }
        }
        if sent < n {
            // UDP may drop: the kernel's queue was full.
            self.drop_packets(i, (n - sent) as u64);
        }
    }

    fn peek_send_arrival(&mut self, i: usize, now: u64) -> Option<u64> {
        let s = self.sessions[i].as_mut()?;
        let opened = s.opened_ns;
        let mut slot = s.ep.try_peek().ok()?;
        let h = Header::decode(slot.bytes()).ok()?;
        let a = (h.op == Op::Send).then(|| h.stamp.clamp(opened, now));
        s.tx_head = a;
        a
    }

    /// `recvmmsg` -> channel.
    fn udp_recv(&mut self, i: usize, b: &mut Batch, now: u64) {
        let Some(fd) = self.sessions[i].as_ref().and_then(|s| s.sock.fd()) else {
            return;
        };
        let arrival = self.sessions[i]
            .as_ref()
            .and_then(|s| s.rx_seen)
            .unwrap_or(now);
        // As many as fit the quantum at the link's packet rate.
        let per_packet = self.sched.link().cost_ns(0);
        let fit = ((clock::ns(self.cfg.quantum) as f64 / per_packet) as usize).max(1);
        let want = fit.min(self.cfg.batch);
        let got = match self.rx_mmsg.recv(fd, want, &mut self.rx_meta) {
            Ok(n) => n,
            Err(e) => {
                if let Some(s) = self.sessions[i].as_mut() {
                    let mut h = Header::new(Op::Error);
                    h.status = e.raw_os_error().unwrap_or(libc::EIO) as u16;
                    notify(s, &h, &[]);
                    s.rx_seen = None;
                }
                return;
            }
        };
        let fallback_ns = realtime_ns();
        let mut delivered = 0;
        let mut dropped = 0;
        for k in 0..got {
            let m = self.rx_meta[k];
            let Some(from) = m.from else {
                dropped += 1;
                continue;
            };
            let mut h = Header::new(Op::Datagram).with_addr(from);
            h.value = m.kernel_ns.unwrap_or(fallback_ns);
            if m.kernel_ns.is_some() {
                h.flags |= FLAG_KERNEL_STAMP;
            }
            if m.truncated {
                h.flags |= FLAG_TRUNCATED;
            }
            let len = m.len.min(self.rx_mmsg.payload_capacity());
            let rec = {
                let slot = self.rx_mmsg.slot_mut(k);
                h.encode(&mut slot[..HEADER_LEN]);
                &self.rx_mmsg.slot(k)[..HEADER_LEN + len]
            };
            let ok = match self.sessions[i].as_mut() {
                Some(s) => s.ep.try_send(rec).is_ok(),
                None => false,
            };
            if ok {
                delivered += 1;
                self.count(i, false, len, b.phase.is_reserved());
            } else {
                dropped += 1;
            }
            // The rest of the batch is already read: charge it all; stop choosing after it.
            let next = (k + 1 < got).then_some(arrival);
            self.charge(b, arrival, len as u64 * 8, now, next);
        }
        if dropped > 0 {
            self.drop_packets(i, dropped);
        }
        if let Some(s) = self.sessions[i].as_mut() {
            // Fewer than asked for: the socket is drained until epoll says otherwise.
            if got < want {
                s.readable = false;
                s.rx_seen = None;
            }
        }
        let _ = delivered;
    }

    /// Channel -> `write`, one record (or the part the socket takes).
    fn tcp_write(&mut self, i: usize, b: &mut Batch, now: u64) {
        let chunk_max = self.cfg.max_datagram;
        let Some(s) = self.sessions[i].as_mut() else {
            return;
        };
        let opened = s.opened_ns;
        let Sock::Stream {
            sock, tx_offset, ..
        } = &mut s.sock
        else {
            return;
        };
        let Ok(mut slot) = s.ep.try_peek() else {
            return;
        };
        let Ok(h) = Header::decode(slot.bytes()) else {
            return;
        };
        if h.op != Op::Write {
            return;
        }
        let payload = &slot.bytes()[HEADER_LEN..];
        let off = (*tx_offset).min(payload.len());
        let end = (off + chunk_max).min(payload.len());
        let result = if end > off {
            sock.write(&payload[off..end])
        } else {
            Ok(0)
        };
        let arrival = h.stamp.clamp(opened, now);
        let mut error = None;
        let mut blocked = false;
        let written = match result {
            Ok(n) => {
                *tx_offset = off + n;
                if *tx_offset >= payload.len() {
                    *tx_offset = 0;
                    slot.release();
                    s.tx_head = None;
                }
                n
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                blocked = true;
                0
            }
            Err(e) => {
                error = Some(e.raw_os_error().unwrap_or(libc::EIO));
                slot.release();
                0
            }
        };
        if blocked {
            s.tx_blocked = true;
            s.tx_head = None;
        }
        if let Some(errno) = error {
            let mut h = Header::new(Op::Error);
            h.status = errno as u16;
            notify(s, &h, &[]);
            s.closing = true;
        }
        if written > 0 {
            self.count(i, true, written, b.phase.is_reserved());
            self.charge(b, arrival, written as u64 * 8, now, None);
        }
    }

    /// `read` -> channel slot, in place.
    fn tcp_read(&mut self, i: usize, b: &mut Batch, now: u64) {
        let chunk_max = self.cfg.max_datagram;
        let Some(s) = self.sessions[i].as_mut() else {
            return;
        };
        let arrival = s.rx_seen.unwrap_or(now);
        let Sock::Stream { sock, eof, .. } = &mut s.sock else {
            return;
        };
        let Ok(mut slot) = s.ep.try_reserve(HEADER_LEN + chunk_max) else {
            s.rx_seen = None;
            return;
        };
        let fd = sock.as_raw_fd();
        let mut closed = false;
        // Read into the slot's private buffer (copied into the channel on commit): the kernel
        // would write shared memory the client may scribble on, which is fine for it, but a
        // `&mut [u8]` over that memory is not fine for us.
        let got = match sock.read(&mut slot.buffer()[HEADER_LEN..]) {
            Ok(0) => {
                Header::new(Op::Eof).encode(&mut slot.buffer()[..HEADER_LEN]);
                slot.commit_len(HEADER_LEN);
                *eof = true;
                0
            }
            Ok(n) => {
                Header::new(Op::Data).encode(&mut slot.buffer()[..HEADER_LEN]);
                slot.commit_len(HEADER_LEN + n);
                n
            }
            // Nothing to read: the slot is dropped uncommitted, which sends nothing.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => {
                let mut h = Header::new(Op::Error);
                h.status = e.raw_os_error().unwrap_or(libc::EIO) as u16;
                h.encode(&mut slot.buffer()[..HEADER_LEN]);
                slot.commit_len(HEADER_LEN);
                closed = true;
                0
            }
        };
        s.rx_seen = None;
        s.readable = false;
        if *eof || closed {
            // Stop watching for input; writes may go on after the peer's end of stream.
            let interest = if s.tx_blocked {
                libc::EPOLLOUT as u32
            } else {
                0
            };
            let _ = self.epoll.modify(fd, interest, i as u64);
            s.interest = interest;
        }
        if got > 0 {
            self.count(i, false, got, b.phase.is_reserved());
            self.charge(b, arrival, got as u64 * 8, now, None);
        }
    }
}
