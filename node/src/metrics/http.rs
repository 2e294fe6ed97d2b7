//! The Prometheus endpoint: `GET /metrics` on `metrics.listener`, answered by one plain
//! thread off the shards (a scrape never runs on a shard's executor). One connection at
//! a time, each bounded by a read/write timeout and a request-head size, so a client that
//! stalls delays the next scrape by at most the timeout and cannot grow memory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use super::NodeMetrics;

/// Longest a scrape connection may take to send its request or read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
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

fn answer(mut s: TcpStream, metrics: &NodeMetrics) -> std::io::Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_MAX_BYTES {
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
    s.write_all(resp.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.flush()
}
