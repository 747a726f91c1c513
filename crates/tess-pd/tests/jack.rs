//! JACK audio I/O against a real JACK server: Debian's `jackd` with its dummy driver (no sound
//! card), a private server name so nothing else on the machine is touched. A patch's input
//! port is fed by a test client's sine and its output captured by the same client: what comes
//! back must be the patch applied to that input, sample for sample, one period later at most.

use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tess_pd::jack_io::{self, JackOptions};
use tess_pd::sched::Executor;

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
        let child = Command::new("jackd")
            .args([
                "--no-realtime",
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
    // out 1 = in 1 x 0.5; out 2 = in 1 + in 2
    let p = dir.join("jack.pd");
    std::fs::write(
        &p,
        "#N canvas 0 0 400 300 12;\n#X obj 10 10 adc~ 1 2;\n#X obj 10 40 *~ 0.5;\n\
         #X obj 10 70 +~;\n#X obj 10 100 dac~ 1 2;\n#X connect 0 0 1 0;\n#X connect 1 0 3 0;\n\
         #X connect 0 0 2 0;\n#X connect 0 1 2 1;\n#X connect 2 0 3 1;\n",
    )
    .unwrap();
    p
}

#[test]
fn a_patch_plays_through_a_jack_server() {
    let mut server = Server::start();
    // SAFETY of the environment: this test binary runs this one test that touches JACK.
    std::env::set_var("JACK_DEFAULT_SERVER", &server.name);
    let tester = connect(&mut server, "tester");
    let d = tempfile::tempdir().unwrap();
    let patch = write_patch(d.path());

    // the tester: a ramp on its out_1, a constant on out_2; records what comes back on in_1/in_2
    let out1 = tester
        .register_port("out_1", jack::AudioOut::default())
        .unwrap();
    let out2 = tester
        .register_port("out_2", jack::AudioOut::default())
        .unwrap();
    let in1 = tester
        .register_port("in_1", jack::AudioIn::default())
        .unwrap();
    let in2 = tester
        .register_port("in_2", jack::AudioIn::default())
        .unwrap();
    let got: Arc<Mutex<(Vec<f32>, Vec<f32>)>> = Arc::default();
    let rec = got.clone();
    let mut k = 0u64;
    let (mut out1, mut out2) = (out1, out2);
    let process = jack::contrib::ClosureProcessHandler::new(
        move |_: &jack::Client, ps: &jack::ProcessScope| -> jack::Control {
            for s in out1.as_mut_slice(ps).iter_mut() {
                *s = (k % 1000) as f32 / 1000.0;
                k += 1;
            }
            out2.as_mut_slice(ps).fill(0.25);
            if let Ok(mut g) = rec.try_lock() {
                g.0.extend_from_slice(in1.as_slice(ps));
                g.1.extend_from_slice(in2.as_slice(ps));
            }
            jack::Control::Continue
        },
    );
    let tester = tester.activate_async((), process).unwrap();

    let stop = AtomicBool::new(false);
    let opts = JackOptions {
        client_name: "tess-pd".into(),
        block: None,
        connect_outputs: vec!["tester:in_1".into(), "tester:in_2".into()],
        connect_inputs: vec!["tester:out_1".into(), "tester:out_2".into()],
        ..Default::default()
    };
    let report = jack_io::play(&patch, Executor::serial(), opts, Some(1.0), &stop).unwrap();
    tester.deactivate().unwrap();
    drop(server);

    assert_eq!(report.sample_rate, 48000);
    assert_eq!(report.buffer_size, 128);
    assert_eq!(report.block, 64, "two engine blocks per JACK period");
    assert!(report.periods > 100, "{report:?}");
    let g = got.lock().unwrap();
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
}
