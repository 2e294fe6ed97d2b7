//! Which configuration keys weir knows: the keys it reads, and Kafka's broker keys it
//! accepts and ignores, so that startup can warn about every other key by name (a typo
//! or a feature weir lacks must not pass silently; Kafka logs "was supplied but isn't a
//! known config" for the same reason).
//!
//! A module that starts reading a new key adds it to [`WEIR_KEYS`] (else startup calls
//! it ignored).

use super::Properties;

/// Every broker key weir reads (Kafka's names, and weir's own keys).
pub const WEIR_KEYS: &[&str] = &[
    // config.rs
    "advertised.listeners",
    "auto.create.topics.enable",
    "broker.id",
    "broker.rack",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.type",
    "compression.zstd.level",
    "connections.max.idle.ms",
    "default.replication.factor",
    "fetch.max.bytes",
    "fetch.response.buffer.max.bytes",
    "listeners",
    "max.incremental.fetch.session.cache.slots",
    "log.cleanup.policy",
    "log.dir",
    "log.dirs",
    "log.flush.on.ack",
    "log.index.cache.bytes",
    "log.tail.cache.max.bytes",
    "log.message.timestamp.after.max.ms",
    "log.message.timestamp.before.max.ms",
    "log.message.timestamp.type",
    "log.retention.bytes",
    "log.retention.check.interval.ms",
    "log.retention.hours",
    "log.retention.minutes",
    "log.retention.ms",
    "log.segment.bytes",
    "max.connections",
    "max.connections.per.ip",
    "max.connections.per.ip.overrides",
    "max.open.partitions",
    "max.partitions",
    "max.partitions.per.request",
    "message.max.bytes",
    "min.insync.replicas",
    "node.id",
    "num.partitions",
    "queued.max.request.bytes",
    "request.read.timeout.ms",
    "socket.request.max.bytes",
    "weir.shards",
    "weir.shard.stall.warn.ms",
    "weir.shard.cpus",
    // Topic-level names accepted as broker defaults (config.rs).
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    // Passed to the storage engine and producer state (config.rs `log_defaults`).
    "log.flush.interval.messages",
    "log.flush.interval.ms",
    "log.index.interval.bytes",
    "log.index.size.max.bytes",
    "log.preallocate",
    "log.roll.hours",
    "log.roll.ms",
    "log.tail.cache.bytes",
    "log.read.ahead.bytes",
    "producer.id.expiration.ms",
    // Passed as `file.delete.delay.ms` (config.rs `topic_defaults`).
    "log.segment.delete.delay.ms",
    // The group coordinator (group/mod.rs `Settings`).
    "group.initial.rebalance.delay.ms",
    "group.max.session.timeout.ms",
    "group.max.size",
    "group.min.session.timeout.ms",
    "offset.metadata.max.bytes",
    "offsets.retention.check.interval.ms",
    "offsets.retention.minutes",
    "offsets.topic.num.partitions",
    "offsets.topic.segment.bytes",
    // cluster, replication, metrics, security, cleaner, transactions (merged later)
    "broker.heartbeat.interval.ms",
    "broker.session.timeout.ms",
    "controller.quorum.election.timeout.ms",
    "controller.quorum.voters",
    "connection.failed.authentication.delay.ms",
    "inter.broker.listener.name",
    "listener.security.protocol.map",
    "log.cleaner.backoff.ms",
    "log.cleaner.dedupe.buffer.size",
    "log.cleaner.delete.retention.ms",
    "log.cleaner.enable",
    "log.cleaner.io.max.bytes.per.second",
    "log.cleaner.max.compaction.lag.ms",
    "log.cleaner.min.cleanable.ratio",
    "log.cleaner.min.compaction.lag.ms",
    "metrics.listener",
    "replica.fetch.max.bytes",
    "replica.fetch.min.bytes",
    "replica.fetch.response.max.bytes",
    "replica.fetch.wait.max.ms",
    "replica.high.watermark.checkpoint.interval.ms",
    "replica.lag.time.max.ms",
    "replica.selector.class",
    "sasl.enabled.mechanisms",
    "sasl.plain.users",
    "sasl.server.max.receive.size",
    "ssl.client.auth",
    "ssl.handshake.timeout.ms",
    "ssl.key.password",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
    "ssl.keystore.location",
    "ssl.keystore.type",
    "ssl.truststore.certificates",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms",
    "transaction.max.timeout.ms",
    "transaction.state.log.num.partitions",
    "transaction.remove.expired.transaction.cleanup.interval.ms",
    "transaction.state.log.segment.bytes",
    "transactional.id.expiration.ms",
    // security/peer.rs: node-to-node connections
    "controller.listener.names",
    "sasl.mechanism.inter.broker.protocol",
    "security.inter.broker.protocol",
    // security/sasl.rs, security/tls.rs, security/peer.rs, security/scram_bootstrap.rs
    "connections.max.reauth.ms",
    "sasl.jaas.config",
    "sasl.mechanism.controller.protocol",
    "scram.bootstrap.credentials",
    "ssl.endpoint.identification.algorithm",
    // api/admin.rs: refused (TOPIC_DELETION_DISABLED) when false
    "delete.topic.enable",
    // config.rs: refused at startup (weir cannot run Kafka's Java policies, or form a
    // quorum from bootstrap servers), rather than running without them
    "alter.config.policy.class.name",
    "controller.quorum.bootstrap.servers",
    "create.topic.policy.class.name",
    // controller/quorum: the default of a topic's own value (also set dynamically)
    "unclean.leader.election.enable",
    // security/authorizer.rs
    "allow.everyone.if.no.acl.found",
    "authorizer.class.name",
    "super.users",
    // preferred-leader rebalance (controller/quorum)
    "auto.leader.rebalance.enable",
    "leader.imbalance.check.interval.seconds",
    "leader.imbalance.per.broker.percentage",
    // group/mod.rs, txn/mod.rs: the internal topics' replication
    "offsets.topic.replication.factor",
    "transaction.state.log.min.isr",
    "transaction.state.log.replication.factor",
];

/// Kafka broker keys weir accepts without using them (Kafka 3.x/4.x `KafkaConfig`).
const KAFKA_KEYS: &[&str] = &[
    "alter.log.dirs.replication.quota.window.num",
    "auto.include.jmx.reporter",
    "background.threads",
    "broker.id.generation.enable",
    "client.quota.callback.class",
    "control.plane.listener.name",
    "controlled.shutdown.enable",
    "controlled.shutdown.max.retries",
    "controlled.shutdown.retry.backoff.ms",
    "controller.quorum.append.linger.ms",
    "controller.quorum.election.backoff.max.ms",
    "controller.quorum.fetch.timeout.ms",
    "controller.quorum.request.timeout.ms",
    "controller.quorum.retry.backoff.ms",
    "controller.socket.timeout.ms",
    "delete.records.purgatory.purge.interval.requests",
    "early.start.listeners",
    "eligible.leader.replicas.enable",
    "fetch.purgatory.purge.interval.requests",
    "group.coordinator.rebalance.protocols",
    "group.coordinator.threads",
    "initial.broker.registration.timeout.ms",
    "inter.broker.protocol.version",
    "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.buffer.size",
    "log.cleaner.threads",
    "log.dir.failure.timeout.ms",
    "log.flush.offset.checkpoint.interval.ms",
    "log.flush.scheduler.interval.ms",
    "log.flush.start.offset.checkpoint.interval.ms",
    "log.initial.task.delay.ms",
    "log.local.retention.bytes",
    "log.local.retention.ms",
    "log.message.downconversion.enable",
    "log.message.format.version",
    "log.message.timestamp.difference.max.ms",
    "log.roll.jitter.hours",
    "log.roll.jitter.ms",
    "max.connection.creation.rate",
    "metadata.log.dir",
    "metadata.log.max.record.bytes.between.snapshots",
    "metadata.log.max.snapshot.interval.ms",
    "metadata.log.segment.bytes",
    "metadata.log.segment.ms",
    "metadata.max.idle.interval.ms",
    "metadata.max.retention.bytes",
    "metadata.max.retention.ms",
    "metric.reporters",
    "metrics.num.samples",
    "metrics.recording.level",
    "metrics.sample.window.ms",
    "num.io.threads",
    "num.network.threads",
    "num.recovery.threads.per.data.dir",
    "num.replica.alter.log.dirs.threads",
    "num.replica.fetchers",
    "offsets.commit.required.acks",
    "offsets.commit.timeout.ms",
    "offsets.load.buffer.size",
    "offsets.topic.compression.codec",
    "principal.builder.class",
    "process.roles",
    "producer.id.expiration.check.interval.ms",
    "producer.purgatory.purge.interval.requests",
    "queued.max.requests",
    "quota.window.num",
    "quota.window.size.seconds",
    "replica.fetch.backoff.ms",
    "replica.socket.receive.buffer.bytes",
    "replica.socket.timeout.ms",
    "replication.quota.window.num",
    "replication.quota.window.size.seconds",
    "request.timeout.ms",
    "reserved.broker.max.id",
    "socket.connection.setup.timeout.max.ms",
    "socket.connection.setup.timeout.ms",
    "socket.listen.backlog.size",
    "socket.receive.buffer.bytes",
    "socket.send.buffer.bytes",
    "transaction.partition.verification.enable",
    "transaction.state.log.load.buffer.size",
];

/// Families of Kafka keys too many to list one by one (TLS, SASL, ZooKeeper, tiered
/// storage, per-listener overrides, ...): accepted and ignored like [`KAFKA_KEYS`].
const KAFKA_PREFIXES: &[&str] = &[
    "delegation.token.",
    "group.consumer.",
    "group.share.",
    "kafka.metrics.",
    "listener.name.",
    "password.encoder.",
    "remote.log.",
    "sasl.",
    "share.",
    "ssl.",
    "zookeeper.",
];

/// Broker keys weir applies at runtime when set dynamically (AlterConfigs on the BROKER
/// resource), with the topic-level key each is the default of: they change the defaults
/// of every topic without its own override, at once for open partitions too.
pub const DYNAMIC_APPLIED: &[(&str, &str)] = &[
    ("compression.gzip.level", "compression.gzip.level"),
    ("compression.lz4.level", "compression.lz4.level"),
    ("compression.type", "compression.type"),
    ("compression.zstd.level", "compression.zstd.level"),
    ("log.cleanup.policy", "cleanup.policy"),
    ("log.message.timestamp.type", "message.timestamp.type"),
    ("log.retention.bytes", "retention.bytes"),
    ("log.retention.ms", "retention.ms"),
    ("log.segment.bytes", "segment.bytes"),
];

/// Keys weir reads where they are used, in their dynamic form too (the dynamic value
/// wins over the static one there): stored, described, and read at once.
pub const DYNAMIC_READ: &[&str] = &["unclean.leader.election.enable"];

/// Kafka keys Kafka lets an admin change at runtime that weir does not use: accepted,
/// stored and described like their static form, without effect.
pub const KAFKA_DYNAMIC_IGNORED: &[&str] = &[
    "background.threads",
    "log.cleaner.dedupe.buffer.size",
    "log.cleaner.delete.retention.ms",
    "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.buffer.size",
    "log.cleaner.io.max.bytes.per.second",
    "log.cleaner.max.compaction.lag.ms",
    "log.cleaner.min.cleanable.ratio",
    "log.cleaner.min.compaction.lag.ms",
    "log.cleaner.threads",
    "log.message.downconversion.enable",
    "log.roll.jitter.hours",
    "log.roll.jitter.ms",
    "max.connection.creation.rate",
    "num.io.threads",
    "num.network.threads",
    "num.recovery.threads.per.data.dir",
    "num.replica.alter.log.dirs.threads",
    "num.replica.fetchers",
];

/// Families of per-listener security keys Kafka reconfigures at runtime.
const KAFKA_DYNAMIC_IGNORED_PREFIXES: &[&str] = &["listener.name.", "sasl.", "ssl."];

/// Endings of the keys whose values are secrets: Kafka's PASSWORD-typed keys
/// (`ssl.key.password`, `ssl.keystore.key`, `sasl.jaas.config`, `password.encoder.secret`,
/// `delegation.token.secret.key`, the certificate PEMs, ...), also under a
/// `listener.name.<l>.[<mechanism>.]` prefix, and weir's own keys holding passwords.
const SENSITIVE_SUFFIXES: &[&str] = &[
    ".password",
    ".secret",
    ".key",
    ".passphrase",
    "sasl.jaas.config",
    "sasl.plain.users",
    "scram.bootstrap.credentials",
    "ssl.keystore.certificate.chain",
    "ssl.truststore.certificates",
];

/// Whether `key`'s value is a secret: DescribeConfigs answers it as Kafka answers a
/// PASSWORD key (value null, `is_sensitive`), and logs never show it.
pub fn is_sensitive(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SENSITIVE_SUFFIXES.iter().any(|s| key.ends_with(s))
}

/// `key=value` for a log line or message, the value hidden if it is a secret.
pub fn shown(key: &str, value: &str) -> String {
    match is_sensitive(key) {
        true => format!("{key}=[hidden]"),
        false => format!("{key}={value}"),
    }
}

/// Whether and how a broker key may be set dynamically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dynamic {
    /// Applied at once, as the default of this topic-level key.
    Applied(&'static str),
    /// Stored and described: without effect for a Kafka dynamic key weir does not use,
    /// read where it is used for one of [`DYNAMIC_READ`].
    Stored,
    /// A key weir reads only at startup: refused (set it statically and restart).
    ReadOnly,
    /// Neither weir nor Kafka knows it: refused.
    Unknown,
}

/// How AlterConfigs on the BROKER resource treats `key`.
pub fn dynamic_kind(key: &str) -> Dynamic {
    if let Some((_, topic_key)) = DYNAMIC_APPLIED.iter().find(|(k, _)| *k == key) {
        return Dynamic::Applied(topic_key);
    }
    if DYNAMIC_READ.contains(&key) {
        return Dynamic::Stored;
    }
    match kind(key) {
        KeyKind::Used => Dynamic::ReadOnly,
        KeyKind::KafkaIgnored
            if KAFKA_DYNAMIC_IGNORED.contains(&key)
                || KAFKA_DYNAMIC_IGNORED_PREFIXES
                    .iter()
                    .any(|p| key.starts_with(p)) =>
        {
            Dynamic::Stored
        }
        KeyKind::KafkaIgnored => Dynamic::ReadOnly,
        KeyKind::Unknown => Dynamic::Unknown,
    }
}

/// How weir treats a configuration key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// weir reads it.
    Used,
    /// Kafka knows it; weir accepts and ignores it.
    KafkaIgnored,
    /// Neither weir nor Kafka knows it (a typo?).
    Unknown,
}

/// What weir does with `key`. A per-listener key (`listener.name.<l>.<key>`, also
/// `listener.name.<l>.<mechanism>.sasl.jaas.config` and
/// `listener.name.<l>.<mechanism>.connections.max.reauth.ms`) is what its `<key>` is.
pub fn kind(key: &str) -> KeyKind {
    if let Some(rest) = key.strip_prefix("listener.name.")
        && let Some((_listener, key)) = rest.split_once('.')
    {
        return match kind(key) {
            KeyKind::Used => KeyKind::Used,
            _ if key.ends_with(".sasl.jaas.config") => KeyKind::Used,
            // Read only for a lower-case listener and a mechanism weir has, spelt as
            // Kafka spells it (`scram-sha-256`): any other spelling would never be read,
            // and its lifetime silently not applied, so it gets the unused-key warning.
            _ => match key.strip_suffix(".connections.max.reauth.ms") {
                Some(mechanism) if reauth_key_read(_listener, mechanism) => KeyKind::Used,
                _ => KeyKind::KafkaIgnored,
            },
        };
    }
    if WEIR_KEYS.contains(&key) {
        KeyKind::Used
    } else if KAFKA_KEYS.contains(&key) || KAFKA_PREFIXES.iter().any(|p| key.starts_with(p)) {
        KeyKind::KafkaIgnored
    } else {
        KeyKind::Unknown
    }
}

/// Whether `listener.name.<listener>.<mechanism>.connections.max.reauth.ms` is a key
/// the SASL setup reads (`security::sasl`).
fn reauth_key_read(listener: &str, mechanism: &str) -> bool {
    let lower = |s: &str| s == s.to_ascii_lowercase();
    lower(listener)
        && lower(mechanism)
        && wire::sasl::Mechanism::parse(&mechanism.to_ascii_uppercase()).is_some()
}

/// One warning line per key weir does not use, naming it, in key order.
pub fn warnings(props: &Properties) -> Vec<String> {
    props
        .keys()
        .filter_map(|key| match kind(key) {
            KeyKind::Used => None,
            KeyKind::KafkaIgnored => Some(format!(
                "config key {key} is a Kafka setting weir does not use: ignored"
            )),
            KeyKind::Unknown => Some(format!(
                "unknown config key {key}: weir does not know it (a typo?), ignored"
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kafka_and_used_keys_are_told_apart() {
        assert_eq!(kind("num.partitions"), KeyKind::Used);
        assert_eq!(kind("controller.quorum.voters"), KeyKind::Used);
        assert_eq!(kind("ssl.keystore.location"), KeyKind::Used);
        assert_eq!(kind("foo.bar"), KeyKind::Unknown);
        assert_eq!(kind("num.partition"), KeyKind::Unknown);
        let mut p = Properties::default();
        p.set("foo.bar", "1");
        p.set("num.partitions", "3");
        p.set("num.replica.fetchers", "2");
        let w = warnings(&p);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w.iter()
                .any(|l| l.contains("num.replica.fetchers") && l.contains("Kafka setting")),
            "{w:?}"
        );
        assert!(
            w.iter().any(|l| l.contains("unknown config key foo.bar")),
            "{w:?}"
        );
    }

    #[test]
    fn dynamic_keys_are_applied_stored_or_refused() {
        assert_eq!(
            dynamic_kind("log.retention.ms"),
            Dynamic::Applied("retention.ms")
        );
        assert_eq!(dynamic_kind("background.threads"), Dynamic::Stored);
        assert_eq!(
            dynamic_kind("sasl.kerberos.min.time.before.relogin"),
            Dynamic::Stored
        );
        assert_eq!(dynamic_kind("num.partitions"), Dynamic::ReadOnly);
        // KIP-368's session lifetime is read-only in Kafka too (read at startup), in
        // every form.
        for key in [
            "connections.max.reauth.ms",
            "listener.name.ext.connections.max.reauth.ms",
            "listener.name.ext.scram-sha-512.connections.max.reauth.ms",
        ] {
            assert_eq!(kind(key), KeyKind::Used, "{key}");
            assert_eq!(dynamic_kind(key), Dynamic::ReadOnly, "{key}");
        }
        // A mechanism weir does not have, or spelt otherwise than Kafka's key, is never
        // read: warned about as unused, not silently taken.
        for key in [
            "listener.name.ext.oauthbearer.connections.max.reauth.ms",
            "listener.name.ext.scram_sha_512.connections.max.reauth.ms",
            "listener.name.ext.PLAIN.connections.max.reauth.ms",
            "listener.name.EXT.plain.connections.max.reauth.ms",
        ] {
            assert_eq!(kind(key), KeyKind::KafkaIgnored, "{key}");
        }
        assert_eq!(dynamic_kind("broker.rack"), Dynamic::ReadOnly);
        assert_eq!(dynamic_kind("foo.bar"), Dynamic::Unknown);
        // Keys weir reads at startup, under a listener's prefix too: refused at runtime
        // (a "successful" certificate rotation that changes nothing would mislead).
        for key in [
            "listener.name.ext.ssl.keystore.location",
            "listener.name.ext.plain.sasl.jaas.config",
            "listener.name.ext.sasl.enabled.mechanisms",
            "sasl.jaas.config",
            "ssl.endpoint.identification.algorithm",
            "log.roll.hours",
            "log.preallocate",
        ] {
            assert_eq!(kind(key), KeyKind::Used, "{key}");
            assert_eq!(dynamic_kind(key), Dynamic::ReadOnly, "{key}");
        }
        assert_eq!(kind("scram.bootstrap.credentials"), KeyKind::Used);
        assert_eq!(kind("unclean.leader.election.enable"), KeyKind::Used);
        assert_eq!(
            dynamic_kind("unclean.leader.election.enable"),
            Dynamic::Stored
        );
        assert_eq!(
            kind("listener.name.ext.ssl.cipher.suites"),
            KeyKind::KafkaIgnored
        );
        assert_eq!(
            dynamic_kind("listener.name.ext.ssl.cipher.suites"),
            Dynamic::Stored
        );
        for (k, _) in DYNAMIC_APPLIED {
            assert_eq!(kind(k), KeyKind::Used, "{k}");
        }
    }

    #[test]
    fn secrets_are_told_from_other_keys() {
        for key in [
            "sasl.plain.users",
            "sasl.jaas.config",
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.truststore.password",
            "ssl.keystore.key",
            "ssl.keystore.certificate.chain",
            "ssl.truststore.certificates",
            "listener.name.client.ssl.key.password",
            "scram.bootstrap.credentials",
            "password.encoder.secret",
            "delegation.token.secret.key",
            "sasl.oauthbearer.client.credentials.client.secret",
        ] {
            assert!(is_sensitive(key), "{key}");
        }
        for key in [
            "num.partitions",
            "sasl.enabled.mechanisms",
            "ssl.keystore.location",
            "ssl.client.auth",
            "log.retention.ms",
        ] {
            assert!(!is_sensitive(key), "{key}");
        }
        assert_eq!(shown("ssl.key.password", "pw"), "ssl.key.password=[hidden]");
        assert_eq!(shown("num.partitions", "3"), "num.partitions=3");
    }

    #[test]
    fn lists_do_not_overlap() {
        for k in WEIR_KEYS {
            assert!(!KAFKA_KEYS.contains(k), "{k} is in both lists");
        }
    }
}
