//! What an unauthenticated connection on a SASL listener may send: Kafka caps each frame
//! read before authentication at `sasl.server.max.receive.size` (512 KiB by default), so a
//! client that has not logged in cannot make the broker buffer `socket.request.max.bytes`
//! (100 MB) per connection. After authentication the ordinary limit applies.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Broker, Client, batch};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn start() -> Broker {
    Broker::start(
        1,
        &[
            ("listeners", "SASL_PLAINTEXT://127.0.0.1:0"),
            ("sasl.enabled.mechanisms", "PLAIN"),
            ("sasl.plain.users", "admin:admin-pw"),
            ("connection.failed.authentication.delay.ms", "0"),
        ],
    )
}

fn login(b: &Broker) -> Client {
    let mut c = b.client();
    let hs: SaslHandshakeResponse = c.call(
        api::SASL_HANDSHAKE,
        1,
        &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")),
    );
    assert_eq!(hs.error_code, 0, "handshake");
    let auth: SaslAuthenticateResponse = c.call(
        api::SASL_AUTHENTICATE,
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from("\0admin\0admin-pw")),
    );
    assert_eq!(auth.error_code, 0, "authenticate");
    c
}

/// A 10 MB size prefix before SaslHandshake: the connection is closed at once, not held
/// open while the broker waits for (and budgets) 10 MB from a stranger.
#[test]
fn an_unauthenticated_frame_over_sasl_server_max_receive_size_closes_the_connection() {
    let b = start();
    let mut raw = TcpStream::connect(b.addr()).expect("connect");
    raw.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let started = Instant::now();
    raw.write_all(&(10_000_000i32).to_be_bytes()).expect("size");
    raw.write_all(&[0u8; 1024]).expect("some of the body");
    let mut byte = [0u8; 1];
    let read = raw.read(&mut byte);
    let closed = match &read {
        Ok(0) => true,
        Err(e) => matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe),
        Ok(_) => false,
    };
    assert!(closed, "closed, not answered or left waiting: {read:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed at once, after {:?}",
        started.elapsed()
    );
    // Authenticated, a frame over 512 KiB is an ordinary request.
    let mut c = login(&b);
    let topic = CreatableTopic::default()
        .with_name(TopicName(s("big")))
        .with_num_partitions(1)
        .with_replication_factor(1);
    let created: CreateTopicsResponse = c.call(
        api::CREATE_TOPICS,
        7,
        &CreateTopicsRequest::default()
            .with_topics(vec![topic])
            .with_timeout_ms(10_000),
    );
    assert_eq!(created.topics[0].error_code, 0);
    let value = vec![7u8; 600 * 1024];
    let p = PartitionProduceData::default()
        .with_index(0)
        .with_records(Some(batch(&[&value], 1)));
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(s("big")))
                .with_partition_data(vec![p]),
        ]);
    let resp: ProduceResponse = c.call(api::PRODUCE, 9, &req);
    assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
}
