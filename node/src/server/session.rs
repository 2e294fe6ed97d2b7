//! What one connection is, beyond its bytes: the client's address, the listener it came
//! through (which decides the advertised address and the security protocol), the
//! principal it acts as (for the authorizer), where it is in SASL, and its cached ACL
//! decisions.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::security::acl::{Operation, ResourceType};
use crate::security::authorizer::{AclCache, AuthorizerSettings};
use crate::security::sasl::SaslState;
use crate::security::{ANONYMOUS, ListenerSetup};

pub struct Session {
    pub peer: SocketAddr,
    pub listener: Arc<ListenerSetup>,
    principal: RefCell<String>,
    pub sasl: RefCell<SaslState>,
    /// The client's address as ACL hosts name it.
    host: String,
    acl: RefCell<AclCache>,
}

impl Session {
    /// A new connection; `tls_principal` is the client certificate's principal, if any.
    pub fn new(
        peer: SocketAddr,
        listener: Arc<ListenerSetup>,
        tls_principal: Option<String>,
    ) -> Session {
        let sasl = match listener.sasl {
            Some(_) => SaslState::Handshake,
            None => SaslState::NotRequired,
        };
        Session {
            peer,
            listener,
            principal: RefCell::new(tls_principal.unwrap_or_else(|| ANONYMOUS.to_string())),
            sasl: RefCell::new(sasl),
            // An IPv4 client of a dual-stack (`[::]`) listener arrives as `::ffff:a.b.c.d`:
            // ACLs name its IPv4 address, as Kafka's do.
            host: peer.ip().to_canonical().to_string(),
            acl: RefCell::new(AclCache::default()),
        }
    }

    /// The principal: `User:ANONYMOUS`, `User:CN=...` (client certificate) or
    /// `User:NAME` (SASL).
    pub fn principal(&self) -> String {
        self.principal.borrow().clone()
    }

    /// Sets the principal once SASL authentication succeeded.
    pub fn authenticated_as(&self, principal: String) {
        assert!(
            self.sasl.borrow().is_open(),
            "the principal changes only when authentication completes"
        );
        *self.principal.borrow_mut() = principal;
        self.acl.borrow_mut().clear();
    }

    /// Whether this connection may do `op` on resource `name` of type `rt`, given the
    /// metadata image `(version, catalog)`. Enabled-ness is the caller's check.
    pub fn authorize(
        &self,
        settings: &AuthorizerSettings,
        image: (u64, &std::sync::Arc<crate::metadata::Catalog>),
        what: (Operation, ResourceType, &str),
    ) -> bool {
        let principal = self.principal.borrow();
        if settings.is_super(&principal) {
            return true;
        }
        let who = (principal.as_str(), self.host.as_str());
        self.acl.borrow_mut().allowed(settings, image, who, what)
    }

    /// Whether some resource of type `rt` allows `op` (Kafka's `authorizeByResourceType`).
    pub fn authorize_some(
        &self,
        settings: &AuthorizerSettings,
        image: (u64, &std::sync::Arc<crate::metadata::Catalog>),
        what: (Operation, ResourceType),
    ) -> bool {
        let principal = self.principal.borrow();
        if settings.is_super(&principal) {
            return true;
        }
        let who = (principal.as_str(), self.host.as_str());
        self.acl
            .borrow_mut()
            .allowed_on_some(settings, image, who, what)
    }

    /// Whether requests beyond the SASL ones may be served.
    pub fn is_open(&self) -> bool {
        self.sasl.borrow().is_open()
    }

    /// Whether authentication failed (the connection closes after the answer).
    pub fn has_failed(&self) -> bool {
        matches!(*self.sasl.borrow(), SaslState::Failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_client_of_a_dual_stack_listener_has_its_ipv4_host() {
        let setup = Arc::new(ListenerSetup {
            config: crate::security::listener::ListenerConfig {
                name: "PLAINTEXT".into(),
                protocol: crate::security::listener::SecurityProtocol::Plaintext,
                bind: "[::]:9092".parse().expect("address"),
                advertised: None,
            },
            advertised: ("localhost".into(), 9092),
            tls: None,
            sasl: None,
        });
        let mapped: SocketAddr = "[::ffff:10.0.0.5]:9092".parse().expect("address");
        assert_eq!(Session::new(mapped, setup.clone(), None).host, "10.0.0.5");
        let v6: SocketAddr = "[2001:db8::1]:9092".parse().expect("address");
        assert_eq!(Session::new(v6, setup, None).host, "2001:db8::1");
    }
}
