//! Offline rendering: run a patch for a time and write the `dac~` channels as a 32-bit float
//! WAV (what `tess-pd render` does, and what the compatibility tests compare with Pd).

use crate::engine::{Config, Engine, EngineError, EngineOptions};
use crate::sched::Executor;
use std::path::Path;

/// Why a render failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The engine could not start.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Writing the WAV failed.
    #[error("writing {path}: {source}")]
    Wav {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: hound::Error,
    },
}

/// Renders `seconds` of `patch`; returns one `Vec` per output channel.
pub fn render(
    patch: &Path,
    config: Config,
    seconds: f64,
    exec: &mut Executor,
) -> Result<Vec<Vec<f32>>, EngineError> {
    render_with(patch, config, seconds, exec, &EngineOptions::default())
}

/// [`render`] with engine options.
pub fn render_with(
    patch: &Path,
    config: Config,
    seconds: f64,
    exec: &mut Executor,
    options: &EngineOptions,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let mut e = Engine::open_with(patch, config, options)?;
    let total = (seconds * config.sample_rate as f64).round() as usize;
    let ch = e.channels();
    let mut out = vec![Vec::with_capacity(total + config.block); ch];
    let mut buf = vec![0.0f32; config.block];
    while out[0].len() < total {
        e.tick(exec);
        // Offline, all the background work there is runs between blocks: no step is late.
        e.run_background();
        for (c, o) in out.iter_mut().enumerate() {
            e.read_output(c, &mut buf);
            o.extend_from_slice(&buf);
        }
    }
    for o in &mut out {
        o.truncate(total);
    }
    Ok(out)
}

/// Writes channels as an interleaved 32-bit float WAV.
pub fn write_wav(path: &Path, channels: &[Vec<f32>], sample_rate: u32) -> Result<(), RenderError> {
    let spec = hound::WavSpec {
        channels: channels.len() as u16,
        sample_rate,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let wrap = |source| RenderError::Wav {
        path: path.to_path_buf(),
        source,
    };
    let mut w = hound::WavWriter::create(path, spec).map_err(wrap)?;
    let n = channels.first().map(Vec::len).unwrap_or(0);
    for i in 0..n {
        for c in channels {
            w.write_sample(c[i]).map_err(wrap)?;
        }
    }
    w.finalize().map_err(wrap)
}

/// Reads a WAV (float or integer) into channels of `f32`.
pub fn read_wav(path: &Path) -> Result<(Vec<Vec<f32>>, u32), RenderError> {
    let wrap = |source| RenderError::Wav {
        path: path.to_path_buf(),
        source,
    };
    let mut r = hound::WavReader::open(path).map_err(wrap)?;
    let spec = r.spec();
    let nch = spec.channels as usize;
    let samples: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => r.samples::<f32>().collect::<Result<_, _>>().map_err(wrap)?,
        hound::SampleFormat::Int => {
            let scale = (1i64 << (spec.bits_per_sample - 1)) as f32;
            r.samples::<i32>()
                .map(|s| s.map(|v| v as f32 / scale))
                .collect::<Result<_, _>>()
                .map_err(wrap)?
        }
    };
    let mut out = vec![Vec::with_capacity(samples.len() / nch.max(1)); nch];
    for (i, s) in samples.into_iter().enumerate() {
        out[i % nch].push(s);
    }
    Ok((out, spec.sample_rate))
}
