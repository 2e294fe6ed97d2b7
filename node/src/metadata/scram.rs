//! SCRAM credentials in the persisted catalogue: salted (salt, iterations, StoredKey,
//! ServerKey), never a password. Every write is the controller's `AlterScramCredentials`
//! command, which runs [`apply`] on the catalogue (on every node of a cluster, from the
//! metadata log), so all nodes authenticate against the same credentials.

use serde::{Deserialize, Serialize};

use super::Catalog;
use crate::security::scram::{ScramCredential, ScramMechanism};

/// One change of an AlterUserScramCredentials request, already checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ScramChange {
    Upsert {
        user: String,
        credential: ScramCredential,
    },
    Delete {
        user: String,
        mechanism: ScramMechanism,
    },
}

/// Most users with SCRAM credentials, whole cluster: every credential change rewrites the
/// metadata image, so its size must stay bounded whatever clients send.
pub const SCRAM_USERS_MAX: usize = 10_000;

/// The outcome of one change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScramOutcome {
    Done,
    /// A deletion of a credential that does not exist.
    NotFound,
    /// An upsert for a new user while [`SCRAM_USERS_MAX`] users have credentials.
    TooManyUsers,
}

/// Applies `changes` in order to `catalog`; returns each one's outcome and whether the
/// catalogue changed (the controller command's whole effect).
pub fn alter(catalog: &mut Catalog, changes: &[ScramChange]) -> (Vec<ScramOutcome>, bool) {
    let mut changed = false;
    let outcomes = changes
        .iter()
        .map(|change| {
            let outcome = apply(catalog, change);
            changed |= outcome == ScramOutcome::Done;
            outcome
        })
        .collect();
    assert!(
        catalog.scram_users.len() <= SCRAM_USERS_MAX,
        "SCRAM users stay within SCRAM_USERS_MAX"
    );
    (outcomes, changed)
}

fn apply(catalog: &mut Catalog, change: &ScramChange) -> ScramOutcome {
    match change {
        ScramChange::Upsert { user, credential } => {
            let known = catalog.scram_users.contains_key(user);
            if !known && catalog.scram_users.len() >= SCRAM_USERS_MAX {
                return ScramOutcome::TooManyUsers;
            }
            let mechanisms = catalog.scram_users.entry(user.clone()).or_default();
            mechanisms.insert(credential.mechanism.name().to_string(), credential.clone());
            ScramOutcome::Done
        }
        ScramChange::Delete { user, mechanism } => {
            let Some(mechanisms) = catalog.scram_users.get_mut(user) else {
                return ScramOutcome::NotFound;
            };
            if mechanisms.remove(mechanism.name()).is_none() {
                return ScramOutcome::NotFound;
            }
            if mechanisms.is_empty() {
                catalog.scram_users.remove(user);
            }
            ScramOutcome::Done
        }
    }
}

/// The stored credential of `user` for `mechanism`.
pub fn credential(
    catalog: &Catalog,
    user: &str,
    mechanism: ScramMechanism,
) -> Option<ScramCredential> {
    catalog
        .scram_users
        .get(user)?
        .get(mechanism.name())
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::super::MetaStore;
    use super::*;

    #[test]
    fn credentials_persist_salted_and_deletions_report_missing_ones() {
        let dir = tempfile::tempdir().expect("tmp");
        let meta = MetaStore::open(dir.path()).expect("open");
        let mech = ScramMechanism::Sha512;
        let salted = mech.salted_password(b"secret", b"salt", 4096);
        let cred = ScramCredential::from_salted(mech, b"salt", 4096, &salted);
        let up = ScramChange::Upsert {
            user: "alice".into(),
            credential: cred.clone(),
        };
        assert_eq!(
            meta.update_batch(|c| alter(c, &[up])).expect("write"),
            vec![ScramOutcome::Done]
        );
        let reopened = MetaStore::open(dir.path()).expect("reopen");
        assert_eq!(
            credential(&reopened.snapshot(), "alice", mech),
            Some(cred),
            "persisted"
        );
        let text = std::fs::read_to_string(dir.path().join(super::super::CATALOG_FILE))
            .expect("catalogue");
        assert!(!text.contains("secret"), "no password on disk");
        let del = |m| ScramChange::Delete {
            user: "alice".into(),
            mechanism: m,
        };
        let out = meta
            .update_batch(|c| alter(c, &[del(ScramMechanism::Sha256), del(mech)]))
            .expect("delete");
        assert_eq!(out, vec![ScramOutcome::NotFound, ScramOutcome::Done]);
        assert!(meta.snapshot().scram_users.is_empty());
    }

    #[test]
    fn new_users_past_the_limit_are_refused_and_known_ones_still_change() {
        let mut catalog = Catalog::default();
        let mech = ScramMechanism::Sha256;
        let cred = ScramCredential::from_salted(mech, b"s", 4096, &[1; 32]);
        let up = |user: String| ScramChange::Upsert {
            user,
            credential: cred.clone(),
        };
        for i in 0..SCRAM_USERS_MAX {
            assert_eq!(
                apply(&mut catalog, &up(format!("u{i}"))),
                ScramOutcome::Done
            );
        }
        assert_eq!(
            apply(&mut catalog, &up("one-too-many".into())),
            ScramOutcome::TooManyUsers
        );
        assert_eq!(apply(&mut catalog, &up("u0".into())), ScramOutcome::Done);
        assert_eq!(catalog.scram_users.len(), SCRAM_USERS_MAX);
    }
}
