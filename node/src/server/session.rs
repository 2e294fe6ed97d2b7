//! What one connection is, beyond its bytes: the client's address, the listener it came
//! through (which decides the advertised address and the security protocol), the
//! principal it acts as (for the authorizer), where it is in SASL (and, KIP-368, when
//! its authenticated session expires and whether it is re-authenticating), and its
//! cached ACL decisions.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::security::acl::{Operation, ResourceType};
use crate::security::authorizer::{AclCache, AuthorizerSettings};
use crate::security::sasl::{Mechanism, SaslState};
use crate::security::{ANONYMOUS, ListenerSetup};

pub struct Session {
    pub peer: SocketAddr,
    pub listener: Arc<ListenerSetup>,
    principal: RefCell<String>,
    pub sasl: RefCell<SaslState>,
    /// The client's address as ACL hosts name it.
    host: String,
    acl: RefCell<AclCache>,
    /// KIP-368: when the authenticated session ends (`None`: it does not). Past it, any
    /// request but SaslHandshake closes the connection.
    expires_at: Cell<Option<Instant>>,
    /// The mechanism the last successful SaslHandshake chose.
    mechanism: Cell<Option<Mechanism>>,
    /// While the client re-authenticates: the login it must repeat.
    reauth: RefCell<Option<Reauth>>,
    /// When the last re-authentication began: Kafka starts at most one a second, so a
    /// client cannot make the broker run SCRAM's key derivation in a loop.
    reauth_began: Cell<Option<Instant>>,
}

/// Shortest time between the starts of two re-authentications of one connection (Kafka's
/// `MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS`); a SaslHandshake sooner is refused as an
/// unexpected handshake (ILLEGAL_SASL_STATE), the session is unchanged.
pub const REAUTH_INTERVAL_MIN: Duration = Duration::from_secs(1);

/// What a re-authentication must keep: Kafka refuses a change of principal or mechanism.
#[derive(Debug, Clone)]
struct Reauth {
    principal: String,
    mechanism: Mechanism,
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
            expires_at: Cell::new(None),
            mechanism: Cell::new(None),
            reauth: RefCell::new(None),
            reauth_began: Cell::new(None),
        }
    }

    /// The principal: `User:ANONYMOUS`, `User:CN=...` (client certificate) or
    /// `User:NAME` (SASL).
    pub fn principal(&self) -> String {
        self.principal.borrow().clone()
    }

    /// Sets the principal once SASL authentication succeeded, and the session's end
    /// (`lifetime`: KIP-368's, `None` for none). Returns whether this was a
    /// re-authentication (which [`Session::reauth_refusal`] checked kept the principal).
    pub fn authenticated_as(
        &self,
        principal: String,
        lifetime: Option<Duration>,
        now: Instant,
    ) -> bool {
        assert!(
            self.sasl.borrow().is_open(),
            "the principal changes only when authentication completes"
        );
        let reauth = self.reauth.borrow_mut().take();
        if let Some(previous) = &reauth {
            assert_eq!(
                previous.principal, principal,
                "re-authentication kept the principal"
            );
        }
        self.expires_at.set(lifetime.map(|l| now + l));
        *self.principal.borrow_mut() = principal;
        self.acl.borrow_mut().clear();
        reauth.is_some()
    }

    /// The mechanism the last successful SaslHandshake chose.
    pub fn mechanism(&self) -> Option<Mechanism> {
        self.mechanism.get()
    }

    /// Records the mechanism a SaslHandshake chose.
    pub fn chose(&self, mechanism: Mechanism) {
        self.mechanism.set(Some(mechanism));
    }

    /// KIP-368: a SaslHandshake on an authenticated connection begins a re-authentication
    /// when the session has a lifetime and the last one began at least
    /// [`REAUTH_INTERVAL_MIN`] ago (Kafka's rules). The connection then serves nothing
    /// but the SASL requests until the new login completes. Returns whether it began.
    pub fn begin_reauthentication(&self, now: Instant) -> bool {
        if !matches!(*self.sasl.borrow(), SaslState::Done) || self.expires_at.get().is_none() {
            return false;
        }
        let Some(mechanism) = self.mechanism.get() else {
            return false;
        };
        let recent = self
            .reauth_began
            .get()
            .is_some_and(|t| now.saturating_duration_since(t) < REAUTH_INTERVAL_MIN);
        if recent {
            return false;
        }
        self.reauth_began.set(Some(now));
        *self.reauth.borrow_mut() = Some(Reauth {
            principal: self.principal(),
            mechanism,
        });
        *self.sasl.borrow_mut() = SaslState::Handshake;
        true
    }

    /// During a re-authentication, why the login cannot go on: the handshake chose
    /// another mechanism, or (`principal`, once the credentials checked out) the client
    /// logged in as someone else. `None` outside a re-authentication.
    pub fn reauth_refusal(&self, principal: Option<&str>) -> Option<String> {
        let reauth = self.reauth.borrow();
        let previous = reauth.as_ref()?;
        let chosen = self.mechanism.get();
        if chosen != Some(previous.mechanism) {
            let chosen = chosen.map_or("none", Mechanism::name);
            return Some(format!(
                "SASL mechanism {chosen} is not the one being re-authenticated ({})",
                previous.mechanism.name()
            ));
        }
        match principal {
            Some(p) if p != previous.principal => Some(format!(
                "cannot change principals during re-authentication, from {} to {p}",
                previous.principal
            )),
            _ => None,
        }
    }

    /// Whether the connection is re-authenticating (KIP-368).
    pub fn is_reauthenticating(&self) -> bool {
        self.reauth.borrow().is_some()
    }

    /// Whether the authenticated session's lifetime is over at `now` (KIP-368).
    pub fn has_expired(&self, now: Instant) -> bool {
        self.expires_at.get().is_some_and(|end| now >= end)
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

    fn listener() -> Arc<ListenerSetup> {
        Arc::new(ListenerSetup {
            config: crate::security::listener::ListenerConfig {
                name: "PLAINTEXT".into(),
                protocol: crate::security::listener::SecurityProtocol::Plaintext,
                bind: "[::]:9092".parse().expect("address"),
                advertised: None,
            },
            advertised: ("localhost".into(), 9092),
            tls: None,
            sasl: None,
        })
    }

    /// A session authenticated with `m` as `principal`, with `lifetime`, at `now`.
    fn logged_in(
        m: Mechanism,
        principal: &str,
        lifetime: Option<Duration>,
        now: Instant,
    ) -> Session {
        let peer: SocketAddr = "127.0.0.1:5000".parse().expect("address");
        let s = Session::new(peer, listener(), None);
        *s.sasl.borrow_mut() = SaslState::Token(m);
        s.chose(m);
        *s.sasl.borrow_mut() = SaslState::Done;
        assert!(
            !s.authenticated_as(principal.into(), lifetime, now),
            "a first login"
        );
        s
    }

    /// KIP-368's rules: expiry at login + lifetime; a re-authentication begins only with
    /// a lifetime and at most once a second; it must keep mechanism and principal.
    #[test]
    fn reauthentication_keeps_who_and_how_and_renews_the_lifetime() {
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        let none = logged_in(Mechanism::Plain, "User:a", None, t0);
        assert!(!none.has_expired(t0 + 1000 * second));
        assert!(
            !none.begin_reauthentication(t0),
            "no lifetime, no re-authentication"
        );
        let s = logged_in(Mechanism::Plain, "User:a", Some(2 * second), t0);
        assert!(!s.has_expired(t0 + second));
        assert!(s.has_expired(t0 + 2 * second));
        assert!(s.begin_reauthentication(t0 + second));
        assert!(!s.is_open(), "only SASL requests while re-authenticating");
        s.chose(Mechanism::Scram(
            crate::security::scram::ScramMechanism::Sha256,
        ));
        assert!(s.reauth_refusal(None).is_some(), "another mechanism");
        s.chose(Mechanism::Plain);
        assert_eq!(s.reauth_refusal(None), None);
        assert!(
            s.reauth_refusal(Some("User:b")).is_some(),
            "another principal"
        );
        assert_eq!(s.reauth_refusal(Some("User:a")), None);
        *s.sasl.borrow_mut() = SaslState::Done;
        assert!(s.authenticated_as("User:a".into(), Some(2 * second), t0 + second));
        assert!(
            !s.has_expired(t0 + 2 * second),
            "a new lifetime from the re-login"
        );
        assert!(s.has_expired(t0 + 3 * second));
        let soon = t0 + second + second / 2;
        assert!(
            !s.begin_reauthentication(soon),
            "under a second after the last start"
        );
        assert!(s.is_open(), "the session goes on");
        assert!(s.begin_reauthentication(t0 + 2 * second));
    }

    #[test]
    fn an_ipv4_client_of_a_dual_stack_listener_has_its_ipv4_host() {
        let setup = listener();
        let mapped: SocketAddr = "[::ffff:10.0.0.5]:9092".parse().expect("address");
        assert_eq!(Session::new(mapped, setup.clone(), None).host, "10.0.0.5");
        let v6: SocketAddr = "[2001:db8::1]:9092".parse().expect("address");
        assert_eq!(Session::new(v6, setup, None).host, "2001:db8::1");
    }
}
