//! SCRAM credentials a new cluster starts with (weir's `scram.bootstrap.credentials`, in
//! the syntax of Kafka's `kafka-storage format --add-scram`): so that a cluster whose
//! inter-broker mechanism is SCRAM can replicate from its first minute, with no PLAIN
//! user or client-side AlterUserScramCredentials first. The passwords are salted at
//! startup (a random salt per credential) and only the salted form goes to the
//! controller; the first active controller of a fresh cluster commits them once, before
//! it names the cluster (see `controller::quorum::leases`).

use crate::metadata::scram::ScramChange;
use crate::security::scram::{ITERATIONS_MAX, ITERATIONS_MIN, ScramCredential, ScramMechanism};

/// The key: `SCRAM-SHA-512=[name=admin,password=secret];SCRAM-SHA-256=[...]`.
pub const KEY: &str = "scram.bootstrap.credentials";
/// Most credentials the key may give (each is one PBKDF2 at startup).
pub const CREDENTIALS_MAX: usize = 64;
/// Bytes of random salt per credential (Kafka's ScramFormatter uses a random nonce).
const SALT_BYTES: usize = 24;

/// Parses and salts the credentials of [`KEY`] (errors name the key and the part).
pub fn parse(value: &str) -> anyhow::Result<Vec<ScramChange>> {
    let mut out = Vec::new();
    let mut rest = value.trim();
    while !rest.is_empty() {
        anyhow::ensure!(
            out.len() < CREDENTIALS_MAX,
            "{KEY}: more than {CREDENTIALS_MAX} credentials"
        );
        let (entry, after) = split_entry(rest)?;
        out.push(credential(entry)?);
        rest = after.trim_start_matches([';', ',', ' ', '\t', '\n']).trim();
    }
    Ok(out)
}

/// `MECHANISM=[...]` at the start of `text`, and what follows it.
fn split_entry(text: &str) -> anyhow::Result<((&str, &str), &str)> {
    let bad = || anyhow::anyhow!("{KEY}: expected MECHANISM=[name=..,password=..], got {text:?}");
    let (mechanism, after) = text.split_once('=').ok_or_else(bad)?;
    let body = after.trim_start().strip_prefix('[').ok_or_else(bad)?;
    let close = closing_bracket(body).ok_or_else(bad)?;
    Ok(((mechanism.trim(), &body[..close]), &body[close + 1..]))
}

/// The `]` that ends the entry (one inside a quoted value does not).
fn closing_bracket(body: &str) -> Option<usize> {
    let mut quoted = false;
    for (i, c) in body.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ']' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

fn credential((mechanism, body): (&str, &str)) -> anyhow::Result<ScramChange> {
    let m = match mechanism {
        "SCRAM-SHA-256" => ScramMechanism::Sha256,
        "SCRAM-SHA-512" => ScramMechanism::Sha512,
        other => anyhow::bail!("{KEY}: mechanism {other:?} (SCRAM-SHA-256 or SCRAM-SHA-512)"),
    };
    let (mut name, mut password, mut iterations) = (None, None, ITERATIONS_MIN);
    for (k, v) in fields(body)? {
        match k {
            "name" => name = Some(v),
            "password" => password = Some(v),
            "iterations" => {
                iterations = v
                    .parse()
                    .ok()
                    .filter(|i| (ITERATIONS_MIN..=ITERATIONS_MAX).contains(i))
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "{KEY}: iterations={v}: {ITERATIONS_MIN}..={ITERATIONS_MAX}"
                        )
                    })?
            }
            other => anyhow::bail!("{KEY}: unknown field {other:?} (name, password, iterations)"),
        }
    }
    let (Some(user), Some(password)) = (name, password) else {
        anyhow::bail!("{KEY}: {mechanism} needs name=.. and password=..");
    };
    anyhow::ensure!(!user.is_empty(), "{KEY}: an empty user name");
    let mut salt = [0u8; SALT_BYTES];
    rand::Rng::fill(&mut rand::rng(), &mut salt[..]);
    let salted = m.salted_password(password.as_bytes(), &salt, iterations);
    let credential = ScramCredential::from_salted(m, &salt, iterations, &salted);
    Ok(ScramChange::Upsert {
        user: user.to_string(),
        credential,
    })
}

/// `k=v,k="v, with comma",...`
fn fields(body: &str) -> anyhow::Result<Vec<(&str, &str)>> {
    let mut out = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let (k, after) = rest
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("{KEY}: expected key=value in [{body}]"))?;
        let after = after.trim_start();
        let (v, next) = match after.strip_prefix('"') {
            Some(q) => {
                let close = q
                    .find('"')
                    .ok_or_else(|| anyhow::anyhow!("{KEY}: an unclosed quote in [{body}]"))?;
                (&q[..close], &q[close + 1..])
            }
            None => after.split_once(',').unwrap_or((after, "")),
        };
        out.push((k.trim(), v.trim_end()));
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upsert(c: &ScramChange) -> (&str, &ScramCredential) {
        match c {
            ScramChange::Upsert { user, credential } => (user.as_str(), credential),
            other => panic!("not an upsert: {other:?}"),
        }
    }

    #[test]
    fn kafka_add_scram_syntax_is_read_and_salted() {
        let v = r#"SCRAM-SHA-512=[name=admin,password=admin-secret]; SCRAM-SHA-256=[name="bob",password="p,w]x",iterations=8192]"#;
        let out = parse(v).expect("parse");
        assert_eq!(out.len(), 2);
        let (user, c) = upsert(&out[0]);
        assert_eq!(user, "admin");
        assert_eq!(c.mechanism, ScramMechanism::Sha512);
        assert_eq!(c.iterations, ITERATIONS_MIN);
        // The stored form checks the password, and holds no trace of it.
        let salt = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &c.salt)
            .expect("salt");
        let salted = c
            .mechanism
            .salted_password(b"admin-secret", &salt, c.iterations);
        assert_eq!(
            &ScramCredential::from_salted(c.mechanism, &salt, c.iterations, &salted),
            c
        );
        assert!(!format!("{c:?}").contains("admin-secret"));
        let (user, c) = upsert(&out[1]);
        assert_eq!(user, "bob");
        assert_eq!(c.iterations, 8192);
        let salt = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &c.salt)
            .expect("salt");
        let salted = c.mechanism.salted_password(b"p,w]x", &salt, c.iterations);
        assert_eq!(
            ScramCredential::from_salted(c.mechanism, &salt, c.iterations, &salted).stored_key,
            c.stored_key
        );
        assert!(parse("").expect("empty").is_empty());
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            "SCRAM-SHA-1=[name=a,password=b]",
            "SCRAM-SHA-512=[name=a]",
            "SCRAM-SHA-512=[password=b]",
            "SCRAM-SHA-512=name=a,password=b",
            "SCRAM-SHA-512=[name=a,password=b",
            "SCRAM-SHA-512=[name=a,password=b,iterations=1]",
            "SCRAM-SHA-512=[name=a,password=b,salt=x]",
            "SCRAM-SHA-512=[name=,password=b]",
            r#"SCRAM-SHA-512=[name="a,password=b]"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
