//! "It must sound right": the WAV written by `tess-migrator --record`, while `tess-slabs` holds
//! one pad with zero gaussian width, has its spectral peaks on the pitches of the active table.

use rustfft::num_complex::Complex;
use rustfft::FftPlanner;
use std::process::Command;
use std::time::Duration;
use tess_music::record::read_wav_channel;
use tess_music::synth::{channel_of, Tables};

const PAD: usize = 8; // root 110 Hz, channel 0
const Y: f32 = 0.3; // table 1: 7-limit just intonation

/// Local maxima of the magnitude spectrum above `floor_db` relative to the largest, as Hz.
fn peaks(signal: &[f32], floor_db: f64) -> Vec<(f64, f64)> {
    let n = signal.len();
    let mut buf: Vec<Complex<f64>> = signal
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let w = 0.5 - 0.5 * (std::f64::consts::TAU * i as f64 / n as f64).cos();
            Complex::new(f64::from(s) * w, 0.0)
        })
        .collect();
    FftPlanner::new().plan_fft_forward(n).process(&mut buf);
    let mag: Vec<f64> = buf[..n / 2].iter().map(|c| c.norm()).collect();
    let max = mag.iter().cloned().fold(0.0, f64::max);
    let floor = max * 10f64.powf(floor_db / 20.0);
    let bin_hz = 44_100.0 / n as f64;
    (2..mag.len() - 2)
        .filter(|&i| {
            mag[i] > floor
                && mag[i] >= mag[i - 1]
                && mag[i] > mag[i + 1]
                && mag[i] >= mag[i - 2]
                && mag[i] > mag[i + 2]
        })
        .map(|i| {
            // Parabolic interpolation of the peak position.
            let (a, b, c) = (mag[i - 1].ln(), mag[i].ln(), mag[i + 1].ln());
            let d = 0.5 * (a - c) / (a - 2.0 * b + c);
            ((i as f64 + d) * bin_hz, 20.0 * (mag[i] / max).log10())
        })
        .collect()
}

#[test]
fn recorded_spectrum_peaks_sit_on_the_active_table() {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("out.wav");
    let ready = dir.path().join("ready");
    let gesture = dir.path().join("one-pad.toml");
    std::fs::write(
        &gesture,
        format!("name = \"one pad\"\n[[pads]]\npad = {PAD}\nkeys = [{{ t = 0.0, x = 0.0, y = {Y}, p = 1.0 }}]\n"),
    )
    .unwrap();
    let port = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let synth = Command::new(env!("CARGO_BIN_EXE_tess-migrator"))
        .args(["--bind", &addr, "--duration", "5", "--warmup", "0.2"])
        .arg("--record")
        .arg(&wav)
        .arg("--ready-file")
        .arg(&ready)
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !ready.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let dev = Command::new(env!("CARGO_BIN_EXE_tess-slabs"))
        .args([
            "--to",
            &addr,
            "--duration",
            "3",
            "--warmup",
            "0.2",
            "--pace",
            "hybrid:20",
        ])
        .arg("--gesture")
        .arg(&gesture)
        .output()
        .unwrap();
    assert!(
        dev.status.success(),
        "{}",
        String::from_utf8_lossy(&dev.stderr)
    );
    assert!(synth.wait_with_output().unwrap().status.success());

    let ch = read_wav_channel(&wav, channel_of(PAD)).unwrap();
    let n = 1 << 16; // 1.49 s, 0.67 Hz per bin
    assert!(
        ch.len() >= n + 44_100 / 2,
        "only {} frames recorded",
        ch.len()
    );
    let window = &ch[ch.len() - n..];
    // Other channels are silent: only pad 8 is pressed.
    let other = read_wav_channel(&wav, 1).unwrap();
    assert!(other.iter().all(|s| *s == 0.0));

    let tables = Tables::new();
    let table = Tables::table_for_y(Y);
    let allowed = tables.frequencies_hz(PAD, table);
    // Migrations glide (0.2 s chirps between table pitches), which leaves a floor of small
    // local maxima 20-30 dB down; the peaks proper are the ones within 15 dB of the largest.
    let found = peaks(window, -15.0);
    assert!(found.len() >= 5, "too few peaks: {found:?}");
    for (hz, db) in &found {
        let nearest = allowed
            .iter()
            .map(|a| (a - hz).abs())
            .fold(f64::INFINITY, f64::min);
        assert!(
            nearest < 1.0,
            "peak at {hz:.2} Hz ({db:.1} dB) is {nearest:.2} Hz from every pitch of table {table} {allowed:?}"
        );
    }
    // And the strongest peaks cover several distinct table pitches.
    let distinct = allowed
        .iter()
        .filter(|a| found.iter().any(|(hz, _)| (*a - hz).abs() < 1.0))
        .count();
    assert!(distinct >= 5, "{distinct} table pitches found");
    // Most of the energy sits within 2 Hz of a table pitch.
    let on_table = energy_fraction_near(window, &allowed, 2.0);
    eprintln!(
        "{} peaks within 15 dB, on {distinct} table pitches; {on_table:.3} of the energy within 2 Hz of the table",
        found.len()
    );
    assert!(
        on_table > 0.8,
        "only {on_table:.3} of the energy is on table pitches"
    );
}

/// Fraction of the spectrum's energy (20 Hz - 20 kHz, Hann window) within `tol_hz` of `freqs`.
fn energy_fraction_near(signal: &[f32], freqs: &[f64], tol_hz: f64) -> f64 {
    let n = signal.len();
    let mut buf: Vec<Complex<f64>> = signal
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let w = 0.5 - 0.5 * (std::f64::consts::TAU * i as f64 / n as f64).cos();
            Complex::new(f64::from(s) * w, 0.0)
        })
        .collect();
    FftPlanner::new().plan_fft_forward(n).process(&mut buf);
    let bin_hz = 44_100.0 / n as f64;
    let (mut near, mut total) = (0.0, 0.0);
    for (i, c) in buf[..n / 2].iter().enumerate() {
        let hz = i as f64 * bin_hz;
        if !(20.0..=20_000.0).contains(&hz) {
            continue;
        }
        let e = c.norm_sqr();
        total += e;
        if freqs.iter().any(|f| (f - hz).abs() <= tol_hz) {
            near += e;
        }
    }
    near / total
}
