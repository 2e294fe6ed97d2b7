//! `weir acls add|list|remove`: ACLs of a running node over the Kafka protocol
//! (CreateAcls, DescribeAcls, DeleteAcls), in the shape of Kafka's `kafka-acls.sh`.
//! Connects with the admin commands' security flags (TLS, SASL: [`super::security`]); the
//! principal needs Cluster Alter (add, remove) or Describe (list), or to be a super user.

use std::io::Write;
use std::process::ExitCode;

use anyhow::bail;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::Client;
use crate::security::acl::{CLUSTER_NAME, Operation, PatternType, Permission, ResourceType};

/// The ACL API version spoken (Kafka 4.x serves 2–3).
const ACL_API_VERSION: i16 = 3;
/// Kafka's wire code for ANY in filters.
const ANY: i8 = 1;

#[derive(clap::Args)]
pub struct AclsArgs {
    /// HOST:PORT of the node.
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap_server: String,
    /// Installed by `main` before [`run`], as for the other admin commands.
    #[command(flatten)]
    pub security: super::security::SecurityArgs,
    #[command(subcommand)]
    command: AclsCommand,
}

#[derive(clap::Subcommand)]
enum AclsCommand {
    /// Add one ACL: `--principal User:alice --operation Read --topic orders`.
    Add(Binding),
    /// List ACLs (every one, or those matching the given resource and principal).
    List(Selector),
    /// Remove the ACLs matching the selector (an unset field matches anything). A
    /// resource is required, or `--all` to match every resource (as kafka-acls.sh
    /// requires a resource option).
    Remove(RemoveArgs),
}

#[derive(clap::Args)]
struct RemoveArgs {
    #[command(flatten)]
    selector: Selector,
    /// Remove matching ACLs of every resource (with no resource named).
    #[arg(long)]
    all: bool,
}

impl RemoveArgs {
    /// No resource and no `--all` would remove every ACL (or every ACL of a principal)
    /// in one keystroke: with the authorizer on, that locks out every client.
    fn check(&self) -> anyhow::Result<()> {
        if self.selector.resource.get()?.is_none() && !self.all {
            bail!(
                "name a resource (--topic, --group, --transactional-id or --cluster), or \
                 --all to remove the matching ACLs of every resource"
            );
        }
        Ok(())
    }
}

/// Which resource: exactly one of topic, group, transactional id, cluster.
#[derive(clap::Args)]
struct Resource {
    #[arg(long)]
    topic: Option<String>,
    #[arg(long)]
    group: Option<String>,
    #[arg(long)]
    transactional_id: Option<String>,
    #[arg(long)]
    cluster: bool,
}

impl Resource {
    fn get(&self) -> anyhow::Result<Option<(ResourceType, String)>> {
        let mut named = Vec::new();
        if let Some(t) = &self.topic {
            named.push((ResourceType::Topic, t.clone()));
        }
        if let Some(g) = &self.group {
            named.push((ResourceType::Group, g.clone()));
        }
        if let Some(t) = &self.transactional_id {
            named.push((ResourceType::TransactionalId, t.clone()));
        }
        if self.cluster {
            named.push((ResourceType::Cluster, CLUSTER_NAME.to_string()));
        }
        if named.len() > 1 {
            bail!("name one resource: --topic, --group, --transactional-id or --cluster");
        }
        Ok(named.pop())
    }
}

#[derive(clap::Args)]
struct Binding {
    #[command(flatten)]
    resource: Resource,
    /// literal (the name, or every name for `*`) or prefixed.
    #[arg(long, default_value = "literal")]
    pattern: String,
    /// TYPE:NAME, e.g. User:alice, or User:* for everyone.
    #[arg(long)]
    principal: String,
    /// All, Read, Write, Create, Delete, Alter, Describe, ClusterAction,
    /// DescribeConfigs, AlterConfigs, IdempotentWrite.
    #[arg(long)]
    operation: String,
    /// `*` or a client address.
    #[arg(long, default_value = "*")]
    host: String,
    /// A DENY ACL (default: ALLOW).
    #[arg(long)]
    deny: bool,
}

#[derive(clap::Args)]
struct Selector {
    #[command(flatten)]
    resource: Resource,
    /// any (default), match (every ACL that applies to the named resource), literal,
    /// prefixed.
    #[arg(long, default_value = "any")]
    pattern: String,
    #[arg(long)]
    principal: Option<String>,
}

fn parse_operation(name: &str) -> anyhow::Result<Operation> {
    let wanted = name.replace(['_', '-'], "").to_ascii_lowercase();
    Operation::EVERY
        .into_iter()
        .find(|o| format!("{o:?}").to_ascii_lowercase() == wanted)
        .ok_or_else(|| anyhow::anyhow!("unknown operation {name}"))
}

fn pattern_code(name: &str) -> anyhow::Result<i8> {
    match name.to_ascii_lowercase().as_str() {
        "any" => Ok(ANY),
        "match" => Ok(2),
        "literal" => Ok(PatternType::Literal.code()),
        "prefixed" => Ok(PatternType::Prefixed.code()),
        other => bail!("unknown pattern type {other} (literal, prefixed, any, match)"),
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn name_of(code: i8, names: &[(i8, &'static str)]) -> &'static str {
    names
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("?", |(_, n)| n)
}

fn resource_name(code: i8) -> &'static str {
    let names: Vec<(i8, &'static str)> = ResourceType::ALL
        .iter()
        .map(|r| {
            let n: &'static str = match r {
                ResourceType::Topic => "Topic",
                ResourceType::Group => "Group",
                ResourceType::Cluster => "Cluster",
                ResourceType::TransactionalId => "TransactionalId",
            };
            (r.code(), n)
        })
        .collect();
    name_of(code, &names)
}

fn operation_name(code: i8) -> String {
    Operation::from_code(code).map_or("?".into(), |o| format!("{o:?}"))
}

fn add(c: &mut Client, b: &Binding, out: &mut impl Write) -> anyhow::Result<()> {
    let Some((rt, name)) = b.resource.get()? else {
        bail!("add needs a resource: --topic, --group, --transactional-id or --cluster");
    };
    let pattern = pattern_code(&b.pattern)?;
    if pattern == ANY || pattern == 2 {
        bail!("add takes --pattern literal or prefixed");
    }
    let permission = if b.deny {
        Permission::Deny
    } else {
        Permission::Allow
    };
    let creation = AclCreation::default()
        .with_resource_type(rt.code())
        .with_resource_name(s(&name))
        .with_resource_pattern_type(pattern)
        .with_principal(s(&b.principal))
        .with_host(s(&b.host))
        .with_operation(parse_operation(&b.operation)?.code())
        .with_permission_type(permission.code());
    let req = CreateAclsRequest::default().with_creations(vec![creation]);
    let resp: CreateAclsResponse = c.call(ApiKey::CreateAcls, ACL_API_VERSION, &req)?;
    for r in &resp.results {
        if r.error_code != 0 {
            let why = r.error_message.as_ref().map_or("", |m| m.as_str());
            bail!("refused: error {} {why}", r.error_code);
        }
    }
    writeln!(out, "added")?;
    Ok(())
}

fn filter_of(sel: &Selector) -> anyhow::Result<DeleteAclsFilter> {
    let resource = sel.resource.get()?;
    Ok(DeleteAclsFilter::default()
        .with_resource_type_filter(resource.as_ref().map_or(ANY, |(rt, _)| rt.code()))
        .with_resource_name_filter(resource.map(|(_, n)| s(&n)))
        .with_pattern_type_filter(pattern_code(&sel.pattern)?)
        .with_principal_filter(sel.principal.as_deref().map(s))
        .with_host_filter(None)
        .with_operation(ANY)
        .with_permission_type(ANY))
}

fn list(c: &mut Client, sel: &Selector, out: &mut impl Write) -> anyhow::Result<()> {
    let f = filter_of(sel)?;
    let req = DescribeAclsRequest::default()
        .with_resource_type_filter(f.resource_type_filter)
        .with_resource_name_filter(f.resource_name_filter)
        .with_pattern_type_filter(f.pattern_type_filter)
        .with_principal_filter(f.principal_filter)
        .with_host_filter(None)
        .with_operation(ANY)
        .with_permission_type(ANY);
    let resp: DescribeAclsResponse = c.call(ApiKey::DescribeAcls, ACL_API_VERSION, &req)?;
    if resp.error_code != 0 {
        let why = resp.error_message.as_ref().map_or("", |m| m.as_str());
        bail!("refused: error {} {why}", resp.error_code);
    }
    for r in &resp.resources {
        let pattern = if r.pattern_type == PatternType::Prefixed.code() {
            "PREFIXED"
        } else {
            "LITERAL"
        };
        writeln!(
            out,
            "Current ACLs for resource `ResourcePattern(resourceType={}, name={}, patternType={pattern})`:",
            resource_name(r.resource_type),
            r.resource_name.as_str()
        )?;
        for a in &r.acls {
            let perm = if a.permission_type == Permission::Deny.code() {
                "DENY"
            } else {
                "ALLOW"
            };
            writeln!(
                out,
                " \t(principal={}, host={}, operation={}, permissionType={perm})",
                a.principal.as_str(),
                a.host.as_str(),
                operation_name(a.operation)
            )?;
        }
    }
    Ok(())
}

fn remove(c: &mut Client, sel: &Selector, out: &mut impl Write) -> anyhow::Result<()> {
    let req = DeleteAclsRequest::default().with_filters(vec![filter_of(sel)?]);
    let resp: DeleteAclsResponse = c.call(ApiKey::DeleteAcls, ACL_API_VERSION, &req)?;
    let mut removed = 0;
    for r in &resp.filter_results {
        if r.error_code != 0 {
            let why = r.error_message.as_ref().map_or("", |m| m.as_str());
            bail!("refused: error {} {why}", r.error_code);
        }
        removed += r.matching_acls.len();
    }
    writeln!(out, "removed {removed}")?;
    Ok(())
}

/// Runs `weir acls ...`.
pub fn run(args: AclsArgs) -> ExitCode {
    let mut out = std::io::stdout().lock();
    let checked = match &args.command {
        AclsCommand::Remove(r) => r.check(),
        _ => Ok(()),
    };
    let done = checked
        .and_then(|()| Client::connect(&args.bootstrap_server))
        .and_then(|mut c| match &args.command {
            AclsCommand::Add(b) => add(&mut c, b, &mut out),
            AclsCommand::List(sel) => list(&mut c, sel, &mut out),
            AclsCommand::Remove(r) => remove(&mut c, &r.selector, &mut out),
        });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir acls: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        acls: AclsArgs,
    }

    fn remove_args(args: &[&str]) -> RemoveArgs {
        let mut all = vec!["weir", "remove"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).expect("parse").acls.command {
            AclsCommand::Remove(r) => r,
            _ => panic!("not remove"),
        }
    }

    #[test]
    fn remove_needs_a_resource_or_all() {
        assert!(remove_args(&[]).check().is_err());
        assert!(remove_args(&["--principal", "User:x"]).check().is_err());
        assert!(remove_args(&["--topic", "t"]).check().is_ok());
        assert!(remove_args(&["--all"]).check().is_ok());
        assert!(
            remove_args(&["--all", "--principal", "User:x"])
                .check()
                .is_ok()
        );
    }
}
