//! Security: listeners and their protocols ([`listener`]), TLS ([`tls`]), SASL
//! ([`sasl`], [`scram`]) and the principal a connection acts as. The connection side
//! (transport, session) is in `server/`; the SASL and SCRAM APIs in `api/sasl.rs`.

pub mod acl;
pub mod authorizer;
pub mod listener;
pub mod peer;
pub mod sasl;
/// SCRAM's messages live in `wire`, shared with the load generator's client.
pub use wire::scram;
pub mod scram_bootstrap;
pub mod tls;

use crate::config::Config;
use listener::ListenerConfig;

/// Kafka's principal of a connection that did not authenticate (PLAINTEXT, or SSL
/// without a client certificate).
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// One listener, ready to serve: its configuration, the address it is advertised as, and
/// its TLS and SASL setup. Shared by every shard.
pub struct ListenerSetup {
    pub config: ListenerConfig,
    /// `host:port` given in Metadata and FindCoordinator to clients of this listener.
    pub advertised: (String, u16),
    pub tls: Option<tls::TlsSetup>,
    pub sasl: Option<sasl::SaslSetup>,
}

impl ListenerSetup {
    /// Builds the TLS and SASL setup the listener's protocol needs (errors name the key).
    pub fn new(
        node: &Config,
        config: ListenerConfig,
        advertised: (String, u16),
    ) -> anyhow::Result<ListenerSetup> {
        let tls = match config.protocol.is_tls() {
            true => Some(tls::setup(&node.props, &config.name)?),
            false => None,
        };
        let sasl = match config.protocol.is_sasl() {
            true => Some(sasl::setup(&node.props, &config.name)?),
            false => None,
        };
        Ok(ListenerSetup {
            config,
            advertised,
            tls,
            sasl,
        })
    }
}
