//! Who may open a connection: open connections per client address, node-wide
//! (`max.connections.per.ip`, with per-address overrides), so that one client cannot take
//! every `max.connections` slot; and a rate limit on the log lines of refusals, so that a
//! client retrying in a loop cannot flood the log.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Open connections per client address, all shards. Touched once per accept and once per
/// close, never on the request path, so a mutex costs nothing that matters.
#[derive(Default)]
pub struct PerIp {
    open: Mutex<HashMap<IpAddr, u64>>,
}

/// One admitted connection's place in its address's count; given back on drop.
pub struct IpSlot {
    table: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    /// Admits a connection from `ip` if it has fewer than `max` open; else returns how
    /// many it has.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, max: u64) -> Result<IpSlot, u64> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= max {
            let have = *count;
            if have == 0 {
                open.remove(&ip);
            }
            return Err(have);
        }
        *count += 1;
        Ok(IpSlot {
            table: self.clone(),
            ip,
        })
    }

    /// Connections open from `ip` now.
    pub fn open_from(&self, ip: IpAddr) -> u64 {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.get_mut(&self.ip);
        assert!(
            count.as_ref().is_some_and(|c| **c > 0),
            "a slot's address is counted while the slot lives"
        );
        let Some(count) = count else { return };
        *count -= 1;
        if *count == 0 {
            // Forget addresses with nothing open, so the table stays as small as the set
            // of connected clients.
            open.remove(&self.ip);
        }
    }
}

/// At most one log line per [`RefusalLog::INTERVAL`] per shard; the lines in between are
/// counted and the count is reported with the next one.
#[derive(Default)]
pub struct RefusalLog {
    last: Cell<Option<Instant>>,
    suppressed: Cell<u64>,
}

impl RefusalLog {
    pub const INTERVAL: Duration = Duration::from_secs(1);

    /// `Some(lines suppressed since the last one)` if a line may be logged now.
    pub fn allow(&self) -> Option<u64> {
        let now = Instant::now();
        if self.last.get().is_some_and(|t| now < t + Self::INTERVAL) {
            self.suppressed.set(self.suppressed.get().saturating_add(1));
            return None;
        }
        self.last.set(Some(now));
        Some(self.suppressed.replace(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_ip_counts_and_forgets() {
        let table = Arc::new(PerIp::default());
        let a: IpAddr = "127.0.0.1".parse().expect("ip");
        let b: IpAddr = "127.0.0.2".parse().expect("ip");
        let s1 = table.admit(a, 2).expect("first");
        let s2 = table.admit(a, 2).expect("second");
        assert_eq!(table.admit(a, 2).err(), Some(2), "the third is refused");
        let s3 = table
            .admit(b, 2)
            .expect("another address has its own count");
        drop(s1);
        let s4 = table.admit(a, 2).expect("a freed slot is reused");
        drop((s2, s3, s4));
        assert_eq!(table.open_from(a), 0);
        assert!(table.open.lock().expect("lock").is_empty());
        assert_eq!(table.admit(a, 0).err(), Some(0), "0 refuses everyone");
        assert!(table.open.lock().expect("lock").is_empty());
    }

    #[test]
    fn refusal_log_is_rate_limited() {
        let log = RefusalLog::default();
        assert_eq!(log.allow(), Some(0));
        assert_eq!(log.allow(), None);
        assert_eq!(log.allow(), None);
        log.last.set(Some(Instant::now() - RefusalLog::INTERVAL));
        assert_eq!(
            log.allow(),
            Some(2),
            "the next line reports what was left out"
        );
    }
}
