//! KIP-368 on the wire: with `connections.max.reauth.ms` set, the final SaslAuthenticate
//! answer carries the session lifetime; a client that does not log in again within it is
//! closed at its next request; one that does keeps its connection; a re-authentication
//! as someone else, with another mechanism, or with a deleted SCRAM user's credentials is
//! answered SASL_AUTHENTICATION_FAILED and the connection closed.

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Broker, Client};
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use wire::api;
use wire::sasl::{Login, Mechanism};
use wire::scram::{ITERATIONS_MIN, ScramMechanism};

/// The session lifetime the broker is started with.
const LIFETIME_MS: i64 = 1_500;
/// SASL_AUTHENTICATION_FAILED, ILLEGAL_SASL_STATE.
const AUTH_FAILED: i16 = 58;
const ILLEGAL_STATE: i16 = 34;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn start() -> Broker {
    Broker::start(
        1,
        &[
            ("listeners", "SASL_PLAINTEXT://127.0.0.1:0"),
            ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-256"),
            ("sasl.plain.users", "admin:admin-pw,bob:bob-pw"),
            ("connection.failed.authentication.delay.ms", "0"),
            // The per-listener-and-mechanism form wins over the broker-wide one.
            ("connections.max.reauth.ms", "3600000"),
            (
                "listener.name.sasl_plaintext.plain.connections.max.reauth.ms",
                "1500",
            ),
            (
                "listener.name.sasl_plaintext.scram-sha-256.connections.max.reauth.ms",
                "1500",
            ),
            ("metrics.listener", "127.0.0.1:0"),
        ],
    )
}

/// One SaslHandshake v1 + SaslAuthenticate exchange (version `v`) on `c`: the last
/// answer (an error answer ends the exchange early).
fn login(c: &mut Client, m: Mechanism, user: &str, pw: &str, v: i16) -> SaslAuthenticateResponse {
    let hs: SaslHandshakeResponse = c.call(
        api::SASL_HANDSHAKE,
        1,
        &SaslHandshakeRequest::default().with_mechanism(s(m.name())),
    );
    assert_eq!(hs.error_code, 0, "handshake");
    let (mut login, mut token) = Login::start(m, user, pw);
    // PLAIN takes one round, SCRAM two.
    for _ in 0..2 {
        let auth: SaslAuthenticateResponse = c.call(
            api::SASL_AUTHENTICATE,
            v,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
        );
        if auth.error_code != 0 {
            return auth;
        }
        match login.answer(&auth.auth_bytes).expect("the broker's answer") {
            Some(next) => token = next,
            None => return auth,
        }
    }
    panic!("the login did not end in two rounds");
}

fn connect(b: &Broker, m: Mechanism, user: &str, pw: &str) -> Client {
    let mut c = b.client();
    let auth = login(&mut c, m, user, pw, 1);
    assert_eq!(auth.error_code, 0, "authenticate: {:?}", auth.error_message);
    assert_eq!(auth.session_lifetime_ms, LIFETIME_MS, "session lifetime");
    c
}

/// A request any authenticated client may send; `None` if the connection was closed.
fn metadata(c: &mut Client) -> Option<MetadataResponse> {
    let sent = c.send(api::METADATA, 4, &MetadataRequest::default());
    let frame = c.read_frame()?;
    let (got, resp) = wire::messages::decode_response_as(api::METADATA, 4, &frame).expect("decode");
    assert_eq!(got, sent);
    Some(resp)
}

fn metrics_addr(broker: &Broker) -> String {
    assert!(broker.wait_log("metrics listening on", Duration::from_secs(30)));
    let line = broker
        .log_tail(200)
        .lines()
        .find(|l| l.contains("metrics listening on"))
        .expect("the line")
        .to_string();
    line.rsplit(' ').next().expect("address").trim().to_string()
}

fn counter(b: &Broker, series: &str) -> f64 {
    let text = common::scrape_metrics(&metrics_addr(b), "/metrics");
    common::metric_value(&text, series).unwrap_or(0.0)
}

/// Sleeps until `lifetime` past `from` (the broker's announced deadline) has passed.
fn past(from: Instant, lifetime: Duration) {
    let end = from + lifetime + Duration::from_millis(100);
    sleep(end.saturating_duration_since(Instant::now()));
}

/// Not re-authenticating: served until the lifetime ends, then closed at the first
/// request, unanswered, and counted. A client that logged in with SaslAuthenticate v0
/// (told no lifetime: v0 has no field) is closed all the same (KAFKA-9241).
#[test]
fn a_session_not_renewed_is_closed_at_its_first_request_after_the_lifetime() {
    let b = start();
    let mut late = b.client();
    let began = Instant::now();
    let auth = login(&mut late, Mechanism::Plain, "admin", "admin-pw", 1);
    assert_eq!(auth.error_code, 0);
    assert_eq!(auth.session_lifetime_ms, LIFETIME_MS);
    let mut v0 = b.client();
    let auth = login(&mut v0, Mechanism::Plain, "bob", "bob-pw", 0);
    assert_eq!((auth.error_code, auth.session_lifetime_ms), (0, 0));
    assert!(metadata(&mut late).is_some(), "served within the lifetime");
    assert!(metadata(&mut v0).is_some(), "served within the lifetime");
    past(began, Duration::from_millis(LIFETIME_MS as u64));
    assert!(metadata(&mut late).is_none(), "closed after the lifetime");
    assert!(metadata(&mut v0).is_none(), "v0 closed after the lifetime");
    let closed = counter(&b, "weir_sasl_expired_connections_closed_total");
    assert_eq!(closed, 2.0);
}

/// Re-authenticating before the end (several times, past the first lifetime) keeps the
/// connection; Metadata asked just before the handshake is answered first, in order. A
/// second handshake less than a second after the last re-authentication began is
/// answered ILLEGAL_SASL_STATE and the session goes on.
#[test]
fn a_renewed_session_keeps_its_connection() {
    let b = start();
    let mut renewed = Instant::now();
    let mut c = connect(&b, Mechanism::Plain, "admin", "admin-pw");
    for round in 0..3 {
        // Renewed at 80% of the lifetime (and over a second after the last start).
        let at = renewed + Duration::from_millis(1_200);
        sleep(at.saturating_duration_since(Instant::now()));
        // Pipelined: a Metadata, then the handshake, before reading either answer.
        let meta = c.send(api::METADATA, 4, &MetadataRequest::default());
        let auth = {
            let began = Instant::now();
            let hs = c.send(
                api::SASL_HANDSHAKE,
                1,
                &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")),
            );
            let (got, _): (i32, MetadataResponse) = c.recv(api::METADATA, 4);
            assert_eq!(got, meta, "round {round}: the earlier answer first");
            let (got, hs_resp): (i32, SaslHandshakeResponse) = c.recv(api::SASL_HANDSHAKE, 1);
            assert_eq!((got, hs_resp.error_code), (hs, 0), "round {round}");
            renewed = began;
            c.call::<_, SaslAuthenticateResponse>(
                api::SASL_AUTHENTICATE,
                2,
                &SaslAuthenticateRequest::default()
                    .with_auth_bytes(Bytes::from_static(b"\0admin\0admin-pw")),
            )
        };
        assert_eq!(
            auth.error_code, 0,
            "round {round}: {:?}",
            auth.error_message
        );
        assert_eq!(auth.session_lifetime_ms, LIFETIME_MS);
        assert!(metadata(&mut c).is_some(), "round {round}: served after");
    }
    // Too soon after the last start: refused, the session unchanged.
    let hs: SaslHandshakeResponse = c.call(
        api::SASL_HANDSHAKE,
        1,
        &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")),
    );
    assert_eq!(hs.error_code, ILLEGAL_STATE);
    assert!(metadata(&mut c).is_some(), "still served");
    let done = counter(&b, "weir_sasl_reauthentications_total");
    assert_eq!(done, 3.0);
}

/// A re-authentication as another user, or with another mechanism, is refused and the
/// connection closed after the answer; so is a request sent between the handshake and
/// the login.
#[test]
fn a_reauthentication_that_changes_who_or_how_is_refused_and_closes() {
    let b = start();
    // Another principal, valid credentials.
    let mut c = b.client();
    let auth = login(&mut c, Mechanism::Plain, "admin", "admin-pw", 2);
    assert_eq!(auth.error_code, 0);
    let again = login(&mut c, Mechanism::Plain, "bob", "bob-pw", 2);
    assert_eq!(again.error_code, AUTH_FAILED);
    let message = again
        .error_message
        .map(|m| m.to_string())
        .unwrap_or_default();
    assert!(
        message.contains("User:admin") && message.contains("User:bob"),
        "{message}"
    );
    assert!(c.read_frame().is_none(), "closed after the refusal");
    // Another mechanism (SCRAM-SHA-256 is enabled; the session was PLAIN's).
    let mut c = b.client();
    assert_eq!(
        login(&mut c, Mechanism::Plain, "admin", "admin-pw", 2).error_code,
        0
    );
    add_scram_user(&b, "admin", "admin-pw");
    let again = login(
        &mut c,
        Mechanism::Scram(ScramMechanism::Sha256),
        "admin",
        "admin-pw",
        2,
    );
    assert_eq!(again.error_code, AUTH_FAILED);
    assert!(c.read_frame().is_none(), "closed after the refusal");
    // A Metadata between the handshake and SaslAuthenticate: closed unanswered.
    let mut c = b.client();
    assert_eq!(
        login(&mut c, Mechanism::Plain, "admin", "admin-pw", 2).error_code,
        0
    );
    let hs: SaslHandshakeResponse = c.call(
        api::SASL_HANDSHAKE,
        1,
        &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")),
    );
    assert_eq!(hs.error_code, 0);
    assert!(metadata(&mut c).is_none(), "closed mid re-authentication");
}

/// A SCRAM user deleted (AlterUserScramCredentials) while connected: its connection is
/// served until it re-authenticates, which fails, and the connection is closed.
#[test]
fn a_deleted_scram_users_reauthentication_fails_and_closes() {
    let b = start();
    add_scram_user(&b, "carol", "carol-pw");
    let scram = Mechanism::Scram(ScramMechanism::Sha256);
    let mut c = connect(&b, scram, "carol", "carol-pw");
    assert!(metadata(&mut c).is_some());
    let mut admin = connect(&b, Mechanism::Plain, "admin", "admin-pw");
    let deletion = ScramCredentialDeletion::default()
        .with_name(s("carol"))
        .with_mechanism(ScramMechanism::Sha256.code());
    let resp: AlterUserScramCredentialsResponse = admin.call(
        api::ALTER_USER_SCRAM_CREDENTIALS,
        0,
        &AlterUserScramCredentialsRequest::default().with_deletions(vec![deletion]),
    );
    assert_eq!(resp.results[0].error_code, 0, "deleted");
    assert!(
        metadata(&mut c).is_some(),
        "served until it re-authenticates"
    );
    let again = login(&mut c, scram, "carol", "carol-pw", 2);
    assert_eq!(again.error_code, AUTH_FAILED);
    assert!(
        c.read_frame().is_none(),
        "closed after the failed re-authentication"
    );
    let failed = counter(
        &b,
        r#"weir_connections_refused_total{reason="authentication_failed"}"#,
    );
    assert_eq!(failed, 1.0);
}

/// Creates SCRAM-SHA-256 `user` with `pw` through an admin connection.
fn add_scram_user(b: &Broker, user: &str, pw: &str) {
    let mut admin = b.client();
    assert_eq!(
        login(&mut admin, Mechanism::Plain, "admin", "admin-pw", 2).error_code,
        0
    );
    let m = ScramMechanism::Sha256;
    let salt = format!("salt-of-{user}");
    let salted = m.salted_password(pw.as_bytes(), salt.as_bytes(), ITERATIONS_MIN);
    let upsert = ScramCredentialUpsertion::default()
        .with_name(s(user))
        .with_mechanism(m.code())
        .with_iterations(ITERATIONS_MIN as i32)
        .with_salt(Bytes::from(salt))
        .with_salted_password(Bytes::from(salted));
    let resp: AlterUserScramCredentialsResponse = admin.call(
        api::ALTER_USER_SCRAM_CREDENTIALS,
        0,
        &AlterUserScramCredentialsRequest::default().with_upsertions(vec![upsert]),
    );
    assert_eq!(
        resp.results[0].error_code, 0,
        "{:?}",
        resp.results[0].error_message
    );
}

/// DescribeConfigs of the broker shows the broker-wide lifetime as a read-only key (as
/// in Kafka, it is read at startup), and IncrementalAlterConfigs refuses to change it.
#[test]
fn the_lifetime_is_described_and_read_only() {
    let b = start();
    let mut c = connect(&b, Mechanism::Plain, "admin", "admin-pw");
    let res = DescribeConfigsResource::default()
        .with_resource_type(4)
        .with_resource_name(s(""))
        .with_configuration_keys(Some(vec![s("connections.max.reauth.ms")]));
    let resp: DescribeConfigsResponse = c.call(
        api::DESCRIBE_CONFIGS,
        4,
        &DescribeConfigsRequest::default().with_resources(vec![res]),
    );
    assert_eq!(resp.results[0].error_code, 0);
    let entry = &resp.results[0].configs[0];
    assert_eq!(entry.name.as_str(), "connections.max.reauth.ms");
    assert_eq!(entry.value.as_deref(), Some("3600000"));
    assert!(entry.read_only);
    let set = AlterConfigsResource::default()
        .with_resource_type(4)
        .with_resource_name(s(""))
        .with_configs(vec![
            AlterableConfig::default()
                .with_name(s("connections.max.reauth.ms"))
                .with_config_operation(0)
                .with_value(Some(s("60000"))),
        ]);
    let resp: IncrementalAlterConfigsResponse = c.call(
        api::INCREMENTAL_ALTER_CONFIGS,
        1,
        &IncrementalAlterConfigsRequest::default().with_resources(vec![set]),
    );
    assert_ne!(resp.responses[0].error_code, 0, "read-only");
}

/// A Fetch long poll of `topic`'s empty partition 0, waiting up to `wait_ms`.
fn long_poll(topic: &str, wait_ms: i32) -> FetchRequest {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    let p = FetchPartition::default()
        .with_partition(0)
        .with_fetch_offset(0)
        .with_partition_max_bytes(1 << 20);
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(s(topic)))
                .with_partitions(vec![p]),
        ])
}

/// Fetches pipelined behind a long poll are read within the lifetime but would start
/// after it: they are not served, and the connection closes once the first is answered
/// (before, each was served in turn, up to 16 × 300 s past the session's end).
#[test]
fn a_fetch_queued_past_the_lifetime_is_not_served() {
    let b = start();
    let mut c = connect(&b, Mechanism::Plain, "admin", "admin-pw");
    let created = common::requests::create_topics(&mut c, &[("polled", 1)]);
    assert_eq!(created, vec![0], "CreateTopics");
    let wait_ms = i32::try_from(LIFETIME_MS).expect("ms") + 1_000;
    let first = c.send(api::FETCH, 11, &long_poll("polled", wait_ms));
    c.send(api::FETCH, 11, &long_poll("polled", wait_ms));
    let frame = c.read_frame().expect("the first long poll is answered");
    let (got, _): (i32, FetchResponse) =
        wire::messages::decode_response_as(api::FETCH, 11, &frame).expect("decode");
    assert_eq!(got, first);
    assert!(
        c.read_frame().is_none(),
        "the queued fetch is not served: closed"
    );
}

/// A re-authentication begun and never finished does not keep an ended session's
/// connection: a second handshake after the lifetime (which cannot begin another) is
/// answered ILLEGAL_SASL_STATE and the connection closed. Before, it was kept open, and
/// a handshake a second held it (and its idle timer) for ever.
#[test]
fn a_handshake_after_the_lifetime_that_begins_nothing_closes() {
    let b = start();
    let began = Instant::now();
    let mut c = connect(&b, Mechanism::Plain, "admin", "admin-pw");
    let handshake = |c: &mut Client| -> Option<i16> {
        c.send(
            api::SASL_HANDSHAKE,
            1,
            &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")),
        );
        let frame = c.read_frame()?;
        let (_, r): (i32, SaslHandshakeResponse) =
            wire::messages::decode_response_as(api::SASL_HANDSHAKE, 1, &frame).expect("decode");
        Some(r.error_code)
    };
    assert_eq!(handshake(&mut c), Some(0), "a re-authentication begins");
    past(began, Duration::from_millis(LIFETIME_MS as u64));
    assert_eq!(handshake(&mut c), Some(ILLEGAL_STATE), "answered");
    // ApiVersions, which a re-authentication in progress may send, is not answered.
    c.send(api::API_VERSIONS, 3, &ApiVersionsRequest::default());
    assert!(c.read_frame().is_none(), "then closed");
}
