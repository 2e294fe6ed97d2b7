//! ACLs in a three-node cluster with the authorizer on: a CreateAcls sent to one node is
//! a controller command committed through the quorum and applied on every node (each
//! one's DescribeAcls shows it), it survives a node's restart (rebuilt from the Raft
//! log), and a DeleteAcls through another node removes it everywhere.
//!
//! The nodes and the test talk PLAINTEXT as `User:ANONYMOUS`, the super user here (in a
//! cluster with an authorizer the inter-node principal must be one: follower fetches need
//! ClusterAction). Enforcement itself is node-local and tested in node/tests/security_acls.rs.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use weir_tests::cluster::Cluster;
use weir_tests::raw::RawConn;

/// Bound on every wait for the quorum (elections, catch-up on a loaded machine).
const AGREE_TIMEOUT: Duration = Duration::from_secs(60);
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
const ANY: i8 = 1;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The ACLs node `addr` describes, as `resource name/principal` strings.
fn described(addr: std::net::SocketAddr) -> Result<Vec<String>> {
    let mut c = RawConn::connect_timeout(addr, CALL_TIMEOUT)?;
    let req = DescribeAclsRequest::default()
        .with_resource_type_filter(ANY)
        .with_resource_name_filter(None)
        .with_pattern_type_filter(ANY)
        .with_principal_filter(None)
        .with_host_filter(None)
        .with_operation(ANY)
        .with_permission_type(ANY);
    let resp: DescribeAclsResponse = c.call(ApiKey::DescribeAcls, 3, &req)?;
    let mut out: Vec<String> = resp
        .resources
        .iter()
        .flat_map(|r| {
            r.acls
                .iter()
                .map(move |a| format!("{}/{}", r.resource_name.as_str(), a.principal.as_str()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Waits until every live node describes exactly `want`.
fn wait_everywhere(c: &mut Cluster, want: &[&str]) -> Result<()> {
    let deadline = Instant::now() + AGREE_TIMEOUT;
    let mut last = Vec::new();
    while Instant::now() < deadline {
        last = c
            .live()
            .into_iter()
            .map(|id| described(c.node(id).addr()).map_err(|e| e.to_string()))
            .collect();
        if last.iter().all(|r| r.as_ref().is_ok_and(|v| v == want)) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("nodes did not all describe {want:?}: {last:?}")
}

/// Sends `f` to node `id` until it answers 0 (no controller yet → retried, bounded).
fn until_ok(c: &mut Cluster, id: i32, f: impl Fn(&mut RawConn) -> Result<i16>) -> Result<()> {
    let deadline = Instant::now() + AGREE_TIMEOUT;
    let mut last = None;
    while Instant::now() < deadline {
        let addr = c.node(id).addr();
        match RawConn::connect_timeout(addr, CALL_TIMEOUT).and_then(|mut conn| f(&mut conn)) {
            Ok(0) => return Ok(()),
            other => last = Some(format!("{other:?}")),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("node {id} never answered 0: {last:?}")
}

#[test]
fn acls_are_committed_through_the_quorum_and_applied_on_every_node() -> Result<()> {
    let mut c = Cluster::start(
        3,
        &[
            ("authorizer.class.name", "weir"),
            ("super.users", "User:ANONYMOUS"),
        ],
    )?;
    c.controller(AGREE_TIMEOUT)?;
    let creation = AclCreation::default()
        .with_resource_type(2)
        .with_resource_name(s("orders"))
        .with_resource_pattern_type(3)
        .with_principal(s("User:alice"))
        .with_host(s("*"))
        .with_operation(3)
        .with_permission_type(3);
    until_ok(&mut c, 1, |conn| {
        let req = CreateAclsRequest::default().with_creations(vec![creation.clone()]);
        let resp: CreateAclsResponse = conn.call(ApiKey::CreateAcls, 3, &req)?;
        Ok(resp.results.first().map_or(-1, |r| r.error_code))
    })?;
    wait_everywhere(&mut c, &["orders/User:alice"])?;

    c.node(2).terminate()?;
    c.node(2).restart()?;
    wait_everywhere(&mut c, &["orders/User:alice"])?;

    until_ok(&mut c, 3, |conn| {
        let filter = DeleteAclsFilter::default()
            .with_resource_type_filter(ANY)
            .with_resource_name_filter(None)
            .with_pattern_type_filter(ANY)
            .with_principal_filter(Some(s("User:alice")))
            .with_host_filter(None)
            .with_operation(ANY)
            .with_permission_type(ANY);
        let req = DeleteAclsRequest::default().with_filters(vec![filter]);
        let resp: DeleteAclsResponse = conn.call(ApiKey::DeleteAcls, 3, &req)?;
        Ok(resp.filter_results.first().map_or(-1, |r| r.error_code))
    })?;
    wait_everywhere(&mut c, &[])?;
    Ok(())
}
