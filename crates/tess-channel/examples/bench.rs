//! Runs the channel benchmark: `cargo run -p tess-channel --release --example bench -- [--json]
//! [--quick] [--harts P,C]`.

use tess_channel::bench::{run, BenchOptions};

fn main() -> anyhow::Result<()> {
    let mut json = false;
    let mut opts = BenchOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json = true,
            "--quick" => {
                opts = BenchOptions {
                    parent_hart: opts.parent_hart,
                    child_hart: opts.child_hart,
                    ..BenchOptions::quick()
                }
            }
            "--harts" => {
                let v = args.next().unwrap_or_default();
                let (p, c) = v
                    .split_once(',')
                    .ok_or_else(|| anyhow::anyhow!("--harts wants P,C, got {v:?}"))?;
                opts.parent_hart = p.trim().parse()?;
                opts.child_hart = c.trim().parse()?;
            }
            other => anyhow::bail!("unknown argument {other:?} (use --json, --quick, --harts P,C)"),
        }
    }
    let report = run(opts)?;
    if json {
        println!("{}", report.render_json());
    } else {
        print!("{}", report.render_text());
    }
    Ok(())
}
