//! `soundfiler` on bad input: a missing file, a missing table, a type tess-pd does not read,
//! bad flags, an 8-bit file: each prints an error and outputs 0 frames (as Pd does), and the
//! patch plays on. (Its agreement with Pd 0.53 on good files is in tests/compat.rs.)

use tess_pd::engine::Config;
use tess_pd::sched::Executor;

/// Renders a patch that sends `msg` to a `soundfiler` after filling table `t` (4 points) and
/// plays the frame count on channel 1 and table `t`'s first point on channel 2.
fn frames_after(dir: &std::path::Path, msg: &str) -> (f32, f32) {
    let patch = dir.join("sf.pd");
    std::fs::write(
        &patch,
        format!(
            "#N canvas 0 0 400 300 12;\n#X obj 10 10 loadbang;\n#X obj 10 30 t b b;\n\
             #X msg 100 50 \\; t 0 0.5 0.5 0.5 0.5;\n#X msg 10 50 {msg};\n\
             #X obj 10 70 soundfiler;\n#X obj 10 90 sig~ 42;\n#X obj 200 10 table t 4;\n\
             #X obj 100 90 sig~ 1;\n#X obj 100 110 tabread4~ t;\n#X obj 10 150 dac~ 1 2;\n\
             #X connect 0 0 1 0;\n#X connect 1 1 2 0;\n#X connect 1 0 3 0;\n\
             #X connect 3 0 4 0;\n#X connect 4 0 5 0;\n#X connect 5 0 9 0;\n\
             #X connect 7 0 8 0;\n#X connect 8 0 9 1;\n"
        ),
    )
    .unwrap();
    let cfg = Config {
        sample_rate: 44100.0,
        block: 64,
    };
    let out = tess_pd::render::render(&patch, cfg, 0.01, &mut Executor::serial()).unwrap();
    (out[0][100], out[1][100])
}

#[test]
fn bad_reads_output_zero_frames_and_leave_the_tables_alone() {
    let d = tempfile::tempdir().unwrap();
    // the patch itself works: a good file reads its frames (and zeroes the table's rest)
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 44100,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(d.path().join("two.wav"), spec).unwrap();
    w.write_sample(16384i16).unwrap();
    w.write_sample(-16384i16).unwrap();
    w.finalize().unwrap();
    assert_eq!(frames_after(d.path(), "read two.wav t"), (2.0, -0.5));

    for msg in [
        "read missing.wav t",
        "read two.wav nosuchtable",
        "read -aiff two.wav t",
        "read -skip two.wav t",
        "read",
        "write two.wav",
    ] {
        assert_eq!(frames_after(d.path(), msg), (0.0, 0.5), "{msg}");
    }
    // no such method: an error and no output at all, as in Pd
    assert_eq!(frames_after(d.path(), "frobnicate"), (42.0, 0.5));
    // an 8-bit file is refused, not misread
    let mut w = hound::WavWriter::create(
        d.path().join("eight.wav"),
        hound::WavSpec {
            bits_per_sample: 8,
            ..spec
        },
    )
    .unwrap();
    w.write_sample(5i8).unwrap();
    w.finalize().unwrap();
    assert_eq!(frames_after(d.path(), "read eight.wav t"), (0.0, 0.5));
}
