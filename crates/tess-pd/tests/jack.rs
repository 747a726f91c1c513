//! JACK audio I/O against a real JACK server: Debian's `jackd` with its dummy driver (no sound
//! card), a private server name so nothing else on the machine is touched. A patch's input
//! port is fed by a test client's sine and its output captured by the same client: what comes
//! back must be the patch applied to that input, sample for sample, one period later at most.
//! A MIDI note sent to the patch's `notein` in the middle of a JACK period must show in the
//! output from the block holding that frame on, not from the next period.

use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tess_pd::jack_io::{self, JackOptions};
use tess_pd::sched::{Executor, Strategy};

/// A private `jackd -d dummy`, stopped by the pid we started when dropped.
struct Server {
    child: Child,
    name: String,
    /// jackd's stdout and stderr, shown when it does not come up.
    log: tempfile::NamedTempFile,
}

impl Server {
    fn start() -> Server {
        let name = format!("tess-pd-test-{}", std::process::id());
        let log = tempfile::NamedTempFile::new().unwrap();
        // `--port-max 64`: jackd sizes one shared-memory segment in /dev/shm for its port
        // table, about 100 MB at the default 2048 ports, more than a container's usual 64 MB
        // /dev/shm holds (jackd then dies on its first client). The test needs 12 ports.
        // As root, real time (SCHED_FIFO for jackd's and its clients' process threads), as a
        // musician runs it: on a loaded machine (the suite's own builds, a VM) ordinary threads
        // miss periods. Without privileges, ordinary threads.
        let realtime = if nix::unistd::geteuid().is_root() {
            "--realtime"
        } else {
            "--no-realtime"
        };
        let child = Command::new("jackd")
            .args([
                realtime,
                "--port-max",
                "64",
                "-n",
                &name,
                "-d",
                "dummy",
                "-r",
                "48000",
                "-p",
                "128",
            ])
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("jackd (Debian's jackd2) is not installed: run scripts/setup");
        Server { child, name, log }
    }

    /// What jackd printed, and whether it has exited.
    fn diagnosis(&mut self) -> String {
        let status = match self.child.try_wait() {
            Ok(Some(s)) => format!("jackd exited ({s})"),
            _ => "jackd is still running".to_string(),
        };
        let out = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        format!("{status}; it printed:\n{out}")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM first: jackd then removes its segments from /dev/shm
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for the server to take clients, with a client of our own.
fn connect(server: &mut Server, name: &str) -> jack::Client {
    let t0 = Instant::now();
    loop {
        match jack::Client::new(name, jack::ClientOptions::NO_START_SERVER) {
            Ok((c, _)) => return c,
            Err(e) if t0.elapsed() > Duration::from_secs(10) => panic!(
                "the JACK server did not take a client within 10 s: {e}\n{}",
                server.diagnosis()
            ),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn write_patch(dir: &Path) -> std::path::PathBuf {
    // out 1 = in 1 x 0.5; out 2 = in 1 + in 2; out 3 = the pitch of the last note (sig~)
    let p = dir.join("jack.pd");
    std::fs::write(
        &p,
        "#N canvas 0 0 400 300 12;\n#X obj 10 10 adc~ 1 2;\n#X obj 10 40 *~ 0.5;\n\
         #X obj 10 70 +~;\n#X obj 10 100 dac~ 1 2 3;\n#X obj 200 10 notein;\n\
         #X obj 200 40 sig~;\n#X connect 0 0 1 0;\n#X connect 1 0 3 0;\n\
         #X connect 0 0 2 0;\n#X connect 0 1 2 1;\n#X connect 2 0 3 1;\n\
         #X connect 4 0 5 0;\n#X connect 5 0 3 2;\n",
    )
    .unwrap();
    p
}

/// What the tester recorded: per sample, JACK's frame time and what came back on in_1..in_3;
/// and the frame it sent its MIDI note at.
#[derive(Default)]
struct Recording {
    frames: Vec<u32>,
    ins: [Vec<f32>; 3],
    note_sent_at: Option<u32>,
}

/// The frame in its period at which the tester sends its note: in the period's second
/// 64-sample block.
const NOTE_OFFSET: u32 = 100;

#[test]
fn a_patch_plays_through_a_jack_server() {
    let mut server = Server::start();
    // SAFETY of the environment: this test binary runs this one test that touches JACK.
    std::env::set_var("JACK_DEFAULT_SERVER", &server.name);
    let tester = connect(&mut server, "tester");
    let d = tempfile::tempdir().unwrap();
    let patch = write_patch(d.path());

    // The tester: a ramp on its out_1, a constant on out_2, one MIDI note on midi_out once the
    // patch's output has come back for 40 periods (everything is connected by then); records
    // what comes back on in_1..in_3 with each sample's frame time.
    let mut out1 = tester
        .register_port("out_1", jack::AudioOut::default())
        .unwrap();
    let mut out2 = tester
        .register_port("out_2", jack::AudioOut::default())
        .unwrap();
    let mut midi_out = tester
        .register_port("midi_out", jack::MidiOut::default())
        .unwrap();
    let ins: Vec<_> = (1..=3)
        .map(|n| {
            tester
                .register_port(&format!("in_{n}"), jack::AudioIn::default())
                .unwrap()
        })
        .collect();
    let got: Arc<Mutex<Recording>> = Arc::default();
    let rec = got.clone();
    let mut k = 0u64;
    let mut answered = 0;
    let process = jack::contrib::ClosureProcessHandler::new(
        move |_: &jack::Client, ps: &jack::ProcessScope| -> jack::Control {
            for s in out1.as_mut_slice(ps).iter_mut() {
                *s = (k % 1000) as f32 / 1000.0;
                k += 1;
            }
            out2.as_mut_slice(ps).fill(0.25);
            let Ok(mut g) = rec.try_lock() else {
                return jack::Control::Continue;
            };
            let start = ps.last_frame_time();
            if ins[1].as_slice(ps).iter().any(|&x| x != 0.0) {
                answered += 1;
            }
            // the writer clears the port's buffer: a JACK MIDI output must be cleared in every
            // period, or the last event is sent again and again
            let mut writer = midi_out.writer(ps);
            if answered == 40 && g.note_sent_at.is_none() {
                let note = jack::RawMidi {
                    time: NOTE_OFFSET,
                    bytes: &[0x90, 69, 100],
                };
                if writer.write(&note).is_ok() {
                    g.note_sent_at = Some(start + NOTE_OFFSET);
                }
            }
            g.frames.extend((0..ps.n_frames()).map(|i| start + i));
            for (r, p) in g.ins.iter_mut().zip(&ins) {
                r.extend_from_slice(p.as_slice(ps));
            }
            jack::Control::Continue
        },
    );
    let tester = tester.activate_async((), process).unwrap();

    let stop = AtomicBool::new(false);
    let opts = JackOptions {
        client_name: "tess-pd".into(),
        block: None,
        connect_outputs: vec![
            "tester:in_1".into(),
            "tester:in_2".into(),
            "tester:in_3".into(),
        ],
        connect_inputs: vec!["tester:out_1".into(), "tester:out_2".into()],
        connect_midi: vec!["tester:midi_out".into()],
        ..Default::default()
    };
    let report = jack_io::play(&patch, Executor::serial(), opts, Some(1.0), &stop).unwrap();
    tester.deactivate().unwrap();

    // The same patch on a tess runtime's harts (standalone: no tessd here), resized to one hart
    // and back while it plays: JACK's process thread is the executor's hart 0, the runtime's
    // other hart its worker, and the graph is split again for each size.
    let p2 = patch.clone();
    let on_harts = tess_pd::cell::run_on_harts(
        tess_runtime::Runtime::builder().standalone(2, None),
        Strategy::WorkStealing,
        move |exec| {
            let rt = exec.runtime().expect("on a runtime");
            let resizer = std::thread::spawn(move || {
                for n in [1, 2] {
                    std::thread::sleep(Duration::from_millis(400));
                    assert!(rt.resize(n), "a standalone runtime resizes");
                }
            });
            let exec = std::mem::replace(exec, Executor::serial());
            let opts = JackOptions {
                client_name: "tess-pd-harts".into(),
                ..Default::default()
            };
            let r = jack_io::play(&p2, exec, opts, Some(1.5), &AtomicBool::new(false));
            resizer.join().unwrap();
            r
        },
    )
    .expect("the runtime ran")
    .expect("played on the runtime's harts");
    drop(server);
    assert_eq!(on_harts.splits, [2, 1, 2], "{on_harts:?}");
    assert!(on_harts.periods > 100, "{on_harts:?}");

    assert_eq!(report.sample_rate, 48000);
    assert_eq!(report.buffer_size, 128);
    assert_eq!(report.block, 64, "two engine blocks per JACK period");
    assert!(report.periods > 100, "{report:?}");
    let rec = got.lock().unwrap();
    let g = (&rec.ins[0], &rec.ins[1]);
    // From the first sample of the patch's output to the last that still carries the ramp, with
    // the first 0.1 s left out: the four connections are made one by one, and at the end they
    // go one by one too (the inputs can go a period or two before the outputs, which then carry
    // the bare 0.25 of the patch's empty input).
    let first =
        g.1.iter()
            .position(|&x| x != 0.0)
            .expect("the patch's output came back");
    let last =
        g.1.iter()
            .rposition(|&x| x != 0.0 && (x - 0.25).abs() > 1e-4)
            .unwrap();
    let (start, end) = (first + 4800, last + 1);
    assert!(
        end > start + 10_000,
        "only {} samples came back",
        end - start
    );
    // out 2 = in 1 + 0.25 carries the ramp itself, out 1 = in 1 x 0.5 its half
    let ramp_at = |i: usize| g.1[i] - 0.25;
    for i in start..end {
        assert!(
            (g.0[i] - 0.5 * ramp_at(i)).abs() < 1e-6,
            "sample {i}: out 1 {} is not half of the ramp {}",
            g.0[i],
            ramp_at(i)
        );
    }
    // and the ramp arrives whole: consecutive samples step by 1/1000, or wrap. An xrun (a
    // client late for its period: --no-realtime on a loaded machine) loses up to a period or two
    // of the ramp around it, which is JACK's behaviour, not the engine's; those are allowed for.
    let steps = end - start - 1;
    let steps_ok = (start + 1..end)
        .filter(|&i| {
            let d = ramp_at(i) - ramp_at(i - 1);
            (d - 0.001).abs() < 1e-4 || d < -0.9
        })
        .count();
    let allowed = steps / 1000 + 3 * report.buffer_size * report.xruns as usize;
    assert!(
        steps - steps_ok <= allowed,
        "the ramp came back broken: {steps_ok} good steps of {steps}, {} xruns: {report:?}",
        report.xruns
    );
    assert!(
        report.xruns * 20 < report.periods,
        "the engine did not keep up: {report:?}"
    );

    // The note: one MIDI event in, and the pitch on out 3 from the block that holds its frame
    // (the second 64-sample block of a 128-frame period), in the period it was sent or the next
    // (the tester and the engine feed each other, so one of them reads the other a period
    // late); a period-start delivery would put it at a multiple of 128.
    assert_eq!(report.midi_events, 1, "{report:?}");
    let sent = rec.note_sent_at.expect("the tester sent its note");
    let on = rec.ins[2]
        .iter()
        .position(|&x| x == 69.0)
        .expect("the note's pitch came back on out 3");
    assert!(
        rec.ins[2][..on].iter().all(|&x| x == 0.0),
        "out 3 carried something before the note"
    );
    let after = rec.frames[on].wrapping_sub(sent - NOTE_OFFSET);
    assert!(
        after == 64 || after == 64 + 128,
        "the note came back {after} frames after the start of the period it was sent in"
    );
}
