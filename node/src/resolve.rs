//! Where another node's registered host name points, found off the shard's thread.
//!
//! Nodes register the host they advertise (`advertised.listeners`), which may be a DNS
//! name. `getaddrinfo` blocks: on a shard thread every client of the shard waits for it,
//! for a resolver's whole timeout (seconds) when DNS is slow or down. So a name is looked
//! up on a thread of its own (not glommio's blocking pool, whose one thread also syncs
//! files and loads indexes: a dead resolver would stall those), one lookup per name at a
//! time however many callers wait for it, and the answer kept, process-wide, for
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

/// The address of `host:port`, looked up on a thread of its own when `host` is a name
/// not resolved recently. `None` when it does not resolve.
pub async fn resolve(host: &str, port: u16) -> Option<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, port));
    }
    let (tx, rx) = flume::bounded(1);
    let first = match lock().get_or_wait(host, port, Instant::now(), tx) {
        Lookup::Known(found) => return found,
        Lookup::Waiting => false,
        Lookup::First => true,
    };
    if first {
        let name = host.to_string();
        let spawned = std::thread::Builder::new()
            .name("weir-resolve".into())
            .spawn(move || {
                let found = lookup(&name, port);
                for waiter in lock().put(&name, port, found, Instant::now()) {
                    let _ = waiter.send(found);
                }
            });
        if spawned.is_err() {
            for waiter in lock().put(host, port, None, Instant::now()) {
                let _ = waiter.send(None);
            }
        }
    }
    rx.recv_async().await.ok().flatten()
}

/// `getaddrinfo`, first answer. Blocking.
fn lookup(host: &str, port: u16) -> Option<SocketAddr> {
    (host, port).to_socket_addrs().ok()?.next()
}

fn lock() -> std::sync::MutexGuard<'static, Cache> {
    // The cache holds no invariant a panicking holder could break.
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

type Waiter = flume::Sender<Option<SocketAddr>>;

/// What a caller gets from the cache.
enum Lookup {
    /// A remembered answer (`None`: a remembered failure).
    Known(Option<SocketAddr>),
    /// A lookup is under way; its answer will be sent to the caller's waiter.
    Waiting,
    /// The caller must start the lookup; its waiter is registered.
    First,
}

enum Entry {
    /// The answer and when it stops being used.
    Known(Option<SocketAddr>, Instant),
    /// A lookup under way and who waits for it.
    Pending(Vec<Waiter>),
}

/// Lookups remembered or under way, by name and port.
#[derive(Default)]
struct Cache {
    entries: HashMap<(String, u16), Entry>,
}

impl Cache {
    fn get_or_wait(&mut self, host: &str, port: u16, now: Instant, waiter: Waiter) -> Lookup {
        let key = (host.to_string(), port);
        match self.entries.get_mut(&key) {
            Some(Entry::Known(found, until)) if now < *until => return Lookup::Known(*found),
            Some(Entry::Pending(waiters)) => {
                waiters.push(waiter);
                return Lookup::Waiting;
            }
            _ => {}
        }
        if self.entries.len() >= ENTRIES_MAX {
            self.entries.retain(|_, e| match e {
                Entry::Known(_, until) => now < *until,
                Entry::Pending(_) => true,
            });
        }
        self.entries.insert(key, Entry::Pending(vec![waiter]));
        Lookup::First
    }

    /// Records the answer of a lookup; returns who waited for it.
    fn put(
        &mut self,
        host: &str,
        port: u16,
        found: Option<SocketAddr>,
        now: Instant,
    ) -> Vec<Waiter> {
        let ttl = if found.is_some() {
            FOUND_TTL
        } else {
            FAILED_TTL
        };
        let key = (host.to_string(), port);
        match self.entries.insert(key, Entry::Known(found, now + ttl)) {
            Some(Entry::Pending(waiters)) => waiters,
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(c: &mut Cache, host: &str, port: u16, now: Instant) -> Option<Option<SocketAddr>> {
        let (tx, _rx) = flume::bounded(1);
        match c.get_or_wait(host, port, now, tx) {
            Lookup::Known(found) => Some(found),
            _ => {
                // Undo the pending mark a miss leaves.
                c.entries.remove(&(host.to_string(), port));
                None
            }
        }
    }

    #[test]
    fn answers_expire_found_after_their_ttl_and_failures_sooner() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        let a: SocketAddr = "10.0.0.1:9092".parse().expect("addr");
        assert_eq!(
            known(&mut c, "kafka-1", 9092, t0),
            None,
            "nothing remembered yet"
        );
        c.put("kafka-1", 9092, Some(a), t0);
        c.put("kafka-2", 9092, None, t0);
        assert_eq!(known(&mut c, "kafka-1", 9092, t0), Some(Some(a)));
        assert_eq!(
            known(&mut c, "kafka-1", 9093, t0),
            None,
            "another port is another entry"
        );
        assert_eq!(
            known(&mut c, "kafka-2", 9092, t0),
            Some(None),
            "a failure is remembered"
        );
        let later = t0 + FAILED_TTL;
        assert_eq!(
            known(&mut c, "kafka-2", 9092, later),
            None,
            "and asked again after its ttl"
        );
        assert_eq!(known(&mut c, "kafka-1", 9092, later), Some(Some(a)));
        assert_eq!(known(&mut c, "kafka-1", 9092, t0 + FOUND_TTL), None);
    }

    #[test]
    fn callers_of_a_name_being_looked_up_wait_for_that_one_lookup() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        let (tx1, rx1) = flume::bounded(1);
        let (tx2, rx2) = flume::bounded(1);
        assert!(matches!(c.get_or_wait("n", 1, t0, tx1), Lookup::First));
        assert!(matches!(c.get_or_wait("n", 1, t0, tx2), Lookup::Waiting));
        let a: SocketAddr = "10.0.0.2:1".parse().expect("addr");
        for w in c.put("n", 1, Some(a), t0) {
            w.send(Some(a)).expect("send");
        }
        assert_eq!(rx1.recv().expect("first"), Some(a));
        assert_eq!(rx2.recv().expect("second"), Some(a));
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        for i in 0..ENTRIES_MAX + 10 {
            c.put(&format!("h{i}"), 1, None, t0);
        }
        let later = t0 + FAILED_TTL;
        assert_eq!(known(&mut c, "fresh", 1, later), None);
        let (tx, _rx) = flume::bounded(1);
        assert!(matches!(
            c.get_or_wait("fresh", 1, later, tx),
            Lookup::First
        ));
        assert!(
            c.entries.len() <= ENTRIES_MAX,
            "expired answers dropped: {}",
            c.entries.len()
        );
    }

    #[test]
    fn names_resolve_off_the_thread_and_literals_without_a_lookup() {
        let ex = glommio::LocalExecutorBuilder::default()
            .make()
            .expect("executor");
        ex.run(async {
            let lit = resolve("127.0.0.1", 7).await;
            assert_eq!(lit, Some("127.0.0.1:7".parse().expect("addr")));
            assert!(!lock().entries.contains_key(&("127.0.0.1".to_string(), 7)), "literals are not cached");
            let local = resolve("localhost", 7).await.expect("localhost resolves");
            assert!(local.ip().is_loopback() && local.port() == 7);
            assert!(
                matches!(lock().entries.get(&("localhost".to_string(), 7)), Some(Entry::Known(Some(a), _)) if *a == local),
                "the name's answer is kept"
            );
            assert_eq!(resolve("no-such-host.invalid", 7).await, None);
        });
    }
}
