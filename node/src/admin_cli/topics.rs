//! `weir topics create|list|describe|delete|alter`: topic administration of a running
//! cluster over the Kafka protocol (any node works: writes are forwarded to the
//! controller), printing what Kafka's `kafka-topics` prints — `describe` in the shape of
//! `kafka-topics --describe`, one line per topic then one per partition with its leader,
//! replicas and ISR.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Context, bail};
use kafka_protocol::messages::create_partitions_request::{
    CreatePartitionsAssignment, CreatePartitionsTopic,
};
use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::MetadataResponsePartition;
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    MetadataRequest, MetadataResponse, TopicName,
};

use super::{Client, kafka_error};

/// Versions asked for: each is within what weir and Kafka 3.x+ serve.
const METADATA_VERSION: i16 = 9;
const CREATE_TOPICS_VERSION: i16 = 5;
const DELETE_TOPICS_VERSION: i16 = 4;
const CREATE_PARTITIONS_VERSION: i16 = 2;
const DESCRIBE_CONFIGS_VERSION: i16 = 3;
const INCREMENTAL_ALTER_VERSION: i16 = 1;
/// How long the controller may take to commit a topic change.
const ADMIN_TIMEOUT_MS: i32 = 30_000;
/// DescribeConfigs resource type of a topic.
const TOPIC_RESOURCE: i8 = 2;
/// DescribeConfigs config source of a per-topic override (the ones `describe` prints).
const SOURCE_DYNAMIC_TOPIC: i8 = 1;
/// IncrementalAlterConfigs operations.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;

/// What `create` asks for.
#[derive(Debug, Default, Clone)]
pub struct CreateSpec {
    pub name: String,
    /// -1: the broker's `num.partitions` (only without an explicit assignment).
    pub partitions: i32,
    /// -1: the broker's `default.replication.factor`.
    pub replication_factor: i16,
    /// Explicit replicas per partition (`1:2:3,2:3:1`); empty: the controller places them.
    pub assignment: Vec<Vec<i32>>,
    pub configs: Vec<(String, String)>,
}

/// What `alter` changes.
#[derive(Debug, Default, Clone)]
pub struct AlterSpec {
    pub name: String,
    /// New total partition count, if given.
    pub partitions: Option<i32>,
    /// Replicas for the added partitions (`--replica-assignment`), if given.
    pub assignment: Vec<Vec<i32>>,
    pub set: Vec<(String, String)>,
    pub delete: Vec<String>,
}

/// `KEY=VALUE` → (key, value).
pub fn parse_config(kv: &str) -> anyhow::Result<(String, String)> {
    let (k, v) = kv
        .split_once('=')
        .with_context(|| format!("config {kv:?} is not KEY=VALUE"))?;
    if k.is_empty() {
        bail!("config {kv:?} has an empty key");
    }
    Ok((k.to_string(), v.to_string()))
}

/// `1:2:3,2:3:1` → one replica list per partition, as `kafka-topics --replica-assignment`.
pub fn parse_assignment(text: &str) -> anyhow::Result<Vec<Vec<i32>>> {
    text.split(',')
        .map(|partition| {
            partition
                .split(':')
                .map(|id| {
                    id.trim()
                        .parse::<i32>()
                        .with_context(|| format!("replica {id:?} in {text:?} is not a node id"))
                })
                .collect()
        })
        .collect()
}

/// `weir topics create`.
pub fn create(bootstrap: &str, spec: &CreateSpec, out: &mut impl Write) -> anyhow::Result<()> {
    let mut c = Client::connect(bootstrap)?;
    let mut topic = CreatableTopic::default();
    topic.name = TopicName(spec.name.clone().into());
    if spec.assignment.is_empty() {
        topic.num_partitions = spec.partitions;
        topic.replication_factor = spec.replication_factor;
    } else {
        // Kafka's rule: with an explicit assignment both counts are -1.
        topic.num_partitions = -1;
        topic.replication_factor = -1;
        topic.assignments = spec
            .assignment
            .iter()
            .enumerate()
            .map(|(i, replicas)| {
                let mut a = CreatableReplicaAssignment::default();
                a.partition_index = i as i32;
                a.broker_ids = replicas.iter().map(|id| BrokerId(*id)).collect();
                a
            })
            .collect();
    }
    topic.configs = spec
        .configs
        .iter()
        .map(|(k, v)| {
            let mut c = CreatableTopicConfig::default();
            c.name = k.clone().into();
            c.value = Some(v.clone().into());
            c
        })
        .collect();
    let mut req = CreateTopicsRequest::default();
    req.topics = vec![topic];
    req.timeout_ms = ADMIN_TIMEOUT_MS;
    let resp: CreateTopicsResponse = c.call(ApiKey::CreateTopics, CREATE_TOPICS_VERSION, &req)?;
    let Some(t) = resp.topics.first() else {
        bail!("CreateTopics returned no topic");
    };
    if t.error_code != 0 {
        bail!(
            "creating {}: {}{}",
            spec.name,
            kafka_error(t.error_code),
            message(&t.error_message)
        );
    }
    writeln!(out, "Created topic {}.", spec.name)?;
    Ok(())
}

/// `weir topics delete`: every named topic; fails if any could not be deleted.
pub fn delete(bootstrap: &str, names: &[String], out: &mut impl Write) -> anyhow::Result<()> {
    let mut c = Client::connect(bootstrap)?;
    let mut req = DeleteTopicsRequest::default();
    req.topic_names = names.iter().map(|n| TopicName(n.clone().into())).collect();
    req.timeout_ms = ADMIN_TIMEOUT_MS;
    let resp: DeleteTopicsResponse = c.call(ApiKey::DeleteTopics, DELETE_TOPICS_VERSION, &req)?;
    let mut failed = Vec::new();
    for r in &resp.responses {
        let name = r.name.as_ref().map_or("?", |n| n.0.as_str());
        if r.error_code == 0 {
            writeln!(out, "Deleted topic {name}.")?;
        } else {
            failed.push(format!("{name}: {}", kafka_error(r.error_code)));
        }
    }
    if !failed.is_empty() {
        bail!("deleting {}", failed.join("; "));
    }
    Ok(())
}

/// `weir topics alter`: partitions first (CreatePartitions), then configs
/// (IncrementalAlterConfigs), as `kafka-topics --alter` and `kafka-configs --alter` do.
pub fn alter(bootstrap: &str, spec: &AlterSpec, out: &mut impl Write) -> anyhow::Result<()> {
    if spec.partitions.is_none() && spec.set.is_empty() && spec.delete.is_empty() {
        bail!("nothing to alter: give --partitions, --config or --delete-config");
    }
    let mut c = Client::connect(bootstrap)?;
    if let Some(count) = spec.partitions {
        let mut topic = CreatePartitionsTopic::default();
        topic.name = TopicName(spec.name.clone().into());
        topic.count = count;
        if !spec.assignment.is_empty() {
            topic.assignments = Some(
                spec.assignment
                    .iter()
                    .map(|replicas| {
                        let mut a = CreatePartitionsAssignment::default();
                        a.broker_ids = replicas.iter().map(|id| BrokerId(*id)).collect();
                        a
                    })
                    .collect(),
            );
        }
        let mut req = CreatePartitionsRequest::default();
        req.topics = vec![topic];
        req.timeout_ms = ADMIN_TIMEOUT_MS;
        let resp: CreatePartitionsResponse =
            c.call(ApiKey::CreatePartitions, CREATE_PARTITIONS_VERSION, &req)?;
        let Some(r) = resp.results.first() else {
            bail!("CreatePartitions returned no topic");
        };
        if r.error_code != 0 {
            bail!(
                "adding partitions to {}: {}{}",
                spec.name,
                kafka_error(r.error_code),
                message(&r.error_message)
            );
        }
        writeln!(out, "Topic {} now has {count} partitions.", spec.name)?;
    }
    if !spec.set.is_empty() || !spec.delete.is_empty() {
        let mut resource = AlterConfigsResource::default();
        resource.resource_type = TOPIC_RESOURCE;
        resource.resource_name = spec.name.clone().into();
        for (k, v) in &spec.set {
            let mut a = AlterableConfig::default();
            a.name = k.clone().into();
            a.config_operation = OP_SET;
            a.value = Some(v.clone().into());
            resource.configs.push(a);
        }
        for k in &spec.delete {
            let mut a = AlterableConfig::default();
            a.name = k.clone().into();
            a.config_operation = OP_DELETE;
            resource.configs.push(a);
        }
        let mut req = IncrementalAlterConfigsRequest::default();
        req.resources = vec![resource];
        let resp: IncrementalAlterConfigsResponse = c.call(
            ApiKey::IncrementalAlterConfigs,
            INCREMENTAL_ALTER_VERSION,
            &req,
        )?;
        let Some(r) = resp.responses.first() else {
            bail!("IncrementalAlterConfigs returned no resource");
        };
        if r.error_code != 0 {
            bail!(
                "altering configs of {}: {}{}",
                spec.name,
                kafka_error(r.error_code),
                message(&r.error_message)
            );
        }
        writeln!(out, "Altered configs of topic {}.", spec.name)?;
    }
    Ok(())
}

/// `weir topics list`: one topic name per line, sorted; internal topics only with
/// `internal`.
pub fn list(bootstrap: &str, internal: bool, out: &mut impl Write) -> anyhow::Result<()> {
    let m = metadata(&mut Client::connect(bootstrap)?, None)?;
    let mut names: Vec<&str> = m
        .topics
        .iter()
        .filter(|t| t.error_code == 0 && (internal || !t.is_internal))
        .filter_map(|t| t.name.as_ref().map(|n| n.0.as_str()))
        .collect();
    names.sort_unstable();
    for n in names {
        writeln!(out, "{n}")?;
    }
    Ok(())
}

/// `weir topics describe [TOPIC...]` (all topics when none is named).
pub fn describe(bootstrap: &str, names: &[String], out: &mut impl Write) -> anyhow::Result<()> {
    let mut c = Client::connect(bootstrap)?;
    let m = metadata(&mut c, (!names.is_empty()).then_some(names))?;
    let mut topics: Vec<_> = m.topics.iter().collect();
    topics.sort_by_key(|t| t.name.as_ref().map(|n| n.0.to_string()));
    let mut missing = Vec::new();
    for t in topics {
        let name = t.name.as_ref().map_or("?", |n| n.0.as_str());
        if t.error_code != 0 {
            missing.push(format!("{name}: {}", kafka_error(t.error_code)));
            continue;
        }
        let overrides = topic_overrides(&mut c, name)?;
        let rf = t.partitions.first().map_or(0, |p| p.replica_nodes.len());
        writeln!(
            out,
            "Topic: {name}\tPartitionCount: {}\tReplicationFactor: {rf}\tConfigs: {}",
            t.partitions.len(),
            overrides
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        )?;
        let mut partitions: Vec<_> = t.partitions.iter().collect();
        partitions.sort_by_key(|p| p.partition_index);
        for p in partitions {
            writeln!(out, "\t{}", partition_line(name, p))?;
        }
    }
    if !missing.is_empty() {
        bail!("{}", missing.join("; "));
    }
    Ok(())
}

/// `Topic: T\tPartition: P\tLeader: L\tReplicas: a,b\tIsr: a,b` as `kafka-topics
/// --describe` prints a partition (`Leader: none` when it has none).
pub fn partition_line(topic: &str, p: &MetadataResponsePartition) -> String {
    let ids = |v: &[BrokerId]| {
        v.iter()
            .map(|b| b.0.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let leader = if p.leader_id.0 < 0 {
        "none".to_string()
    } else {
        p.leader_id.0.to_string()
    };
    format!(
        "Topic: {topic}\tPartition: {}\tLeader: {leader}\tReplicas: {}\tIsr: {}",
        p.partition_index,
        ids(&p.replica_nodes),
        ids(&p.isr_nodes)
    )
}

pub(super) fn metadata(
    c: &mut Client,
    names: Option<&[String]>,
) -> anyhow::Result<MetadataResponse> {
    let topics = names.map(|names| {
        names
            .iter()
            .map(|n| MetadataRequestTopic::default().with_name(Some(TopicName(n.clone().into()))))
            .collect()
    });
    let mut req = MetadataRequest::default().with_topics(topics);
    req.allow_auto_topic_creation = false;
    c.call(ApiKey::Metadata, METADATA_VERSION, &req)
}

/// The topic's per-topic overrides (what `kafka-topics --describe` lists as Configs).
fn topic_overrides(c: &mut Client, topic: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut resource = DescribeConfigsResource::default();
    resource.resource_type = TOPIC_RESOURCE;
    resource.resource_name = topic.to_string().into();
    resource.configuration_keys = None;
    let mut req = DescribeConfigsRequest::default();
    req.resources = vec![resource];
    let resp: DescribeConfigsResponse =
        c.call(ApiKey::DescribeConfigs, DESCRIBE_CONFIGS_VERSION, &req)?;
    let mut out = BTreeMap::new();
    for r in &resp.results {
        if r.error_code != 0 {
            bail!(
                "DescribeConfigs {topic}: {}{}",
                kafka_error(r.error_code),
                message(&r.error_message)
            );
        }
        for cfg in &r.configs {
            if cfg.config_source == SOURCE_DYNAMIC_TOPIC && !cfg.is_sensitive {
                let value = cfg.value.as_ref().map_or("", |v| v.as_str());
                out.insert(cfg.name.to_string(), value.to_string());
            }
        }
    }
    Ok(out)
}

fn message(m: &Option<kafka_protocol::protocol::StrBytes>) -> String {
    m.as_ref()
        .filter(|m| !m.is_empty())
        .map_or_else(String::new, |m| format!(" ({})", m.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignment_parses_as_kafka_topics_writes_it() {
        assert_eq!(
            parse_assignment("1:2:3,2:3:1").ok(),
            Some(vec![vec![1, 2, 3], vec![2, 3, 1]])
        );
        assert_eq!(parse_assignment("0").ok(), Some(vec![vec![0]]));
        assert!(parse_assignment("1:x").is_err());
        assert!(parse_assignment("").is_err());
    }

    #[test]
    fn configs_parse_as_key_value() {
        assert_eq!(
            parse_config("retention.ms=1000").ok(),
            Some(("retention.ms".into(), "1000".into()))
        );
        assert_eq!(
            parse_config("cleanup.policy=compact,delete").ok(),
            Some(("cleanup.policy".into(), "compact,delete".into()))
        );
        assert!(parse_config("novalue").is_err());
        assert!(parse_config("=1").is_err());
    }
}
