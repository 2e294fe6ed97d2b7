//! The Prometheus endpoint: `GET /metrics` on `metrics.listener`, answered by one plain
//! thread off the shards (a scrape never runs on a shard's executor). One connection at
//! a time, each bounded as a whole by a deadline (not each read or write: a client that
//! trickles a byte at a time would otherwise hold the thread for hours) and by a
//! request-head size, so a client that stalls delays the next scrape by at most the
//! deadline and cannot grow memory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::NodeMetrics;

/// Longest a scrape connection may take, from accept to the last byte of the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes written per write call, each under what is left of the deadline.
const WRITE_CHUNK_BYTES: usize = 64 << 10;
/// Largest request head read.
const HEAD_MAX_BYTES: usize = 8 << 10;

/// Binds `addr` now (so a bad address fails startup) and serves it on its own thread.
/// Returns the bound address.
pub fn serve(addr: SocketAddr, metrics: Arc<NodeMetrics>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("weir-metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(s) => {
                        if let Err(e) = answer(s, &metrics) {
                            tracing::debug!("metrics scrape: {e}");
                        }
                    }
                    Err(e) => {
                        tracing::warn!("metrics accept: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })?;
    Ok(bound)
}

/// What is left until `deadline`, or TimedOut once it has passed.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, "scrape deadline"))
}

fn answer(mut s: TcpStream, metrics: &NodeMetrics) -> std::io::Result<()> {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_MAX_BYTES {
        s.set_read_timeout(Some(left(deadline)?))?;
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = if method == "GET" && (path == "/metrics" || path == "/") {
        let body = metrics.render();
        ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body)
    } else {
        ("404 Not Found", "text/plain", "GET /metrics\n".to_string())
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    for chunk in resp
        .as_bytes()
        .chunks(WRITE_CHUNK_BYTES)
        .chain(body.as_bytes().chunks(WRITE_CHUNK_BYTES))
    {
        let mut rest = chunk;
        while !rest.is_empty() {
            s.set_write_timeout(Some(left(deadline)?))?;
            let n = s.write(rest)?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            rest = &rest[n..];
        }
    }
    Ok(())
}
