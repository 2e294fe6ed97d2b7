//! The transactional producer against a fake cluster whose partition leader reads Produce
//! requests and never answers: `prepare` connects to the leader before the run (so setup
//! is not charged to the first transaction), and with request.timeout.ms the unanswered
//! Produce drops its connection within it, counted once as `ClientRequestTimeout`, and
//! the transaction is aborted. Without it the read waited for the connection's fixed
//! 30 s socket timeout and counted a lost connection.

// Test code: a panic is a failed test, with the message it carries.
#![allow(clippy::unwrap_used)]

mod fake;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use fake::{Fake, Req, api_versions, metadata};
use kafka_protocol::messages::{
    AddPartitionsToTxnResponse, BrokerId, EndTxnResponse, FindCoordinatorResponse,
    InitProducerIdResponse, ProducerId,
};
use kafka_protocol::protocol::StrBytes;
use weir_loadgen::client::producer::NoSink;
use weir_loadgen::client::txn::TxnProducer;
use weir_loadgen::run::LoadSpec;
use weir_loadgen::schedule::{Pacer, Rate};
use weir_loadgen::stats::{Clock, Recorder};
use wire::api;

const TOPIC: &str = "txn-silent";
const RECORDS: u64 = 5;
const REQUEST_TIMEOUT_MS: i32 = 300;
/// The run must end well within the 30 s a read waited before request.timeout.ms applied.
const RUN_BOUND: Duration = Duration::from_secs(15);
/// A held request is let go after this at most, so no fake thread outlives the test long.
const HOLD_MAX: Duration = Duration::from_secs(90);
/// The node that coordinates; the partition's leader is the other one.
const COORDINATOR: usize = 0;
const LEADER: usize = 1;

/// Set when the test is done: the fake's held requests close their connections.
#[derive(Default)]
struct Release {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Release {
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
fn an_unanswered_transactional_produce_times_out_at_the_request_timeout() {
    let release = Arc::new(Release::default());
    // Connections opened to the leader (each starts with ApiVersions).
    let leader_conns = Arc::new(AtomicU64::new(0));
    let (r, conns) = (release.clone(), leader_conns.clone());
    let fake = Fake::start(
        2,
        Arc::new(move |req: &Req| match req.api_key {
            api::API_VERSIONS => {
                if req.node == LEADER {
                    conns.fetch_add(1, Ordering::SeqCst);
                }
                req.answer(&api_versions(&[
                    (api::PRODUCE, 3, 9),
                    (api::METADATA, 1, 12),
                    (api::API_VERSIONS, 0, 3),
                    (api::FIND_COORDINATOR, 1, 3),
                    (api::INIT_PRODUCER_ID, 0, 4),
                    (api::ADD_PARTITIONS_TO_TXN, 0, 3),
                    (api::END_TXN, 0, 3),
                ]))
            }
            api::METADATA => req.answer(&metadata(&req.ports, TOPIC, &[LEADER as i32])),
            api::FIND_COORDINATOR => req.answer(
                &FindCoordinatorResponse::default()
                    .with_node_id(BrokerId(COORDINATOR as i32))
                    .with_host(StrBytes::from_static_str("127.0.0.1"))
                    .with_port(i32::from(req.ports[COORDINATOR])),
            ),
            api::INIT_PRODUCER_ID => req.answer(
                &InitProducerIdResponse::default()
                    .with_producer_id(ProducerId(7))
                    .with_producer_epoch(0),
            ),
            api::ADD_PARTITIONS_TO_TXN => req.answer(&AddPartitionsToTxnResponse::default()),
            api::END_TXN => req.answer(&EndTxnResponse::default()),
            api::PRODUCE => {
                r.hold();
                None
            }
            _ => None,
        }),
    );
    let mut cfg = LoadSpec::new(&fake.addr(COORDINATOR), TOPIC).producer;
    cfg.transactional_id = Some("t".to_string());
    cfg.idempotent = true;
    cfg.txn_records = RECORDS as usize;
    cfg.request_timeout_ms = REQUEST_TIMEOUT_MS;
    cfg.delivery_timeout_ms = 5_000;
    cfg.retry_backoff_ms = 50;
    cfg.retry_backoff_max_ms = 100;
    let clock = Clock::start();
    let recorder = Arc::new(Recorder::new(0));
    let mut p = TxnProducer::new(
        cfg,
        fake.cluster(&[LEADER as i32]),
        clock,
        recorder.clone(),
        Arc::new(NoSink),
        1,
        0,
    )
    .unwrap();
    p.prepare();
    assert_eq!(
        leader_conns.load(Ordering::SeqCst),
        1,
        "the leader's connection is opened before the run"
    );
    assert!(recorder.summary(1).errors.is_empty(), "a clean setup");
    let pacer = Pacer::new(clock.now_ns(), Rate::Max, Some(RECORDS), None);
    let started = Instant::now();
    let stats = p.run(pacer, &AtomicBool::new(false)).unwrap();
    let elapsed = started.elapsed();
    release.release();
    let errors = recorder.summary(1).errors;
    println!("{elapsed:?}: {stats:?}, errors {errors:?}");
    assert!(elapsed < RUN_BOUND, "took {elapsed:?}: {errors:?}");
    assert_eq!((stats.acked, stats.failed), (0, RECORDS), "{stats:?}");
    assert_eq!(errors.get("ClientRequestTimeout"), Some(&1), "{errors:?}");
    assert_eq!(errors.get("ClientTxnAborted"), Some(&1), "{errors:?}");
    assert!(
        !errors.contains_key("ClientConnectionLost"),
        "a response overdue is counted as that, not as a lost connection: {errors:?}"
    );
}
