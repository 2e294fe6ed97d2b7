//! A transactional producer whose InitProducerId answers "no error" but producer id -1 (a
//! broker bug): the transaction fails as an error, the producer thread does not panic.

// Test code: a panic is a failed test, with the message it carries.
#![allow(clippy::unwrap_used)]

mod fake;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use fake::{Fake, Req, api_versions, metadata};
use kafka_protocol::messages::{
    BrokerId, FindCoordinatorResponse, InitProducerIdResponse, ProducerId,
};
use kafka_protocol::protocol::StrBytes;
use weir_loadgen::client::producer::NoSink;
use weir_loadgen::client::txn::TxnProducer;
use weir_loadgen::run::LoadSpec;
use weir_loadgen::schedule::{Pacer, Rate};
use weir_loadgen::stats::{Clock, Recorder};
use wire::api;

const TOPIC: &str = "txn";
const RECORDS: u64 = 5;

#[test]
fn init_producer_id_without_an_id_is_an_error_not_a_panic() {
    let fake = Fake::start(
        1,
        Arc::new(|req: &Req| match req.api_key {
            api::API_VERSIONS => req.answer(&api_versions(&[
                (api::FIND_COORDINATOR, 1, 3),
                (api::INIT_PRODUCER_ID, 0, 4),
                (api::METADATA, 1, 12),
                (api::API_VERSIONS, 0, 3),
            ])),
            api::METADATA => req.answer(&metadata(&req.ports, TOPIC, &[0])),
            api::FIND_COORDINATOR => req.answer(
                &FindCoordinatorResponse::default()
                    .with_node_id(BrokerId(0))
                    .with_host(StrBytes::from_static_str("127.0.0.1"))
                    .with_port(i32::from(req.ports[0])),
            ),
            api::INIT_PRODUCER_ID => req.answer(
                &InitProducerIdResponse::default()
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            ),
            _ => None,
        }),
    );
    let mut cfg = LoadSpec::new(&fake.addr(0), TOPIC).producer;
    cfg.transactional_id = Some("t".to_string());
    cfg.txn_records = RECORDS as usize;
    let clock = Clock::start();
    let recorder = Arc::new(Recorder::new(0));
    let p = TxnProducer::new(
        cfg,
        fake.cluster(&[0]),
        clock,
        recorder.clone(),
        Arc::new(NoSink),
        1,
        0,
    )
    .unwrap();
    let pacer = Pacer::new(clock.now_ns(), Rate::Max, Some(RECORDS), None);
    let h = std::thread::spawn(move || p.run(pacer, &AtomicBool::new(false)));
    let stats = h
        .join()
        .expect("the producer thread panicked")
        .expect("the run returns its stats");
    assert_eq!(stats.acked, 0);
    assert_eq!(stats.failed, RECORDS);
    let errors = recorder.summary(1).errors;
    assert!(errors.contains_key("ClientTxnAborted"), "{errors:?}");
}
