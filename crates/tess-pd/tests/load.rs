//! Patch loading: errors name the object, file and line; abstractions get `$N` and `$0`;
//! subpatch ports are ordered by x; parameters are checked.

use std::path::Path;
use tess_pd::engine::{Config, Engine, EngineError};
use tess_pd::sched::Executor;

const CFG: Config = Config {
    sample_rate: 44100.0,
    block: 64,
};

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

fn render1(p: &Path, seconds: f64) -> Vec<f32> {
    tess_pd::render::render(p, CFG, seconds, &mut Executor::serial())
        .expect("render")
        .remove(0)
}

#[test]
fn unknown_object_names_object_file_and_line() {
    let d = tempfile::tempdir().expect("tmp");
    let p = write(
        d.path(),
        "bad.pd",
        "#N canvas 0 0 100 100 12;\n#X obj 1 1 osc~ 3;\n#X obj 1 1 frobnicate~ 2;\n",
    );
    let e = Engine::open(&p, CFG).expect_err("unknown object");
    let s = e.to_string();
    assert!(s.contains("frobnicate~"), "{s}");
    assert!(s.contains("bad.pd:3"), "{s}");
}

#[test]
fn bad_connection_is_an_error() {
    let d = tempfile::tempdir().expect("tmp");
    let p = write(
        d.path(),
        "c.pd",
        "#N canvas 0 0 100 100 12;\n#X obj 1 1 osc~ 3;\n#X connect 0 0 7 0;\n",
    );
    let e = Engine::open(&p, CFG).expect_err("bad connection");
    assert!(e.to_string().contains("no such box"), "{e}");
}

#[test]
fn block_size_is_checked() {
    let d = tempfile::tempdir().expect("tmp");
    let p = write(d.path(), "e.pd", "#N canvas 0 0 100 100 12;\n");
    for block in [8, 48, 2048] {
        let e = Engine::open(
            &p,
            Config {
                sample_rate: 48000.0,
                block,
            },
        )
        .expect_err("bad block");
        assert!(matches!(e, EngineError::Config(_)), "{e}");
    }
}

#[test]
fn abstraction_gets_its_arguments_and_a_private_dollar_zero() {
    let d = tempfile::tempdir().expect("tmp");
    // gain~ $1: multiplies by its first argument; its delay line is private ($0-line)
    write(
        d.path(),
        "gain~.pd",
        "#N canvas 0 0 100 100 12;\n#X obj 1 1 inlet~;\n#X obj 1 20 *~ \\$1;\n#X obj 1 40 outlet~;\n#X obj 50 1 delwrite~ \\$0-line 10;\n#X connect 0 0 1 0;\n#X connect 1 0 2 0;\n#X connect 1 0 3 0;\n",
    );
    let p = write(
        d.path(),
        "main.pd",
        "#N canvas 0 0 100 100 12;\n#X obj 1 1 sig~ 1;\n#X obj 1 20 gain~ 0.25;\n#X obj 60 20 gain~ 2;\n#X obj 1 40 dac~ 1 2;\n#X connect 0 0 1 0;\n#X connect 0 0 2 0;\n#X connect 1 0 3 0;\n#X connect 2 0 3 1;\n",
    );
    let out = tess_pd::render::render(&p, CFG, 0.01, &mut Executor::serial()).expect("render");
    assert!(out[0].iter().all(|&x| x == 0.25), "{:?}", &out[0][..4]);
    assert!(out[1].iter().all(|&x| x == 2.0), "{:?}", &out[1][..4]);
}

#[test]
fn subpatch_inlets_are_ordered_by_x_not_by_creation() {
    let d = tempfile::tempdir().expect("tmp");
    // the inlet~ created first sits on the right: it is inlet 1
    let p = write(
        d.path(),
        "sub.pd",
        "#N canvas 0 0 100 100 12;\n#X obj 1 1 sig~ 3;\n#X obj 50 1 sig~ 5;\n#N canvas 0 0 100 100 s 0;\n#X obj 80 1 inlet~;\n#X obj 10 1 inlet~;\n#X obj 10 40 -~;\n#X obj 10 60 outlet~;\n#X connect 1 0 2 0;\n#X connect 0 0 2 1;\n#X connect 2 0 3 0;\n#X restore 1 20 pd s;\n#X obj 1 40 dac~ 1;\n#X connect 0 0 2 0;\n#X connect 1 0 2 1;\n#X connect 2 0 3 0;\n",
    );
    // left inlet (x=10) gets sig~ 3, right (x=80) gets sig~ 5: 3 - 5
    assert!(render1(&p, 0.01).iter().all(|&x| x == -2.0));
}

#[test]
fn escaped_semicolons_send_from_message_boxes() {
    let d = tempfile::tempdir().expect("tmp");
    let p = write(
        d.path(),
        "semi.pd",
        "#N canvas 0 0 100 100 12;\n#X obj 1 1 loadbang;\n#X msg 1 20 \\; level 0.5 \\, 0.75;\n#X obj 1 40 r level;\n#X obj 1 60 sig~;\n#X obj 1 80 dac~ 1;\n#X connect 0 0 1 0;\n#X connect 2 0 3 0;\n#X connect 3 0 4 0;\n",
    );
    // `; level 0.5, 0.75` sends both to `level`; the last wins
    assert!(render1(&p, 0.01).iter().all(|&x| x == 0.75));
}

#[test]
fn dsp_loop_is_an_error() {
    let d = tempfile::tempdir().expect("tmp");
    let p = write(
        d.path(),
        "loop.pd",
        "#N canvas 0 0 100 100 12;\n#X obj 1 1 +~;\n#X obj 1 20 *~;\n#X connect 0 0 1 0;\n#X connect 1 0 0 0;\n",
    );
    let e = Engine::open(&p, CFG).expect_err("loop");
    assert!(e.to_string().contains("DSP loop"), "{e}");
}

#[test]
fn dac_channels_sum_their_writers_and_a_lone_writer_stands_alone() {
    let d = tempfile::tempdir().expect("tmp");
    // channel 1: two dac~ inlets (0.25 + 0.5); channel 2: one (-0.125), which overwrites the
    // bus instead of adding to a cleared one: every block must still hold exactly its value
    let p = write(
        d.path(),
        "dac.pd",
        "#N canvas 0 0 400 300 12;\n#X obj 10 10 sig~ 0.25;\n#X obj 10 40 sig~ 0.5;\n#X obj 10 70 sig~ -0.125;\n#X obj 10 100 dac~ 1;\n#X obj 10 130 dac~ 1 2;\n#X connect 0 0 3 0;\n#X connect 1 0 4 0;\n#X connect 2 0 4 1;\n",
    );
    let out = tess_pd::render::render(&p, CFG, 0.1, &mut Executor::serial()).expect("render");
    assert!(
        out[0].iter().all(|&x| x == 0.75),
        "channel 1 sums both dac~"
    );
    assert!(
        out[1].iter().all(|&x| x == -0.125),
        "channel 2 holds its one writer"
    );
}

/// Runs one block after `midi` and returns the first sample of each output channel.
fn after_midi(p: &Path, midi: &[u8]) -> Vec<f32> {
    let mut e = Engine::open(p, CFG).expect("open");
    let mut exec = Executor::serial();
    e.tick(&mut exec);
    e.midi_in(midi);
    e.tick(&mut exec);
    (0..e.channels())
        .map(|ch| {
            let mut out = vec![0.0; CFG.block];
            e.read_output(ch, &mut out);
            out[0]
        })
        .collect()
}

#[test]
fn notein_and_ctlin_spread_midi_as_pd_does() {
    let d = tempfile::tempdir().expect("tmp");
    // every outlet into a sig~ and its own dac~ channel, so the block shows what came out
    let wire = |class: &str, outlets: usize| {
        let mut t = format!("#N canvas 0 0 400 300 12;\n#X obj 10 10 {class};\n");
        let ch: Vec<String> = (1..=outlets).map(|c| c.to_string()).collect();
        t += &format!("#X obj 10 200 dac~ {};\n", ch.join(" "));
        for _ in 0..outlets {
            t += "#X obj 10 100 sig~;\n";
        }
        for o in 0..outlets {
            t += &format!("#X connect 0 {o} {} 0;\n", 2 + o);
            t += &format!("#X connect {} 0 1 {o};\n", 2 + o);
        }
        write(d.path(), &format!("{}.pd", class.replace(' ', "_")), &t)
    };
    // notein: pitch, velocity, channel (from 1); a note-off is velocity 0
    let p = wire("notein", 3);
    assert_eq!(after_midi(&p, &[0x92, 60, 100]), vec![60.0, 100.0, 3.0]);
    assert_eq!(
        after_midi(&p, &[0x92, 60, 100, 0x82, 61, 64]),
        vec![61.0, 0.0, 3.0]
    );
    // notein 3: only channel 3, no channel outlet
    let p = wire("notein 3", 2);
    assert_eq!(after_midi(&p, &[0x92, 60, 100]), vec![60.0, 100.0]);
    assert_eq!(after_midi(&p, &[0x90, 60, 100]), vec![0.0, 0.0]);
    // ctlin: value, number, channel; ctlin 7: value, channel; ctlin 7 1: value
    let p = wire("ctlin", 3);
    assert_eq!(after_midi(&p, &[0xb0, 7, 99]), vec![99.0, 7.0, 1.0]);
    let p = wire("ctlin 7", 2);
    assert_eq!(after_midi(&p, &[0xb1, 7, 99, 8, 5]), vec![99.0, 2.0]);
    let p = wire("ctlin 7 1", 1);
    assert_eq!(after_midi(&p, &[0xb1, 7, 99]), vec![0.0]);
    assert_eq!(after_midi(&p, &[0xb0, 7, 42]), vec![42.0]);
}
