//! The authorizer with a real client: confluent-kafka (librdkafka 2.16) over SASL_SSL with
//! SCRAM-SHA-512. The PLAINTEXT listener's anonymous principal is the super user that
//! creates the topic and the ACLs through AdminClient (CreateAcls, DescribeAcls,
//! DeleteAcls); alice, allowed Read and Write on the topic and Read on `g-` groups,
//! produces (idempotent, acks=all) and consumes in a group; bob, with no ACL, is refused
//! with TOPIC_AUTHORIZATION_FAILED on both (he may use the group); once alice's ACLs are
//! deleted she is too.

mod security_support;

use anyhow::{Result, ensure};
use security_support::{SCRAM_USER, SecureBroker, run_client};

const TOPIC: &str = "acl-orders";

#[test]
fn scram_users_are_allowed_or_refused_by_acls_made_with_admin_client() -> Result<()> {
    let b = SecureBroker::start(&[
        (
            "authorizer.class.name",
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        ),
        ("super.users", "User:ANONYMOUS"),
    ])?;
    let admin = b.client_conf("PLAINTEXT")?;
    b.add_scram_user("SCRAM-SHA-512")?;
    run_client("scram-add", &admin, &["bob", "bob-secret", "SCRAM-SHA-512"])?;
    let out = run_client("acl-setup", &admin, &[TOPIC, SCRAM_USER])?;
    ensure!(out == "OK 3 acls", "{out}");

    let alice = b.client_conf("SASL_SSL")?;
    run_client("produce-consume", &alice, &[TOPIC, "100"])?;

    let mut bob = alice.clone();
    for (k, v) in [("sasl.username", "bob"), ("sasl.password", "bob-secret")] {
        bob.retain(|(key, _)| key != k);
        bob.push((k.to_string(), v.to_string()));
    }
    // bob may use `g-` groups, but not the topic.
    run_client("acl-group", &admin, &["bob"])?;
    let out = run_client("expect-denied", &bob, &[TOPIC])?;
    println!("bob: {out}");

    let out = run_client("acl-delete", &admin, &[SCRAM_USER])?;
    ensure!(out == "OK 3", "{out}");
    run_client("acl-group", &admin, &[SCRAM_USER])?;
    run_client("expect-denied", &alice, &[TOPIC])?;
    Ok(())
}
