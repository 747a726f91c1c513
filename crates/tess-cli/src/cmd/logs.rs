//! `tess logs CELL [-f]`: the lines a cell sent to the console service.

use super::usage;
use clap::Args;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::Duration;

/// `tess logs`.
#[derive(Args, Debug)]
#[command(
    after_help = "The console service writes DIR/CELL.log (owned by the cell's user). Start it once:\n  tess cell create console --policy best-effort\n  tess run --cell console -- tess-console &\nPrograms log through it with the tess-console library, or unmodified with `tess run --console`."
)]
pub struct LogsArgs {
    /// Cell name (or uid-N for processes outside cells).
    pub cell: String,
    /// Keep printing new lines as they arrive.
    #[arg(long, short)]
    pub follow: bool,
    /// Only the last N lines.
    #[arg(long, short = 'n', value_name = "N")]
    pub lines: Option<usize>,
    /// The console service's directory.
    #[arg(long, default_value = tess_console::service::DEFAULT_DIR)]
    pub dir: PathBuf,
}

/// Runs `tess logs`.
pub fn run(a: LogsArgs) -> anyhow::Result<i32> {
    if tess_core::spec::validate_name(&a.cell).is_err() && !a.cell.starts_with("uid-") {
        return usage(format!("invalid cell name {:?}", a.cell));
    }
    let path = a.dir.join(format!("{}.log", a.cell));
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            anyhow::bail!(
                "no log for cell {} in {} (has it logged through the console service?)",
                a.cell,
                a.dir.display()
            )
        }
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    };
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    let lines: Vec<&str> = text.lines().collect();
    let start = a.lines.map_or(0, |n| lines.len().saturating_sub(n));
    let mut out = std::io::stdout().lock();
    for l in &lines[start..] {
        writeln!(out, "{l}")?;
    }
    out.flush()?;
    if !a.follow {
        return Ok(0);
    }
    let mut pos = f.stream_position()?;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let len = std::fs::metadata(&path)?.len();
        if len < pos {
            pos = 0;
        }
        if len > pos {
            f.seek(SeekFrom::Start(pos))?;
            let mut chunk = String::new();
            f.read_to_string(&mut chunk)?;
            pos += chunk.len() as u64;
            out.write_all(chunk.as_bytes())?;
            out.flush()?;
        }
    }
}
