//! Per-token request rate bound of the admin API (a token bucket per token id): a
//! client flooding the master with admin requests is answered 429 instead of
//! holding the core's lock away from the agents. Agents' requests are not limited.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Requests per second each admin token may send on average.
pub const ADMIN_RATE_PER_SEC: f64 = 2_000.0;
/// How many requests a token may send at once after a quiet period.
pub const ADMIN_BURST: f64 = 4_000.0;
/// Buckets kept before idle ones are dropped.
const MAX_BUCKETS: usize = 10_000;

/// One token's bucket: how many requests it may still send, as of `at`.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    level: f64,
    at: Instant,
}

/// Whether a request with `bucket` at `now` is allowed (pure), and the new bucket.
fn take(bucket: Option<Bucket>, now: Instant, rate: f64, burst: f64) -> (bool, Bucket) {
    let level = match bucket {
        None => burst,
        Some(b) => (b.level + now.saturating_duration_since(b.at).as_secs_f64() * rate).min(burst),
    };
    if level >= 1.0 {
        (
            true,
            Bucket {
                level: level - 1.0,
                at: now,
            },
        )
    } else {
        (false, Bucket { level, at: now })
    }
}

/// The buckets of every admin token.
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Default for RateLimiter {
    fn default() -> RateLimiter {
        RateLimiter::new(ADMIN_RATE_PER_SEC, ADMIN_BURST)
    }
}

impl RateLimiter {
    /// A limiter of `rate` requests per second with bursts of `burst`.
    pub fn new(rate: f64, burst: f64) -> RateLimiter {
        RateLimiter {
            rate,
            burst,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `token_id` may send a request now.
    pub fn allow(&self, token_id: &str) -> bool {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(token_id) {
            let full = self.burst / self.rate;
            buckets.retain(|_, b| now.saturating_duration_since(b.at).as_secs_f64() < full);
        }
        let (allowed, bucket) = take(buckets.get(token_id).copied(), now, self.rate, self.burst);
        buckets.insert(token_id.to_string(), bucket);
        allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut bucket = None;
        let mut allowed = 0;
        for _ in 0..10 {
            let (ok, b) = take(bucket, t0, 100.0, 5.0);
            allowed += usize::from(ok);
            bucket = Some(b);
        }
        assert_eq!(allowed, 5, "the burst");
        let (ok, b) = take(bucket, t0 + Duration::from_millis(5), 100.0, 5.0);
        assert!(!ok, "half a request refilled");
        let (ok, _) = take(Some(b), t0 + Duration::from_millis(11), 100.0, 5.0);
        assert!(ok, "one request refilled after 10 ms at 100/s");
    }

    #[test]
    fn tokens_have_their_own_buckets() {
        let limiter = RateLimiter::new(1.0, 2.0);
        assert!(limiter.allow("a") && limiter.allow("a"));
        assert!(!limiter.allow("a"));
        assert!(limiter.allow("b"));
    }
}
