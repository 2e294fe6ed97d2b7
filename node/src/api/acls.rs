//! CreateAcls, DescribeAcls, DeleteAcls (v1–v3, what Kafka 4.1 defines): bindings are
//! checked here, written by the controller (a command committed through the quorum and
//! applied on every node), and read from the metadata image. Kafka's filter semantics for
//! Describe and Delete (ANY / MATCH pattern filters, see `security::acl::AclFilter`).
//! Cluster Alter (create, delete) or Describe (describe) is required.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::authz::Authz;
use super::str_bytes;
use crate::controller::{Command, Outcome};
use crate::errors;
use crate::security::acl::{
    AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType,
};
use crate::shard::Shard;

/// Most creations or filters one request may carry.
pub const ACL_CHANGES_PER_REQUEST_MAX: usize = 1_000;

fn opt(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|s| s.to_string())
}

fn binding_of(
    c: &kafka_protocol::messages::create_acls_request::AclCreation,
) -> Result<AclBinding, String> {
    let b = AclBinding {
        resource_type: ResourceType::from_code(c.resource_type)
            .ok_or("unknown or unsupported resource type")?,
        name: c.resource_name.to_string(),
        pattern: PatternType::from_code(c.resource_pattern_type)
            .ok_or("the pattern type must be LITERAL or PREFIXED")?,
        principal: c.principal.to_string(),
        host: c.host.to_string(),
        operation: Operation::from_code(c.operation).ok_or("unknown or unsupported operation")?,
        permission: Permission::from_code(c.permission_type)
            .ok_or("the permission type must be ALLOW or DENY")?,
    };
    b.validate()?;
    Ok(b)
}

fn creation_result(code: i16, message: Option<String>) -> AclCreationResult {
    AclCreationResult::default()
        .with_error_code(code)
        .with_error_message(message.map(|m| str_bytes(&m)))
}

/// CreateAcls: each valid binding is added (an existing one is not an error).
pub async fn create(
    shard: &Rc<Shard>,
    authz: &Authz<'_>,
    req: CreateAclsRequest,
) -> CreateAclsResponse {
    let refuse = |code: i16, why: &str| {
        let results = req
            .creations
            .iter()
            .map(|_| creation_result(code, Some(why.to_string())))
            .collect();
        CreateAclsResponse::default().with_results(results)
    };
    if !authz.cluster(Operation::Alter) {
        return refuse(
            errors::CLUSTER_AUTHORIZATION_FAILED,
            "Cluster Alter is required",
        );
    }
    if req.creations.len() > ACL_CHANGES_PER_REQUEST_MAX {
        return refuse(
            errors::INVALID_REQUEST,
            "too many ACL creations in one request",
        );
    }
    let checked: Vec<Result<AclBinding, String>> = req.creations.iter().map(binding_of).collect();
    let valid: Vec<AclBinding> = checked
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .cloned()
        .collect();
    let mut outcomes = match valid.is_empty() {
        true => Vec::new().into_iter(),
        false => match shard
            .node
            .controller
            .submit(&shard.node, Command::CreateAcls { bindings: valid })
            .await
        {
            Outcome::AclsCreated(v) => v.into_iter(),
            other => {
                tracing::error!("CreateAcls: unexpected outcome {other:?}");
                return refuse(
                    errors::UNKNOWN_SERVER_ERROR,
                    "unexpected controller outcome",
                );
            }
        },
    };
    let results = checked
        .into_iter()
        .map(|c| match c {
            Err(why) => creation_result(errors::INVALID_REQUEST, Some(why)),
            Ok(_) => match outcomes.next() {
                Some(Ok(())) => creation_result(errors::NONE, None),
                Some(Err((code, why))) => creation_result(code, Some(why)),
                None => creation_result(errors::UNKNOWN_SERVER_ERROR, None),
            },
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

/// DescribeAcls: the bindings matching the filter, grouped by resource pattern.
pub fn describe(
    shard: &Shard,
    authz: &Authz<'_>,
    req: DescribeAclsRequest,
) -> DescribeAclsResponse {
    let error = |code: i16, why: &str| {
        DescribeAclsResponse::default()
            .with_error_code(code)
            .with_error_message(Some(str_bytes(why)))
    };
    if !authz.cluster(Operation::Describe) {
        return error(
            errors::CLUSTER_AUTHORIZATION_FAILED,
            "Cluster Describe is required",
        );
    }
    let codes = (
        req.resource_type_filter,
        req.pattern_type_filter,
        req.operation,
        req.permission_type,
    );
    let filter = match AclFilter::from_wire(
        codes,
        opt(&req.resource_name_filter),
        opt(&req.principal_filter),
        opt(&req.host_filter),
    ) {
        Ok(f) => f,
        Err(why) => return error(errors::INVALID_REQUEST, why),
    };
    let catalog = shard.catalog();
    let mut by_resource: BTreeMap<(i8, &str, i8), Vec<AclDescription>> = BTreeMap::new();
    for b in catalog.acls.iter().filter(|b| filter.matches(b)) {
        let key = (b.resource_type.code(), b.name.as_str(), b.pattern.code());
        by_resource.entry(key).or_default().push(
            AclDescription::default()
                .with_principal(str_bytes(&b.principal))
                .with_host(str_bytes(&b.host))
                .with_operation(b.operation.code())
                .with_permission_type(b.permission.code()),
        );
    }
    let resources = by_resource
        .into_iter()
        .map(|((rt, name, pattern), acls)| {
            DescribeAclsResource::default()
                .with_resource_type(rt)
                .with_resource_name(str_bytes(name))
                .with_pattern_type(pattern)
                .with_acls(acls)
        })
        .collect();
    DescribeAclsResponse::default().with_resources(resources)
}

fn filter_result(code: i16, why: &str) -> DeleteAclsFilterResult {
    DeleteAclsFilterResult::default()
        .with_error_code(code)
        .with_error_message(Some(str_bytes(why)))
}

/// DeleteAcls: per filter, the bindings it matched (and deleted).
pub async fn delete(
    shard: &Rc<Shard>,
    authz: &Authz<'_>,
    req: DeleteAclsRequest,
) -> DeleteAclsResponse {
    let refuse = |code: i16, why: &str| {
        let results = req
            .filters
            .iter()
            .map(|_| filter_result(code, why))
            .collect();
        DeleteAclsResponse::default().with_filter_results(results)
    };
    if !authz.cluster(Operation::Alter) {
        return refuse(
            errors::CLUSTER_AUTHORIZATION_FAILED,
            "Cluster Alter is required",
        );
    }
    if req.filters.len() > ACL_CHANGES_PER_REQUEST_MAX {
        return refuse(
            errors::INVALID_REQUEST,
            "too many ACL filters in one request",
        );
    }
    let parsed: Vec<Result<AclFilter, &'static str>> = req
        .filters
        .iter()
        .map(|f| {
            let codes = (
                f.resource_type_filter,
                f.pattern_type_filter,
                f.operation,
                f.permission_type,
            );
            AclFilter::from_wire(
                codes,
                opt(&f.resource_name_filter),
                opt(&f.principal_filter),
                opt(&f.host_filter),
            )
        })
        .collect();
    let filters: Vec<AclFilter> = parsed.iter().filter_map(|f| f.clone().ok()).collect();
    let mut deleted = match filters.is_empty() {
        true => Vec::new().into_iter(),
        false => match shard
            .node
            .controller
            .submit(&shard.node, Command::DeleteAcls { filters })
            .await
        {
            Outcome::AclsDeleted(Ok(v)) => v.into_iter(),
            Outcome::AclsDeleted(Err((code, why))) => return refuse(code, &why),
            other => {
                tracing::error!("DeleteAcls: unexpected outcome {other:?}");
                return refuse(
                    errors::UNKNOWN_SERVER_ERROR,
                    "unexpected controller outcome",
                );
            }
        },
    };
    let results = parsed
        .into_iter()
        .map(|f| match f {
            Err(why) => filter_result(errors::INVALID_REQUEST, why),
            Ok(_) => {
                let gone = deleted.next().unwrap_or_default();
                DeleteAclsFilterResult::default()
                    .with_matching_acls(gone.iter().map(matching_acl).collect())
            }
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}

fn matching_acl(b: &AclBinding) -> DeleteAclsMatchingAcl {
    DeleteAclsMatchingAcl::default()
        .with_resource_type(b.resource_type.code())
        .with_resource_name(str_bytes(&b.name))
        .with_pattern_type(b.pattern.code())
        .with_principal(str_bytes(&b.principal))
        .with_host(str_bytes(&b.host))
        .with_operation(b.operation.code())
        .with_permission_type(b.permission.code())
}
