//! The client side of a SASL login as Kafka speaks it (SaslHandshake, then
//! SaslAuthenticate rounds: KIP-43, KIP-84), without I/O: which token to send next and
//! when the login is done. PLAIN is one round; SCRAM two, the second answer proving the
//! broker knows the password. weir's replication client, its admin commands and
//! `weir-loadgen` each send the tokens their own way (async with deadlines, or blocking).

use crate::scram::{ScramClient, ScramError, ScramMechanism};

/// The mechanisms weir speaks (Kafka's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    Scram(ScramMechanism),
}

impl Mechanism {
    /// Kafka's name, exactly (surrounding blanks ignored).
    pub fn parse(name: &str) -> Option<Mechanism> {
        match name.trim() {
            "PLAIN" => Some(Mechanism::Plain),
            "SCRAM-SHA-256" => Some(Mechanism::Scram(ScramMechanism::Sha256)),
            "SCRAM-SHA-512" => Some(Mechanism::Scram(ScramMechanism::Sha512)),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Scram(m) => m.name(),
        }
    }
}

/// Why a login failed on the client's side (the broker's refusals are error codes in
/// its SaslAuthenticate answers, which the caller reads).
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("SCRAM server-first: {0}")]
    ServerFirst(ScramError),
    #[error("SCRAM server-final (the broker did not prove it knows the password): {0}")]
    ServerFinal(ScramError),
}

/// One login under way.
pub struct Login {
    state: State,
}

enum State {
    /// PLAIN's one token was sent: any successful answer ends it.
    Plain,
    /// SCRAM's client-first was sent.
    ScramFirst(ScramClient),
    /// SCRAM's client-final was sent.
    ScramFinal(ScramClient),
    Done,
}

impl Login {
    /// The login of `user` with `password`, and the token to send first.
    pub fn start(mechanism: Mechanism, user: &str, password: &str) -> (Login, Vec<u8>) {
        match mechanism {
            Mechanism::Plain => {
                let token = format!("\0{user}\0{password}").into_bytes();
                (
                    Login {
                        state: State::Plain,
                    },
                    token,
                )
            }
            Mechanism::Scram(m) => {
                let (client, first) = ScramClient::start(m, user, password);
                let state = State::ScramFirst(client);
                (Login { state }, first)
            }
        }
    }

    /// The broker's successful answer (its `auth_bytes`) to the last token sent: the next
    /// token to send, or `None` once logged in. Never more rounds than the mechanism has:
    /// the exchange is not driven by the broker.
    pub fn answer(&mut self, server: &[u8]) -> Result<Option<Vec<u8>>, LoginError> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Plain | State::Done => Ok(None),
            State::ScramFirst(mut client) => {
                let last = client
                    .client_final(server)
                    .map_err(LoginError::ServerFirst)?;
                self.state = State::ScramFinal(client);
                Ok(Some(last))
            }
            State::ScramFinal(client) => {
                client
                    .check_server_final(server)
                    .map_err(LoginError::ServerFinal)?;
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scram::{ScramCredential, ScramServer, parse_client_first};

    /// PLAIN: one token, `\0user\0password`, and done at the first answer.
    #[test]
    fn plain_is_one_token() {
        let (mut login, token) = Login::start(Mechanism::Plain, "alice", "secret");
        assert_eq!(token, b"\0alice\0secret");
        assert!(matches!(login.answer(b""), Ok(None)));
    }

    /// SCRAM against weir's own server side: two rounds, then done; a final message
    /// without the signature only the password's keys give is refused.
    #[test]
    fn scram_takes_two_rounds_and_checks_the_server() {
        for m in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
            let salt = b"0123456789abcdef";
            let credential = |password: &str| {
                let salted = m.salted_password(password.as_bytes(), salt, 4096);
                ScramCredential::from_salted(m, salt, 4096, &salted)
            };
            let (mut login, first) = Login::start(Mechanism::Scram(m), "alice", "secret");
            let client_first = parse_client_first(&first).expect("client-first");
            let (server, server_first) = ScramServer::start(m, client_first, credential("secret"));
            let last = login
                .answer(&server_first)
                .expect("server-first")
                .expect("a second token");
            let server_final = server.finish(&last).expect("the proof");
            assert!(matches!(login.answer(&server_final), Ok(None)), "{m:?}");
            assert!(matches!(login.answer(b"more"), Ok(None)), "done stays done");

            // A server with another password's keys cannot sign the exchange as the client
            // computes it: a final message with any other signature is refused.
            let (mut login, first) = Login::start(Mechanism::Scram(m), "alice", "secret");
            let client_first = parse_client_first(&first).expect("client-first");
            let (_, server_first) = ScramServer::start(m, client_first, credential("other"));
            let last = login.answer(&server_first).expect("server-first");
            assert!(last.is_some());
            let forged = credential("other");
            let forged_final = format!("v={}", forged.server_key).into_bytes();
            assert!(
                matches!(login.answer(&forged_final), Err(LoginError::ServerFinal(_))),
                "{m:?}"
            );
        }
    }

    #[test]
    fn mechanisms_by_kafkas_names() {
        for m in [
            Mechanism::Plain,
            Mechanism::Scram(ScramMechanism::Sha256),
            Mechanism::Scram(ScramMechanism::Sha512),
        ] {
            assert_eq!(Mechanism::parse(m.name()), Some(m));
        }
        assert_eq!(Mechanism::parse("plain"), None);
    }
}
