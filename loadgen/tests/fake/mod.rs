//! A fake Kafka cluster for tests of the load generator's client: a few listeners on
//! 127.0.0.1 (one per node) that hand every request to one handler, which answers it (or
//! closes the connection by answering `None`). Helpers build the usual responses.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{ApiVersionsResponse, BrokerId, MetadataResponse, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use weir_loadgen::client::metadata::Cluster;
use wire::{api, frame, messages};

/// Largest request frame the fake reads.
const REQUEST_MAX_BYTES: usize = 64 << 20;
const ACCEPT_POLL: Duration = Duration::from_millis(5);

/// One request, as the handler sees it.
pub struct Req {
    /// Which node (listener) it came to.
    pub node: usize,
    pub api_key: i16,
    pub version: i16,
    pub correlation_id: i32,
    /// The body after the request header.
    pub body: Bytes,
    /// Every node's port, by node index (= broker id).
    pub ports: Arc<Vec<u16>>,
}

impl Req {
    /// The encoded response frame for `resp`.
    pub fn answer<R: Encodable>(&self, resp: &R) -> Option<Bytes> {
        // ApiVersions answers in v0 framing whatever the request's version.
        let v = if self.api_key == api::API_VERSIONS {
            0
        } else {
            self.version
        };
        messages::encode_response(self.correlation_id, self.api_key, v, resp).ok()
    }

    /// Decodes the body as request type `R`.
    pub fn decode<R: kafka_protocol::protocol::Decodable>(&self) -> R {
        messages::decode_request_as::<R>(self.api_key, self.version, self.body.clone())
            .expect("a request the fake can decode")
    }
}

pub type Handler = dyn Fn(&Req) -> Option<Bytes> + Send + Sync;

/// The running fake; stops accepting when dropped.
pub struct Fake {
    pub ports: Arc<Vec<u16>>,
    done: Arc<AtomicBool>,
    acceptors: Vec<JoinHandle<()>>,
}

impl Fake {
    /// `nodes` listeners, all served by `handler`.
    pub fn start(nodes: usize, handler: Arc<Handler>) -> Self {
        let listeners: Vec<TcpListener> = (0..nodes)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
            .collect();
        let ports: Arc<Vec<u16>> = Arc::new(
            listeners
                .iter()
                .map(|l| l.local_addr().expect("local addr").port())
                .collect(),
        );
        let done = Arc::new(AtomicBool::new(false));
        let mut acceptors = Vec::new();
        for (node, l) in listeners.into_iter().enumerate() {
            l.set_nonblocking(true).expect("nonblocking");
            let (d, h, p) = (done.clone(), handler.clone(), ports.clone());
            acceptors.push(std::thread::spawn(move || {
                while !d.load(Ordering::SeqCst) {
                    match l.accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(false).expect("blocking");
                            let (h, p) = (h.clone(), p.clone());
                            std::thread::spawn(move || serve(s, node, &*h, p));
                        }
                        Err(_) => std::thread::sleep(ACCEPT_POLL),
                    }
                }
            }));
        }
        Self {
            ports,
            done,
            acceptors,
        }
    }

    pub fn addr(&self, node: usize) -> String {
        format!("127.0.0.1:{}", self.ports[node])
    }

    /// The cluster layout with every node as a broker and these partition leaders.
    pub fn cluster(&self, leaders: &[i32]) -> Cluster {
        Cluster {
            brokers: (0..self.ports.len())
                .map(|n| (n as i32, self.addr(n)))
                .collect(),
            leaders: leaders.to_vec(),
        }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        for a in self.acceptors.drain(..) {
            let _ = a.join();
        }
    }
}

/// Serves one connection until it closes or the handler declines.
fn serve(mut s: TcpStream, node: usize, handler: &Handler, ports: Arc<Vec<u16>>) {
    let mut prefix = [0u8; 4];
    while s.read_exact(&mut prefix).is_ok() {
        let size = i32::from_be_bytes(prefix) as usize;
        if size > REQUEST_MAX_BYTES {
            return;
        }
        let mut body = vec![0u8; size];
        if s.read_exact(&mut body).is_err() {
            return;
        }
        let body = Bytes::from(body);
        let Ok((h, at)) = frame::parse_request_header(&body) else {
            return;
        };
        let req = Req {
            node,
            api_key: h.api_key,
            version: h.api_version,
            correlation_id: h.correlation_id,
            body: body.slice(at..),
            ports: ports.clone(),
        };
        let Some(out) = handler(&req) else { return };
        if s.write_all(&out).is_err() {
            return;
        }
    }
}

/// ApiVersions advertising `(key, min, max)` for each API.
pub fn api_versions(keys: &[(i16, i16, i16)]) -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(
        keys.iter()
            .map(|&(k, lo, hi)| {
                ApiVersion::default()
                    .with_api_key(k)
                    .with_min_version(lo)
                    .with_max_version(hi)
            })
            .collect(),
    )
}

/// Metadata naming every node and `topic` with partition i led by `leaders[i]`.
pub fn metadata(ports: &[u16], topic: &str, leaders: &[i32]) -> MetadataResponse {
    let partitions = leaders
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            MetadataResponsePartition::default()
                .with_partition_index(i as i32)
                .with_leader_id(BrokerId(l))
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(
            ports
                .iter()
                .enumerate()
                .map(|(n, &port)| {
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(n as i32))
                        .with_host(StrBytes::from_static_str("127.0.0.1"))
                        .with_port(i32::from(port))
                })
                .collect(),
        )
        .with_topics(vec![
            MetadataResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(topic.to_string()))))
                .with_partitions(partitions),
        ])
}
