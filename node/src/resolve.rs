//! Where another node's registered host name points, found off the shard's thread.
//!
//! Nodes register the host they advertise (`advertised.listeners`), which may be a DNS
//! name. `getaddrinfo` blocks: on a shard thread every client of the shard waits for it,
//! for a resolver's whole timeout (seconds) when DNS is slow or down. So a name is looked
//! up in glommio's blocking pool, and the answer kept, process-wide, for
//! [`FOUND_TTL`] (a host that moves, as a restarted pod does, is followed within it) or,
//! when the lookup failed, for [`FAILED_TTL`] (so a dead resolver is not asked again by
//! every caller). An IP literal never reaches the resolver.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// How long an address found for a name is used before the name is looked up again.
pub const FOUND_TTL: Duration = Duration::from_secs(30);
/// How long a failed lookup is remembered.
pub const FAILED_TTL: Duration = Duration::from_secs(5);
/// Names remembered at most (a cluster has one per node); past it the oldest answers go.
const ENTRIES_MAX: usize = 4096;

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| Mutex::new(Cache::default()));

/// The address of `host:port`, looked up in the blocking pool when `host` is a name not
/// resolved recently. `None` when it does not resolve.
pub async fn resolve(host: &str, port: u16) -> Option<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, port));
    }
    if let Some(known) = lock().get(host, port, Instant::now()) {
        return known;
    }
    let name = host.to_string();
    let found = glommio::executor()
        .spawn_blocking(move || lookup(&name, port))
        .await;
    lock().put(host, port, found, Instant::now());
    found
}

/// `getaddrinfo`, first answer. Blocking.
fn lookup(host: &str, port: u16) -> Option<SocketAddr> {
    (host, port).to_socket_addrs().ok()?.next()
}

fn lock() -> std::sync::MutexGuard<'static, Cache> {
    // The cache holds no invariant a panicking holder could break.
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Lookups remembered: the answer and when it stops being used.
#[derive(Default)]
struct Cache {
    entries: HashMap<(String, u16), (Option<SocketAddr>, Instant)>,
}

impl Cache {
    /// The remembered answer, if it has not expired: `Some(None)` is a remembered failure.
    fn get(&self, host: &str, port: u16, now: Instant) -> Option<Option<SocketAddr>> {
        let (found, until) = self.entries.get(&(host.to_string(), port))?;
        (now < *until).then_some(*found)
    }

    fn put(&mut self, host: &str, port: u16, found: Option<SocketAddr>, now: Instant) {
        if self.entries.len() >= ENTRIES_MAX {
            self.entries.retain(|_, (_, until)| now < *until);
            if self.entries.len() >= ENTRIES_MAX {
                self.entries.clear();
            }
        }
        let ttl = if found.is_some() {
            FOUND_TTL
        } else {
            FAILED_TTL
        };
        self.entries
            .insert((host.to_string(), port), (found, now + ttl));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_expire_found_after_their_ttl_and_failures_sooner() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        let a: SocketAddr = "10.0.0.1:9092".parse().expect("addr");
        assert_eq!(c.get("kafka-1", 9092, t0), None, "nothing remembered yet");
        c.put("kafka-1", 9092, Some(a), t0);
        c.put("kafka-2", 9092, None, t0);
        assert_eq!(c.get("kafka-1", 9092, t0), Some(Some(a)));
        assert_eq!(
            c.get("kafka-1", 9093, t0),
            None,
            "another port is another entry"
        );
        assert_eq!(
            c.get("kafka-2", 9092, t0),
            Some(None),
            "a failure is remembered"
        );
        let later = t0 + FAILED_TTL;
        assert_eq!(
            c.get("kafka-2", 9092, later),
            None,
            "and asked again after its ttl"
        );
        assert_eq!(c.get("kafka-1", 9092, later), Some(Some(a)));
        assert_eq!(c.get("kafka-1", 9092, t0 + FOUND_TTL), None);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        for i in 0..ENTRIES_MAX + 10 {
            c.put(&format!("h{i}"), 1, None, t0);
        }
        assert!(c.entries.len() <= ENTRIES_MAX);
        assert_eq!(c.get(&format!("h{}", ENTRIES_MAX + 9), 1, t0), Some(None));
    }

    #[test]
    fn names_resolve_in_the_blocking_pool_and_literals_without_it() {
        let ex = glommio::LocalExecutorBuilder::default()
            .make()
            .expect("executor");
        ex.run(async {
            let lit = resolve("127.0.0.1", 7).await;
            assert_eq!(lit, Some("127.0.0.1:7".parse().expect("addr")));
            assert_eq!(
                lock().get("127.0.0.1", 7, Instant::now()),
                None,
                "literals are not cached"
            );
            let local = resolve("localhost", 7).await.expect("localhost resolves");
            assert!(local.ip().is_loopback() && local.port() == 7);
            assert_eq!(
                lock().get("localhost", 7, Instant::now()),
                Some(Some(local)),
                "the name's answer is kept"
            );
            assert_eq!(resolve("no-such-host.invalid", 7).await, None);
        });
    }
}
