//! The producer against a fake broker that stops answering with its connections open:
//! every Produce is read and never answered. Without a request timeout the requests stay
//! in flight forever and a 1 s run lasts until the drain gives up (a minute). With
//! Kafka's request.timeout.ms the producer drops each such connection, retries the batches
//! on a new one, and gives them up at delivery.timeout.ms: the run ends in seconds, every
//! record accounted for, each dropped connection counted once.

// Test code: a panic is a failed test, with the message it carries.
#![allow(clippy::unwrap_used)]

mod fake;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use fake::{Fake, Req, api_versions, metadata};
use weir_loadgen::client::producer::{NoSink, Producer};
use weir_loadgen::run::LoadSpec;
use weir_loadgen::schedule::{Pacer, Rate};
use weir_loadgen::stats::{Clock, Recorder};
use wire::api;

const TOPIC: &str = "silent";
const REQUEST_TIMEOUT_MS: i32 = 300;
const DELIVERY_TIMEOUT_MS: u64 = 1_500;
/// The run must end well within this (without a request timeout it takes over 60 s).
const RUN_BOUND: Duration = Duration::from_secs(20);
/// A held request is let go (its connection closed) after this at most, so no fake
/// thread outlives the test by long even if it fails.
const HOLD_MAX: Duration = Duration::from_secs(90);

/// Set when the test is done: the fake's held requests close their connections.
#[derive(Default)]
struct Release {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Release {
    /// Holds the calling connection's thread (its request unanswered) until released.
    fn hold(&self) {
        let g = self.done.lock().unwrap();
        let _ = self
            .cv
            .wait_timeout_while(g, HOLD_MAX, |done| !*done)
            .unwrap();
    }

    fn release(&self) {
        *self.done.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

#[test]
fn a_broker_that_stops_answering_does_not_stretch_the_run() {
    let release = Arc::new(Release::default());
    let produces = Arc::new(AtomicU64::new(0));
    let (r, n) = (release.clone(), produces.clone());
    let fake = Fake::start(
        1,
        Arc::new(move |req: &Req| match req.api_key {
            api::API_VERSIONS => req.answer(&api_versions(&[
                (api::PRODUCE, 3, 9),
                (api::METADATA, 1, 12),
                (api::API_VERSIONS, 0, 3),
            ])),
            api::METADATA => req.answer(&metadata(&req.ports, TOPIC, &[0])),
            api::PRODUCE => {
                n.fetch_add(1, Ordering::SeqCst);
                r.hold();
                None
            }
            _ => None,
        }),
    );
    let mut cfg = LoadSpec::new(&fake.addr(0), TOPIC).producer;
    cfg.acks = 1;
    cfg.record_size_bytes = 100;
    cfg.request_timeout_ms = REQUEST_TIMEOUT_MS;
    cfg.delivery_timeout_ms = DELIVERY_TIMEOUT_MS;
    cfg.retries = 1_000;
    cfg.retry_backoff_ms = 50;
    cfg.retry_backoff_max_ms = 100;
    let clock = Clock::start();
    let recorder = Arc::new(Recorder::new(0));
    let mut p = Producer::new(
        cfg,
        fake.cluster(&[0]),
        clock,
        recorder.clone(),
        Arc::new(NoSink),
        1,
        0,
    )
    .unwrap();
    p.connect();
    let start = clock.now_ns();
    let pacer = Pacer::new(
        start,
        Rate::PerSec(500.0),
        None,
        Some(start + 1_000_000_000),
    );
    let started = Instant::now();
    let stats = p.run(pacer, &AtomicBool::new(false)).unwrap();
    let elapsed = started.elapsed();
    release.release();
    let errors = recorder.summary(1).errors;
    println!("{elapsed:?}: {stats:?}, errors {errors:?}");
    assert!(
        elapsed < RUN_BOUND,
        "a 1 s run took {elapsed:?}: {stats:?} {errors:?}"
    );
    assert!(stats.generated >= 400, "{stats:?}");
    assert_eq!(stats.acked, 0, "{stats:?}");
    assert_eq!(stats.failed, stats.generated, "every record accounted for");
    let timeouts = errors.get("ClientRequestTimeout").copied().unwrap_or(0);
    assert!(timeouts >= 2, "retried and timed out again: {errors:?}");
    assert!(
        errors.contains_key("ClientDeliveryTimeout"),
        "given up at the delivery timeout: {errors:?}"
    );
    assert!(
        !errors.contains_key("ClientConnectionLost"),
        "a connection dropped for a timeout is counted as that, once: {errors:?}"
    );
    assert!(
        produces.load(Ordering::SeqCst) >= timeouts,
        "each timed-out connection carried a request"
    );
}
