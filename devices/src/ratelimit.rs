//! Rate-limited logging for paths a guest can trigger at will.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Allows `burst` messages per `window`, then counts what it drops and reports the count
/// with the next message it lets through.
#[derive(Debug)]
pub struct RateLimiter {
    inner: Mutex<State>,
    burst: u32,
    window: Duration,
}

#[derive(Debug)]
struct State {
    window_start: Option<Instant>,
    sent: u32,
    dropped: u64,
    /// Every message dropped over the limiter's life.
    dropped_total: u64,
}

impl RateLimiter {
    /// A limiter of `burst` messages per `window`.
    pub const fn new(burst: u32, window: Duration) -> Self {
        Self {
            inner: Mutex::new(State {
                window_start: None,
                sent: 0,
                dropped: 0,
                dropped_total: 0,
            }),
            burst,
            window,
        }
    }

    /// Whether a message may go out now, and how many were dropped before it.
    pub fn check(&self, now: Instant) -> Option<u64> {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = match s.window_start {
            Some(t) => now.duration_since(t) >= self.window,
            None => true,
        };
        if fresh {
            s.window_start = Some(now);
            s.sent = 0;
        }
        if s.sent < self.burst {
            s.sent += 1;
            let d = s.dropped;
            s.dropped = 0;
            Some(d)
        } else {
            s.dropped += 1;
            s.dropped_total += 1;
            None
        }
    }

    /// How many messages it has dropped in all (for reports).
    pub fn dropped_total(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dropped_total
    }
}

/// Logs a warning through a [`RateLimiter`].
#[macro_export]
macro_rules! warn_ratelimited {
    ($limiter:expr, $($arg:tt)*) => {{
        if let Some(dropped) = $limiter.check(std::time::Instant::now()) {
            if dropped > 0 {
                log::warn!("{} ({} similar messages suppressed)", format_args!($($arg)*), dropped);
            } else {
                log::warn!($($arg)*);
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_drops_then_reports() {
        let l = RateLimiter::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(l.check(t0), Some(0));
        assert_eq!(l.check(t0), Some(0));
        assert_eq!(l.check(t0), None);
        assert_eq!(l.check(t0 + Duration::from_millis(500)), None);
        // Next window: lets one through and reports the two dropped.
        assert_eq!(l.check(t0 + Duration::from_secs(1)), Some(2));
        assert_eq!(l.check(t0 + Duration::from_secs(1)), Some(0));
    }
}
