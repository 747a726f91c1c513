//! Step 2 of the loop: the records at the head of each channel that are not data, and the
//! socket events that are not scheduled (connections completing, connections to accept).

use super::session::{Session, Sock};
use super::sys;
use super::{Pending, Service};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use tess_channel::TryRecvError;
use tess_net_client::wire::{Header, Op, HEADER_LEN};
use tess_net_client::{ControlReply, ControlRequest};

/// Control records handled per channel per round, so a chatty client cannot stall the loop.
const OPS_PER_ROUND: usize = 8;
/// Most labelled flows a cell (or a process outside any cell) may have in the table.
pub const MAX_LABELLED_FLOWS: usize = 256;

const EPOLLIN: u32 = libc::EPOLLIN as u32;
const EPOLLOUT: u32 = libc::EPOLLOUT as u32;

/// What the head of a channel holds.
enum Head {
    /// Nothing, or data (noted in the session).
    Done,
    /// A non-data record, copied to the scratch buffer and consumed.
    Op(Header),
}

fn errno_of(e: &io::Error) -> u16 {
    e.raw_os_error()
        .unwrap_or(libc::EIO)
        .clamp(1, i32::from(u16::MAX)) as u16
}

/// Sends a small record to a client without waiting; a client that lets its channel fill up
/// loses it.
pub(super) fn notify(s: &mut Session, h: &Header, payload: &[u8]) -> bool {
    let total = HEADER_LEN + payload.len();
    match s.ep.try_reserve(total) {
        Ok(mut slot) => {
            let mut head = [0u8; HEADER_LEN];
            h.encode(&mut head);
            slot.write(0, &head);
            slot.write(HEADER_LEN, payload);
            slot.commit_len(total);
            true
        }
        Err(_) => false,
    }
}

fn reply(s: &mut Session, status: u16, addr: Option<SocketAddr>) {
    let mut h = Header::new(Op::Reply);
    h.status = status;
    h.addr = addr;
    notify(s, &h, &[]);
}

impl Service {
    pub(super) fn refresh_sessions(&mut self, now: u64) {
        for i in 0..self.sessions.len() {
            if self.sessions[i].is_none() {
                continue;
            }
            for _ in 0..OPS_PER_ROUND {
                match self.read_head(i, now) {
                    Head::Done => break,
                    Head::Op(h) => self.handle_op(i, h, now),
                }
            }
            self.socket_events(i, now);
        }
        // Clients that hung up are removed at once (peer death is found at window ends).
        for i in 0..self.sessions.len() {
            if self.sessions[i].as_ref().is_some_and(|s| s.closing) {
                self.remove_session(i);
            }
        }
    }

    fn read_head(&mut self, i: usize, now: u64) -> Head {
        let Some(s) = self.sessions[i].as_mut() else {
            return Head::Done;
        };
        let mut slot = match s.ep.try_peek() {
            Ok(slot) => slot,
            Err(TryRecvError::Empty) => {
                s.tx_head = None;
                return Head::Done;
            }
            Err(_) => {
                s.closing = true;
                s.tx_head = None;
                return Head::Done;
            }
        };
        let h = match Header::decode(slot.bytes()) {
            Ok(h) => h,
            Err(_) => {
                slot.release();
                s.malformed += 1;
                return Head::Done;
            }
        };
        let data = matches!(
            (h.op, &s.sock),
            (Op::Send, Sock::Udp { .. })
                | (
                    Op::Write,
                    Sock::Stream {
                        connecting: false,
                        ..
                    }
                )
        );
        if data {
            // Arrival: the client's clock, kept between the channel's opening and now.
            s.tx_head = Some(h.stamp.clamp(s.opened_ns, now));
            return Head::Done;
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&slot.bytes()[HEADER_LEN..]);
        slot.release();
        s.tx_head = None;
        Head::Op(h)
    }

    fn handle_op(&mut self, i: usize, h: Header, now: u64) {
        match h.op {
            Op::UdpBind => self.open_udp(i, h.addr),
            Op::TcpConnect => self.open_connect(i, h.addr),
            Op::TcpListen => self.open_listener(i, h.addr, h.status),
            Op::Adopt => self.adopt(i, h.value),
            Op::Shutdown => {
                let Some(s) = self.sessions[i].as_mut() else {
                    return;
                };
                if let Sock::Stream { sock, .. } = &s.sock {
                    let _ = sock.shutdown(std::net::Shutdown::Write);
                }
            }
            Op::Control => self.control(i),
            Op::Label => self.label(i),
            Op::Send | Op::Write => {
                // Data on a channel whose socket cannot carry it.
                let Some(s) = self.sessions[i].as_mut() else {
                    return;
                };
                let mut e = Header::new(Op::Error);
                e.status = if matches!(s.sock, Sock::None) {
                    libc::ENOTCONN as u16
                } else {
                    libc::EINVAL as u16
                };
                notify(s, &e, &[]);
            }
            _ => {
                if let Some(s) = self.sessions[i].as_mut() {
                    s.malformed += 1;
                }
            }
        }
        let _ = now;
    }

    /// Checks an open request: one socket per channel, an address, and privileged ports for
    /// root only. On failure, replies.
    fn may_open(&mut self, i: usize, addr: Option<SocketAddr>, local: bool) -> Option<SocketAddr> {
        let s = self.sessions[i].as_mut()?;
        let status = match addr {
            _ if !matches!(s.sock, Sock::None) => libc::EISCONN,
            None => libc::EDESTADDRREQ,
            Some(a) if local && a.port() != 0 && a.port() < 1024 && s.client.uid != 0 => {
                libc::EACCES
            }
            Some(a) => return Some(a),
        };
        reply(s, status as u16, None);
        None
    }

    fn register(&mut self, i: usize, fd: i32, events: u32) -> io::Result<()> {
        self.epoll.add(fd, events, i as u64)?;
        if let Some(s) = self.sessions[i].as_mut() {
            s.interest = events;
        }
        Ok(())
    }

    fn open_udp(&mut self, i: usize, addr: Option<SocketAddr>) {
        let Some(addr) = self.may_open(i, addr, true) else {
            return;
        };
        let r = sys::udp_socket(addr).and_then(|(sock, local)| {
            self.register(i, sock.as_raw_fd(), EPOLLIN)?;
            Ok((sock, local))
        });
        let Some(s) = self.sessions[i].as_mut() else {
            return;
        };
        match r {
            Ok((sock, local)) => {
                s.sock = Sock::Udp { sock };
                let flow = s.flow;
                self.flows.get_mut(flow).sockets += 1;
                s.local = Some(local);
                reply(s, 0, Some(local));
            }
            Err(e) => reply(s, errno_of(&e), None),
        }
    }

    fn open_connect(&mut self, i: usize, addr: Option<SocketAddr>) {
        let Some(addr) = self.may_open(i, addr, false) else {
            return;
        };
        let r = sys::tcp_connect_start(addr, self.cfg.tcp_rcvbuf).and_then(|sock| {
            self.register(i, sock.as_raw_fd(), EPOLLIN | EPOLLOUT)?;
            Ok(sock)
        });
        let Some(s) = self.sessions[i].as_mut() else {
            return;
        };
        match r {
            // The reply goes when the connection completes (socket_events).
            Ok(sock) => {
                s.sock = Sock::Stream {
                    sock,
                    connecting: true,
                    eof: false,
                    tx_offset: 0,
                };
                let flow = s.flow;
                self.flows.get_mut(flow).sockets += 1;
            }
            Err(e) => reply(s, errno_of(&e), None),
        }
    }

    fn open_listener(&mut self, i: usize, addr: Option<SocketAddr>, backlog: u16) {
        let Some(addr) = self.may_open(i, addr, true) else {
            return;
        };
        let r = sys::tcp_listener(addr).and_then(|(sock, local)| {
            self.register(i, sock.as_raw_fd(), EPOLLIN)?;
            Ok((sock, local))
        });
        let Some(s) = self.sessions[i].as_mut() else {
            return;
        };
        match r {
            Ok((sock, local)) => {
                let flow = s.flow;
                self.flows.get_mut(flow).sockets += 1;
                s.sock = Sock::Listener {
                    sock,
                    backlog: usize::from(backlog.clamp(1, 1024)),
                };
                s.local = Some(local);
                reply(s, 0, Some(local));
            }
            Err(e) => reply(s, errno_of(&e), None),
        }
    }

    fn adopt(&mut self, i: usize, token: u64) {
        let Some(uid) = self.sessions[i].as_ref().map(|s| s.client.uid) else {
            return;
        };
        let found = self
            .pending
            .iter()
            .position(|p| p.token == token && p.uid == uid);
        let Some(k) = found.filter(|_| {
            self.sessions[i]
                .as_ref()
                .is_some_and(|s| matches!(s.sock, Sock::None))
        }) else {
            if let Some(s) = self.sessions[i].as_mut() {
                reply(s, libc::EINVAL as u16, None);
            }
            return;
        };
        let p = self.pending.remove(k);
        let local = p.stream.local_addr().ok();
        let r = self.register(i, p.stream.as_raw_fd(), EPOLLIN);
        let Some(s) = self.sessions[i].as_mut() else {
            return;
        };
        match r {
            Ok(()) => {
                let flow = s.flow;
                self.flows.get_mut(flow).sockets += 1;
                s.sock = Sock::Stream {
                    sock: p.stream,
                    connecting: false,
                    eof: false,
                    tx_offset: 0,
                };
                s.local = local;
                reply(s, 0, local);
            }
            Err(e) => reply(s, errno_of(&e), None),
        }
    }

    /// Moves channel `i` to the labelled flow of its cell the payload names. Only before the
    /// channel opens a socket (a socket's packets are charged to one flow all its life), once
    /// per channel, and while the cell has fewer than [`MAX_LABELLED_FLOWS`]: a label is cheap
    /// to send and each flow is a row and a published stats page, so a client cycling labels
    /// could otherwise grow the table without bound.
    fn label(&mut self, i: usize) {
        let Some(s) = self.sessions[i].as_mut() else {
            return;
        };
        let label = std::str::from_utf8(&self.scratch)
            .ok()
            .filter(|l| tess_net_client::qos::valid_flow_label(l));
        let base = tess_net_client::qos::flow_key(s.client.cell.as_deref(), s.client.pid);
        let status = match label {
            _ if !matches!(s.sock, Sock::None) => libc::EISCONN,
            _ if self.flows.get(s.flow).key != base => libc::EALREADY,
            None => libc::EINVAL,
            Some(l) => {
                let key = format!("{base}/{l}");
                if !self.flows.has(&key) && self.flows.labelled(&base) >= MAX_LABELLED_FLOWS {
                    libc::EMFILE
                } else {
                    let old = s.flow;
                    s.flow = self.flows.join(&key);
                    self.flows.leave(old);
                    0
                }
            }
        };
        reply(s, status as u16, None);
    }

    fn control(&mut self, i: usize) {
        let Some(s) = self.sessions[i].as_ref() else {
            return;
        };
        let admin = s.client.uid == 0 || s.client.uid == self.own_uid;
        let reply = match serde_json::from_slice::<ControlRequest>(&self.scratch) {
            Ok(req) => self.flows.control(req, admin, &mut self.sched),
            Err(e) => ControlReply::Error {
                message: format!("bad control request: {e}"),
            },
        };
        let json = serde_json::to_vec(&reply).unwrap_or_default();
        if let Some(s) = self.sessions[i].as_mut() {
            notify(s, &Header::new(Op::ControlReply), &json);
        }
    }

    /// Connections completing, accepts, writability, and whether a packet waits to be received
    /// (readable socket with room in the channel).
    fn socket_events(&mut self, i: usize, now: u64) {
        let pending_here = self.pending.iter().filter(|p| p.listener == i).count();
        let Some(s) = self.sessions[i].as_mut() else {
            return;
        };
        let mut accepted = Vec::new();
        let mut connected = None;
        let mut new_interest = s.interest;
        match &mut s.sock {
            Sock::None => {}
            Sock::Listener { sock, backlog } => {
                if s.readable {
                    let mut room = backlog.saturating_sub(pending_here);
                    while room > 0 {
                        match sock.accept() {
                            Ok((stream, peer)) => {
                                let _ = stream.set_nonblocking(true);
                                let _ = stream.set_nodelay(true);
                                accepted.push((stream, peer));
                                room -= 1;
                            }
                            Err(_) => break,
                        }
                    }
                }
            }
            Sock::Stream {
                sock, connecting, ..
            } => {
                if *connecting && s.writable {
                    let status = match sys::take_socket_error(sock.as_raw_fd()) {
                        Ok(0) => 0,
                        Ok(e) => e as u16,
                        Err(e) => errno_of(&e),
                    };
                    *connecting = false;
                    connected = Some((status, sock.local_addr().ok()));
                    new_interest = EPOLLIN;
                } else if s.tx_blocked && s.writable {
                    s.tx_blocked = false;
                    new_interest = EPOLLIN;
                }
            }
            Sock::Udp { .. } => {
                if s.tx_blocked && s.writable {
                    s.tx_blocked = false;
                    new_interest = EPOLLIN;
                }
            }
        }
        if let Some((status, local)) = connected {
            s.local = local;
            reply(s, status, local);
            if status != 0 {
                s.closing = true;
            }
        }
        // A packet waits to be received if the socket is readable and the channel has room
        // for a maximal record.
        let receives = matches!(s.sock, Sock::Udp { .. })
            || matches!(
                s.sock,
                Sock::Stream {
                    connecting: false,
                    eof: false,
                    ..
                }
            );
        let room = receives && s.readable && s.ep.try_reserve(self.rx_mmsg.slot(0).len()).is_ok();
        s.rx_seen = if room {
            Some(s.rx_seen.unwrap_or(now))
        } else {
            None
        };
        if s.tx_blocked {
            new_interest = EPOLLIN | EPOLLOUT;
        }
        if new_interest != s.interest {
            if let Some(fd) = s.sock.fd() {
                let _ = self.epoll.modify(fd, new_interest, i as u64);
            }
            s.interest = new_interest;
        }
        let uid = s.client.uid;
        for (stream, peer) in accepted {
            let token = self.next_token;
            self.next_token = self.next_token.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut h = Header::new(Op::Accepted).with_addr(peer);
            h.value = token;
            let Some(s) = self.sessions[i].as_mut() else {
                break;
            };
            if notify(s, &h, &[]) {
                self.pending.push(Pending {
                    token,
                    stream,
                    uid,
                    listener: i,
                    since_ns: now,
                });
            }
        }
    }
}
