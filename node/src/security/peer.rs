//! The client side of node-to-node connections in Kafka's keys: which listener a node
//! uses to reach its peers (`inter.broker.listener.name`, else the listener of
//! `security.inter.broker.protocol`, else the first listener), TLS towards it (the
//! listener's truststore and keystore) and SASL (`sasl.mechanism.inter.broker.protocol`
//! with the `username`/`password` of `listener.name.<l>.<mechanism>.sasl.jaas.config`).
//! The controller port's TLS and SASL come from the first of `controller.listener.names`
//! the same way ([`controller_tls`], [`controller_sasl`]; the mechanism from
//! `sasl.mechanism.controller.protocol`, PLAIN only).
//!
//! Resolved once at startup into a process-wide [`PeerSetup`]: replica fetchers, remote
//! transaction markers and the other node-to-node clients connect on many shards and
//! tasks, and a global keeps them from threading it through every constructor.

use std::sync::{Arc, OnceLock};

use super::listener::{ListenerConfig, SecurityProtocol};
use super::sasl::{Mechanism, SaslSetup};
use super::tls::listener_prop;
use crate::config::{Config, Properties};

/// Kafka's default `sasl.mechanism.inter.broker.protocol` is GSSAPI, which weir does not
/// have; PLAIN is its default.
pub const INTER_BROKER_MECHANISM_DEFAULT: &str = "PLAIN";

/// SASL credentials a node authenticates to its peers with.
#[derive(Clone)]
pub struct PeerSasl {
    pub mechanism: Mechanism,
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for PeerSasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password in a log line.
        write!(f, "{} as {}", self.mechanism.name(), self.user)
    }
}

/// How this node speaks to its peers' inter-broker listener.
#[derive(Clone)]
pub struct PeerSetup {
    /// The inter-broker listener's name (the peers' listener of the same name).
    pub listener: String,
    pub protocol: SecurityProtocol,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub sasl: Option<PeerSasl>,
}

static PEER: OnceLock<PeerSetup> = OnceLock::new();

/// Kafka's key for the mechanism a node authenticates to the controllers with.
pub const CONTROLLER_MECHANISM_KEY: &str = "sasl.mechanism.controller.protocol";

/// TLS on the controller port (Raft RPCs, forwarded writes, heartbeats) when the first
/// name of `controller.listener.names` maps to SSL or SASL_SSL in
/// `listener.security.protocol.map`: its `listener.name.<controller>.ssl.*` keys (else
/// the global `ssl.*`) give both sides.
#[derive(Clone)]
pub struct ControllerTls {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
}

/// SASL on the controller port when the controller listener maps to SASL_PLAINTEXT or
/// SASL_SSL: PLAIN only (`sasl.mechanism.controller.protocol`), the users of the
/// listener's `listener.name.<controller>.plain.sasl.jaas.config` (`user_NAME="PW"`, or
/// `sasl.plain.users`) accepted, its `username`/`password` presented.
#[derive(Clone)]
pub struct ControllerSasl {
    pub server: SaslSetup,
    pub client: PeerSasl,
}

/// The controller port's security (both `None`: plain TCP, the default).
struct ControllerSecurity {
    tls: Option<ControllerTls>,
    sasl: Option<ControllerSasl>,
}

static CONTROLLER: OnceLock<ControllerSecurity> = OnceLock::new();

/// The controller port's TLS (`None`: plain TCP, the default).
pub fn controller_tls() -> Option<&'static ControllerTls> {
    CONTROLLER.get().and_then(|c| c.tls.as_ref())
}

/// The controller port's SASL (`None`: connections are not authenticated, the default).
pub fn controller_sasl() -> Option<&'static ControllerSasl> {
    CONTROLLER.get().and_then(|c| c.sasl.as_ref())
}

fn build_controller(config: &Config) -> anyhow::Result<ControllerSecurity> {
    const KEY: &str = "controller.listener.names";
    let none = ControllerSecurity {
        tls: None,
        sasl: None,
    };
    let name = config
        .props
        .get(KEY)
        .and_then(|v| v.split(',').map(str::trim).find(|n| !n.is_empty()));
    // A single node has no controller port (see `build`).
    let Some(name) = name.filter(|_| !config.quorum_voters.is_empty()) else {
        return Ok(none);
    };
    let protocol = super::listener::protocol_of(&config.props, name)?;
    let Some(protocol) = protocol else {
        return Ok(none);
    };
    let tls = match protocol.is_tls() {
        true => Some(ControllerTls {
            server: super::tls::setup(&config.props, name)?.config,
            client: super::tls::client_config(&config.props, name)?,
        }),
        false => None,
    };
    let sasl = match protocol.is_sasl() {
        true => Some(controller_sasl_setup(&config.props, name)?),
        false => None,
    };
    Ok(ControllerSecurity { tls, sasl })
}

fn controller_sasl_setup(props: &Properties, listener: &str) -> anyhow::Result<ControllerSasl> {
    let client = sasl_credentials(props, listener, CONTROLLER_MECHANISM_KEY)?;
    if client.mechanism != Mechanism::Plain {
        anyhow::bail!(
            "{CONTROLLER_MECHANISM_KEY}={}: the controller port takes PLAIN only (SCRAM credentials live in the metadata the quorum replicates, which a new voter does not have yet)",
            client.mechanism.name()
        );
    }
    // Only the controller listener's own credentials log in here (its
    // `listener.name.<l>.` keys): the client listeners' users, from the unprefixed keys,
    // must not reach the quorum's RPCs.
    let own = props.without(&["sasl.plain.users", "sasl.jaas.config"]);
    let server = super::sasl::setup(&own, listener)?;
    if !server.mechanisms.contains(&Mechanism::Plain) {
        anyhow::bail!(
            "listener {listener}: sasl.enabled.mechanisms must include PLAIN on the controller listener"
        );
    }
    // Every voter logs in to the others with its own credentials: if its own controller
    // port would not take them, the others (configured alike) will not either. Said at
    // startup, since a quorum that never forms is harder to read than this line.
    if !server.check_plain(&client.user, &client.password) {
        let l = listener.to_ascii_lowercase();
        tracing::warn!(
            "listener {listener}: the controller port does not accept this node's own controller user {:?}; list it in listener.name.{l}.plain.sasl.jaas.config (user_NAME=\"PASSWORD\") or listener.name.{l}.sasl.plain.users, or the other voters will refuse it too",
            client.user
        );
    }
    Ok(ControllerSasl { server, client })
}

/// The inter-broker listener of `config` (see the module doc).
pub fn inter_broker_listener(config: &Config) -> &ListenerConfig {
    let named = config
        .props
        .get("inter.broker.listener.name")
        .and_then(|n| {
            config
                .listeners
                .iter()
                .find(|l| l.name.eq_ignore_ascii_case(n.trim()))
        });
    let by_protocol = || {
        let p = config
            .props
            .get("security.inter.broker.protocol")
            .and_then(SecurityProtocol::parse)?;
        config.listeners.iter().find(|l| l.protocol == p)
    };
    // `listeners` always holds at least one listener (checked when it was parsed).
    named.or_else(by_protocol).unwrap_or(&config.listeners[0])
}

/// Builds the peer setup from `config` (errors name the key) and makes it the process's.
pub fn init(config: &Config) -> anyhow::Result<()> {
    let setup = build(config)?;
    let controller = build_controller(config)?;
    if controller.tls.is_some() {
        tracing::info!("the controller port speaks TLS (controller.listener.names)");
    }
    if let Some(sasl) = &controller.sasl {
        tracing::info!(sasl = ?sasl.client, "the controller port asks for SASL (controller.listener.names)");
    }
    let _ = CONTROLLER.set(controller);
    tracing::info!(
        listener = %setup.listener,
        protocol = setup.protocol.name(),
        sasl = ?setup.sasl,
        "node-to-node connections use the inter-broker listener"
    );
    // A second init (tests starting several nodes in one process) keeps the first.
    let _ = PEER.set(setup);
    Ok(())
}

/// The process's peer setup (`None` before [`init`]: plaintext).
pub fn get() -> Option<&'static PeerSetup> {
    PEER.get()
}

fn build(config: &Config) -> anyhow::Result<PeerSetup> {
    let l = inter_broker_listener(config);
    // A single node (no `controller.quorum.voters`) has no peers to dial: it needs no
    // inter-broker credentials or truststore, so a lone SASL or SSL listener still starts
    // with the zero-config keys.
    if config.quorum_voters.is_empty() {
        return Ok(PeerSetup {
            listener: l.name.clone(),
            protocol: l.protocol,
            tls: None,
            sasl: None,
        });
    }
    let tls = match l.protocol.is_tls() {
        true => Some(super::tls::client_config(&config.props, &l.name)?),
        false => None,
    };
    let sasl = match l.protocol.is_sasl() {
        true => Some(sasl_credentials(
            &config.props,
            &l.name,
            "sasl.mechanism.inter.broker.protocol",
        )?),
        false => None,
    };
    Ok(PeerSetup {
        listener: l.name.clone(),
        protocol: l.protocol,
        tls,
        sasl,
    })
}

/// The SASL credentials this node presents on `listener`, by the mechanism `key` names
/// (PLAIN when unset).
fn sasl_credentials(props: &Properties, listener: &str, key: &str) -> anyhow::Result<PeerSasl> {
    let name = props.get(key).unwrap_or(INTER_BROKER_MECHANISM_DEFAULT);
    let mechanism = Mechanism::parse(name).ok_or_else(|| {
        anyhow::anyhow!("{key}={name}: not supported (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
    })?;
    let jaas_key = format!(
        "listener.name.{}.{}.sasl.jaas.config",
        listener.to_ascii_lowercase(),
        mechanism.name().to_ascii_lowercase()
    );
    let jaas = props
        .get(&jaas_key)
        .or_else(|| listener_prop(props, listener, "sasl.jaas.config"))
        .ok_or_else(|| {
            anyhow::anyhow!("listener {listener}: node-to-node SASL needs {jaas_key} (username=\"..\" password=\"..\")")
        })?;
    let user = jaas_option(jaas, "username");
    let password = jaas_option(jaas, "password");
    match (user, password) {
        (Some(user), Some(password)) => Ok(PeerSasl {
            mechanism,
            user,
            password,
        }),
        _ => anyhow::bail!("{jaas_key}: needs username=\"..\" and password=\"..\""),
    }
}

/// The quoted value of option `name` in a JAAS line (`name="value"`).
fn jaas_option(jaas: &str, name: &str) -> Option<String> {
    let mut rest = jaas;
    while let Some(at) = rest.find(name) {
        let before_ok = at == 0
            || rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_whitespace() || c == ';');
        let after = rest[at + name.len()..].trim_start();
        if before_ok && let Some(value) = after.strip_prefix('=') {
            let quoted = value.trim_start().strip_prefix('"')?;
            let close = quoted.find('"')?;
            return Some(quoted[..close].to_string());
        }
        rest = &rest[at + name.len()..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_port_takes_only_its_own_sasl_users() {
        let text = "controller.listener.names=CONTROLLER\n\
            sasl.plain.users=bob:pw\n\
            sasl.jaas.config=PlainLoginModule required user_carol=\"pw\";\n\
            listener.name.controller.plain.sasl.jaas.config=PlainLoginModule required username=\"controller\" password=\"c\" user_controller=\"c\";\n";
        let props = Properties::parse(text, "test").expect("properties");
        let setup = controller_sasl_setup(&props, "CONTROLLER").expect("controller SASL");
        assert!(setup.server.check_plain("controller", "c"));
        assert!(
            !setup.server.check_plain("bob", "pw"),
            "a client listener's user"
        );
        assert!(
            !setup.server.check_plain("carol", "pw"),
            "a client listener's user"
        );
    }

    #[test]
    fn unprefixed_jaas_users_do_not_log_in_to_the_controller_port() {
        // The node's own credentials still come from the unprefixed JAAS line (the client
        // side's fallback), its users do not: the startup warning says so.
        let text = "controller.listener.names=CONTROLLER\n\
            sasl.jaas.config=PlainLoginModule required username=\"admin\" password=\"x\" user_admin=\"x\";\n";
        let props = Properties::parse(text, "test").expect("properties");
        let setup = controller_sasl_setup(&props, "CONTROLLER").expect("controller SASL");
        assert_eq!(setup.client.user, "admin");
        assert!(!setup.server.check_plain("admin", "x"));
    }

    #[test]
    fn jaas_username_and_password_are_read() {
        let jaas = r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="s3cr=t" user_admin="x";"#;
        assert_eq!(jaas_option(jaas, "username").as_deref(), Some("admin"));
        assert_eq!(jaas_option(jaas, "password").as_deref(), Some("s3cr=t"));
        assert_eq!(jaas_option("required;", "password"), None);
    }
}
