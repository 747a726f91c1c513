//! `soundfiler` after Pd 0.53's d_soundfile.c (`soundfiler_read`, `soundfiler_dowrite`): reads
//! a WAV file into arrays and writes arrays to a WAV file, synchronously, in the control path
//! (as Pd does: a long file costs the block it is read in).
//!
//! `read [-skip N] [-resize] [-maxsize N] [-wave] FILE [ARRAY...]`: channel i goes to array i;
//! without `-resize` as many frames as the arrays hold are read and the rest of each array is
//! zeroed (arrays beyond the file's channels are zeroed whole); with it the arrays take the
//! file's length (at most `-maxsize`). 16- and 24-bit integer samples become `x / 2^15` and
//! `x / 2^23` exactly, as in Pd; 32-bit float samples are taken as they are.
//!
//! `write [-skip N] [-nframes N] [-bytes 2|3|4] [-rate HZ] [-normalize] [-wave] FILE ARRAY...`:
//! Pd's conversion to integers (truncation after adding the offset, clipped to +-(2^15-1) or
//! +-(2^23-1)), normalising when asked or when an integer file would clip.
//!
//! The left outlet gives the frames read or written (0 on error), the right outlet the file's
//! sample rate, header size, channels, bytes per sample and endianness (`l`). Relative paths
//! are the patch's folder's. AIFF, CAF, NeXT, raw and ASCII files are refused with an error
//! that says so; errors are printed as Pd prints them and output 0, as in Pd.

use super::{Cx, PdObject, Port};
use crate::atom::{Atom, Msg};
use std::path::{Path, PathBuf};

/// Pd's limit on a file's frames (`SFMAXFRAMES`).
const MAX_FRAMES: usize = i32::MAX as usize;
/// Pd's limit on channels (`MAXSFCHANS`).
const MAX_CHANNELS: usize = 64;

/// The `soundfiler` object.
#[derive(Debug)]
pub struct Soundfiler {
    /// The folder relative file names are resolved in (the patch's).
    dir: PathBuf,
}

impl Soundfiler {
    /// A `soundfiler` in a patch whose file is in `dir`.
    pub fn new(dir: &Path) -> Soundfiler {
        Soundfiler {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// What the right outlet reports of a file.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FileInfo {
    /// Frames per second.
    pub sample_rate: u32,
    /// Bytes before the samples.
    pub header_size: usize,
    /// Channels.
    pub channels: usize,
    /// Bytes per sample.
    pub bytes_per_sample: usize,
}

impl FileInfo {
    fn msg(&self) -> Msg {
        Msg::from_atoms(vec![
            Atom::Float(self.sample_rate as f32),
            Atom::Float(self.header_size as f32),
            Atom::Float(self.channels as f32),
            Atom::Float(self.bytes_per_sample as f32),
            Atom::Symbol("l".into()),
        ])
    }
}

/// Why a read or write failed, in Pd's words where Pd has them.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SoundfileError {
    /// Bad arguments.
    #[error("usage: {0}")]
    Usage(&'static str),
    /// A named array does not exist.
    #[error("{0}: no such table")]
    NoTable(String),
    /// The file could not be opened, read, created or written.
    #[error("{file}: {what}")]
    File {
        /// The file name as given.
        file: String,
        /// What went wrong.
        what: String,
    },
    /// A file type tess-pd does not read or write.
    #[error("'-{0}' files are not supported by tess-pd (WAV only)")]
    Type(String),
}

const READ_USAGE: &str =
    "read [flags] filename [tablename]... (flags: -skip <n> -resize -maxsize <n> -wave)";
const WRITE_USAGE: &str = "write [flags] filename tablename... (flags: -skip <n> -nframes <n> -bytes <2|3|4> -rate <hz> -normalize -wave)";

/// Reads the leading `-flag [value]` words of `args`; returns the flags and the rest.
fn flags(args: &[Atom]) -> (Vec<(&str, Option<f32>)>, &[Atom]) {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(flag) = args
        .get(i)
        .and_then(Atom::symbol)
        .and_then(|s| s.strip_prefix('-'))
    {
        let value = match args.get(i + 1) {
            Some(Atom::Float(v)) => Some(*v),
            _ => None,
        };
        let takes_value = matches!(flag, "skip" | "maxsize" | "nframes" | "bytes" | "rate");
        out.push((flag, if takes_value { value } else { None }));
        i += if takes_value { 2 } else { 1 };
    }
    (out, &args[i.min(args.len())..])
}

fn symbols(args: &[Atom], usage: &'static str) -> Result<Vec<String>, SoundfileError> {
    args.iter()
        .map(|a| a.symbol().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or(SoundfileError::Usage(usage))
}

fn non_negative(v: Option<f32>, usage: &'static str) -> Result<usize, SoundfileError> {
    match v {
        Some(v) if v >= 0.0 => Ok((v as f64).min(MAX_FRAMES as f64) as usize),
        _ => Err(SoundfileError::Usage(usage)),
    }
}

/// Bytes before the `data` chunk's samples: walks the RIFF chunks.
fn data_offset(file: &[u8]) -> Option<usize> {
    let mut at = 12;
    while at + 8 <= file.len() {
        let size = u32::from_le_bytes(file[at + 4..at + 8].try_into().ok()?) as usize;
        if &file[at..at + 4] == b"data" {
            return Some(at + 8);
        }
        at += 8 + size + (size & 1);
    }
    None
}

/// A WAV file's samples, channel by channel, as Pd converts them, from frame `skip` on.
fn load(path: &Path, name: &str, skip: usize) -> Result<(Vec<Vec<f32>>, FileInfo), SoundfileError> {
    let err = |what: String| SoundfileError::File {
        file: name.to_string(),
        what,
    };
    let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let mut r = hound::WavReader::new(std::io::Cursor::new(&bytes))
        .map_err(|e| err(format!("unknown or bad header format ({e})")))?;
    let spec = r.spec();
    let channels = spec.channels as usize;
    if channels == 0 || channels > MAX_CHANNELS {
        return Err(err(format!("{channels} channels")));
    }
    let info = FileInfo {
        sample_rate: spec.sample_rate,
        header_size: data_offset(&bytes).unwrap_or(0),
        channels,
        bytes_per_sample: spec.bits_per_sample.div_ceil(8) as usize,
    };
    let frames = r.duration() as usize;
    r.seek(skip.min(frames) as u32)
        .map_err(|e| err(e.to_string()))?;
    let left = frames.saturating_sub(skip) * channels;
    let samples: Vec<f32> = match (spec.sample_format, spec.bits_per_sample) {
        (hound::SampleFormat::Float, 32) => r
            .samples::<f32>()
            .take(left)
            .collect::<Result<_, _>>()
            .map_err(|e| err(e.to_string()))?,
        // Pd shifts the sample to the top of an int and scales by 2^-31: exactly x / 2^(bits-1)
        (hound::SampleFormat::Int, bits @ (16 | 24)) => {
            let scale = 1.0 / (1u32 << (bits - 1)) as f32;
            r.samples::<i32>()
                .take(left)
                .map(|s| s.map(|x| x as f32 * scale))
                .collect::<Result<_, _>>()
                .map_err(|e| err(e.to_string()))?
        }
        (f, b) => {
            return Err(err(format!(
                "{b}-bit {} samples are not supported (16 or 24-bit integer, 32-bit float)",
                if f == hound::SampleFormat::Float {
                    "float"
                } else {
                    "integer"
                }
            )))
        }
    };
    let mut chans = vec![Vec::with_capacity(samples.len() / channels); channels];
    for frame in samples.chunks_exact(channels) {
        for (c, &x) in chans.iter_mut().zip(frame) {
            c.push(x);
        }
    }
    Ok((chans, info))
}

impl Soundfiler {
    /// `read`: returns the frames read and the file's description.
    pub fn read(&self, args: &[Atom], cx: &Cx<'_>) -> Result<(usize, FileInfo), SoundfileError> {
        let (flags, rest) = flags(args);
        let (mut skip, mut resize, mut maxsize) = (0, false, MAX_FRAMES);
        for (flag, value) in flags {
            match flag {
                "skip" => skip = non_negative(value, READ_USAGE)?,
                "resize" => resize = true,
                "maxsize" => {
                    maxsize = non_negative(value, READ_USAGE)?;
                    resize = true;
                }
                "wave" => {}
                "aiff" | "caf" | "next" | "nextstep" | "raw" | "ascii" => {
                    return Err(SoundfileError::Type(flag.into()))
                }
                _ => return Err(SoundfileError::Usage(READ_USAGE)),
            }
        }
        let names = symbols(rest, READ_USAGE)?;
        let Some((file, tables)) = names.split_first() else {
            return Err(SoundfileError::Usage(READ_USAGE));
        };
        if tables.len() > MAX_CHANNELS {
            return Err(SoundfileError::Usage(READ_USAGE));
        }
        let arrays = tables
            .iter()
            .map(|t| cx.shared.array(t).ok_or(SoundfileError::NoTable(t.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        // arrays of different lengths are read with -resize (Pd: "resizing...")
        let sizes: Vec<usize> = arrays.iter().map(|a| lock_read(a).len()).collect();
        if sizes.windows(2).any(|w| w[0] != w[1]) {
            resize = true;
        }
        let (data, info) = load(&self.path(file), file, skip)?;
        let in_file = data[0].len().min(maxsize);
        if tables.is_empty() {
            return Ok((in_file, info));
        }
        let size = if resize {
            in_file
        } else {
            sizes.last().copied().unwrap_or(0)
        };
        let frames = size.min(in_file);
        for (i, a) in arrays.iter().enumerate() {
            let mut v = a.write().unwrap_or_else(|e| e.into_inner());
            if resize {
                v.resize(size, 0.0);
            }
            let v = v.as_mut_slice();
            match data.get(i) {
                Some(ch) => {
                    let n = frames.min(v.len());
                    v[..n].copy_from_slice(&ch[..n]);
                    v[n..].fill(0.0);
                }
                None => v.fill(0.0),
            }
        }
        Ok((frames, info))
    }

    /// `write`: returns the frames written and the file's description.
    pub fn write(&self, args: &[Atom], cx: &Cx<'_>) -> Result<(usize, FileInfo), SoundfileError> {
        let (flags, rest) = flags(args);
        let (mut onset, mut nframes, mut bytes, mut normalize) = (0, MAX_FRAMES, 2, false);
        let mut rate = cx.shared.sample_rate;
        for (flag, value) in flags {
            match flag {
                "skip" => onset = non_negative(value, WRITE_USAGE)?,
                "nframes" => nframes = non_negative(value, WRITE_USAGE)?,
                "bytes" => {
                    bytes = non_negative(value, WRITE_USAGE)?;
                    if !(2..=4).contains(&bytes) {
                        return Err(SoundfileError::Usage(WRITE_USAGE));
                    }
                }
                "rate" => rate = value.ok_or(SoundfileError::Usage(WRITE_USAGE))?,
                "normalize" => normalize = true,
                "wave" | "little" => {}
                "aiff" | "caf" | "next" | "nextstep" | "ascii" | "big" => {
                    return Err(SoundfileError::Type(flag.into()))
                }
                _ => return Err(SoundfileError::Usage(WRITE_USAGE)),
            }
        }
        let names = symbols(rest, WRITE_USAGE)?;
        let Some((file, tables)) = names.split_first() else {
            return Err(SoundfileError::Usage(WRITE_USAGE));
        };
        if tables.is_empty() || tables.len() > MAX_CHANNELS {
            return Err(SoundfileError::Usage(WRITE_USAGE));
        }
        let arrays = tables
            .iter()
            .map(|t| cx.shared.array(t).ok_or(SoundfileError::NoTable(t.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        let guards: Vec<_> = arrays.iter().map(|a| lock_read(a)).collect();
        for g in &guards {
            nframes = nframes.min(g.len().saturating_sub(onset));
        }
        if nframes == 0 {
            return Err(SoundfileError::File {
                file: file.clone(),
                what: format!("no samples at onset {onset}"),
            });
        }
        let chans: Vec<&[f32]> = guards.iter().map(|g| &g[onset..onset + nframes]).collect();
        let biggest = chans.iter().flat_map(|c| c.iter()).fold(0.0f32, |m, &x| {
            if x > m {
                x
            } else if -x > m {
                -x
            } else {
                m
            }
        });
        // Pd normalises integer files that would clip
        if bytes != 4 && biggest > 1.0 {
            normalize = true;
        }
        let norm: f32 = if normalize && biggest > 0.0 {
            (32767.0 / (32768.0 * biggest as f64)) as f32
        } else {
            1.0
        };
        let path = self.path(file);
        let info = FileInfo {
            sample_rate: if rate > 0.0 {
                rate as u32
            } else {
                cx.shared.sample_rate as u32
            },
            header_size: if bytes == 4 { 58 } else { 44 },
            channels: chans.len(),
            bytes_per_sample: bytes,
        };
        write_wav(&path, &chans, info.sample_rate, bytes, norm).map_err(|e| {
            SoundfileError::File {
                file: file.clone(),
                what: e.to_string(),
            }
        })?;
        let header_size = std::fs::read(&path)
            .ok()
            .and_then(|b| data_offset(&b))
            .unwrap_or(info.header_size);
        Ok((
            nframes,
            FileInfo {
                header_size,
                ..info
            },
        ))
    }
}

fn lock_read(a: &std::sync::RwLock<Vec<f32>>) -> std::sync::RwLockReadGuard<'_, Vec<f32>> {
    a.read().unwrap_or_else(|e| e.into_inner())
}

/// Pd's conversion of a sample to a `bits`-bit integer (d_soundfile.c
/// `soundfile_xferout_words`): offset, truncate, remove the offset, clip to the symmetric range.
fn to_int(x: f32, ff: f32, bits: u32) -> i32 {
    let half = (1u32 << (bits - 1)) as f64;
    let limit = (1i32 << (bits - 1)) - 1;
    let xx = (half + (x * ff) as f64) as i32 - half as i32;
    xx.clamp(-limit, limit)
}

fn write_wav(
    path: &Path,
    chans: &[&[f32]],
    rate: u32,
    bytes: usize,
    norm: f32,
) -> Result<(), hound::Error> {
    let spec = hound::WavSpec {
        channels: chans.len() as u16,
        sample_rate: rate,
        bits_per_sample: (bytes * 8) as u16,
        sample_format: if bytes == 4 {
            hound::SampleFormat::Float
        } else {
            hound::SampleFormat::Int
        },
    };
    let mut w = hound::WavWriter::create(path, spec)?;
    let frames = chans[0].len();
    let bits = (bytes * 8) as u32;
    let ff = norm * (1u32 << (bits.min(24) - 1)) as f32;
    for i in 0..frames {
        for c in chans {
            if bytes == 4 {
                w.write_sample(c[i] * norm)?;
            } else {
                w.write_sample(to_int(c[i], ff, bits))?;
            }
        }
    }
    w.finalize()
}

impl PdObject for Soundfiler {
    fn ports(&self) -> (Vec<Port>, Vec<Port>) {
        (vec![Port::Control], vec![Port::Control, Port::Control])
    }

    fn message(&mut self, _inlet: usize, msg: &Msg, cx: &mut Cx<'_>) {
        let what = match msg.selector.as_str() {
            "read" => "read",
            "write" => "write",
            s => {
                eprintln!("error: soundfiler: no method for '{s}'");
                return;
            }
        };
        let result = if what == "read" {
            self.read(&msg.args, cx)
        } else {
            self.write(&msg.args, cx)
        };
        let (frames, info) = result.unwrap_or_else(|e| {
            eprintln!("error: soundfiler {what}: {e}");
            (0, FileInfo::default())
        });
        // Pd outputs right to left: the description, then the count
        cx.out(1, info.msg());
        cx.out(0, Msg::float(frames as f32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_converted_as_pd_converts_them() {
        // 16 bits: truncation after the offset, symmetric clip
        assert_eq!(to_int(0.5, 32768.0, 16), 16384);
        assert_eq!(to_int(-0.5, 32768.0, 16), -16384);
        assert_eq!(to_int(1.0, 32768.0, 16), 32767);
        assert_eq!(to_int(-1.0, 32768.0, 16), -32767);
        // -0.00001 * 32768 = -0.33: 32767.67 truncates to 32767, so -1 (not 0 as a plain
        // truncation toward zero would give)
        assert_eq!(to_int(-0.00001, 32768.0, 16), -1);
        assert_eq!(to_int(0.00001, 32768.0, 16), 0);
        assert_eq!(to_int(2.0, 8388608.0, 24), 8388607);
    }

    #[test]
    fn flags_are_read_up_to_the_file_name() {
        let a = |s: &str| Atom::parse(s, false);
        let args = vec![a("-skip"), a("10"), a("-resize"), a("f.wav"), a("t")];
        let (f, rest) = flags(&args);
        assert_eq!(f, vec![("skip", Some(10.0)), ("resize", None)]);
        assert_eq!(rest, &args[3..]);
    }

    #[test]
    fn the_data_chunk_is_found_past_other_chunks() {
        let mut f = b"RIFF\0\0\0\0WAVE".to_vec();
        f.extend(b"fmt \x10\0\0\0");
        f.extend([0u8; 16]);
        f.extend(b"LIST\x03\0\0\0abc\0"); // odd size: padded
        f.extend(b"data\x04\0\0\0\x01\x02\x03\x04");
        assert_eq!(data_offset(&f), Some(12 + 24 + 12 + 8));
    }
}
