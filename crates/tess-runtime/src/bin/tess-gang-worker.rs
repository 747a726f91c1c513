//! The workload of `tess bench gang`: joins the bench cell and runs the runtime there
//! (`tess_runtime::bench::worker`). Not meant to be run by hand.

fn main() {
    let code = tess_runtime::bench::worker::WorkerArgs::parse(std::env::args().skip(1))
        .and_then(tess_runtime::bench::worker::worker_main)
        .unwrap_or_else(|e| {
            eprintln!("tess-gang-worker: {e:#}");
            1
        });
    std::process::exit(code);
}
