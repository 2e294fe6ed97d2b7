//! SaslHandshake (v0–v1) and SaslAuthenticate (v0–v2), which drive the connection's SASL
//! state ([`crate::security::sasl`]), and the SCRAM credential APIs
//! DescribeUserScramCredentials / AlterUserScramCredentials (KIP-554). Alterations are
//! controller commands: in a cluster they go through the metadata quorum, so every node
//! authenticates against the same salted credentials.
//!
//! A failed authentication is logged (rate limited), answered with
//! SASL_AUTHENTICATION_FAILED after `connection.failed.authentication.delay.ms`, and the
//! connection is closed after that answer.

use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use wire::WireError;

use super::{Response, str_bytes};
use crate::controller::apply::{Command, Outcome};
use crate::errors;
use crate::metadata::scram::{ScramChange, ScramOutcome};
use crate::proto::{self, Request};
use crate::security::sasl::{self, Mechanism, SaslState, Step};
use crate::security::scram::{self, ScramCredential, ScramMechanism};
use crate::server::session::Session;
use crate::shard::Shard;

/// Most credential changes one AlterUserScramCredentials request may carry.
const SCRAM_CHANGES_PER_REQUEST_MAX: usize = 1_000;
/// Longest SCRAM salt (bytes) accepted.
const SCRAM_SALT_MAX_BYTES: usize = 1_024;
/// Longest salted password accepted (SHA-512's output is 64 bytes).
const SCRAM_SALTED_PASSWORD_MAX_BYTES: usize = 128;
/// Longest SCRAM user name accepted (bytes).
const SCRAM_USER_NAME_MAX_BYTES: usize = 256;

/// SaslHandshake: picks the mechanism for the following SaslAuthenticate. On an
/// authenticated connection whose session has a lifetime it begins a re-authentication
/// (KIP-368); otherwise an unexpected handshake is answered ILLEGAL_SASL_STATE without
/// closing, as Kafka does.
pub fn handshake(session: &Session, req: SaslHandshakeRequest) -> SaslHandshakeResponse {
    let Some(setup) = &session.listener.sasl else {
        return handshake_error(errors::ILLEGAL_SASL_STATE, &[]);
    };
    let offered: Vec<&str> = setup.mechanisms.iter().map(|m| m.name()).collect();
    let now = Instant::now();
    if session.begin_reauthentication(now) {
        tracing::debug!(peer = %session.peer, principal = %session.principal(), "SASL re-authentication begins");
    } else if session.has_expired(now) {
        // A handshake that begins nothing (a re-authentication already under way, or one
        // begun less than a second ago) on a session that has ended closes the
        // connection, as any other request then does (Kafka's rule): answered and kept
        // open, one every second kept the socket, and its idle timer, alive for ever.
        crate::client_warn!(peer = %session.peer, principal = %session.principal(), "closing connection: SaslHandshake after the SASL session expired that cannot begin a re-authentication");
        *session.sasl.borrow_mut() = SaslState::Failed;
        return handshake_error(errors::ILLEGAL_SASL_STATE, &offered);
    }
    let mut state = session.sasl.borrow_mut();
    if !matches!(*state, SaslState::Handshake) {
        return handshake_error(errors::ILLEGAL_SASL_STATE, &offered);
    }
    let wanted = Mechanism::parse(req.mechanism.as_str()).filter(|m| setup.mechanisms.contains(m));
    match wanted {
        Some(m) => {
            // A re-authentication that changes the mechanism fails at its first token,
            // as in Kafka (the handshake itself is answered).
            session.chose(m);
            *state = SaslState::Token(m);
            handshake_error(errors::NONE, &offered)
        }
        None => {
            crate::client_warn!(peer = %session.peer, "SASL: mechanism {:?} not enabled; closing", req.mechanism.as_str());
            *state = SaslState::Failed;
            handshake_error(errors::UNSUPPORTED_SASL_MECHANISM, &offered)
        }
    }
}

fn handshake_error(code: i16, mechanisms: &[&str]) -> SaslHandshakeResponse {
    SaslHandshakeResponse::default()
        .with_error_code(code)
        .with_mechanisms(mechanisms.iter().map(|m| str_bytes(m)).collect())
}

/// SaslAuthenticate: one token of the chosen mechanism. The final answer carries the
/// session's lifetime (v1+, KIP-368); a re-authentication must log in as the same
/// principal with the same mechanism.
pub async fn authenticate(
    shard: &Rc<Shard>,
    session: &Session,
    req: SaslAuthenticateRequest,
) -> SaslAuthenticateResponse {
    let Some(setup) = &session.listener.sasl else {
        return auth_error(errors::ILLEGAL_SASL_STATE, "this listener has no SASL");
    };
    if session.is_open() {
        return auth_error(errors::ILLEGAL_SASL_STATE, "already authenticated");
    }
    // A re-authentication's refusals (another mechanism, then another principal) are
    // told to the client, as Kafka does; a bad credential's reason is only logged.
    let mut refusal = session.reauth_refusal(None);
    let mut step = match &refusal {
        Some(why) => Step::Failure(why.clone()),
        None => {
            let catalog = shard.node.meta.snapshot();
            let mut state = session.sasl.borrow_mut();
            sasl::step(&mut state, setup, &catalog, &req.auth_bytes)
        }
    };
    if let Step::Success { user, .. } = &step {
        refusal = session.reauth_refusal(Some(&principal_of(user)));
        if let Some(why) = &refusal {
            step = Step::Failure(why.clone());
        }
    }
    match step {
        Step::Challenge(token) => {
            SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(token))
        }
        Step::Success { token, user } => {
            let principal = principal_of(&user);
            let lifetime_ms = session
                .mechanism()
                .and_then(|m| setup.session_lifetime_ms(m));
            let lifetime = lifetime_ms.map(Duration::from_millis);
            let again = session.authenticated_as(principal.clone(), lifetime, Instant::now());
            match again {
                true => {
                    crate::metrics::local(|m| m.reauthenticated());
                    tracing::debug!(peer = %session.peer, %principal, ?lifetime_ms, "SASL re-authentication succeeded");
                }
                false => {
                    tracing::debug!(peer = %session.peer, %principal, ?lifetime_ms, "SASL authentication succeeded");
                }
            }
            // Encoded from v1 on (v0 has no field; the session expires all the same,
            // KAFKA-9241).
            let lifetime_ms = lifetime_ms.map_or(0, |ms| i64::try_from(ms).unwrap_or(i64::MAX));
            SaslAuthenticateResponse::default()
                .with_auth_bytes(Bytes::from(token))
                .with_session_lifetime_ms(lifetime_ms)
        }
        Step::Failure(why) => {
            // Whatever failed (a bad token, or a re-authentication's refusal after a good
            // one), the connection closes after this answer.
            *session.sasl.borrow_mut() = SaslState::Failed;
            let what = match session.is_reauthenticating() {
                true => "re-authentication",
                false => "authentication",
            };
            crate::metrics::local(|m| m.refused(crate::metrics::Refusal::AuthenticationFailed));
            crate::client_warn!(peer = %session.peer, listener = %session.listener.config.name, "SASL {what} failed: {why}");
            // Slow down guessing: the answer (and the close) come only after the delay.
            glommio::timer::sleep(Duration::from_millis(setup.failed_auth_delay_ms)).await;
            let message = match (what, refusal) {
                (_, Some(why)) => format!("Re-authentication failed: {why}"),
                ("re-authentication", None) => {
                    "Re-authentication failed: invalid credentials".into()
                }
                _ => "Authentication failed: invalid credentials".into(),
            };
            auth_error(errors::SASL_AUTHENTICATION_FAILED, &message)
        }
    }
}

/// The principal a SASL user acts as.
fn principal_of(user: &str) -> String {
    format!("User:{user}")
}

fn auth_error(code: i16, message: &str) -> SaslAuthenticateResponse {
    SaslAuthenticateResponse::default()
        .with_error_code(code)
        .with_error_message(Some(str_bytes(message)))
}

/// Decodes, runs and encodes the two SASL APIs (they need the session, not just the shard).
pub async fn handle(
    shard: &Rc<Shard>,
    req: &Request,
    session: &Session,
) -> Result<Response, WireError> {
    let frame = if req.api_key == wire::api::SASL_HANDSHAKE {
        let typed: SaslHandshakeRequest = proto::decode(req)?;
        proto::encode_response(req, &handshake(session, typed))?
    } else {
        let typed: SaslAuthenticateRequest = proto::decode(req)?;
        let resp = authenticate(shard, session, typed).await;
        proto::encode_response(req, &resp)?
    };
    Ok(Some(vec![frame]))
}

/// DescribeUserScramCredentials: mechanisms and iterations per user (never the keys).
pub async fn describe_scram(
    shard: &Rc<Shard>,
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let catalog = shard.node.meta.snapshot();
    let names: Vec<String> = match &req.users {
        Some(users) if !users.is_empty() => users.iter().map(|u| u.name.to_string()).collect(),
        _ => catalog.scram_users.keys().cloned().collect(),
    };
    let mut seen = BTreeSet::new();
    let results = names
        .into_iter()
        .map(|user| {
            let result = DescribeUserScramCredentialsResult::default().with_user(str_bytes(&user));
            if !seen.insert(user.clone()) {
                return result
                    .with_error_code(errors::DUPLICATE_RESOURCE)
                    .with_error_message(Some(str_bytes("user named twice")));
            }
            match catalog.scram_users.get(&user) {
                None => result
                    .with_error_code(errors::RESOURCE_NOT_FOUND)
                    .with_error_message(Some(str_bytes("no SCRAM credential for this user"))),
                Some(mechs) => result.with_credential_infos(
                    mechs
                        .values()
                        .map(|c| {
                            CredentialInfo::default()
                                .with_mechanism(c.mechanism.code())
                                .with_iterations(i32::try_from(c.iterations).unwrap_or(i32::MAX))
                        })
                        .collect(),
                ),
            }
        })
        .collect();
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

/// AlterUserScramCredentials: upserts (from the client's SaltedPassword) and deletions,
/// checked as Kafka does, written in one catalogue update.
pub async fn alter_scram(
    shard: &Rc<Shard>,
    req: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let named = req.deletions.len().saturating_add(req.upsertions.len());
    if named > SCRAM_CHANGES_PER_REQUEST_MAX {
        // Refused before any per-entry work: the request may name many thousands.
        return refuse_all(&req);
    }
    let mut results = Vec::new();
    let mut changes = Vec::new();
    let mut users = Vec::new();
    // How often each user is named, counted once: a per-entry scan would be quadratic.
    let mut times: HashMap<&str, usize> = HashMap::with_capacity(named);
    let all_names = req.deletions.iter().map(|d| d.name.as_str());
    for name in all_names.chain(req.upsertions.iter().map(|u| u.name.as_str())) {
        *times.entry(name).or_default() += 1;
    }
    let dup = |name: &str| times.get(name).is_some_and(|n| *n > 1);
    for d in &req.deletions {
        let user = d.name.to_string();
        let checked = check_user(&user, dup(&user)).and_then(|()| {
            ScramMechanism::from_code(d.mechanism).ok_or((
                errors::UNSUPPORTED_SASL_MECHANISM,
                "unknown SCRAM mechanism",
            ))
        });
        match checked {
            Ok(mechanism) => {
                changes.push(ScramChange::Delete {
                    user: user.clone(),
                    mechanism,
                });
                users.push(user);
            }
            Err((code, msg)) => results.push(alter_result(&user, code, msg)),
        }
    }
    for u in &req.upsertions {
        let user = u.name.to_string();
        let checked = check_user(&user, dup(&user)).and_then(|()| upsert_credential(u));
        match checked {
            Ok(credential) => {
                changes.push(ScramChange::Upsert {
                    user: user.clone(),
                    credential,
                });
                users.push(user);
            }
            Err((code, msg)) => results.push(alter_result(&user, code, msg)),
        }
    }
    let outcome = match changes.is_empty() {
        true => Ok(Vec::new()),
        false => {
            let cmd = Command::AlterScramCredentials { changes };
            match shard.node.controller.submit(&shard.node, cmd).await {
                Outcome::ScramAltered(r) => r,
                other => {
                    tracing::error!("AlterUserScramCredentials: unexpected outcome {other:?}");
                    Err((
                        errors::UNKNOWN_SERVER_ERROR,
                        "unexpected controller outcome".into(),
                    ))
                }
            }
        }
    };
    match outcome {
        Ok(outcomes) => {
            for (user, outcome) in users.iter().zip(outcomes) {
                let result = match outcome {
                    ScramOutcome::Done => alter_result(user, errors::NONE, ""),
                    ScramOutcome::NotFound => alter_result(
                        user,
                        errors::RESOURCE_NOT_FOUND,
                        "no such credential to delete",
                    ),
                    ScramOutcome::TooManyUsers => alter_result(
                        user,
                        errors::UNACCEPTABLE_CREDENTIAL,
                        "too many SCRAM users in the cluster (10000)",
                    ),
                };
                results.push(result);
            }
        }
        Err((code, why)) => {
            tracing::warn!("cannot store SCRAM credentials: {why}");
            for user in &users {
                results.push(alter_result(user, code, &why));
            }
        }
    }
    AlterUserScramCredentialsResponse::default().with_results(results)
}

/// A request naming more than [`SCRAM_CHANGES_PER_REQUEST_MAX`] changes: every entry is
/// answered INVALID_REQUEST and nothing is changed.
fn refuse_all(req: &AlterUserScramCredentialsRequest) -> AlterUserScramCredentialsResponse {
    let names = req.deletions.iter().map(|d| d.name.as_str());
    let names = names.chain(req.upsertions.iter().map(|u| u.name.as_str()));
    let why = "too many credential changes in one request";
    let results = names
        .map(|user| alter_result(user, errors::INVALID_REQUEST, why))
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}

fn check_user(user: &str, duplicate: bool) -> Result<(), (i16, &'static str)> {
    if user.is_empty() || user.len() > SCRAM_USER_NAME_MAX_BYTES {
        return Err((
            errors::UNACCEPTABLE_CREDENTIAL,
            "user name must be 1..=256 bytes",
        ));
    }
    if duplicate {
        return Err((
            errors::DUPLICATE_RESOURCE,
            "a user may appear once per request",
        ));
    }
    Ok(())
}

fn upsert_credential(
    u: &kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion,
) -> Result<ScramCredential, (i16, &'static str)> {
    let mechanism = ScramMechanism::from_code(u.mechanism).ok_or((
        errors::UNSUPPORTED_SASL_MECHANISM,
        "unknown SCRAM mechanism",
    ))?;
    let iterations = u32::try_from(u.iterations)
        .ok()
        .filter(|i| (scram::ITERATIONS_MIN..=scram::ITERATIONS_MAX).contains(i))
        .ok_or((
            errors::UNACCEPTABLE_CREDENTIAL,
            "iterations must be 4096..=16384",
        ))?;
    let salted_len = u.salted_password.len();
    if u.salt.is_empty()
        || u.salt.len() > SCRAM_SALT_MAX_BYTES
        || salted_len == 0
        || salted_len > SCRAM_SALTED_PASSWORD_MAX_BYTES
    {
        return Err((
            errors::UNACCEPTABLE_CREDENTIAL,
            "salt and salted password are required",
        ));
    }
    Ok(ScramCredential::from_salted(
        mechanism,
        &u.salt,
        iterations,
        &u.salted_password,
    ))
}

fn alter_result(user: &str, code: i16, message: &str) -> AlterUserScramCredentialsResult {
    let message = (code != errors::NONE).then(|| str_bytes(message));
    AlterUserScramCredentialsResult::default()
        .with_user(str_bytes(user))
        .with_error_code(code)
        .with_error_message(message)
}
