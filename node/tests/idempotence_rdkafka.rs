//! The librdkafka idempotent producer (`enable.idempotence=true`, 5 requests in flight)
//! against a real weir through a TCP proxy that drops Produce responses (and resets the
//! connection with them), delays others, and — in the second test — loses the broker to a
//! SIGKILL and a restart while the producer keeps retrying. Afterwards the partitions
//! hold every record exactly once, at its acknowledged offset, in the order sent.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weir_tests::clients::{self, Sent};
use weir_tests::{Weir, WeirConfig};

const TOPIC: &str = "idem-faults";
const PARTITIONS: [i32; 2] = [0, 1];
const RECORDS: u64 = 20_000;
/// Kafka's Produce API key.
const PRODUCE: i16 = 0;
/// Largest frame the proxy forwards (requests and responses here are far smaller).
const FRAME_BYTES_MAX: usize = 64 << 20;
/// How long the whole produce phase may take.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(120);

/// Counts of what the proxy did, for the test's own checks and messages.
#[derive(Default, Debug)]
struct FaultCounts {
    produce_responses: AtomicU64,
    dropped_with_reset: AtomicU64,
    delayed: AtomicU64,
    connections: AtomicU64,
}

struct Faults {
    /// Chance that a Produce response is swallowed and the connection reset.
    drop_per_mille: u32,
    /// Chance that a response waits 1–40 ms.
    delay_per_mille: u32,
}

/// A TCP proxy between the client and weir; it reads whole Kafka frames so that it can
/// pick out Produce responses by correlation id.
struct Proxy {
    addr: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    enabled: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    counts: Arc<FaultCounts>,
}

impl Proxy {
    fn start(faults: Faults, seed: u64) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let proxy = Proxy {
            addr: listener.local_addr()?,
            upstream: Arc::new(Mutex::new(listener.local_addr()?)),
            enabled: Arc::new(AtomicBool::new(true)),
            stop: Arc::new(AtomicBool::new(false)),
            counts: Arc::new(FaultCounts::default()),
        };
        let ctx = ConnCtx {
            upstream: proxy.upstream.clone(),
            enabled: proxy.enabled.clone(),
            counts: proxy.counts.clone(),
            faults: Arc::new(faults),
        };
        let stop = proxy.stop.clone();
        thread::spawn(move || accept_loop(listener, ctx, stop, seed));
        Ok(proxy)
    }

    fn set_upstream(&self, addr: SocketAddr) {
        *self.upstream.lock().unwrap_or_else(|p| p.into_inner()) = addr;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct ConnCtx {
    upstream: Arc<Mutex<SocketAddr>>,
    enabled: Arc<AtomicBool>,
    counts: Arc<FaultCounts>,
    faults: Arc<Faults>,
}

fn accept_loop(listener: TcpListener, ctx: ConnCtx, stop: Arc<AtomicBool>, seed: u64) {
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                n += 1;
                ctx.counts.connections.fetch_add(1, Ordering::Relaxed);
                let ctx = ctx.clone();
                thread::spawn(move || serve(client, ctx, seed.wrapping_add(n)));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(2)),
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn serve(client: TcpStream, ctx: ConnCtx, seed: u64) {
    let upstream = *ctx.upstream.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nonblocking(false);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let keys: Arc<Mutex<HashMap<i32, i16>>> = Arc::default();
    let (c_read, s_write) = match (client.try_clone(), server.try_clone()) {
        (Ok(c), Ok(s)) => (c, s),
        _ => return,
    };
    let keys_up = keys.clone();
    let up = thread::spawn(move || pump_requests(c_read, s_write, keys_up));
    pump_responses(server, client, keys, ctx, seed);
    let _ = up.join();
}

/// Reads one frame (size prefix included); `None` at EOF, reset or a bad size.
fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size).ok()?;
    let len = usize::try_from(i32::from_be_bytes(size)).ok()?;
    if len > FRAME_BYTES_MAX {
        return None;
    }
    let mut frame = vec![0u8; 4 + len];
    frame[..4].copy_from_slice(&size);
    s.read_exact(&mut frame[4..]).ok()?;
    Some(frame)
}

/// Client → broker: remembers each request's API key by correlation id.
fn pump_requests(
    mut client: TcpStream,
    mut server: TcpStream,
    keys: Arc<Mutex<HashMap<i32, i16>>>,
) {
    while let Some(frame) = read_frame(&mut client) {
        if frame.len() >= 12 {
            let key = i16::from_be_bytes([frame[4], frame[5]]);
            let corr = i32::from_be_bytes([frame[8], frame[9], frame[10], frame[11]]);
            keys.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(corr, key);
        }
        if server.write_all(&frame).is_err() {
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Both);
    let _ = client.shutdown(Shutdown::Both);
}

/// Broker → client, with the faults.
fn pump_responses(
    mut server: TcpStream,
    mut client: TcpStream,
    keys: Arc<Mutex<HashMap<i32, i16>>>,
    ctx: ConnCtx,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    while let Some(frame) = read_frame(&mut server) {
        let corr = frame
            .get(4..8)
            .map_or(-1, |b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        let key = keys.lock().unwrap_or_else(|p| p.into_inner()).remove(&corr);
        let faulty = ctx.enabled.load(Ordering::SeqCst);
        if faulty && key == Some(PRODUCE) {
            ctx.counts.produce_responses.fetch_add(1, Ordering::Relaxed);
            if rng.random_range(0..1000) < ctx.faults.drop_per_mille {
                ctx.counts
                    .dropped_with_reset
                    .fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        if faulty && rng.random_range(0..1000) < ctx.faults.delay_per_mille {
            ctx.counts.delayed.fetch_add(1, Ordering::Relaxed);
            thread::sleep(Duration::from_millis(rng.random_range(1..40)));
        }
        if client.write_all(&frame).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
}

fn start_weir_behind(proxy: &Proxy) -> Result<Weir> {
    let advertised = format!("PLAINTEXT://127.0.0.1:{}", proxy.addr.port());
    let weir = Weir::start(WeirConfig::shards(2).set("advertised.listeners", advertised))?;
    proxy.set_upstream(weir.addr());
    Ok(weir)
}

fn idempotent_producer(
    bootstrap: &str,
) -> Result<(clients::TestProducer, Arc<clients::DeliveryLog>)> {
    clients::producer(
        bootstrap,
        "all",
        "none",
        &[
            ("enable.idempotence", "true"),
            ("max.in.flight.requests.per.connection", "5"),
            ("batch.num.messages", "50"),
            ("linger.ms", "2"),
            ("retry.backoff.ms", "20"),
            ("reconnect.backoff.ms", "20"),
            ("reconnect.backoff.max.ms", "200"),
            ("message.timeout.ms", "110000"),
        ],
    )
}

/// Sends every record (round-robin over the partitions, so each partition's order is the
/// send order), runs `during` once a third of them are acknowledged (the rest still queued
/// or in flight), then waits (bounded) for every delivery report.
fn produce_through_faults(
    proxy: &Proxy,
    during: impl FnOnce() -> Result<()>,
) -> Result<(Vec<Sent>, Vec<clients::Acked>)> {
    let bootstrap = proxy.addr.to_string();
    let (producer, log) = idempotent_producer(&bootstrap)?;
    let sent = clients::make_records(0, RECORDS, "idem", clients::now_ms());
    let deadline = Instant::now() + PRODUCE_TIMEOUT;
    for (i, r) in sent.iter().enumerate() {
        let partition = PARTITIONS[i % PARTITIONS.len()];
        clients::send_one(&producer, TOPIC, r, Some(partition))?;
    }
    let wait_reports = |n: usize| -> Result<()> {
        while log.reports() < n {
            if Instant::now() > deadline {
                bail!(
                    "{} of {n} delivery reports within {PRODUCE_TIMEOUT:?}",
                    log.reports()
                );
            }
            thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    };
    wait_reports(sent.len() / 3)?;
    let reports_before = log.reports();
    during()?;
    eprintln!(
        "fault injected after {reports_before} of {} delivery reports",
        sent.len()
    );
    assert!(
        reports_before < sent.len() * 2 / 3,
        "most records were still unacknowledged"
    );
    wait_reports(sent.len())?;
    let failed = log.failed();
    if !failed.is_empty() {
        bail!(
            "{} deliveries failed, first: {:?}",
            failed.len(),
            failed.first()
        );
    }
    Ok((sent, log.acked()))
}

fn check_exactly_once(proxy: &Proxy, sent: &[Sent], acked: &[clients::Acked]) -> Result<()> {
    proxy.enabled.store(false, Ordering::SeqCst);
    let bootstrap = proxy.addr.to_string();
    let got = clients::consume_to_end(&bootstrap, TOPIC, &PARTITIONS)?;
    assert_eq!(
        got.len(),
        sent.len(),
        "the partitions hold exactly the records sent"
    );
    let checked = clients::verify(sent, acked, &got).context("verify exactly once, in order")?;
    assert_eq!(checked, sent.len());
    Ok(())
}

#[test]
fn librdkafka_idempotent_producer_through_dropped_responses_and_resets() -> Result<()> {
    let seed = clients::now_ms() as u64;
    eprintln!("proxy seed {seed}");
    let proxy = Proxy::start(
        Faults {
            drop_per_mille: 40,
            delay_per_mille: 100,
        },
        seed,
    )?;
    let weir = start_weir_behind(&proxy)?;
    clients::create_topics(&proxy.addr.to_string(), &[TOPIC], 2, &[])?;
    let (sent, acked) = produce_through_faults(&proxy, || Ok(()))?;
    let dropped = proxy.counts.dropped_with_reset.load(Ordering::Relaxed);
    eprintln!("proxy: {:?}", proxy.counts);
    assert!(
        dropped >= 3,
        "the proxy dropped Produce responses (seed {seed}): {dropped}"
    );
    check_exactly_once(&proxy, &sent, &acked)?;
    drop(weir);
    Ok(())
}

#[test]
fn librdkafka_idempotent_producer_across_sigkill_and_restart() -> Result<()> {
    let seed = clients::now_ms() as u64 ^ 0x5eed;
    eprintln!("proxy seed {seed}");
    let proxy = Proxy::start(
        Faults {
            drop_per_mille: 20,
            delay_per_mille: 50,
        },
        seed,
    )?;
    let weir = Arc::new(Mutex::new(start_weir_behind(&proxy)?));
    clients::create_topics(&proxy.addr.to_string(), &[TOPIC], 2, &[])?;
    let restart = {
        let weir = weir.clone();
        let upstream = proxy.upstream.clone();
        move || -> Result<()> {
            let mut w = weir.lock().unwrap_or_else(|p| p.into_inner());
            w.kill()?;
            w.restart()?;
            *upstream.lock().unwrap_or_else(|p| p.into_inner()) = w.addr();
            Ok(())
        }
    };
    let (sent, acked) = produce_through_faults(&proxy, restart)?;
    eprintln!("proxy: {:?}", proxy.counts);
    check_exactly_once(&proxy, &sent, &acked)?;
    Ok(())
}
