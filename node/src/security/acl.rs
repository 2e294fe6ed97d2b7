//! Kafka's ACL model as plain data: resource types, pattern types, operations with their
//! implied operations, ALLOW/DENY, bindings as stored in the cluster metadata, the
//! Describe/Delete filters (ANY / MATCH) and the matching rules the authorizer uses.
//!
//! Wire codes are Kafka's (`org.apache.kafka.common.resource.ResourceType`,
//! `PatternType`, `acl.AclOperation`, `acl.AclPermissionType`).

use serde::{Deserialize, Serialize};

/// The one name a Cluster resource has.
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// The literal resource name (and host) that matches every name.
pub const WILDCARD: &str = "*";
/// The principal that matches every user.
pub const WILDCARD_PRINCIPAL: &str = "User:*";
/// Longest resource name, principal or host accepted in an ACL (bytes).
pub const ACL_FIELD_MAX_BYTES: usize = 1_024;

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceType {
    Topic,
    Group,
    Cluster,
    TransactionalId,
}

impl ResourceType {
    pub const ALL: [ResourceType; 4] = [
        ResourceType::Topic,
        ResourceType::Group,
        ResourceType::Cluster,
        ResourceType::TransactionalId,
    ];

    pub fn code(self) -> i8 {
        match self {
            ResourceType::Topic => 2,
            ResourceType::Group => 3,
            ResourceType::Cluster => 4,
            ResourceType::TransactionalId => 5,
        }
    }

    pub fn from_code(code: i8) -> Option<ResourceType> {
        Self::ALL.into_iter().find(|r| r.code() == code)
    }

    /// Index into per-type tables.
    pub fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PatternType {
    /// The name itself, or every name when it is `*`.
    Literal,
    /// Every name that starts with it.
    Prefixed,
}

impl PatternType {
    pub fn code(self) -> i8 {
        match self {
            PatternType::Literal => 3,
            PatternType::Prefixed => 4,
        }
    }

    pub fn from_code(code: i8) -> Option<PatternType> {
        match code {
            3 => Some(PatternType::Literal),
            4 => Some(PatternType::Prefixed),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
}

impl Operation {
    pub const EVERY: [Operation; 11] = [
        Operation::All,
        Operation::Read,
        Operation::Write,
        Operation::Create,
        Operation::Delete,
        Operation::Alter,
        Operation::Describe,
        Operation::ClusterAction,
        Operation::DescribeConfigs,
        Operation::AlterConfigs,
        Operation::IdempotentWrite,
    ];

    pub fn code(self) -> i8 {
        match self {
            Operation::All => 2,
            Operation::Read => 3,
            Operation::Write => 4,
            Operation::Create => 5,
            Operation::Delete => 6,
            Operation::Alter => 7,
            Operation::Describe => 8,
            Operation::ClusterAction => 9,
            Operation::DescribeConfigs => 10,
            Operation::AlterConfigs => 11,
            Operation::IdempotentWrite => 12,
        }
    }

    pub fn from_code(code: i8) -> Option<Operation> {
        Self::EVERY.into_iter().find(|o| o.code() == code)
    }

    /// One bit per operation (decision caches).
    pub fn bit(self) -> u16 {
        1 << (self as u16)
    }

    /// Whether an ALLOW binding for `self` allows `wanted` (Kafka: All allows everything;
    /// Read, Write, Delete and Alter imply Describe; AlterConfigs implies DescribeConfigs).
    pub fn allows(self, wanted: Operation) -> bool {
        if self == wanted || self == Operation::All {
            return true;
        }
        match wanted {
            Operation::Describe => matches!(
                self,
                Operation::Read | Operation::Write | Operation::Delete | Operation::Alter
            ),
            Operation::DescribeConfigs => self == Operation::AlterConfigs,
            _ => false,
        }
    }

    /// Whether a DENY binding for `self` denies `wanted`: only the operation itself or All
    /// (a deny of Describe does not deny Read).
    pub fn denies(self, wanted: Operation) -> bool {
        self == wanted || self == Operation::All
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    Deny,
    Allow,
}

impl Permission {
    pub fn code(self) -> i8 {
        match self {
            Permission::Deny => 2,
            Permission::Allow => 3,
        }
    }

    pub fn from_code(code: i8) -> Option<Permission> {
        match code {
            2 => Some(Permission::Deny),
            3 => Some(Permission::Allow),
            _ => None,
        }
    }
}

/// One ACL: who (principal, host) may or may not do what (operation) to which resources
/// (type, name, pattern type).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub name: String,
    pub pattern: PatternType,
    pub principal: String,
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

impl AclBinding {
    /// Checks a binding from CreateAcls the way Kafka does; the error is the message.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.name.is_empty() {
            return Err("the resource name must not be empty");
        }
        let too_long = [&self.name, &self.principal, &self.host]
            .iter()
            .any(|s| s.len() > ACL_FIELD_MAX_BYTES);
        if too_long {
            return Err("a resource name, principal or host is longer than 1024 bytes");
        }
        if self.resource_type == ResourceType::Cluster && self.name != CLUSTER_NAME {
            return Err("the only valid name for the CLUSTER resource is kafka-cluster");
        }
        match self.principal.split_once(':') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
            _ => return Err("the principal must be TYPE:NAME, e.g. User:alice"),
        }
        if self.host.is_empty() {
            return Err("the host must be * or an address");
        }
        Ok(())
    }

    /// Whether this binding's resource pattern covers resource `name` of type `rt`.
    pub fn covers(&self, rt: ResourceType, name: &str) -> bool {
        if self.resource_type != rt {
            return false;
        }
        match self.pattern {
            PatternType::Literal => self.name == name || self.name == WILDCARD,
            PatternType::Prefixed => name.starts_with(self.name.as_str()),
        }
    }

    /// Whether this binding applies to a connection of `principal` from `host`.
    pub fn applies_to(&self, principal: &str, host: &str) -> bool {
        let who = self.principal == principal || self.principal == WILDCARD_PRINCIPAL;
        let from = self.host == WILDCARD || self.host == host;
        who && from
    }
}

/// A pattern filter's pattern type: Kafka's ANY (every pattern type, the name compared
/// as is), MATCH (every binding that would apply to the named resource), or one type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PatternFilter {
    Any,
    Match,
    Exactly(PatternType),
}

impl PatternFilter {
    pub fn from_code(code: i8) -> Option<PatternFilter> {
        match code {
            1 => Some(PatternFilter::Any),
            2 => Some(PatternFilter::Match),
            c => PatternType::from_code(c).map(PatternFilter::Exactly),
        }
    }
}

/// A DescribeAcls / DeleteAcls filter: `None` fields match anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclFilter {
    pub resource_type: Option<ResourceType>,
    pub name: Option<String>,
    pub pattern: PatternFilter,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<Operation>,
    pub permission: Option<Permission>,
}

impl AclFilter {
    /// A filter from wire codes; `Err` for an unknown or UNKNOWN code (Kafka answers
    /// INVALID_REQUEST). ANY (1) becomes `None`.
    pub fn from_wire(
        codes: (i8, i8, i8, i8),
        name: Option<String>,
        principal: Option<String>,
        host: Option<String>,
    ) -> Result<AclFilter, &'static str> {
        let (rt, pattern, op, perm) = codes;
        const ANY: i8 = 1;
        let resource_type = match rt {
            ANY => None,
            c => Some(ResourceType::from_code(c).ok_or("unknown resource type")?),
        };
        let pattern = PatternFilter::from_code(pattern).ok_or("unknown pattern type")?;
        let operation = match op {
            ANY => None,
            c => Some(Operation::from_code(c).ok_or("unknown operation")?),
        };
        let permission = match perm {
            ANY => None,
            c => Some(Permission::from_code(c).ok_or("unknown permission type")?),
        };
        Ok(AclFilter {
            resource_type,
            name,
            pattern,
            principal,
            host,
            operation,
            permission,
        })
    }

    /// Kafka's `AclBindingFilter.matches`.
    pub fn matches(&self, b: &AclBinding) -> bool {
        self.pattern_matches(b) && self.entry_matches(b)
    }

    fn pattern_matches(&self, b: &AclBinding) -> bool {
        if self.resource_type.is_some_and(|rt| rt != b.resource_type) {
            return false;
        }
        if let PatternFilter::Exactly(p) = self.pattern
            && p != b.pattern
        {
            return false;
        }
        let Some(name) = &self.name else {
            return true;
        };
        match self.pattern {
            PatternFilter::Any | PatternFilter::Exactly(_) => *name == b.name,
            PatternFilter::Match => match b.pattern {
                PatternType::Literal => *name == b.name || b.name == WILDCARD,
                PatternType::Prefixed => name.starts_with(b.name.as_str()),
            },
        }
    }

    fn entry_matches(&self, b: &AclBinding) -> bool {
        self.principal.as_ref().is_none_or(|p| *p == b.principal)
            && self.host.as_ref().is_none_or(|h| *h == b.host)
            && self.operation.is_none_or(|o| o == b.operation)
            && self.permission.is_none_or(|p| p == b.permission)
    }
}

/// Kafka's decision for one (operation, resource) over `bindings` that already apply to
/// the connection's principal and host: a matching DENY wins over any ALLOW; with no
/// matching binding, `None` (the caller applies `allow.everyone.if.no.acl.found`).
pub fn decide<'a>(
    bindings: impl Iterator<Item = &'a AclBinding>,
    op: Operation,
    rt: ResourceType,
    name: &str,
) -> Option<bool> {
    let mut allowed = None;
    for b in bindings.filter(|b| b.covers(rt, name)) {
        match b.permission {
            Permission::Deny if b.operation.denies(op) => return Some(false),
            Permission::Allow if b.operation.allows(op) => allowed = Some(true),
            _ => {}
        }
    }
    allowed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(rt: ResourceType, name: &str, pattern: PatternType, op: Operation) -> AclBinding {
        AclBinding {
            resource_type: rt,
            name: name.into(),
            pattern,
            principal: "User:alice".into(),
            host: WILDCARD.into(),
            operation: op,
            permission: Permission::Allow,
        }
    }

    #[test]
    fn implied_operations_and_deny_wins() {
        assert!(Operation::Read.allows(Operation::Describe));
        assert!(Operation::AlterConfigs.allows(Operation::DescribeConfigs));
        assert!(!Operation::Describe.allows(Operation::Read));
        assert!(Operation::All.allows(Operation::IdempotentWrite));
        assert!(!Operation::Describe.denies(Operation::Read));
        let read = acl(
            ResourceType::Topic,
            "t",
            PatternType::Literal,
            Operation::Read,
        );
        let mut deny = read.clone();
        deny.permission = Permission::Deny;
        let topic = ResourceType::Topic;
        assert_eq!(
            decide([&read].into_iter(), Operation::Describe, topic, "t"),
            Some(true)
        );
        assert_eq!(
            decide([&read, &deny].into_iter(), Operation::Read, topic, "t"),
            Some(false)
        );
        assert_eq!(
            decide([&read].into_iter(), Operation::Write, topic, "t"),
            None
        );
        assert_eq!(
            decide([&read].into_iter(), Operation::Read, topic, "u"),
            None
        );
    }

    #[test]
    fn literal_wildcard_and_prefixed_patterns() {
        let topic = ResourceType::Topic;
        let star = acl(topic, "*", PatternType::Literal, Operation::Read);
        let pre = acl(topic, "app.", PatternType::Prefixed, Operation::Read);
        assert!(star.covers(topic, "anything"));
        assert!(!star.covers(ResourceType::Group, "anything"));
        assert!(pre.covers(topic, "app.orders"));
        assert!(!pre.covers(topic, "ap"));
        let any_app = AclFilter {
            resource_type: None,
            name: Some("app.orders".into()),
            pattern: PatternFilter::Match,
            principal: None,
            host: None,
            operation: None,
            permission: None,
        };
        assert!(any_app.matches(&pre) && any_app.matches(&star));
        let exact = AclFilter {
            pattern: PatternFilter::Any,
            ..any_app.clone()
        };
        assert!(!exact.matches(&pre), "ANY compares the name as is");
        let literal_only = AclFilter {
            name: None,
            pattern: PatternFilter::Exactly(PatternType::Literal),
            ..any_app
        };
        assert!(literal_only.matches(&star) && !literal_only.matches(&pre));
    }

    #[test]
    fn bindings_are_validated_like_kafka() {
        let ok = acl(
            ResourceType::Cluster,
            CLUSTER_NAME,
            PatternType::Literal,
            Operation::Alter,
        );
        assert!(ok.validate().is_ok());
        let bad_cluster = AclBinding {
            name: "other".into(),
            ..ok.clone()
        };
        assert!(bad_cluster.validate().is_err());
        let bad_principal = AclBinding {
            principal: "alice".into(),
            ..ok
        };
        assert!(bad_principal.validate().is_err());
    }
}
