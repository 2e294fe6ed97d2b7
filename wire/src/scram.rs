//! SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka speaks it (KIP-84): the
//! stored credential (salt, iterations, StoredKey, ServerKey — never the password), the
//! server side of the two-message exchange (the broker) and the client side (weir's
//! replication client, `weir-loadgen`). HMAC, SHA-2 and PBKDF2 are the RustCrypto
//! crates'; only the message syntax is written here.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// Kafka's bounds on SCRAM iterations (`ScramMechanism.minIterations` / max 16384).
pub const ITERATIONS_MIN: u32 = 4096;
pub const ITERATIONS_MAX: u32 = 16384;
/// Longest SCRAM message accepted from a client (a user name, nonce, proof and
/// extensions fit in a small fraction of it).
pub const MESSAGE_MAX_BYTES: usize = 4096;
/// Random bytes in the server's nonce part.
const SERVER_NONCE_BYTES: usize = 24;

/// The two SCRAM mechanisms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScramMechanism {
    #[serde(rename = "SCRAM-SHA-256")]
    Sha256,
    #[serde(rename = "SCRAM-SHA-512")]
    Sha512,
}

impl ScramMechanism {
    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// Kafka's wire code in the SCRAM credential APIs (1 = SHA-256, 2 = SHA-512).
    pub fn from_code(code: i8) -> Option<ScramMechanism> {
        match code {
            1 => Some(ScramMechanism::Sha256),
            2 => Some(ScramMechanism::Sha512),
            _ => None,
        }
    }

    pub fn code(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        // HMAC takes keys of any length: new_from_slice cannot fail.
        match self {
            ScramMechanism::Sha256 => Hmac::<Sha256>::new_from_slice(key)
                .map(|m| m.chain_update(data).finalize().into_bytes().to_vec())
                .unwrap_or_default(),
            ScramMechanism::Sha512 => Hmac::<Sha512>::new_from_slice(key)
                .map(|m| m.chain_update(data).finalize().into_bytes().to_vec())
                .unwrap_or_default(),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
            ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// RFC 5802's SaltedPassword: PBKDF2 with this mechanism's HMAC.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => {
                pbkdf2::pbkdf2_hmac_array::<Sha256, 32>(password, salt, iterations).to_vec()
            }
            ScramMechanism::Sha512 => {
                pbkdf2::pbkdf2_hmac_array::<Sha512, 64>(password, salt, iterations).to_vec()
            }
        }
    }
}

/// One user's stored credential for one mechanism (what Kafka keeps in its metadata log).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScramCredential {
    pub mechanism: ScramMechanism,
    /// Base64 of each byte string, as in Kafka's `ScramCredential` text form.
    pub salt: String,
    pub iterations: u32,
    pub stored_key: String,
    pub server_key: String,
}

impl ScramCredential {
    /// The credential for a client-computed SaltedPassword (AlterUserScramCredentials
    /// sends that, never the password).
    pub fn from_salted(
        mechanism: ScramMechanism,
        salt: &[u8],
        iterations: u32,
        salted: &[u8],
    ) -> ScramCredential {
        let client_key = mechanism.hmac(salted, b"Client Key");
        let server_key = mechanism.hmac(salted, b"Server Key");
        ScramCredential {
            mechanism,
            salt: B64.encode(salt),
            iterations,
            stored_key: B64.encode(mechanism.hash(&client_key)),
            server_key: B64.encode(server_key),
        }
    }
}

/// Why a SCRAM exchange failed (the client gets SASL_AUTHENTICATION_FAILED).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("unknown user or no {0} credential")]
    UnknownUser(&'static str),
    #[error("invalid proof (wrong password)")]
    InvalidProof,
    #[error("the stored credential is damaged")]
    BadCredential,
}

/// The server's state between its first message and the client's final one.
#[derive(Debug)]
pub struct ScramServer {
    mechanism: ScramMechanism,
    user: String,
    credential: ScramCredential,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

/// The parsed client-first message.
#[derive(Debug, PartialEq)]
pub struct ClientFirst {
    pub user: String,
    bare: String,
    nonce: String,
}

/// Parses `gs2-header client-first-message-bare`; channel binding is not offered (as in
/// Kafka), so the gs2 header must be `n,,` or `y,,` (an authzid `a=` is accepted only
/// if it equals the user).
pub fn parse_client_first(msg: &[u8]) -> Result<ClientFirst, ScramError> {
    if msg.len() > MESSAGE_MAX_BYTES {
        return Err(ScramError::Malformed("too long"));
    }
    let text = std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("not UTF-8"))?;
    let mut parts = text.splitn(3, ',');
    let flag = parts.next().unwrap_or_default();
    let authzid = parts.next().ok_or(ScramError::Malformed("no gs2 header"))?;
    let bare = parts.next().ok_or(ScramError::Malformed("no gs2 header"))?;
    if flag != "n" && flag != "y" {
        return Err(ScramError::Malformed("channel binding is not supported"));
    }
    let mut user = None;
    let mut nonce = None;
    for attr in bare.split(',') {
        match attr.split_once('=') {
            Some(("n", v)) => user = Some(decode_saslname(v)?),
            Some(("r", v)) => nonce = Some(v.to_string()),
            Some(("m", _)) => return Err(ScramError::Malformed("mandatory extension")),
            // Kafka's extensions (e.g. tokenauth) and anything unknown are ignored, except
            // delegation-token authentication, which weir does not have.
            Some(("tokenauth", v)) if v.eq_ignore_ascii_case("true") => {
                return Err(ScramError::Malformed("delegation tokens are not supported"));
            }
            _ => {}
        }
    }
    let user = user.ok_or(ScramError::Malformed("no user name"))?;
    let nonce = nonce
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_graphic() && b != b','))
        .ok_or(ScramError::Malformed("no or bad client nonce"))?;
    if let Some(z) = authzid.strip_prefix("a=") {
        if decode_saslname(z)? != user {
            return Err(ScramError::Malformed("authzid differs from the user"));
        }
    } else if !authzid.is_empty() {
        return Err(ScramError::Malformed("bad gs2 header"));
    }
    Ok(ClientFirst {
        user,
        bare: bare.to_string(),
        nonce,
    })
}

/// RFC 5802 saslname: `=2C` is `,`, `=3D` is `=`, any other `=` is an error.
fn decode_saslname(v: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(v.len());
    let mut rest = v;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("bad escape in user name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    if out.is_empty() {
        return Err(ScramError::Malformed("empty user name"));
    }
    Ok(out)
}

impl ScramServer {
    /// Starts the exchange for `first` with the user's stored credential; returns the
    /// state and the server-first message.
    pub fn start(
        mechanism: ScramMechanism,
        first: ClientFirst,
        credential: ScramCredential,
    ) -> (ScramServer, Vec<u8>) {
        assert_eq!(
            credential.mechanism, mechanism,
            "the credential's mechanism"
        );
        let mut random = [0u8; SERVER_NONCE_BYTES];
        rand::Rng::fill(&mut rand::rng(), &mut random[..]);
        // Alphanumeric, like Kafka's own server nonce.
        let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let nonce = format!("{}{suffix}", first.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            credential.salt, credential.iterations
        );
        let state = ScramServer {
            mechanism,
            user: first.user,
            credential,
            client_first_bare: first.bare,
            server_first: server_first.clone(),
            nonce,
        };
        (state, server_first.into_bytes())
    }

    /// RFC 5802: the client echoes the server's whole nonce. librdkafka before 2.6.1
    /// (kcat and Debian's librdkafka 2.0.2 among them) sends its own nonce once more in
    /// front of it (librdkafka PR 4895; Kafka 3.8.1 accepts that too). The server's nonce
    /// is still checked in full, so a replayed final message cannot pass.
    fn nonce_matches(&self, echoed: &str) -> bool {
        if echoed == self.nonce {
            return true;
        }
        let client_nonce_bytes = self.nonce.len() - SERVER_NONCE_BYTES * 2;
        echoed.len() == self.nonce.len() + client_nonce_bytes
            && echoed.starts_with(&self.nonce[..client_nonce_bytes])
            && echoed.ends_with(self.nonce.as_str())
    }

    /// The user this exchange authenticates.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Checks the client-final message; on success returns the server-final message
    /// (`v=ServerSignature`) that proves the server knows the credential too.
    pub fn finish(&self, msg: &[u8]) -> Result<Vec<u8>, ScramError> {
        if msg.len() > MESSAGE_MAX_BYTES {
            return Err(ScramError::Malformed("too long"));
        }
        let text = std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("no proof"))?;
        let mut binding = None;
        let mut nonce = None;
        for attr in without_proof.split(',') {
            match attr.split_once('=') {
                Some(("c", v)) => binding = Some(v),
                Some(("r", v)) => nonce = Some(v),
                _ => {}
            }
        }
        // Without channel binding the client echoes its gs2 header: "n,," or "y,,".
        let binding = binding.ok_or(ScramError::Malformed("no channel binding"))?;
        if binding != B64.encode("n,,") && binding != B64.encode("y,,") {
            let decoded = B64.decode(binding).unwrap_or_default();
            if !decoded.starts_with(b"n,a=") && !decoded.starts_with(b"y,a=") {
                return Err(ScramError::Malformed("unexpected channel binding"));
            }
        }
        if !self.nonce_matches(nonce.unwrap_or_default()) {
            return Err(ScramError::Malformed("nonce differs from the server's"));
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| ScramError::Malformed("proof is not base64"))?;
        let stored_key = B64
            .decode(&self.credential.stored_key)
            .map_err(|_| ScramError::BadCredential)?;
        let server_key = B64
            .decode(&self.credential.server_key)
            .map_err(|_| ScramError::BadCredential)?;
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare, self.server_first
        );
        let signature = self.mechanism.hmac(&stored_key, auth_message.as_bytes());
        if proof.len() != signature.len() {
            return Err(ScramError::InvalidProof);
        }
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        let computed = self.mechanism.hash(&client_key);
        if !bool::from(computed.ct_eq(&stored_key)) {
            return Err(ScramError::InvalidProof);
        }
        let server_signature = self.mechanism.hmac(&server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

/// The client side of the exchange (a node authenticating to a peer's SASL listener with
/// `sasl.mechanism.inter.broker.protocol` SCRAM-SHA-*): client-first, then client-final
/// from the server-first message, then the server-final check.
pub struct ScramClient {
    mechanism: ScramMechanism,
    password: String,
    client_first_bare: String,
    nonce: String,
    /// Set by [`ScramClient::client_final`]: the signature the server must send back.
    expected_server_signature: Option<String>,
}

impl ScramClient {
    /// Starts the exchange; returns the client and the client-first message.
    pub fn start(mechanism: ScramMechanism, user: &str, password: &str) -> (ScramClient, Vec<u8>) {
        let mut random = [0u8; SERVER_NONCE_BYTES];
        rand::Rng::fill(&mut rand::rng(), &mut random[..]);
        let nonce: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let escaped = user.replace('=', "=3D").replace(',', "=2C");
        let bare = format!("n={escaped},r={nonce}");
        let first = format!("n,,{bare}").into_bytes();
        let client = ScramClient {
            mechanism,
            password: password.to_string(),
            client_first_bare: bare,
            nonce,
            expected_server_signature: None,
        };
        (client, first)
    }

    /// The client-final message for the server's first message.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        if server_first.len() > MESSAGE_MAX_BYTES {
            return Err(ScramError::Malformed("too long"));
        }
        let text =
            std::str::from_utf8(server_first).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for attr in text.split(',') {
            match attr.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(v),
                Some(("i", v)) => iterations = v.parse::<u32>().ok(),
                Some(("m", _)) => return Err(ScramError::Malformed("mandatory extension")),
                _ => {}
            }
        }
        let nonce = nonce
            .filter(|n| n.starts_with(self.nonce.as_str()) && n.len() > self.nonce.len())
            .ok_or(ScramError::Malformed("server nonce does not extend ours"))?;
        let salt = salt
            .and_then(|s| B64.decode(s).ok())
            .ok_or(ScramError::Malformed("no or bad salt"))?;
        // The same bounds the server side keeps: a peer cannot make us spin PBKDF2.
        let iterations = iterations
            .filter(|i| (ITERATIONS_MIN..=ITERATIONS_MAX).contains(i))
            .ok_or(ScramError::Malformed("iterations out of bounds"))?;
        let m = self.mechanism;
        let salted = m.salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        let stored_key = m.hash(&client_key);
        let without_proof = format!("c={},r={nonce}", B64.encode("n,,"));
        let auth = format!("{},{text},{without_proof}", self.client_first_bare);
        let signature = m.hmac(&stored_key, auth.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = m.hmac(&salted, b"Server Key");
        self.expected_server_signature = Some(format!(
            "v={}",
            B64.encode(m.hmac(&server_key, auth.as_bytes()))
        ));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message: the server knew the credential too.
    pub fn check_server_final(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let want = self
            .expected_server_signature
            .as_deref()
            .ok_or(ScramError::Malformed("server-final before client-final"))?;
        match bool::from(server_final.ct_eq(want.as_bytes())) {
            true => Ok(()),
            false => Err(ScramError::InvalidProof),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client side of RFC 5802, written from the RFC for this test only.
    fn client_final(
        mech: ScramMechanism,
        password: &str,
        client_first_bare: &str,
        server_first: &str,
    ) -> (String, Vec<u8>) {
        let attrs: Vec<(&str, &str)> = server_first
            .split(',')
            .filter_map(|a| a.split_once('='))
            .collect();
        let get = |k: &str| {
            attrs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| *v)
                .unwrap()
        };
        let salt = B64.decode(get("s")).unwrap();
        let iterations: u32 = get("i").parse().unwrap();
        let salted = mech.salted_password(password.as_bytes(), &salt, iterations);
        let client_key = mech.hmac(&salted, b"Client Key");
        let stored_key = mech.hash(&client_key);
        let without_proof = format!("c={},r={}", B64.encode("n,,"), get("r"));
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let sig = mech.hmac(&stored_key, auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
        let server_key = mech.hmac(&salted, b"Server Key");
        let expected_v = mech.hmac(&server_key, auth.as_bytes());
        (
            format!("{without_proof},p={}", B64.encode(proof)),
            format!("v={}", B64.encode(expected_v)).into_bytes(),
        )
    }

    fn exchange(mech: ScramMechanism, stored_pw: &str, given_pw: &str) -> Result<(), ScramError> {
        let salt = b"0123456789abcdef";
        let salted = mech.salted_password(stored_pw.as_bytes(), salt, ITERATIONS_MIN);
        let cred = ScramCredential::from_salted(mech, salt, ITERATIONS_MIN, &salted);
        let first = parse_client_first(b"n,,n=al=2Cice,r=fyko+d2lbbFgONRv9qkxdawL")?;
        assert_eq!(first.user, "al,ice");
        let bare = first.bare.clone();
        let (server, server_first) = ScramServer::start(mech, first, cred);
        let server_first = String::from_utf8(server_first).unwrap();
        assert!(server_first.starts_with("r=fyko+d2lbbFgONRv9qkxdawL"));
        let (final_msg, expected) = client_final(mech, given_pw, &bare, &server_first);
        let v = server.finish(final_msg.as_bytes())?;
        assert_eq!(v, expected, "the server proves itself");
        Ok(())
    }

    #[test]
    fn both_mechanisms_accept_the_right_password_and_refuse_a_wrong_one() {
        for mech in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
            assert_eq!(exchange(mech, "pencil", "pencil"), Ok(()));
            assert_eq!(
                exchange(mech, "pencil", "pen"),
                Err(ScramError::InvalidProof)
            );
        }
    }

    /// RFC 7677's SCRAM-SHA-256 test vector: user "user", password "pencil".
    #[test]
    fn rfc7677_vector() {
        let mech = ScramMechanism::Sha256;
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = mech.salted_password(b"pencil", &salt, 4096);
        let cred = ScramCredential::from_salted(mech, &salt, 4096, &salted);
        let state = ScramServer {
            mechanism: mech,
            user: "user".into(),
            credential: cred,
            client_first_bare: "n=user,r=rOprNGfwEbeRWgbNEkqO".into(),
            server_first: "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".into(),
            nonce: "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
        };
        let v = state.finish(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=").unwrap();
        assert_eq!(v, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
    }

    /// librdkafka < 2.6.1 echoes its nonce twice; any other nonce is refused.
    #[test]
    fn old_librdkafka_nonce_is_accepted_and_others_are_not() {
        let mech = ScramMechanism::Sha256;
        let salted = mech.salted_password(b"pw", b"salt", ITERATIONS_MIN);
        let cred = ScramCredential::from_salted(mech, b"salt", ITERATIONS_MIN, &salted);
        let first = parse_client_first(b"n,,n=u,r=abc").unwrap();
        let (server, _) = ScramServer::start(mech, first, cred);
        let full = server.nonce.clone();
        assert!(server.nonce_matches(&full));
        assert!(
            server.nonce_matches(&format!("abc{full}")),
            "librdkafka < 2.6.1"
        );
        assert!(!server.nonce_matches("abc"));
        assert!(!server.nonce_matches(&format!("xyz{full}")));
        assert!(!server.nonce_matches(&format!("abc{}", &full[..full.len() - 1])));
        assert!(!server.nonce_matches(&full[3..]));
    }

    #[test]
    fn the_client_side_authenticates_against_the_server_side() {
        for mech in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
            for (given, ok) in [("pencil", true), ("pen", false)] {
                let salted = mech.salted_password(b"pencil", b"salt-1", ITERATIONS_MIN);
                let cred = ScramCredential::from_salted(mech, b"salt-1", ITERATIONS_MIN, &salted);
                let (mut client, first) = ScramClient::start(mech, "a,b=c", given);
                let first = parse_client_first(&first).unwrap();
                assert_eq!(first.user, "a,b=c");
                let (server, server_first) = ScramServer::start(mech, first, cred);
                let fin = client.client_final(&server_first).unwrap();
                match server.finish(&fin) {
                    Ok(v) => {
                        assert!(ok, "wrong password accepted");
                        client.check_server_final(&v).unwrap();
                        assert!(client.check_server_final(b"v=AAAA").is_err());
                    }
                    Err(e) => assert!(!ok, "{e}"),
                }
            }
        }
    }

    #[test]
    fn malformed_client_first_is_refused() {
        for bad in [
            &b"p=tls-unique,,n=u,r=x"[..],
            b"n,,r=x",
            b"n,,n=u",
            b"n,,n=u=zz,r=x",
            b"n,a=other,n=u,r=x",
            b"n,,n=u,r=x,tokenauth=true",
            b"garbage",
            &[0xff, 0xfe],
        ] {
            assert!(parse_client_first(bad).is_err(), "{bad:?}");
        }
        assert!(parse_client_first(b"n,a=u,n=u,r=x").is_ok());
    }
}
