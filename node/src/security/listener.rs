//! Listeners in Kafka's keys: `listeners` (`NAME://HOST:PORT,...`), `advertised.listeners`,
//! `listener.security.protocol.map` (`NAME:PROTOCOL,...`) and `inter.broker.listener.name`,
//! resolved once at startup into one [`ListenerConfig`] per listener.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::config::{ConfigError, Properties};

/// Most listeners one node may have (each is a socket per shard).
pub const LISTENERS_MAX: usize = 16;

/// Kafka's four security protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn parse(s: &str) -> Option<SecurityProtocol> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Some(SecurityProtocol::Plaintext),
            "SSL" => Some(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Some(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Some(SecurityProtocol::SaslSsl),
            _ => None,
        }
    }

    /// Whether the transport is TLS.
    pub fn is_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether a client must authenticate with SASL before anything else is served.
    pub fn is_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }
}

/// One listener as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerConfig {
    /// Upper-case name (`PLAINTEXT`, `SSL`, `CLIENT`, ...).
    pub name: String,
    pub protocol: SecurityProtocol,
    pub bind: SocketAddr,
    /// `host:port` given to clients that connect through this listener; `None` = the
    /// bound address.
    pub advertised: Option<(String, u16)>,
}

/// Resolves the listeners. `cli_listen` (`--listen HOST:PORT`) replaces the first
/// listener's address; `cli_advertised` its advertised address.
pub fn resolve(
    props: &Properties,
    cli_listen: Option<&str>,
    cli_advertised: Option<&str>,
) -> Result<Vec<ListenerConfig>, ConfigError> {
    let map = protocol_map(props)?;
    let text = props
        .get("listeners")
        .unwrap_or("PLAINTEXT://127.0.0.1:9092");
    let mut listeners = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        // A bare HOST:PORT (weir's older form) is a PLAINTEXT listener.
        let (name, addr) = item.split_once("://").unwrap_or(("PLAINTEXT", item));
        let name = name.trim().to_ascii_uppercase();
        let protocol = map
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                bad(
                    "listeners",
                    text,
                    "listener name not in listener.security.protocol.map",
                )
            })?;
        if listeners.iter().any(|l: &ListenerConfig| l.name == name) {
            return Err(bad("listeners", text, "a listener name is used twice"));
        }
        let bind = parse_addr("listeners", addr)?;
        listeners.push(ListenerConfig {
            name,
            protocol,
            bind,
            advertised: None,
        });
    }
    if listeners.is_empty() || listeners.len() > LISTENERS_MAX {
        return Err(bad("listeners", text, "expected 1..=16 listeners"));
    }
    if let Some(l) = cli_listen {
        listeners[0].bind = parse_addr("--listen", l)?;
    }
    apply_advertised(props, &mut listeners)?;
    if let Some(a) = cli_advertised {
        listeners[0].advertised = Some(parse_advertised("--advertised-listener", a)?);
    }
    check_distinct_ports(&listeners, text)?;
    check_inter_broker(props, &listeners)?;
    Ok(listeners)
}

/// The protocol `listener.security.protocol.map` gives listener `name` (e.g. the
/// controller listener of `controller.listener.names`, which need not be in `listeners`:
/// weir's controller port is the one in `controller.quorum.voters`).
pub fn protocol_of(
    props: &Properties,
    name: &str,
) -> Result<Option<SecurityProtocol>, ConfigError> {
    let map = protocol_map(props)?;
    Ok(map
        .into_iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()))
        .map(|(_, p)| p))
}

/// `listener.security.protocol.map`, Kafka's default mapping each protocol name to itself.
fn protocol_map(props: &Properties) -> Result<Vec<(String, SecurityProtocol)>, ConfigError> {
    const KEY: &str = "listener.security.protocol.map";
    let text = props
        .get(KEY)
        .unwrap_or("PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL");
    let mut map = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let parsed = item
            .split_once(':')
            .and_then(|(n, p)| Some((n.trim().to_ascii_uppercase(), SecurityProtocol::parse(p)?)));
        let entry = parsed.ok_or_else(|| bad(KEY, text, "expected NAME:PROTOCOL[,...]"))?;
        map.push(entry);
    }
    Ok(map)
}

/// `advertised.listeners` by listener name (a bare `HOST:PORT` is the first listener's).
fn apply_advertised(
    props: &Properties,
    listeners: &mut [ListenerConfig],
) -> Result<(), ConfigError> {
    const KEY: &str = "advertised.listeners";
    let Some(text) = props.get(KEY) else {
        return Ok(());
    };
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, addr) = match item.split_once("://") {
            Some((n, a)) => (n.trim().to_ascii_uppercase(), a),
            None => (listeners[0].name.clone(), item),
        };
        let listener = listeners
            .iter_mut()
            .find(|l| l.name == name)
            .ok_or_else(|| bad(KEY, text, "names a listener not in listeners"))?;
        listener.advertised = Some(parse_advertised(KEY, addr)?);
    }
    Ok(())
}

/// An advertised `HOST:PORT`: a client must be able to dial it, so neither an empty
/// host nor a wildcard address (Kafka refuses the "non-routable meta-address" too).
fn parse_advertised(key: &str, v: &str) -> Result<(String, u16), ConfigError> {
    let (host, port) = parse_host_port(key, v)?;
    let wildcard = host
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified());
    if host.is_empty() || wildcard {
        return Err(bad(
            key,
            v,
            "an advertised host must be reachable: not empty or 0.0.0.0",
        ));
    }
    Ok((host, port))
}

/// Two listeners on one port would both bind it (SO_REUSEPORT) and split its clients.
fn check_distinct_ports(listeners: &[ListenerConfig], text: &str) -> Result<(), ConfigError> {
    for (i, a) in listeners.iter().enumerate() {
        let clash = listeners[i + 1..]
            .iter()
            .any(|b| b.bind.port() != 0 && b.bind.port() == a.bind.port());
        if clash {
            return Err(bad("listeners", text, "two listeners share a port"));
        }
    }
    Ok(())
}

/// `inter.broker.listener.name` must name a listener (one node has no peers yet; the key
/// is checked so that a cluster config is not silently wrong).
fn check_inter_broker(props: &Properties, listeners: &[ListenerConfig]) -> Result<(), ConfigError> {
    const KEY: &str = "inter.broker.listener.name";
    match props.get(KEY) {
        Some(n)
            if !listeners
                .iter()
                .any(|l| l.name.eq_ignore_ascii_case(n.trim())) =>
        {
            Err(bad(KEY, n, "names a listener not in listeners"))
        }
        _ => Ok(()),
    }
}

fn bad(key: &str, value: &str, reason: &'static str) -> ConfigError {
    ConfigError::Value {
        key: key.to_string(),
        value: value.to_string(),
        reason,
    }
}

pub fn parse_host_port(key: &str, v: &str) -> Result<(String, u16), ConfigError> {
    let Some((host, port)) = v.trim().rsplit_once(':') else {
        return Err(bad(key, v, "expected HOST:PORT"));
    };
    let port = port.parse().map_err(|_| bad(key, v, "bad port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((host.to_string(), port))
}

pub(crate) fn parse_addr(key: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    let (host, port) = parse_host_port(key, v)?;
    let host = if host.is_empty() {
        "0.0.0.0".to_string()
    } else {
        host
    };
    (host.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .ok_or_else(|| bad(key, v, "cannot resolve address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> Properties {
        let mut p = Properties::default();
        for (k, v) in pairs {
            p.set(k, v);
        }
        p
    }

    #[test]
    fn several_listeners_with_names_protocols_and_advertised_addresses() {
        let p = props(&[
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093,CLIENT://:9094",
            ),
            (
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,SSL:SSL,CLIENT:SASL_SSL",
            ),
            ("advertised.listeners", "CLIENT://broker.example:19094"),
            ("inter.broker.listener.name", "PLAINTEXT"),
        ]);
        let l = resolve(&p, None, None).expect("valid");
        assert_eq!(l.len(), 3);
        assert_eq!(l[1].protocol, SecurityProtocol::Ssl);
        assert_eq!(l[2].protocol, SecurityProtocol::SaslSsl);
        assert!(l[2].bind.ip().is_unspecified());
        assert_eq!(l[2].advertised, Some(("broker.example".into(), 19094)));
        assert_eq!(l[0].advertised, None);
        let l = resolve(&p, Some("127.0.0.1:0"), Some("h:1")).expect("cli");
        assert_eq!(l[0].bind.port(), 0);
        assert_eq!(l[0].advertised, Some(("h".into(), 1)));
    }

    #[test]
    fn defaults_and_refusals() {
        let l = resolve(&Properties::default(), None, None).expect("default");
        assert_eq!(l[0].name, "PLAINTEXT");
        assert_eq!(l[0].bind.port(), 9092);
        let l = resolve(&props(&[("listeners", "127.0.0.1:7")]), None, None).expect("bare");
        assert_eq!(l[0].protocol, SecurityProtocol::Plaintext);
        let l = resolve(
            &props(&[("listeners", "sasl_ssl://127.0.0.1:7")]),
            None,
            None,
        )
        .expect("lower-case name");
        assert_eq!(l[0].protocol, SecurityProtocol::SaslSsl);
        for bad in [
            vec![("listeners", "FOO://127.0.0.1:1")],
            vec![("listeners", "SSL://127.0.0.1:1,SSL://127.0.0.1:2")],
            vec![("listeners", "PLAINTEXT://127.0.0.1:1,SSL://127.0.0.1:1")],
            vec![("listener.security.protocol.map", "PLAINTEXT:TLS")],
            vec![("advertised.listeners", "SSL://h:1")],
            vec![("inter.broker.listener.name", "SSL")],
        ] {
            assert!(resolve(&props(&bad), None, None).is_err(), "{bad:?}");
        }
    }
}
