//! The idempotent producer after it gives up on a batch: a fake broker that keeps Kafka's
//! sequence rules (a batch must start where the producer's last one ended, per producer id
//! and epoch) refuses the first batch with a non-retriable error. Every later batch then
//! has a sequence gap, so the producer must do what Kafka's does: get a new producer id
//! (InitProducerId) and start its sequences again at 0, instead of failing every later
//! batch of the partition with OUT_OF_ORDER_SEQUENCE_NUMBER for the rest of the run.

// Test code: a panic is a failed test, with the message it carries.
#![allow(clippy::unwrap_used)]

mod fake;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use fake::{Fake, Req, api_versions, metadata};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    InitProducerIdResponse, ProduceRequest, ProduceResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use weir_loadgen::client::producer::{NoSink, Producer};
use weir_loadgen::run::LoadSpec;
use weir_loadgen::schedule::{Pacer, Rate};
use weir_loadgen::stats::{Clock, Recorder};
use wire::api;
use wire::batch::read_header;

const TOPIC: &str = "idem";
const RECORDS: u64 = 100;
/// Records per batch: batch.size / record size.
const BATCH_RECORDS: u64 = 10;
/// INVALID_RECORD: not retriable.
const INVALID_RECORD: i16 = 87;
const OUT_OF_ORDER: i16 = 45;
const DUPLICATE: i16 = 46;

#[derive(Default)]
struct Log {
    /// Next expected sequence per (producer id, epoch).
    expected: HashMap<(i64, i16), i32>,
    log_end: i64,
    refused_first: bool,
    inits: i64,
}

impl Log {
    /// Kafka's sequence check for one batch; returns (error code, base offset).
    fn append(&mut self, records: &[u8]) -> (i16, i64) {
        let h = read_header(records).unwrap();
        let key = (h.producer_id().get(), h.producer_epoch().get());
        let (seq, n) = (h.base_sequence().get(), h.records_count());
        if !self.refused_first {
            self.refused_first = true;
            return (INVALID_RECORD, -1);
        }
        let expected = self.expected.entry(key).or_insert(0);
        if seq < *expected {
            return (DUPLICATE, -1);
        }
        if seq > *expected {
            return (OUT_OF_ORDER, -1);
        }
        *expected += n;
        let base = self.log_end;
        self.log_end += i64::from(n);
        (0, base)
    }
}

fn produce(req: &Req, log: &Mutex<Log>) -> ProduceResponse {
    let r: ProduceRequest = req.decode();
    let mut out = Vec::new();
    for t in &r.topic_data {
        for p in &t.partition_data {
            let records = p.records.as_deref().unwrap_or(&[]);
            let (code, base) = log.lock().unwrap().append(records);
            out.push(
                PartitionProduceResponse::default()
                    .with_index(p.index)
                    .with_error_code(code)
                    .with_base_offset(base),
            );
        }
    }
    ProduceResponse::default().with_responses(vec![
        TopicProduceResponse::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partition_responses(out),
    ])
}

#[test]
fn a_given_up_batch_gets_a_new_producer_id_and_later_batches_go_through() {
    let log = Arc::new(Mutex::new(Log::default()));
    let l = log.clone();
    let fake = Fake::start(
        1,
        Arc::new(move |req: &Req| match req.api_key {
            api::API_VERSIONS => req.answer(&api_versions(&[
                (api::PRODUCE, 3, 9),
                (api::INIT_PRODUCER_ID, 0, 4),
                (api::METADATA, 1, 12),
                (api::API_VERSIONS, 0, 3),
            ])),
            api::METADATA => req.answer(&metadata(&req.ports, TOPIC, &[0])),
            api::INIT_PRODUCER_ID => {
                let mut g = l.lock().unwrap();
                g.inits += 1;
                req.answer(
                    &InitProducerIdResponse::default()
                        .with_producer_id(ProducerId(1000 + g.inits))
                        .with_producer_epoch(0),
                )
            }
            api::PRODUCE => req.answer(&produce(req, &l)),
            _ => None,
        }),
    );
    let mut cfg = LoadSpec::new(&fake.addr(0), TOPIC).producer;
    cfg.idempotent = true;
    cfg.acks = -1;
    cfg.record_size_bytes = 100;
    cfg.batch_size_bytes = (BATCH_RECORDS * 100) as usize;
    cfg.linger_ms = 0;
    cfg.retries = 5;
    cfg.retry_backoff_ms = 10;
    cfg.retry_backoff_max_ms = 50;
    cfg.delivery_timeout_ms = 20_000;
    let clock = Clock::start();
    let recorder = Arc::new(Recorder::new(0));
    let p = Producer::new(
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
    let stats = p.run(pacer, &AtomicBool::new(false)).unwrap();
    let g = log.lock().unwrap();
    let errors = recorder.summary(1).errors;
    assert_eq!(
        (stats.acked, stats.failed),
        (RECORDS - BATCH_RECORDS, BATCH_RECORDS),
        "only the refused batch may fail; errors {errors:?}"
    );
    assert_eq!(g.log_end as u64, RECORDS - BATCH_RECORDS);
    assert_eq!(
        g.inits, 2,
        "one InitProducerId at the start, one after the give-up"
    );
}
