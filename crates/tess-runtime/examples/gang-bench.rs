//! Runs `tess_runtime::bench::run` (what `tess bench gang` prints) against the tessd at
//! `$TESS_SOCKET`: `scripts/with-tessd -- target/debug/examples/gang-bench [--quick] [--json]`.

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let opts = tess_runtime::bench::BenchOptions::new(quick);
    let report = tess_runtime::bench::run(&opts)?;
    if args.iter().any(|a| a == "--json") {
        println!("{}", report.render_json());
    } else {
        print!("{}", report.render_text());
    }
    Ok(())
}
