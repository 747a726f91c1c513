//! `tessd --metrics-listen ADDR`: the Prometheus endpoint (`GET /metrics`).
//!
//! The exporter is a client of tessd's own API socket, like `tess status`: each scrape asks for
//! `status` and `list-cells` and reads the kernel's counters for what they name
//! ([`tess_observe::snapshot`]). It therefore holds no engine state of its own and takes the
//! engine only as long as those two reads do; nothing is counted on a real-time path.
//!
//! The one thing only the daemon knows is how long its requests take: the API thread records
//! each request in [`TRANSACTIONS`] after answering it ([`record`]), outside the engine.

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;
use tess_observe::kernel::Mounts;
use tess_observe::prom::{self, Transactions};
use tess_observe::snapshot::Sampler;
use tess_proto::{Request, Response};

/// tessd's request counters and latency histogram (one per process).
pub static TRANSACTIONS: LazyLock<Transactions> = LazyLock::new(Transactions::default);

/// The `op` label of a request: its protocol name (`create-cell`, `apply`, ...).
pub fn op_name(req: &Request) -> &'static str {
    match req {
        Request::Hello { .. } => "hello",
        Request::Status => "status",
        Request::ListCells => "list-cells",
        Request::ShowCell { .. } => "show-cell",
        Request::CreateCell { .. } => "create-cell",
        Request::UpdateCell { .. } => "update-cell",
        Request::SetPinned { .. } => "set-pinned",
        Request::DeleteCell { .. } => "delete-cell",
        Request::Apply { .. } => "apply",
        Request::Attach { .. } => "attach",
        Request::Reserve { .. } => "reserve",
        Request::SetQuota { .. } => "set-quota",
        Request::ListQuotas => "list-quotas",
        Request::Register { .. } => "register",
        Request::Connect { .. } => "connect",
        Request::ListNames => "list-names",
        Request::RuntimeAttach { .. } => "runtime-attach",
    }
}

/// Records one answered request.
pub fn record(op: &'static str, resp: &Response, took: Duration) {
    TRANSACTIONS.record(op, matches!(resp, Response::Ok { .. }), took);
}

/// Starts the endpoint on `addr`, scraping the daemon behind `socket`; returns once bound (a
/// taken port is an error at start-up, not a silent loss of metrics).
pub fn serve(addr: SocketAddr, socket: PathBuf) -> Result<()> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("serving metrics on {addr}"))?;
    tracing::info!("metrics on http://{addr}/metrics");
    // One scrape at a time, on this thread; the sampler keeps the kernel's files open between
    // scrapes (tess_observe::kernel::Files).
    let mut sampler = Sampler::new(Mounts::detect());
    std::thread::Builder::new()
        .name("tessd-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let openmetrics = req
                    .headers()
                    .iter()
                    .any(|h| h.field.equiv("Accept") && prom::wants_openmetrics(h.value.as_str()));
                let resp = answer(req.url(), openmetrics, &socket, &mut sampler);
                if let Err(e) = req.respond(resp) {
                    tracing::debug!("metrics client went away: {e}");
                }
            }
        })?;
    Ok(())
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes())
        .expect("static header names and values are valid")
}

/// Answers one request; `/metrics` in OpenMetrics when the client asked for it (Prometheus
/// does), else in the classic text format.
fn answer(
    url: &str,
    openmetrics: bool,
    socket: &std::path::Path,
    sampler: &mut Sampler,
) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let path = url.split('?').next().unwrap_or(url);
    match path {
        "/metrics" => match sampler.take(socket) {
            Ok(s) => {
                let text = prom::render(&s, Some(&TRANSACTIONS));
                if openmetrics {
                    tiny_http::Response::from_string(text)
                        .with_header(header("Content-Type", prom::CONTENT_TYPE))
                } else {
                    tiny_http::Response::from_string(prom::to_text_format(&text))
                        .with_header(header("Content-Type", prom::TEXT_CONTENT_TYPE))
                }
            }
            Err(e) => tiny_http::Response::from_string(format!("tessd did not answer: {e:#}\n"))
                .with_status_code(503),
        },
        "/" => tiny_http::Response::from_string(
            "tessd metrics: GET /metrics (OpenMetrics text; docs/observability.md)\n",
        ),
        _ => tiny_http::Response::from_string("not found: try /metrics\n").with_status_code(404),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_named_as_in_the_protocol() {
        let req = Request::DeleteCell { name: "a".into() };
        let wire = serde_json::to_value(&req).unwrap();
        assert_eq!(wire["op"], op_name(&req));
        let wire = serde_json::to_value(Request::ListCells).unwrap();
        assert_eq!(wire["op"], op_name(&Request::ListCells));
    }
}
