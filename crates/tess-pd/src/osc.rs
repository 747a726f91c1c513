//! OSC control input (Open Sound Control 1.0 over UDP, `--osc-udp`): what a controller, a
//! phone app or another program sends reaches the patch between blocks, as MIDI does.
//!
//! | OSC | reaches |
//! |---|---|
//! | `/NAME args...` | receiver `NAME` (`r NAME`, an array `NAME`), as the message box `; NAME args` would send it: numbers (int, float, double, long, bool) become floats, strings symbols; a leading string is the selector |
//! | `/midi m...` | the MIDI input (`notein`, `ctlin`): each OSC MIDI argument (`m`: port, status, data1, data2), or the bytes of a blob (`b`), as raw MIDI |
//!
//! A bundle's messages are delivered in order at once (time tags are not scheduled). A packet
//! that is not OSC, or an argument of a type Pd has no atom for (a colour, a time tag, an
//! array), is counted and dropped with its message; the engine goes on.

use crate::atom::{Atom, Msg};
use crate::engine::Engine;
use rosc::{OscMessage, OscPacket, OscType};

/// What the OSC input has done so far.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OscStats {
    /// Messages delivered to receivers or the MIDI input.
    pub delivered: u64,
    /// Datagrams that were not OSC packets.
    pub malformed: u64,
    /// Messages dropped for an argument with no Pd atom, or an empty address.
    pub unsupported: u64,
    /// The first reason something was dropped.
    pub first_error: Option<String>,
}

impl OscStats {
    fn count_drop(&mut self, counter: fn(&mut OscStats) -> &mut u64, why: String) {
        *counter(self) += 1;
        self.first_error.get_or_insert(why);
    }
}

/// Decodes one datagram and delivers what it carries to `engine` (call between blocks).
pub fn deliver(engine: &mut Engine, datagram: &[u8], stats: &mut OscStats) {
    match rosc::decoder::decode_udp(datagram) {
        Ok((_, packet)) => deliver_packet(engine, packet, stats),
        Err(e) => stats.count_drop(|s| &mut s.malformed, format!("not an OSC packet: {e:?}")),
    }
}

fn deliver_packet(engine: &mut Engine, packet: OscPacket, stats: &mut OscStats) {
    match packet {
        OscPacket::Message(m) => deliver_message(engine, m, stats),
        OscPacket::Bundle(b) => {
            for p in b.content {
                deliver_packet(engine, p, stats);
            }
        }
    }
}

fn deliver_message(engine: &mut Engine, m: OscMessage, stats: &mut OscStats) {
    let name = m.addr.trim_start_matches('/');
    if name.is_empty() {
        return stats.count_drop(
            |s| &mut s.unsupported,
            format!("address {:?} names no receiver", m.addr),
        );
    }
    if name == "midi" {
        let mut bytes = Vec::new();
        for a in &m.args {
            match a {
                OscType::Midi(x) => bytes.extend([x.status, x.data1, x.data2]),
                OscType::Blob(b) => bytes.extend_from_slice(b),
                other => {
                    return stats.count_drop(
                        |s| &mut s.unsupported,
                        format!("/midi takes MIDI (m) or blob (b) arguments, not {other:?}"),
                    )
                }
            }
        }
        engine.midi_in(&bytes);
        stats.delivered += 1;
        return;
    }
    let mut atoms = Vec::with_capacity(m.args.len());
    for a in m.args {
        atoms.push(match a {
            OscType::Float(x) => Atom::Float(x),
            OscType::Int(x) => Atom::Float(x as f32),
            OscType::Double(x) => Atom::Float(x as f32),
            OscType::Long(x) => Atom::Float(x as f32),
            OscType::Bool(b) => Atom::Float(f32::from(u8::from(b))),
            OscType::String(s) => Atom::Symbol(s),
            OscType::Char(c) => Atom::Symbol(c.to_string()),
            other => {
                return stats.count_drop(
                    |s| &mut s.unsupported,
                    format!("{}: an argument Pd has no atom for ({other:?})", m.addr),
                )
            }
        });
    }
    engine.send(name, &Msg::from_atoms(atoms));
    stats.delivered += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Config;
    use crate::sched::Executor;
    use rosc::{OscBundle, OscMidiMessage, OscTime};

    fn encode(p: &OscPacket) -> Vec<u8> {
        rosc::encoder::encode(p).unwrap()
    }

    fn msg(addr: &str, args: Vec<OscType>) -> OscPacket {
        OscPacket::Message(OscMessage {
            addr: addr.into(),
            args,
        })
    }

    /// `r gain -> sig~ -> dac~ 1`; `notein -> mtof -> sig~ -> dac~ 2`.
    fn engine() -> (tempfile::TempDir, Engine) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("osc.pd");
        std::fs::write(
            &p,
            "#N canvas 0 0 400 300 12;\n#X obj 10 10 r gain;\n#X obj 10 40 sig~;\n\
             #X obj 10 70 dac~ 1 2;\n#X obj 100 10 notein;\n#X obj 100 40 mtof;\n\
             #X obj 100 70 sig~;\n#X connect 0 0 1 0;\n#X connect 1 0 2 0;\n\
             #X connect 3 0 4 0;\n#X connect 4 0 5 0;\n#X connect 5 0 2 1;\n",
        )
        .unwrap();
        let e = Engine::open(
            &p,
            Config {
                sample_rate: 48000.0,
                block: 64,
            },
        )
        .unwrap();
        (d, e)
    }

    fn out(e: &mut Engine, ch: usize) -> f32 {
        e.tick(&mut Executor::serial());
        let mut o = [0f32; 64];
        e.read_output(ch, &mut o);
        o[63]
    }

    #[test]
    fn messages_reach_receivers_and_the_midi_input() {
        let (_d, mut e) = engine();
        let mut st = OscStats::default();
        deliver(
            &mut e,
            &encode(&msg("/gain", vec![OscType::Float(0.25)])),
            &mut st,
        );
        assert_eq!(out(&mut e, 0), 0.25);
        deliver(
            &mut e,
            &encode(&msg("/gain", vec![OscType::Int(2)])),
            &mut st,
        );
        assert_eq!(out(&mut e, 0), 2.0);
        // note 69 on channel 1 (status 0x90), as an OSC MIDI argument
        let note = OscType::Midi(OscMidiMessage {
            port: 0,
            status: 0x90,
            data1: 69,
            data2: 100,
        });
        deliver(&mut e, &encode(&msg("/midi", vec![note])), &mut st);
        assert!((out(&mut e, 1) - 440.0).abs() < 1e-3);
        // a bundle: both messages, in order
        let bundle = OscPacket::Bundle(OscBundle {
            timetag: OscTime::from((0, 1)),
            content: vec![
                msg("/gain", vec![OscType::Float(0.5)]),
                msg("/midi", vec![OscType::Blob(vec![0x90, 81, 100])]),
            ],
        });
        deliver(&mut e, &encode(&bundle), &mut st);
        assert_eq!(out(&mut e, 0), 0.5);
        assert!((out(&mut e, 1) - 880.0).abs() < 1e-2);
        assert_eq!(st.delivered, 5);
        assert_eq!((st.malformed, st.unsupported), (0, 0));
    }

    #[test]
    fn what_is_not_osc_or_has_no_pd_atom_is_counted_and_dropped() {
        let (_d, mut e) = engine();
        let mut st = OscStats::default();
        deliver(&mut e, b"hello", &mut st);
        assert_eq!(st.malformed, 1);
        let time = OscType::Time(OscTime::from((1, 2)));
        deliver(&mut e, &encode(&msg("/gain", vec![time])), &mut st);
        deliver(
            &mut e,
            &encode(&msg("/", vec![OscType::Float(1.0)])),
            &mut st,
        );
        deliver(
            &mut e,
            &encode(&msg("/midi", vec![OscType::Float(1.0)])),
            &mut st,
        );
        assert_eq!(st.unsupported, 3);
        assert_eq!(st.delivered, 0);
        assert!(st.first_error.unwrap().contains("not an OSC packet"));
        assert_eq!(out(&mut e, 0), 0.0, "nothing reached the patch");
    }
}
