//! `weir cluster status`: the nodes, the active controller, and the under-replicated and
//! offline partitions of a running cluster, from one node's Metadata (any node works).

use std::io::Write;

use kafka_protocol::messages::{ApiKey, MetadataRequest, MetadataResponse};

use super::Client;

/// Metadata version asked for (leader epochs and offline replicas).
const METADATA_VERSION: i16 = 9;

/// Prints the cluster's state as `bootstrap` sees it.
pub fn status(bootstrap: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let mut c = Client::connect(bootstrap)?;
    let req = MetadataRequest::default().with_topics(None);
    let m: MetadataResponse = c.call(ApiKey::Metadata, METADATA_VERSION, &req)?;
    status_text(&m, out)
}

/// Writes `m` as `status` prints it.
fn status_text(m: &MetadataResponse, out: &mut impl Write) -> anyhow::Result<()> {
    let cluster = m
        .cluster_id
        .as_ref()
        .map_or("-".to_string(), |c| c.to_string());
    writeln!(out, "cluster {cluster}")?;
    writeln!(out, "controller {}", m.controller_id.0)?;
    let mut brokers: Vec<_> = m.brokers.iter().collect();
    brokers.sort_by_key(|b| b.node_id.0);
    writeln!(out, "{:<8} ADDRESS", "NODE")?;
    for b in brokers {
        writeln!(out, "{:<8} {}:{}", b.node_id.0, b.host.as_str(), b.port)?;
    }
    // How many it saw: a listener that hides topics from this client shows 0 here.
    writeln!(out, "topics: {}", m.topics.len())?;
    let (mut under, mut offline) = (Vec::new(), Vec::new());
    let mut topics: Vec<_> = m.topics.iter().collect();
    topics.sort_by_key(|t| t.name.as_ref().map(|n| n.0.to_string()));
    for t in topics {
        let name = t.name.as_ref().map_or("?", |n| n.0.as_str());
        for p in &t.partitions {
            let line = super::topics::partition_line(name, p);
            if p.leader_id.0 < 0 {
                offline.push(line);
            } else if p.isr_nodes.len() < p.replica_nodes.len() {
                under.push(line);
            }
        }
    }
    writeln!(out, "under-replicated partitions: {}", under.len())?;
    for l in &under {
        writeln!(out, "  {l}")?;
    }
    writeln!(out, "offline partitions: {}", offline.len())?;
    for l in &offline {
        writeln!(out, "  {l}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::messages::metadata_response::MetadataResponseTopic;

    #[test]
    fn status_says_how_many_topics_it_saw() {
        let mut m = MetadataResponse::default();
        for name in ["a", "b"] {
            let mut t = MetadataResponseTopic::default();
            t.name = Some(TopicName(name.to_string().into()));
            m.topics.push(t);
        }
        let mut out = Vec::new();
        status_text(&m, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("topics: 2\n"), "{text}");
    }
}
