//! The byte stream under a connection: plain TCP, or TLS by rustls over glommio's TCP
//! stream (futures-rustls). The TLS handshake is bounded by `ssl.handshake.timeout.ms`.
//!
//! Under TLS every response byte is copied into rustls's record buffer and encrypted
//! there: the vectored zero-copy send of the plaintext path does not apply (kernel TLS,
//! which would keep it, is not done yet).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_lite::io::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;

use crate::security::tls::{self, ClientAuth, TlsSetup};

/// A connection's stream.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<futures_rustls::server::TlsStream<TcpStream>>),
}

/// Why a TLS connection was not set up.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("TLS handshake not finished within {0} ms (ssl.handshake.timeout.ms)")]
    Timeout(u64),
    #[error("TLS handshake failed: {0}")]
    Failed(io::Error),
    #[error("the client certificate's subject cannot be read")]
    BadCertificate,
}

impl Transport {
    /// The TCP socket's descriptor.
    pub fn raw_fd(&self) -> RawFd {
        match self {
            Transport::Plain(s) => s.as_raw_fd(),
            Transport::Tls(s) => s.get_ref().0.as_raw_fd(),
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }
}

/// Runs the server side of the TLS handshake on `stream`, bounded by the listener's
/// handshake timeout; returns the TLS stream and the principal of the client certificate
/// (if the client presented one; with `ssl.client.auth=required` it must have).
pub async fn accept_tls(
    stream: TcpStream,
    setup: &TlsSetup,
) -> Result<(Transport, Option<String>), HandshakeError> {
    let acceptor = futures_rustls::TlsAcceptor::from(setup.config.clone());
    let timeout_ms = setup.handshake_timeout_ms;
    let timer = glommio::timer::Timer::new(Duration::from_millis(timeout_ms));
    let handshake =
        futures_lite::future::or(async { Some(acceptor.accept(stream).await) }, async {
            timer.await;
            None
        });
    let tls = match handshake.await {
        None => return Err(HandshakeError::Timeout(timeout_ms)),
        Some(Err(e)) => return Err(HandshakeError::Failed(e)),
        Some(Ok(tls)) => tls,
    };
    let certificate = tls.get_ref().1.peer_certificates().and_then(|c| c.first());
    let principal = match certificate {
        Some(der) => Some(
            tls::principal_of_certificate(der)
                .map(|subject| format!("User:{subject}"))
                .ok_or(HandshakeError::BadCertificate)?,
        ),
        None => None,
    };
    // rustls enforces `required` itself; this states the invariant the principal rests on.
    assert!(
        principal.is_some() || setup.client_auth != ClientAuth::Required,
        "ssl.client.auth=required lets no client in without a certificate"
    );
    Ok((Transport::Tls(Box::new(tls)), principal))
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_close(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}
