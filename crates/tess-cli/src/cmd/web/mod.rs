//! `tess web`: a live dashboard in the browser, served from this binary.
//!
//! One page (`index.html`, embedded at build time: no CDN, no files to install) polls
//! `/api/view` every second and draws the cells, the harts, CPU used against granted over the
//! last two minutes, and a histogram of the wait per activation. A sampling thread takes a
//! [`View`] every interval (as `tess top` does) and keeps the last [`HISTORY`] of them.
//!
//! The server is read-only (GET only: it changes nothing, whoever asks) and listens on
//! localhost unless told otherwise.

use super::top::Sampler;
use crate::cmd::usage;
use clap::Args;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tess_observe::rates::View;

/// The page.
const INDEX_HTML: &str = include_str!("index.html");

/// Views kept for the plots (two minutes at the default interval).
pub const HISTORY: usize = 120;

/// `tess web` arguments.
#[derive(Args, Debug)]
#[command(
    after_help = "The dashboard is read-only: it serves GET requests and changes nothing. \
It listens on localhost; to reach it from another machine use an SSH tunnel \
(ssh -L 9465:127.0.0.1:9465 HOST) rather than --listen on a public address.\n\n\
Examples:\n  tess web\n  tess web --listen 127.0.0.1:8080 --interval 500ms"
)]
pub struct WebArgs {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:9465", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Time between samples (100ms-10s).
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub interval: String,
}

/// What the sampling thread shares with the server.
#[derive(Debug, Default)]
struct Shared {
    history: VecDeque<View>,
    error: Option<String>,
}

fn sample_forever(shared: Arc<Mutex<Shared>>, interval: Duration) {
    let socket = tess_proto::client::socket_path();
    let mut sampler: Option<Sampler> = None;
    loop {
        std::thread::sleep(interval);
        let s = match sampler.as_mut() {
            Some(s) => s,
            None => match Sampler::connect(&socket) {
                Ok(s) => sampler.insert(s),
                Err(e) => {
                    shared.lock().unwrap_or_else(|p| p.into_inner()).error = Some(format!("{e:#}"));
                    continue;
                }
            },
        };
        let res = s.refresh();
        let mut sh = shared.lock().unwrap_or_else(|p| p.into_inner());
        match res {
            Ok(v) => {
                sh.history.push_back(v);
                while sh.history.len() > HISTORY {
                    sh.history.pop_front();
                }
                sh.error = None;
            }
            Err(e) => {
                sh.error = Some(format!("{e:#}"));
                sampler = None;
            }
        }
    }
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes())
        .expect("static header names and values are valid")
}

type Reply = tiny_http::Response<std::io::Cursor<Vec<u8>>>;

fn answer(
    method: &tiny_http::Method,
    url: &str,
    shared: &Mutex<Shared>,
    interval: Duration,
) -> Reply {
    if *method != tiny_http::Method::Get {
        return tiny_http::Response::from_string("tess web is read-only: GET only\n")
            .with_status_code(405);
    }
    match url.split('?').next().unwrap_or(url) {
        "/" | "/index.html" => tiny_http::Response::from_string(INDEX_HTML)
            .with_header(header("Content-Type", "text/html; charset=utf-8")),
        "/api/view" => {
            let sh = shared.lock().unwrap_or_else(|p| p.into_inner());
            match (sh.history.back(), &sh.error) {
                (Some(v), None) => {
                    let body = serde_json::json!({
                        "view": v,
                        "history": sh.history,
                        "interval_ms": interval.as_millis() as u64,
                    });
                    tiny_http::Response::from_string(body.to_string())
                        .with_header(header("Content-Type", "application/json"))
                        .with_header(header("Cache-Control", "no-store"))
                }
                (_, Some(e)) => {
                    tiny_http::Response::from_string(format!("tessd: {e}")).with_status_code(503)
                }
                (None, None) => tiny_http::Response::from_string("first sample not taken yet")
                    .with_status_code(503),
            }
        }
        _ => tiny_http::Response::from_string("not found\n").with_status_code(404),
    }
}

/// Runs `tess web` until interrupted.
pub fn run(a: WebArgs) -> anyhow::Result<i32> {
    let interval = match tess_core::units::parse_duration(&a.interval) {
        Ok(d) if (Duration::from_millis(100)..=Duration::from_secs(10)).contains(&d) => d,
        Ok(_) => return usage(format!("--interval {} is outside 100ms-10s", a.interval)),
        Err(e) => return usage(format!("--interval {}: {e}", a.interval)),
    };
    // Fail now, with the daemon's own message, if tessd is not there.
    drop(Sampler::connect(&tess_proto::client::socket_path())?);
    let server = tiny_http::Server::http(a.listen)
        .map_err(|e| anyhow::anyhow!("cannot serve on {}: {e}", a.listen))?;
    if !a.listen.ip().is_loopback() {
        eprintln!(
            "tess web: warning: serving on {} (not localhost): anyone who reaches it sees every cell",
            a.listen
        );
    }
    println!("tess web: http://{}/", a.listen);
    let shared = Arc::new(Mutex::new(Shared::default()));
    {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("tess-web-sampler".into())
            .spawn(move || sample_forever(shared, interval))?;
    }
    for req in server.incoming_requests() {
        let resp = answer(req.method(), req.url(), &shared, interval);
        let _ = req.respond(resp);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_self_contained() {
        // No CDN: every script and style is inline.
        assert!(!INDEX_HTML.contains("src=\"http"));
        assert!(!INDEX_HTML.contains("href=\"http"));
        assert!(INDEX_HTML.contains("fetch(\"/api/view\""));
    }

    #[test]
    fn only_get_is_served() {
        let shared = Mutex::new(Shared::default());
        let i = Duration::from_secs(1);
        let r = answer(&tiny_http::Method::Post, "/api/view", &shared, i);
        assert_eq!(r.status_code().0, 405);
        let r = answer(&tiny_http::Method::Get, "/api/view", &shared, i);
        assert_eq!(r.status_code().0, 503, "no sample yet");
        let r = answer(&tiny_http::Method::Get, "/", &shared, i);
        assert_eq!(r.status_code().0, 200);
        let r = answer(&tiny_http::Method::Get, "/etc/passwd", &shared, i);
        assert_eq!(r.status_code().0, 404);
    }
}
