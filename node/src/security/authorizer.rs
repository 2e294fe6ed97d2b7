//! The authorizer: whether a connection's principal may do an operation on a resource,
//! from the ACLs in the cluster metadata, `super.users` and
//! `allow.everyone.if.no.acl.found`. Enabled by Kafka's `authorizer.class.name`.
//!
//! Cheap on the data path: each connection keeps the bindings that apply to its principal
//! and host, and a decision per (resource, operation), both rebuilt only when the metadata
//! image's version moved (one atomic load per check). A cached decision is a hash lookup
//! by `&str`, no allocation.

use std::collections::HashMap;
use std::sync::Arc;

use super::acl::{self, AclBinding, Operation, ResourceType};
use crate::config::{ConfigError, Properties};
use crate::metadata::Catalog;

/// Most decisions one connection caches per resource type; past it the cache starts
/// over (a client naming ever new topics cannot grow it without bound).
pub const DECISIONS_PER_CONNECTION_MAX: usize = 10_000;

/// Longest resource name whose decision is cached (topic names stop at 249 bytes); longer
/// ones are decided each time, so one connection's cache stays within ~2.5 MB per type.
pub const CACHED_NAME_BYTES_MAX: usize = 256;

/// The authorizer's settings (Kafka's keys).
#[derive(Debug, Clone, Default)]
pub struct AuthorizerSettings {
    /// `authorizer.class.name` is set (any non-empty value turns weir's authorizer on).
    pub enabled: bool,
    /// `super.users`: `User:a;User:b`, allowed everything.
    pub super_users: Vec<String>,
    /// `allow.everyone.if.no.acl.found` (default false): a resource with no ACL at all is
    /// open to everyone.
    pub allow_everyone_if_no_acl_found: bool,
}

impl AuthorizerSettings {
    pub fn resolve(props: &Properties) -> Result<AuthorizerSettings, ConfigError> {
        let enabled = props
            .get("authorizer.class.name")
            .is_some_and(|v| !v.trim().is_empty());
        let super_users = props
            .get("super.users")
            .unwrap_or("")
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        Ok(AuthorizerSettings {
            enabled,
            super_users,
            allow_everyone_if_no_acl_found: props
                .parse_bool("allow.everyone.if.no.acl.found", false)?,
        })
    }

    pub fn is_super(&self, principal: &str) -> bool {
        self.super_users.iter().any(|s| s == principal)
    }
}

/// Decided operations of one resource: `known` bits were decided, `allowed` bits allowed.
#[derive(Clone, Copy, Default)]
struct Decided {
    known: u16,
    allowed: u16,
}

/// One connection's view of the ACLs (kept in its session).
#[derive(Default)]
pub struct AclCache {
    /// Image version the cache was built from; 0 = never built.
    version: u64,
    catalog: Arc<Catalog>,
    /// Bindings that apply to this connection's principal and host.
    mine: Vec<AclBinding>,
    decisions: [HashMap<String, Decided>; 4],
}

impl AclCache {
    /// Forgets everything (the principal changed).
    pub fn clear(&mut self) {
        *self = AclCache::default();
    }

    /// The decision for `principal` at `host`, from the image `catalog` at `version`.
    pub fn allowed(
        &mut self,
        settings: &AuthorizerSettings,
        (version, catalog): (u64, &Arc<Catalog>),
        (principal, host): (&str, &str),
        (op, rt, name): (Operation, ResourceType, &str),
    ) -> bool {
        if self.version != version {
            self.rebuild(version, catalog, principal, host);
        }
        let table = &mut self.decisions[rt.index()];
        if let Some(d) = table.get(name)
            && d.known & op.bit() != 0
        {
            return d.allowed & op.bit() != 0;
        }
        let found = acl::decide(self.mine.iter(), op, rt, name);
        let allowed = found.unwrap_or_else(|| {
            // Kafka: the default applies only to a resource no ACL names at all (any
            // principal); a resource with ACLs for others is closed to this one.
            settings.allow_everyone_if_no_acl_found
                && !self.catalog.acls.iter().any(|b| b.covers(rt, name))
        });
        // Names no valid resource has are decided, not remembered: a client sending
        // megabyte-long names would otherwise hold megabytes per cached decision.
        if name.len() > CACHED_NAME_BYTES_MAX {
            return allowed;
        }
        if table.len() >= DECISIONS_PER_CONNECTION_MAX {
            table.clear();
        }
        let d = table.entry(name.to_string()).or_default();
        d.known |= op.bit();
        if allowed {
            d.allowed |= op.bit();
        }
        allowed
    }

    /// Kafka's `authorizeByResourceType`: whether some resource of type `rt` allows `op`
    /// (an ALLOW binding that is not under a DENY of the same reach), or no ACL names the
    /// type at all and `allow.everyone.if.no.acl.found` is set. Not cached: only
    /// InitProducerId asks.
    pub fn allowed_on_some(
        &mut self,
        settings: &AuthorizerSettings,
        (version, catalog): (u64, &Arc<Catalog>),
        (principal, host): (&str, &str),
        (op, rt): (Operation, ResourceType),
    ) -> bool {
        if self.version != version {
            self.rebuild(version, catalog, principal, host);
        }
        let denies_all = self.mine.iter().any(|b| {
            b.resource_type == rt
                && b.permission == acl::Permission::Deny
                && b.operation.denies(op)
                && b.pattern == acl::PatternType::Literal
                && b.name == acl::WILDCARD
        });
        if denies_all {
            return false;
        }
        let allows = self.mine.iter().any(|b| {
            b.resource_type == rt
                && b.permission == acl::Permission::Allow
                && b.operation.allows(op)
                && acl::decide(self.mine.iter(), op, rt, &b.name) != Some(false)
        });
        allows
            || settings.allow_everyone_if_no_acl_found
                && !self.catalog.acls.iter().any(|b| b.resource_type == rt)
    }

    fn rebuild(&mut self, version: u64, catalog: &Arc<Catalog>, principal: &str, host: &str) {
        self.version = version;
        self.catalog = catalog.clone();
        self.mine = catalog
            .acls
            .iter()
            .filter(|b| b.applies_to(principal, host))
            .cloned()
            .collect();
        for table in &mut self.decisions {
            table.clear();
        }
        assert!(self.version != 0, "a built cache has a version");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::acl::{PatternType, Permission};

    fn binding(principal: &str, name: &str, op: Operation, perm: Permission) -> AclBinding {
        AclBinding {
            resource_type: ResourceType::Topic,
            name: name.into(),
            pattern: PatternType::Literal,
            principal: principal.into(),
            host: "*".into(),
            operation: op,
            permission: perm,
        }
    }

    #[test]
    fn decisions_follow_the_image_version_and_the_no_acl_default() {
        let settings = AuthorizerSettings {
            enabled: true,
            super_users: vec!["User:admin".into()],
            allow_everyone_if_no_acl_found: true,
        };
        let mut c = Catalog::default();
        c.acls
            .insert(binding("User:bob", "t", Operation::Read, Permission::Allow));
        let c1 = Arc::new(c.clone());
        let mut cache = AclCache::default();
        let who = ("User:alice", "127.0.0.1");
        let read = |name| (Operation::Read, ResourceType::Topic, name);
        assert!(
            !cache.allowed(&settings, (1, &c1), who, read("t")),
            "t has ACLs"
        );
        assert!(
            cache.allowed(&settings, (1, &c1), who, read("u")),
            "u has none"
        );
        c.acls.insert(binding(
            "User:alice",
            "t",
            Operation::All,
            Permission::Allow,
        ));
        let c2 = Arc::new(c);
        assert!(
            !cache.allowed(&settings, (1, &c2), who, read("t")),
            "cached"
        );
        assert!(
            cache.allowed(&settings, (2, &c2), who, read("t")),
            "new image"
        );
        // A name no resource can have is decided (the default: no ACL names it) but not
        // kept: a megabyte name would otherwise be held per cached decision.
        let long = "g".repeat(1 << 20);
        assert!(cache.allowed(&settings, (2, &c2), who, read(long.as_str())));
        let kept: usize = cache
            .decisions
            .iter()
            .flat_map(|t| t.keys())
            .map(String::len)
            .sum();
        assert!(kept < 1024, "{kept} bytes of names cached");
        assert!(settings.is_super("User:admin") && !settings.is_super("User:alice"));
        assert!(cache.allowed_on_some(
            &settings,
            (2, &c2),
            who,
            (Operation::Write, ResourceType::Topic)
        ));
    }
}
