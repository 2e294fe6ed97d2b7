//! Follower lag during a run: scrapes each node's Prometheus `/metrics` (`--metrics-url`)
//! once a second and keeps, per second, the laggiest follower of the run's topic.
//!
//! weir exports, for every partition it leads and each follower (docs/METRICS.md),
//! `weir_follower_lag_records` (leader's log end − the follower's last fetch offset) and
//! `weir_follower_caught_up_age_seconds` (since the follower's fetch last reached the
//! leader's log end — Kafka's time lag, the one `replica.lag.time.max.ms` is measured
//! against). Leaders report only what they lead, so every node is scraped and the maxima
//! are taken over all of them. The HTTP client is a plain `std` socket: one GET, bounded
//! in time and bytes, the answer's body parsed as Prometheus text format 0.0.4.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;

/// The records gauge.
pub const LAG_RECORDS: &str = "weir_follower_lag_records";
/// The time gauge (seconds; reported in ms).
pub const LAG_AGE_SECONDS: &str = "weir_follower_caught_up_age_seconds";
/// Largest `/metrics` answer read (a node with 10,000 follower series is ~2 MiB).
pub const SCRAPE_BYTES_MAX: u64 = 32 << 20;
/// Connect, write and read timeout of one scrape.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Time between scrapes (weir recomputes these gauges once a second).
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);
/// Most points kept per run (a day of seconds); later ones are dropped.
pub const POINTS_MAX: usize = 86_400;
/// Most labels read on one sample line.
const LABELS_MAX: usize = 32;

/// One second of follower lag: the laggiest (partition, follower) of the topic over all
/// scraped nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct LagPoint {
    /// Seconds since the run started.
    pub t_s: f64,
    /// Whether this second falls in the warm-up.
    pub warmup: bool,
    /// `None` (JSON null) when a node could not be scraped: the laggiest follower may be
    /// one that node leads, so the lag is unknown, never the others' maximum or 0.
    pub lag_records_max: Option<u64>,
    pub lag_ms_max: Option<f64>,
    /// (partition, follower) series of the topic seen in this scrape (on the nodes that
    /// answered).
    pub series: u32,
}

impl LagPoint {
    /// The point of one scrape of every node (`answers`, one per URL), `elapsed` after
    /// the run's start.
    pub fn of(
        answers: &[Result<String>],
        topic: &str,
        elapsed: Duration,
        warmup: Duration,
    ) -> Self {
        let texts = answers.iter().filter_map(|a| a.as_ref().ok());
        let (records, ms, series) = follower_lag(texts.map(String::as_str), topic);
        let complete = answers.iter().all(Result::is_ok);
        Self {
            t_s: elapsed.as_secs_f64(),
            warmup: elapsed < warmup,
            lag_records_max: complete.then_some(records),
            lag_ms_max: complete.then_some(ms),
            series,
        }
    }
}

/// One sample line of Prometheus text: `name{k="v",...} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if present.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses one sample line; `None` for comments, blank or malformed lines (a scrape is
/// best-effort: a line we cannot read is skipped, never a failure of the run).
pub fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(r)?;
        labels = parsed;
        rest = after;
    }
    // The value, then an optional timestamp.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `k="v",k2="v2"}` → the labels and what follows the `}`. Values may hold `\"`, `\\`
/// and `\n` escapes.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        if labels.len() >= LABELS_MAX {
            return None;
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        let body = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut chars = body.char_indices();
        let mut value = String::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        labels.push((key, value));
        s = &body[end + 1..];
    }
}

/// The laggiest follower of `topic` in one or more nodes' metrics text: (records max,
/// ms max, series). Other topics and metrics are ignored.
pub fn follower_lag<'a>(texts: impl IntoIterator<Item = &'a str>, topic: &str) -> (u64, f64, u32) {
    let mut records_max = 0u64;
    let mut ms_max = 0f64;
    let mut series = 0u32;
    for text in texts {
        for s in text.lines().filter_map(parse_line) {
            if s.label("topic") != Some(topic) || !s.value.is_finite() {
                continue;
            }
            if s.name == LAG_RECORDS {
                series = series.saturating_add(1);
                records_max = records_max.max(s.value.max(0.0) as u64);
            } else if s.name == LAG_AGE_SECONDS {
                ms_max = ms_max.max(s.value.max(0.0) * 1000.0);
            }
        }
    }
    (records_max, ms_max, series)
}

/// Polls every node (once per [`SCRAPE_INTERVAL`], within `timeout`) until no follower of
/// `topic` lags by a record; returns how long that took. Errors when the time runs out,
/// naming the last lag seen, or a node that could not be scraped.
pub fn wait_caught_up(urls: &[String], topic: &str, timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let texts: Result<Vec<String>> = urls.iter().map(|u| fetch(u)).collect();
        let last = match texts {
            Ok(t) => {
                let (records, ms, _) = follower_lag(t.iter().map(String::as_str), topic);
                if records == 0 {
                    return Ok(start.elapsed());
                }
                format!("a follower is {records} records ({ms:.0} ms) behind")
            }
            Err(e) => format!("{e:#}"),
        };
        if start.elapsed() + SCRAPE_INTERVAL > timeout {
            bail!("after {:.0} s {last}", start.elapsed().as_secs_f64());
        }
        std::thread::sleep(SCRAPE_INTERVAL);
    }
}

/// `http://host:port/path` (path defaults to `/metrics`) → (host:port, path).
pub fn split_url(url: &str) -> Result<(String, String)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("--metrics-url must start with http:// (got {url:?})"))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/metrics"),
    };
    if host.is_empty() {
        bail!("--metrics-url {url:?} has no host");
    }
    Ok((host.to_string(), path.to_string()))
}

/// One GET; the body of a 200 answer.
pub fn fetch(url: &str) -> Result<String> {
    let (host, path) = split_url(url)?;
    let addr = host
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .next()
        .ok_or_else(|| anyhow!("{host} resolves to nothing"))?;
    let mut s = TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT)
        .with_context(|| format!("connecting to {host}"))?;
    s.set_read_timeout(Some(SCRAPE_TIMEOUT))?;
    s.set_write_timeout(Some(SCRAPE_TIMEOUT))?;
    // One write: `write!` on a socket would send each formatted piece as its own segment.
    let request = format!(
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    );
    s.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    s.take(SCRAPE_BYTES_MAX).read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("{url}: no HTTP header end in {} bytes", raw.len()))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("{url}: {status}");
    }
    Ok(body.to_string())
}

/// A background thread scraping `urls` every [`SCRAPE_INTERVAL`] until [`Scraper::finish`].
pub struct Scraper {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<LagPoint>>,
}

impl Scraper {
    /// Starts scraping now; `t_s` of each point counts from `start`, points before
    /// `start + warmup` are marked warm-up. `None` without URLs.
    pub fn start(urls: &[String], topic: &str, start: Instant, warmup: Duration) -> Option<Self> {
        if urls.is_empty() {
            return None;
        }
        let urls = urls.to_vec();
        let topic = topic.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("loadgen-scrape".into())
            .spawn(move || scrape_loop(&urls, &topic, start, warmup, &stop2))
            .ok()?;
        Some(Self { stop, handle })
    }

    /// Stops the thread (within one scrape's timeout) and returns its points.
    pub fn finish(self) -> Vec<LagPoint> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

fn scrape_loop(
    urls: &[String],
    topic: &str,
    start: Instant,
    warmup: Duration,
    stop: &AtomicBool,
) -> Vec<LagPoint> {
    let mut points = Vec::new();
    let mut failures = 0u64;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() >= next {
            // A slow scrape does not make the next ones bunch up.
            next = (next + SCRAPE_INTERVAL).max(Instant::now());
            let answers: Vec<Result<String>> = urls.iter().map(|u| fetch(u)).collect();
            for e in answers.iter().filter_map(|a| a.as_ref().err()) {
                failures += 1;
                // The first failure and then one in 30, so a dead node is visible
                // without a line per second.
                if failures % 30 == 1 {
                    eprintln!("metrics scrape failed ({failures} so far): {e:#}");
                }
            }
            if points.len() < POINTS_MAX {
                points.push(LagPoint::of(&answers, topic, start.elapsed(), warmup));
            }
        }
        // Short naps so finish() returns promptly after the run.
        std::thread::sleep(Duration::from_millis(50));
    }
    points
}

/// The highest lag after the warm-up of the points whose lag is known: (records, ms);
/// `None` without such a point.
pub fn maxima(points: &[LagPoint]) -> Option<(u64, f64)> {
    let known: Vec<(u64, f64)> = points
        .iter()
        .filter(|p| !p.warmup)
        .filter_map(|p| Some((p.lag_records_max?, p.lag_ms_max?)))
        .collect();
    let records = known.iter().map(|k| k.0).max()?;
    let ms = known.iter().map(|k| k.1).fold(0.0, f64::max);
    Some((records, ms))
}

/// Points after the warm-up whose lag is unknown (a node could not be scraped).
pub fn unknown_after_warmup(points: &[LagPoint]) -> u64 {
    let unknown = points
        .iter()
        .filter(|p| !p.warmup && p.lag_records_max.is_none());
    unknown.count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What weir's `/metrics` renders for followers (docs/METRICS.md), two topics.
    const CANNED: &str = r#"# HELP weir_follower_lag_records Leader's log end minus a follower's, in records.
# TYPE weir_follower_lag_records gauge
weir_follower_lag_records{topic="rf3",partition="0",follower="2"} 120
weir_follower_lag_records{topic="rf3",partition="0",follower="3"} 4500
weir_follower_lag_records{topic="rf3",partition="1",follower="2"} 0
weir_follower_lag_records{topic="other",partition="0",follower="2"} 999999
# HELP weir_follower_caught_up_age_seconds Time since a follower's fetch last reached the leader's log end.
# TYPE weir_follower_caught_up_age_seconds gauge
weir_follower_caught_up_age_seconds{topic="rf3",partition="0",follower="2"} 0.004
weir_follower_caught_up_age_seconds{topic="rf3",partition="0",follower="3"} 0.25
weir_follower_caught_up_age_seconds{topic="rf3",partition="1",follower="2"} 0
weir_follower_caught_up_age_seconds{topic="other",partition="0",follower="2"} 60
weir_request_duration_seconds_bucket{api="Fetch",le="+Inf"} 17
weir_requests_total{api="Produce",version="9"} 12 1700000000000
"#;

    #[test]
    fn sample_lines_parse() {
        let s =
            parse_line(r#"weir_follower_lag_records{topic="a\"b",partition="0",follower="2"} 7"#)
                .expect("a sample");
        assert_eq!(s.name, LAG_RECORDS);
        assert_eq!(s.label("topic"), Some("a\"b"));
        assert_eq!(s.label("follower"), Some("2"));
        assert_eq!(s.value, 7.0);
        let t = parse_line("weir_storage_appends_total 42 1700000000000").expect("no labels");
        assert_eq!(
            (t.name.as_str(), t.labels.len(), t.value),
            ("weir_storage_appends_total", 0, 42.0)
        );
        let inf = parse_line(r#"x_bucket{le="+Inf"} +Inf"#).expect("+Inf");
        assert!(inf.value.is_infinite());
        for bad in [
            "",
            "# HELP x y",
            "x{a=\"1\" 3",
            "x{a=1} 3",
            "x",
            "x{a=\"1\"} notanumber",
        ] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn follower_lag_takes_the_laggiest_of_the_topic_over_all_nodes() {
        let (records, ms, series) = follower_lag([CANNED], "rf3");
        assert_eq!((records, series), (4500, 3));
        assert!((ms - 250.0).abs() < 1e-9, "{ms}");
        // A second node leading another partition with a larger lag wins the maximum.
        let node2 = "weir_follower_lag_records{topic=\"rf3\",partition=\"2\",follower=\"1\"} 9000\n\
                     weir_follower_caught_up_age_seconds{topic=\"rf3\",partition=\"2\",follower=\"1\"} 1.5\n";
        let (records, ms, series) = follower_lag([CANNED, node2], "rf3");
        assert_eq!((records, series), (9000, 4));
        assert!((ms - 1500.0).abs() < 1e-9, "{ms}");
        assert_eq!(follower_lag([CANNED], "absent"), (0, 0.0, 0));
    }

    #[test]
    fn urls_split_and_maxima_skip_the_warmup() {
        assert_eq!(
            split_url("http://127.0.0.1:9404").ok(),
            Some(("127.0.0.1:9404".into(), "/metrics".into()))
        );
        assert_eq!(
            split_url("http://h:1/x").ok(),
            Some(("h:1".into(), "/x".into()))
        );
        assert!(split_url("https://h:1/").is_err());
        assert!(split_url("http:///metrics").is_err());
        let p = |t_s, warmup, r, ms| LagPoint {
            t_s,
            warmup,
            lag_records_max: Some(r),
            lag_ms_max: Some(ms),
            series: 1,
        };
        assert_eq!(maxima(&[]), None);
        assert_eq!(
            maxima(&[
                p(0.0, true, 10_000, 900.0),
                p(1.0, false, 30, 5.0),
                p(2.0, false, 20, 7.0)
            ]),
            Some((30, 7.0))
        );
    }

    #[test]
    fn fetch_reads_a_served_answer() {
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            read_head(&mut s);
            let body = CANNED;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        });
        let text = fetch(&format!("http://{addr}/metrics")).expect("fetch");
        server.join().expect("server");
        assert_eq!(follower_lag([text.as_str()], "rf3").0, 4500);
    }

    /// Reads a request up to the end of its head (bounded), as a server would before answering.
    fn read_head(s: &mut std::net::TcpStream) {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 64 << 10 {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// Serves `answers` in order, one connection each, then stops.
    fn serve(answers: Vec<String>) -> (String, std::thread::JoinHandle<()>) {
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let h = std::thread::spawn(move || {
            for body in answers {
                let Ok((mut s, _)) = l.accept() else { return };
                read_head(&mut s);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (format!("http://{addr}/metrics"), h)
    }

    /// A node that cannot be scraped makes that second's follower lag unknown (null):
    /// the laggiest follower may be one it leads, so neither the other nodes' maximum nor
    /// 0 would be true. The maxima skip such points and count them.
    #[test]
    fn a_failed_scrape_is_unknown_lag_not_zero() {
        let both = [Ok(CANNED.to_string()), Err(anyhow!("connection refused"))];
        let p = LagPoint::of(&both, "rf3", Duration::from_secs(3), Duration::from_secs(1));
        assert_eq!(
            (p.lag_records_max, p.lag_ms_max, p.warmup),
            (None, None, false)
        );
        let one = [Ok(CANNED.to_string())];
        let p = LagPoint::of(&one, "rf3", Duration::from_secs(3), Duration::ZERO);
        assert_eq!(p.lag_records_max, Some(4500));
        // The scraper itself: one live node and one that refuses connections.
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            format!("http://{}/metrics", l.local_addr().expect("addr"))
        };
        let caught_up =
            "weir_follower_lag_records{topic=\"rf3\",partition=\"0\",follower=\"3\"} 0\n";
        let (live, server) = serve(vec![caught_up.to_string()]);
        let scraper = Scraper::start(&[dead, live], "rf3", Instant::now(), Duration::ZERO)
            .expect("a scraper for two urls");
        // The live node is scraped last: once it has answered, the first point is made.
        server.join().expect("server");
        let points = scraper.finish();
        assert!(!points.is_empty(), "no scrape");
        for p in &points {
            assert_eq!(p.lag_records_max, None, "{p:?}");
            assert_eq!(p.lag_ms_max, None, "{p:?}");
        }
        assert_eq!(maxima(&points), None);
        assert_eq!(unknown_after_warmup(&points), points.len() as u64);
        let json = serde_json::to_value(points[0]).unwrap_or_default();
        assert!(json["lag_records_max"].is_null(), "{json}");
    }

    #[test]
    fn wait_caught_up_returns_once_no_follower_lags_and_errs_when_time_runs_out() {
        let lagging = CANNED.to_string();
        let caught_up =
            "weir_follower_lag_records{topic=\"rf3\",partition=\"0\",follower=\"3\"} 0\n";
        let (url, h) = serve(vec![lagging.clone(), caught_up.to_string()]);
        let waited = wait_caught_up(std::slice::from_ref(&url), "rf3", Duration::from_secs(30))
            .expect("caught up on the second scrape");
        assert!(waited >= SCRAPE_INTERVAL, "{waited:?}");
        h.join().expect("server");
        // Still lagging when the time runs out: the error names the lag.
        let (url, h) = serve(vec![lagging; 2]);
        let err = wait_caught_up(&[url], "rf3", Duration::from_millis(1500))
            .expect_err("never caught up");
        assert!(format!("{err:#}").contains("4500 records"), "{err:#}");
        h.join().expect("server");
    }
}
