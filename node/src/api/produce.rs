//! Produce: validate every batch, route each partition's records to its owning shard,
//! append there, answer per partition. acks=0 gets no response; acks=1 and acks=all are
//! answered after the append (single node: the HW moves with the append), and acks=all
//! is refused with NOT_ENOUGH_REPLICAS when `min.insync.replicas` exceeds the one replica.

use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::messages::ProduceResponse;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use wire::WireError;
use wire::produce::ProduceRequestView;

use super::{Response, topic_name};
use crate::errors;
use crate::partition::ProduceOutcome;
use crate::proto::{self, Request};
use crate::shard::{Op, Reply, Shard};

/// In-sync replicas of every partition on a single node.
const ISR_SIZE: i32 = 1;

/// Handles a Produce request; `Ok(None)` for acks=0.
pub async fn handle(shard: &Rc<Shard>, req: &Request) -> Result<Response, WireError> {
    // The hand-parsed view keeps every partition's records a slice of the request frame.
    let produce = ProduceRequestView::parse(&req.body, req.version)?;
    let acks = produce.acks;
    let resp = respond(shard, produce).await;
    if acks == 0 {
        return Ok(None);
    }
    let frame = proto::encode_response(req, &resp)?;
    Ok(Some(vec![frame]))
}

async fn respond(shard: &Rc<Shard>, req: ProduceRequestView) -> ProduceResponse {
    let acks = req.acks;
    let catalog = shard.catalog();
    let mut pending = Vec::new();
    for topic in req.topics {
        // A name that is not UTF-8 cannot exist in the catalogue.
        let name: Arc<str> = Arc::from(String::from_utf8_lossy(&topic.name).as_ref());
        let meta = catalog.topics.get(&*name).cloned();
        for part in topic.partitions {
            let early = if !matches!(acks, -1..=1) {
                Some(errors::INVALID_REQUIRED_ACKS)
            } else {
                match &meta {
                    Some(m) if (0..m.partitions).contains(&part.index) => {
                        let min_isr = m
                            .configs
                            .get("min.insync.replicas")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(shard.config().min_insync_replicas);
                        (acks == -1 && min_isr > ISR_SIZE).then_some(errors::NOT_ENOUGH_REPLICAS)
                    }
                    _ => Some(errors::UNKNOWN_TOPIC_OR_PARTITION),
                }
            };
            let tp = (name.clone(), part.index);
            let task = match (early, part.records) {
                (Some(code), _) => None.ok_or(code),
                (None, None) => None.ok_or(errors::CORRUPT_MESSAGE),
                (None, Some(records)) => {
                    let s = shard.clone();
                    let op = Op::Produce {
                        tp: tp.clone(),
                        records,
                    };
                    Ok(glommio::spawn_local(
                        async move { s.call_owner(&tp, op).await },
                    ))
                }
            };
            pending.push((name.clone(), part.index, task));
        }
    }
    let mut topics: Vec<TopicProduceResponse> = Vec::new();
    for (name, index, task) in pending {
        let outcome = match task {
            Err(code) => failed(code),
            Ok(t) => match t.await {
                Reply::Produce(o) => o,
                Reply::Refused(code) => failed(code),
                _ => failed(errors::UNKNOWN_SERVER_ERROR),
            },
        };
        let p = PartitionProduceResponse::default()
            .with_index(index)
            .with_error_code(outcome.error)
            .with_base_offset(outcome.base_offset)
            .with_log_append_time_ms(outcome.log_append_time_ms)
            .with_log_start_offset(outcome.log_start_offset);
        match topics.last_mut() {
            Some(t) if t.name.0.as_str() == &*name => t.partition_responses.push(p),
            _ => topics.push(
                TopicProduceResponse::default()
                    .with_name(topic_name(&name))
                    .with_partition_responses(vec![p]),
            ),
        }
    }
    ProduceResponse::default().with_responses(topics)
}

fn failed(error: i16) -> ProduceOutcome {
    ProduceOutcome {
        error,
        base_offset: -1,
        log_append_time_ms: -1,
        log_start_offset: -1,
    }
}
