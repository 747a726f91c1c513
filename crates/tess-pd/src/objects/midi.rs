//! MIDI input after Pd 0.53's x_midi.c: `notein` and `ctlin`.
//!
//! Pd binds every such object to one name (`#notein`, `#ctlin`) and sends each incoming event
//! there as a list (`pitch velocity channel`, `number value channel`), the channel counted from
//! 1; the objects filter and spread it right to left. Here the loader gives them those names
//! as their receive names, and [`MidiParser`] turns bytes from a device or the network into
//! the same lists (`Engine::midi_in`).

use super::{farg, Cx, PdObject, Port};
use crate::atom::{Atom, Msg};

/// The name `notein` objects receive events on (Pd's `#notein`).
pub const NOTEIN: &str = "#notein";
/// The name `ctlin` objects receive events on (Pd's `#ctlin`).
pub const CTLIN: &str = "#ctlin";

/// `notein [channel]`: note events; with a channel only that channel's, without the channel
/// outlet.
#[derive(Debug)]
pub struct Notein {
    channel: f32,
}

impl PdObject for Notein {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        let outlets = if self.channel == 0.0 { 3 } else { 2 };
        (vec![], vec![Port::Control; outlets])
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        let (pitch, velo, channel) = (msg.f(0), msg.f(1), msg.f(2));
        if self.channel != 0.0 {
            if channel != self.channel {
                return;
            }
        } else {
            cx.out(2, Msg::float(channel));
        }
        cx.out(1, Msg::float(velo));
        cx.out(0, Msg::float(pitch));
    }
}

/// `ctlin [number [channel]]`: control changes; a number or channel given filters on it and
/// drops its outlet (with a channel, only the value's outlet is left, as in Pd).
#[derive(Debug)]
pub struct Ctlin {
    number: f32,
    channel: f32,
}

impl PdObject for Ctlin {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        let outlets = match (self.number < 0.0, self.channel == 0.0) {
            (_, false) => 1,
            (true, true) => 3,
            (false, true) => 2,
        };
        (vec![], vec![Port::Control; outlets])
    }
    fn distributes_lists(&self) -> bool {
        false
    }
    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        let (number, value, channel) = (msg.f(0), msg.f(1), msg.f(2));
        if self.number >= 0.0 && self.number != number {
            return;
        }
        if self.channel > 0.0 && self.channel != channel {
            return;
        }
        // Pd's outlet 3 is the last one whichever outlets exist
        if self.channel == 0.0 {
            let last = if self.number < 0.0 { 2 } else { 1 };
            cx.out(last, Msg::float(channel));
        }
        if self.number < 0.0 {
            cx.out(1, Msg::float(number));
        }
        cx.out(0, Msg::float(value));
    }
}

/// Creates the x_midi.c objects.
pub fn create(class: &str, args: &[Atom]) -> Option<Box<dyn PdObject>> {
    Some(match class {
        "notein" => Box::new(Notein {
            channel: farg(args, 0, 0.0),
        }),
        "ctlin" => Box::new(Ctlin {
            number: if args.is_empty() {
                -1.0
            } else {
                farg(args, 0, 0.0)
            },
            channel: farg(args, 1, 0.0),
        }),
        _ => return None,
    })
}

/// The receive name of a MIDI input object, if `class` is one.
pub fn receive_name(class: &str) -> Option<&'static str> {
    match class {
        "notein" => Some(NOTEIN),
        "ctlin" => Some(CTLIN),
        _ => None,
    }
}

/// A MIDI event for the objects: the receive name and the list Pd sends there.
#[derive(Debug, Clone, PartialEq)]
pub struct MidiEvent {
    /// [`NOTEIN`] or [`CTLIN`].
    pub to: &'static str,
    /// `pitch velocity channel` or `number value channel` (channel from 1).
    pub list: [f32; 3],
}

/// Turns a MIDI byte stream into events as Pd's s_midi.c parser does for port 0: running
/// status, a note-off as a note with velocity 0, real-time bytes (0xF8 and up) passed over
/// without breaking a message, system-exclusive and other system messages skipped. Events
/// other than notes and control changes are parsed and dropped (no object takes them yet).
#[derive(Debug, Default)]
pub struct MidiParser {
    status: u8,
    data: [u8; 2],
    have: usize,
    in_sysex: bool,
}

impl MidiParser {
    /// Feeds bytes; calls `emit` for each complete note or control change.
    pub fn feed(&mut self, bytes: &[u8], mut emit: impl FnMut(MidiEvent)) {
        for &b in bytes {
            if b >= 0xf8 {
                continue; // real time: may come between any two bytes
            }
            if b >= 0x80 {
                self.in_sysex = b == 0xf0;
                // system common messages cancel running status
                self.status = if b >= 0xf0 { 0 } else { b };
                self.have = 0;
                continue;
            }
            if self.in_sysex || self.status == 0 {
                continue;
            }
            self.data[self.have] = b;
            self.have += 1;
            let kind = self.status & 0xf0;
            let needed = if kind == 0xc0 || kind == 0xd0 { 1 } else { 2 };
            if self.have < needed {
                continue;
            }
            self.have = 0;
            let channel = f32::from(self.status & 0x0f) + 1.0;
            let (d0, d1) = (f32::from(self.data[0]), f32::from(self.data[1]));
            match kind {
                0x90 => emit(MidiEvent {
                    to: NOTEIN,
                    list: [d0, d1, channel],
                }),
                0x80 => emit(MidiEvent {
                    to: NOTEIN,
                    list: [d0, 0.0, channel],
                }),
                0xb0 => emit(MidiEvent {
                    to: CTLIN,
                    list: [d0, d1, channel],
                }),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Vec<MidiEvent> {
        let mut out = Vec::new();
        MidiParser::default().feed(bytes, |e| out.push(e));
        out
    }

    #[test]
    fn notes_controls_running_status_and_interleaved_bytes() {
        let ev = parse(&[
            0x91, 60, 100, // note on, channel 2
            62, 0, // running status: a note with velocity 0
            0x80, 60, 0x7f, // note off becomes velocity 0
            0xb3, 7, 0xf8, 99, // a clock byte inside a control change
            0xf0, 1, 2, 3, 0xf7, // sysex, skipped
            64, 1, // no running status after a system message: ignored
            0xc0, 5, // program change, parsed and dropped
            0xb0, 1, 2,
        ]);
        let got: Vec<(&str, [f32; 3])> = ev.iter().map(|e| (e.to, e.list)).collect();
        assert_eq!(
            got,
            vec![
                (NOTEIN, [60.0, 100.0, 2.0]),
                (NOTEIN, [62.0, 0.0, 2.0]),
                (NOTEIN, [60.0, 0.0, 1.0]),
                (CTLIN, [7.0, 99.0, 4.0]),
                (CTLIN, [1.0, 2.0, 1.0]),
            ]
        );
    }
}
