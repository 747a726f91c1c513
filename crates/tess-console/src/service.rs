//! The service side: accept clients, write their lines to per-cell files.
//!
//! Each client gets a thread that waits on its channel (sleeping when idle: the service is the
//! one that may block, never the client). Lines go to `DIR/CELL.log` (or `DIR/uid-UID.log` for a
//! process outside any cell), one per line as `RFC3339-time cell pid text`, in a file owned by
//! the client's user and readable only by them (and root): a user never sees into another
//! user's cells.

use crate::{decode, Record, SERVICE_NAME};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tess_channel::{Endpoint, Wait};
use tess_proto::ns::{Access, PeerInfo, Service};

/// Default log directory.
pub const DEFAULT_DIR: &str = "/var/log/tess";

/// The log file for a client.
pub fn log_path(dir: &Path, client: &PeerInfo) -> PathBuf {
    match &client.cell {
        Some(c) => dir.join(format!("{c}.log")),
        None => dir.join(format!("uid-{}.log", client.uid)),
    }
}

/// Formats a wall-clock time in ns as `YYYY-MM-DDTHH:MM:SS.uuuuuuZ`.
pub fn rfc3339(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    let micros = (ns % 1_000_000_000) / 1000;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Formats one record as written to the file.
pub fn format_line(client: &PeerInfo, r: &Record) -> String {
    let cell = client.cell.as_deref().unwrap_or("-");
    let mut s = String::new();
    if r.dropped > 0 {
        s.push_str(&format!(
            "{} {cell} {} [console: {} line(s) dropped]\n",
            rfc3339(r.time_ns),
            client.pid,
            r.dropped
        ));
    }
    s.push_str(&format!(
        "{} {cell} {} {}\n",
        rfc3339(r.time_ns),
        client.pid,
        r.text
    ));
    s
}

fn open_log(dir: &Path, client: &PeerInfo) -> std::io::Result<File> {
    let path = log_path(dir, client);
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&path)?;
    // The file belongs to the client's user (the service runs as root).
    if let Err(e) = std::os::unix::fs::chown(&path, Some(client.uid), None) {
        if e.kind() != std::io::ErrorKind::PermissionDenied {
            return Err(e);
        }
    }
    Ok(f)
}

/// Writes everything one client sends until it hangs up.
pub fn serve_client(dir: &Path, client: PeerInfo, mut ep: Endpoint) -> std::io::Result<u64> {
    ep.set_wait(Wait::Adaptive);
    let mut file = open_log(dir, &client)?;
    let mut buf = vec![0u8; ep.max_message_size()];
    let mut lines = 0;
    while let Ok(n) = ep.recv(&mut buf) {
        if let Some(r) = decode(&buf[..n]) {
            file.write_all(format_line(&client, &r).as_bytes())?;
            lines += 1;
        }
    }
    Ok(lines)
}

/// Registers `console` and serves clients forever. A registration lives on the connection to
/// tessd, so when tessd restarts the service registers again (clients already connected keep
/// their channels: tessd is not on the data path).
pub fn run(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let opts = tess_channel::ChannelOptions::for_max_message(1024);
    let mut svc = Service::register(SERVICE_NAME, Access::anyone(), &opts)?;
    eprintln!(
        "tess-console: serving '{SERVICE_NAME}', writing to {}",
        dir.display()
    );
    loop {
        let inc = match svc.accept() {
            Ok(i) => i,
            Err(e) => {
                eprintln!("tess-console: registration lost ({e}); registering again");
                svc = loop {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    match Service::register(SERVICE_NAME, Access::anyone(), &opts) {
                        Ok(s) => break s,
                        Err(tess_proto::ApiError::Unreachable { .. }) => continue,
                        Err(e) => return Err(e.into()),
                    }
                };
                continue;
            }
        };
        let dir = dir.to_path_buf();
        std::thread::spawn(move || {
            let who = format!("{:?} (pid {})", inc.client.cell, inc.client.pid);
            if let Err(e) = serve_client(&dir, inc.client, inc.endpoint) {
                eprintln!("tess-console: client {who}: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Console;
    use tess_channel::{Channel, ChannelOptions};

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456Z"
        );
        assert_eq!(
            rfc3339(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000000Z"
        );
    }

    #[test]
    fn lines_reach_the_cells_file() {
        let dir = tempfile::tempdir().unwrap();
        let (client, service) = Channel::pair(&ChannelOptions::for_max_message(256)).unwrap();
        let peer = PeerInfo {
            uid: 0,
            pid: 77,
            cell: Some("synth".into()),
        };
        let d = dir.path().to_path_buf();
        let t = std::thread::spawn(move || serve_client(&d, peer, service).unwrap());
        let mut c = Console::from_endpoint(client);
        for i in 0..100 {
            while !c.log(&format!("voice {i} ready")) {
                std::thread::yield_now();
            }
        }
        drop(c);
        assert_eq!(t.join().unwrap(), 100);
        let text = std::fs::read_to_string(dir.path().join("synth.log")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 100);
        assert!(
            lines[0].ends_with(" synth 77 voice 0 ready"),
            "{}",
            lines[0]
        );
        let mode = std::fs::metadata(dir.path().join("synth.log"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
