//! The listen sockets: one per shard, one SO_REUSEPORT group on one address, all bound by
//! the main thread before any shard starts, after a probe that makes a second process on
//! the same address fail with "address in use" (as Kafka does).
//!
//! SO_REUSEPORT lets the kernel spread connections over the shards, but it lets any process
//! of the same user join the group: a second `weir serve` on the address used to start and
//! take half the connections. Linux offers no way to close a group, so weir checks first:
//! a socket bound to the address *without* SO_REUSEPORT conflicts with every listening
//! socket there (SO_REUSEPORT or not, any process). It carries SO_REUSEADDR, so the
//! TIME_WAIT connections of a previous run do not count. The probe is closed and our own
//! group is bound right after, from this thread, so the window in which a second weir
//! starting at the same instant could pass the probe too is a few system calls wide.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Pending connections per shard socket (glommio's own value for its listeners).
const LISTEN_BACKLOG: i32 = 1024;

/// Binds `shards` listening sockets on `addr` (`:0` picks one free port for all of them);
/// returns the bound address and the sockets, in shard order.
pub fn bind_listeners(
    addr: SocketAddr,
    shards: usize,
) -> anyhow::Result<(SocketAddr, Vec<OwnedFd>)> {
    assert!(shards > 0, "a node has at least one shard");
    if addr.port() != 0 {
        probe_exclusive(addr)?;
    }
    let mut bound = addr;
    let mut fds = Vec::with_capacity(shards);
    for s in 0..shards {
        let sock = reuseport_listener(bound).map_err(|e| listen_error(bound, &e))?;
        if s == 0 {
            bound = sock
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .ok_or_else(|| anyhow::anyhow!("cannot read the bound address of {addr}"))?;
        }
        // SAFETY: `into_raw_fd` hands over the descriptor it owned; nothing else holds it.
        fds.push(unsafe { OwnedFd::from_raw_fd(sock.into_raw_fd()) });
    }
    assert_eq!(fds.len(), shards);
    assert_eq!(bound.ip(), addr.ip(), "bound where asked");
    Ok((bound, fds))
}

/// Fails with "address in use" if any socket listens on `addr` already.
fn probe_exclusive(addr: SocketAddr) -> anyhow::Result<()> {
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| listen_error(addr, &e))?;
    probe
        .set_reuse_address(true)
        .map_err(|e| listen_error(addr, &e))?;
    probe
        .bind(&SockAddr::from(addr))
        .map_err(|e| listen_error(addr, &e))?;
    drop(probe);
    Ok(())
}

/// One shard's listen socket. SO_REUSEADDR as well as SO_REUSEPORT: the connections it
/// accepts inherit the flag, and after a crash their TIME_WAIT remnants then do not block
/// the next start's probe (without it, a restart right after SIGKILL failed with "address
/// in use" for as long as a client connection of the dead process lingered in TIME_WAIT).
fn reuseport_listener(addr: SocketAddr) -> std::io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.bind(&SockAddr::from(addr))?;
    sock.listen(LISTEN_BACKLOG)?;
    Ok(sock)
}

fn listen_error(addr: SocketAddr, e: &std::io::Error) -> anyhow::Error {
    if e.raw_os_error() == Some(libc::EADDRINUSE) {
        return anyhow::anyhow!(
            "cannot listen on {addr}: address in use (another process listens there; only one weir may serve an address)"
        );
    }
    anyhow::anyhow!("cannot listen on {addr}: {e}")
}
