//! `weir groups list` and `weir groups describe GROUP`: operator commands that ask a
//! running node over the Kafka protocol (through `wire`), so lag is visible without extra
//! tools. A small blocking client: one TCP connection, one request at a time.
//!
//! `describe` shows, per partition the group has committed or been assigned: the committed
//! offset, the log end offset (ListOffsets latest, i.e. the high watermark) and the lag
//! between them, with the member that owns the partition.
//!
//! Every subcommand takes `weir-loadgen`'s security flags (`--security-protocol`,
//! `--ssl-*`, `--sasl-*`, and `--sasl-plain USER:PASSWORD` for PLAIN): every connection a
//! command opens is secured the same way ([`security`]).
//!
//! In a cluster each request goes where Kafka's tools send it: the group's requests to
//! its coordinator (FindCoordinator), ListOffsets to each partition's leader, ListGroups
//! to every node. The bootstrap node may be any of them.

pub mod acls;
pub mod cluster;
pub mod security;
pub mod topics;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    ApiKey, ConsumerProtocolAssignment, DescribeGroupsRequest, DescribeGroupsResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, GroupId, ListGroupsRequest,
    ListGroupsResponse, ListOffsetsRequest, ListOffsetsResponse, OffsetFetchRequest,
    OffsetFetchResponse, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use wire::frame::RequestHeader;

/// Largest response frame accepted (a describe of a huge group stays far below).
const RESPONSE_MAX_BYTES: usize = 64 << 20;
/// How long to wait for the node to answer one request.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A blocking Kafka-protocol connection.
pub struct Client {
    stream: Box<dyn security::Duplex>,
    /// The `host:port` dialled, for error messages.
    addr: String,
    correlation_id: i32,
    /// Whether the node has answered anything on this connection yet.
    answered: bool,
}

impl Client {
    /// Connects to `addr` and secures the connection as `--security-protocol` says: TLS,
    /// then the SASL login.
    pub fn connect(addr: &str) -> anyhow::Result<Client> {
        let stream = security::connect(addr, IO_TIMEOUT)?;
        let mut c = Client {
            stream,
            addr: addr.to_string(),
            correlation_id: 0,
            answered: false,
        };
        if let Some(sasl) = &security::current().sasl {
            c.login(sasl)
                .with_context(|| format!("logging in to {addr}"))?;
        }
        Ok(c)
    }

    /// SaslHandshake v1 and SaslAuthenticate v2: PLAIN's one token, or SCRAM's two rounds.
    fn login(&mut self, sasl: &crate::security::peer::PeerSasl) -> anyhow::Result<()> {
        let mechanism = sasl.mechanism.name();
        let hs: SaslHandshakeResponse = self.call(
            ApiKey::SaslHandshake,
            1,
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism)),
        )?;
        if hs.error_code != 0 {
            let offered: Vec<&str> = hs.mechanisms.iter().map(|m| m.as_str()).collect();
            bail!(
                "SASL handshake for {mechanism} refused: {} (the broker offers {offered:?})",
                kafka_error(hs.error_code)
            );
        }
        let user = &sasl.user;
        let (mut login, mut token) = wire::sasl::Login::start(sasl.mechanism, user, &sasl.password);
        loop {
            let auth: SaslAuthenticateResponse = self.call(
                ApiKey::SaslAuthenticate,
                2,
                &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
            )?;
            if auth.error_code != 0 {
                let why = auth.error_message.as_ref().map_or("", |m| m.as_str());
                bail!(
                    "SASL authentication ({mechanism}) as {user:?} failed: {} {why}",
                    kafka_error(auth.error_code)
                );
            }
            match login.answer(&auth.auth_bytes)? {
                Some(next) => token = next,
                None => return Ok(()),
            }
        }
    }

    /// Sends one request and reads its response.
    pub fn call<Q: Encodable, P: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Q,
    ) -> anyhow::Result<P> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let header = RequestHeader {
            api_key: key as i16,
            api_version: version,
            correlation_id: self.correlation_id,
            client_id: Some(Bytes::from_static(b"weir-groups")),
        };
        let frame = wire::messages::encode_request(&header, req)?;
        self.stream
            .write_all(&frame)
            .and_then(|()| self.stream.flush())
            .map_err(|e| self.failed(e))?;
        let mut size = [0u8; 4];
        if let Err(e) = self.stream.read_exact(&mut size) {
            // A listener that wants SASL or TLS closes a connection whose first request
            // is not the handshake it expects.
            let closed = matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            );
            if !self.answered && closed {
                bail!(
                    "the node closed the connection before answering; the listener may need \
                     authentication (SASL or TLS)"
                );
            }
            return Err(self.failed(e));
        }
        let size = i32::from_be_bytes(size);
        if size < 0 || size as usize > RESPONSE_MAX_BYTES {
            bail!("response size {size} out of range");
        }
        let mut body = vec![0u8; size as usize];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| self.failed(e))?;
        self.answered = true;
        let (correlation_id, resp) =
            wire::messages::decode_response_as::<P>(key as i16, version, &Bytes::from(body))?;
        if correlation_id != self.correlation_id {
            bail!(
                "response for request {correlation_id}, expected {}",
                self.correlation_id
            );
        }
        Ok(resp)
    }
}

impl Client {
    /// An I/O failure on this connection, said in the operator's terms when TLS caused it
    /// (a client certificate refused after the handshake shows at the first read).
    fn failed(&self, e: std::io::Error) -> anyhow::Error {
        let e = anyhow::Error::from(e);
        let host = self
            .addr
            .rsplit_once(':')
            .map_or(self.addr.as_str(), |(h, _)| h);
        security::explain(&e, host)
            .unwrap_or(e)
            .context(format!("talking to {}", self.addr))
    }
}

fn kafka_error(code: i16) -> String {
    kafka_protocol::ResponseError::try_from_code(code)
        .map_or_else(|| format!("error {code}"), |e| format!("{e:?}"))
}

/// The nodes of the cluster `bootstrap` belongs to: id → `host:port`.
fn nodes(c: &mut Client) -> anyhow::Result<BTreeMap<i32, String>> {
    let m = topics::metadata(c, Some(&[]))?;
    Ok(m.brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect())
}

/// A connection to a node at its advertised `addr`; on a single node, the bootstrap
/// address itself if the advertised one cannot be reached (a node bound to 0.0.0.0
/// advertises 127.0.0.1, which a remote operator cannot reach).
fn connect_node(addr: &str, bootstrap: &str, single: bool) -> anyhow::Result<Client> {
    match Client::connect(addr) {
        Err(_) if single => Client::connect(bootstrap),
        other => other,
    }
}

/// A connection to `group`'s coordinator, found through `bootstrap`.
fn coordinator(bootstrap: &str, group: &str) -> anyhow::Result<Client> {
    let mut c = Client::connect(bootstrap)?;
    let single = nodes(&mut c)?.len() == 1;
    let req = FindCoordinatorRequest::default().with_key(group.to_string().into());
    let resp: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, 2, &req)?;
    if resp.error_code != 0 {
        bail!("FindCoordinator: {}", kafka_error(resp.error_code));
    }
    let addr = format!("{}:{}", resp.host.as_str(), resp.port);
    connect_node(&addr, bootstrap, single)
}

/// `weir groups list`: one line per group: id, state, protocol type (from every node:
/// each lists the groups it coordinates).
pub fn list(bootstrap: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let mut c = Client::connect(bootstrap)?;
    let mut groups = Vec::new();
    let nodes = nodes(&mut c)?;
    for addr in nodes.values() {
        let mut node = connect_node(addr, bootstrap, nodes.len() == 1)?;
        let resp: ListGroupsResponse =
            node.call(ApiKey::ListGroups, 4, &ListGroupsRequest::default())?;
        if resp.error_code != 0 {
            bail!("ListGroups at {addr}: {}", kafka_error(resp.error_code));
        }
        groups.extend(resp.groups);
    }
    groups.sort_by(|a, b| a.group_id.0.cmp(&b.group_id.0));
    groups.dedup_by(|a, b| a.group_id == b.group_id);
    writeln!(out, "{:<40} {:<20} PROTOCOL-TYPE", "GROUP", "STATE")?;
    for g in groups {
        let id = g.group_id.as_str();
        writeln!(
            out,
            "{:<40} {:<20} {}",
            id,
            g.group_state.as_str(),
            g.protocol_type.as_str()
        )?;
    }
    Ok(())
}

/// One row of `describe`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Row {
    pub topic: String,
    pub partition: i32,
    /// -1 if nothing is committed.
    pub committed: i64,
    pub log_end: i64,
    pub member: String,
    pub host: String,
    pub client_id: String,
}

impl Row {
    /// Log end minus committed; `None` if nothing is committed. Negative when the commit
    /// is past the log end (a truncated log), shown as it is, as Kafka's tool does.
    pub fn lag(&self) -> Option<i64> {
        (self.committed >= 0 && self.log_end >= 0).then(|| self.log_end - self.committed)
    }
}

/// Who owns each partition, from the members' assignments (consumer protocol).
fn owners(
    group: &kafka_protocol::messages::describe_groups_response::DescribedGroup,
) -> BTreeMap<(String, i32), (String, String, String)> {
    let mut map = BTreeMap::new();
    if group.protocol_type.as_str() != "consumer" {
        return map;
    }
    for m in &group.members {
        let mut bytes = m.member_assignment.clone();
        if bytes.len() < 2 {
            continue;
        }
        let version = i16::from_be_bytes([bytes[0], bytes[1]]);
        let mut body = bytes.split_off(2);
        let Ok(asg) = ConsumerProtocolAssignment::decode(&mut body, version.clamp(0, 3)) else {
            continue;
        };
        for tp in &asg.assigned_partitions {
            for p in &tp.partitions {
                let who = (
                    m.member_id.to_string(),
                    m.client_host.to_string(),
                    m.client_id.to_string(),
                );
                map.insert((tp.topic.to_string(), *p), who);
            }
        }
    }
    map
}

/// Fetches everything `describe` prints: (state, protocol, member count, rows).
pub fn describe_rows(bootstrap: &str, group: &str) -> anyhow::Result<GroupView> {
    let mut c = coordinator(bootstrap, group)?;
    let mut req = DescribeGroupsRequest::default();
    req.groups = vec![GroupId(group.to_string().into())];
    let resp: DescribeGroupsResponse = c.call(ApiKey::DescribeGroups, 5, &req)?;
    let Some(g) = resp.groups.first() else {
        bail!("DescribeGroups returned no group");
    };
    if g.error_code != 0 {
        bail!("DescribeGroups: {}", kafka_error(g.error_code));
    }
    let owners = owners(g);
    let mut req = OffsetFetchRequest::default();
    req.group_id = GroupId(group.to_string().into());
    req.topics = None;
    let fetched: OffsetFetchResponse = c.call(ApiKey::OffsetFetch, 7, &req)?;
    if fetched.error_code != 0 {
        bail!("OffsetFetch: {}", kafka_error(fetched.error_code));
    }
    let mut rows: BTreeMap<(String, i32), Row> = BTreeMap::new();
    for t in &fetched.topics {
        for p in &t.partitions {
            let row = rows
                .entry((t.name.to_string(), p.partition_index))
                .or_default();
            row.committed = p.committed_offset;
        }
    }
    for ((topic, partition), (member, host, client)) in &owners {
        let row = rows.entry((topic.clone(), *partition)).or_insert(Row {
            committed: -1,
            ..Row::default()
        });
        (row.member, row.host, row.client_id) = (member.clone(), host.clone(), client.clone());
    }
    if group_missing(g.group_state.as_str(), g.members.len(), rows.len()) {
        bail!("group {group} does not exist");
    }
    let ends = log_ends(bootstrap, rows.keys())?;
    for ((topic, partition), row) in rows.iter_mut() {
        row.topic = topic.clone();
        row.partition = *partition;
        row.log_end = ends
            .get(&(topic.clone(), *partition))
            .copied()
            .unwrap_or(-1);
    }
    let members = g
        .members
        .iter()
        .map(|m| {
            let mine = owners.iter().filter(|(_, o)| o.0 == m.member_id.as_str());
            MemberView {
                member_id: m.member_id.to_string(),
                instance_id: m.group_instance_id.as_ref().map(|i| i.to_string()),
                client_id: m.client_id.to_string(),
                host: m.client_host.to_string(),
                assignment: mine.map(|((t, p), _)| (t.clone(), *p)).collect(),
            }
        })
        .collect();
    Ok(GroupView {
        state: g.group_state.to_string(),
        protocol: g.protocol_data.to_string(),
        members,
        rows: rows.into_values().collect(),
    })
}

/// Whether a described group is one that does not exist: Kafka answers DescribeGroups for
/// an unknown id with state Dead, no members (and it has no committed offsets).
fn group_missing(state: &str, members: usize, committed_or_owned: usize) -> bool {
    state == "Dead" && members == 0 && committed_or_owned == 0
}

/// One member as `describe` shows it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub host: String,
    /// (topic, partition) pairs assigned to it (consumer protocol).
    pub assignment: Vec<(String, i32)>,
}

/// Everything `describe` prints.
#[derive(Debug, Default, Clone)]
pub struct GroupView {
    pub state: String,
    pub protocol: String,
    pub members: Vec<MemberView>,
    pub rows: Vec<Row>,
}

/// `topic:0,1 other:3` from (topic, partition) pairs in order.
fn assignment_text(pairs: &[(String, i32)]) -> String {
    let mut by_topic: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (t, p) in pairs {
        by_topic.entry(t).or_default().push(p.to_string());
    }
    let parts: Vec<String> = by_topic
        .iter()
        .map(|(t, ps)| format!("{t}:{}", ps.join(",")))
        .collect();
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(" ")
    }
}

/// ListOffsets latest for every partition in `keys`, asked of each partition's leader.
fn log_ends<'a>(
    bootstrap: &str,
    keys: impl Iterator<Item = &'a (String, i32)>,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let keys: Vec<&(String, i32)> = keys.collect();
    let mut c = Client::connect(bootstrap)?;
    let mut names: Vec<String> = keys.iter().map(|(t, _)| t.clone()).collect();
    names.dedup();
    let m = topics::metadata(&mut c, Some(&names))?;
    let addrs: BTreeMap<i32, String> = m
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect();
    let leader = |topic: &str, p: i32| {
        m.topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == topic))
            .and_then(|t| t.partitions.iter().find(|x| x.partition_index == p))
            .map(|x| x.leader_id.0)
    };
    let mut by_leader: BTreeMap<i32, Vec<&(String, i32)>> = BTreeMap::new();
    for k in keys {
        // A partition without a leader (or topic) gets no log end: "-".
        if let Some(l) = leader(&k.0, k.1).filter(|l| addrs.contains_key(l)) {
            by_leader.entry(l).or_default().push(k);
        }
    }
    let mut out = BTreeMap::new();
    for (l, keys) in by_leader {
        let mut node = connect_node(&addrs[&l], bootstrap, addrs.len() == 1)?;
        out.extend(log_ends_at(&mut node, keys.into_iter())?);
    }
    Ok(out)
}

/// ListOffsets latest for every partition in `keys`, at one node.
fn log_ends_at<'a>(
    c: &mut Client,
    keys: impl Iterator<Item = &'a (String, i32)>,
) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in keys {
        by_topic.entry(t).or_default().push(*p);
    }
    let mut req = ListOffsetsRequest::default();
    req.replica_id = kafka_protocol::messages::BrokerId(-1);
    for (t, ps) in by_topic {
        let mut topic = ListOffsetsTopic::default();
        topic.name = kafka_protocol::messages::TopicName(t.to_string().into());
        for p in ps {
            let mut lp = ListOffsetsPartition::default();
            lp.partition_index = p;
            lp.timestamp = -1;
            topic.partitions.push(lp);
        }
        req.topics.push(topic);
    }
    let mut out = BTreeMap::new();
    if req.topics.is_empty() {
        return Ok(out);
    }
    let resp: ListOffsetsResponse = c.call(ApiKey::ListOffsets, 1, &req)?;
    for t in &resp.topics {
        for p in &t.partitions {
            let end = if p.error_code == 0 { p.offset } else { -1 };
            out.insert((t.name.to_string(), p.partition_index), end);
        }
    }
    Ok(out)
}

/// `weir groups describe GROUP`: a header line, then one line per partition.
pub fn describe(bootstrap: &str, group: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let view = describe_rows(bootstrap, group)?;
    let (state, protocol, members) = (&view.state, &view.protocol, view.members.len());
    writeln!(
        out,
        "GROUP {group} STATE {state} PROTOCOL {protocol} MEMBERS {members}"
    )?;
    writeln!(
        out,
        "{:<30} {:>9} {:>14} {:>14} {:>8}  {:<45} {:<16} CLIENT-ID",
        "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER-ID", "HOST"
    )?;
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    for r in view.rows {
        let committed = if r.committed >= 0 {
            r.committed.to_string()
        } else {
            "-".into()
        };
        let log_end = if r.log_end >= 0 {
            r.log_end.to_string()
        } else {
            "-".into()
        };
        let lag = r.lag().map_or_else(|| "-".to_string(), |l| l.to_string());
        writeln!(
            out,
            "{:<30} {:>9} {:>14} {:>14} {:>8}  {:<45} {:<16} {}",
            r.topic,
            r.partition,
            committed,
            log_end,
            lag,
            dash(&r.member),
            dash(&r.host),
            dash(&r.client_id)
        )?;
    }
    // Members, also those without partitions (after a blank line, so row parsers stop).
    writeln!(out)?;
    writeln!(
        out,
        "{:<45} {:<20} {:<16} {:<16} ASSIGNMENT",
        "MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HOST"
    )?;
    for m in &view.members {
        let instance = m.instance_id.as_deref().unwrap_or("-");
        writeln!(
            out,
            "{:<45} {:<20} {:<16} {:<16} {}",
            m.member_id,
            instance,
            dash(&m.client_id),
            dash(&m.host),
            assignment_text(&m.assignment)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_shown_negative_when_the_commit_is_past_the_log_end() {
        let row = |committed, log_end| Row {
            committed,
            log_end,
            ..Row::default()
        };
        assert_eq!(row(5, 10).lag(), Some(5));
        assert_eq!(row(10, 4).lag(), Some(-6));
        assert_eq!(row(-1, 4).lag(), None);
        assert_eq!(row(3, -1).lag(), None);
    }

    #[test]
    fn a_dead_group_without_members_or_offsets_does_not_exist() {
        assert!(group_missing("Dead", 0, 0));
        assert!(!group_missing("Dead", 0, 2));
        assert!(!group_missing("Empty", 0, 0));
        assert!(!group_missing("Stable", 1, 0));
    }

    #[test]
    fn a_connection_closed_before_any_answer_suggests_authentication() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        // The "node" reads the request, then closes without a word.
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut size = [0u8; 4];
            s.read_exact(&mut size).unwrap();
            let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
            s.read_exact(&mut body).unwrap();
        });
        let mut c = Client::connect(&addr).unwrap();
        let e = c
            .call::<_, ListGroupsResponse>(ApiKey::ListGroups, 4, &ListGroupsRequest::default())
            .unwrap_err();
        server.join().unwrap();
        assert!(e.to_string().contains("may need authentication"), "{e}");
    }
}
