//! Rate limit for log lines a client can cause (a bad frame, an unserved version): one
//! line per bad request let one client spraying garbage flood the log, and the shard that
//! writes the line waits on the log's writer (a pipe, a journal) while every other client
//! of that shard waits behind it — measured by the TCP fuzzer: canary p99 72 ms, max
//! 0.8 s with one line per bad frame, 2.9 ms / 47 ms with them off. Per shard thread, at
//! most [`CLIENT_LINES_PER_SECOND_MAX`] such lines a second; the next line let through
//! carries how many were suppressed before it.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Client-caused log lines each shard writes per second, at most.
pub const CLIENT_LINES_PER_SECOND_MAX: u32 = 10;

thread_local! {
    /// Start of the current one-second window and the lines written in it.
    static WINDOW: Cell<Option<(Instant, u32)>> = const { Cell::new(None) };
    /// Lines suppressed since the last one written.
    static SUPPRESSED: Cell<u64> = const { Cell::new(0) };
}

/// Whether a client-caused line may be written now: `Some(n)` with the number of lines
/// suppressed since the last one written, or `None` (the line is dropped and counted).
pub fn allow() -> Option<u64> {
    let now = Instant::now();
    let used = WINDOW.with(|w| {
        let (start, used) = match w.get() {
            Some((start, used)) if now.duration_since(start) < Duration::from_secs(1) => {
                (start, used)
            }
            _ => (now, 0),
        };
        let used = used.saturating_add(1);
        w.set(Some((start, used)));
        used
    });
    if used > CLIENT_LINES_PER_SECOND_MAX {
        SUPPRESSED.with(|s| s.set(s.get().saturating_add(1)));
        return None;
    }
    Some(SUPPRESSED.with(|s| s.replace(0)))
}

/// `tracing::warn!` for a line a client caused, rate limited by [`allow`]; the line gets a
/// `suppressed` field (lines dropped before it).
#[macro_export]
macro_rules! client_warn {
    ($($arg:tt)+) => {
        if let Some(suppressed) = $crate::log_limit::allow() {
            tracing::warn!(suppressed, $($arg)+);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_the_limit_per_second_then_the_count_of_suppressed_lines() {
        let allowed = (0..100).filter(|_| allow().is_some()).count();
        assert_eq!(allowed, CLIENT_LINES_PER_SECOND_MAX as usize);
        // A new window: the first line reports the 90 dropped ones.
        WINDOW.with(|w| w.set(None));
        assert_eq!(allow(), Some(100 - u64::from(CLIENT_LINES_PER_SECOND_MAX)));
        assert_eq!(allow(), Some(0));
    }
}
