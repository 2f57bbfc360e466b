//! Shared state across resolutions: bounded caches whose entries each live for a time chosen by their value
//! (a resolved digest briefly, a failure longer, a token as long as its registry said), with concurrent lookups
//! of one key sharing one computation, bounded in entries or in bytes; and a per-registry concurrency limit,
//! so a burst of requests cannot stampede one registry (or trip its rate limiting), whose map of hosts is
//! pruned of idle ones and bounded.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a value stays, decided when it is stored.
type Lifetime<V> = Arc<dyn Fn(&V) -> Duration + Send + Sync>;

struct ByValue<V>(Lifetime<V>);

impl<K, V> moka::Expiry<K, V> for ByValue<V> {
    fn expire_after_create(&self, _key: &K, value: &V, _created_at: Instant) -> Option<Duration> {
        Some((self.0)(value))
    }
}

/// A bounded cache (least useful entries go first when full) whose entries expire after the lifetime the
/// cache gives their value; a zero lifetime is never served again.
pub struct ExpiringCache<K, V> {
    entries: moka::future::Cache<K, V>,
}

impl<K, V> ExpiringCache<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub fn new(capacity: u64, lifetime: impl Fn(&V) -> Duration + Send + Sync + 'static) -> Self {
        ExpiringCache {
            entries: moka::future::Cache::builder()
                .max_capacity(capacity.max(1))
                .expire_after(ByValue(Arc::new(lifetime)))
                .build(),
        }
    }

    /// A cache holding at most `max_bytes` as `weigh` counts them (an entry weighing more than that is never
    /// kept). Weigh what an entry holds on the heap, with some overhead, so the bound is one of memory.
    pub fn weighed(
        max_bytes: u64,
        weigh: impl Fn(&K, &V) -> u32 + Send + Sync + 'static,
        lifetime: impl Fn(&V) -> Duration + Send + Sync + 'static,
    ) -> Self {
        ExpiringCache {
            entries: moka::future::Cache::builder()
                .max_capacity(max_bytes.max(1))
                .weigher(weigh)
                .expire_after(ByValue(Arc::new(lifetime)))
                .build(),
        }
    }

    /// The total weight held (entries for an unweighed cache), counting entries not yet swept.
    pub fn weight(&self) -> u64 {
        self.entries.weighted_size()
    }

    pub async fn get(&self, key: &K) -> Option<V> {
        self.entries.get(key).await
    }

    pub async fn insert(&self, key: K, value: V) {
        self.entries.insert(key, value).await;
    }

    /// The value stored for `key`, else `lookup`'s, stored. Of concurrent calls for one key, one runs its
    /// `lookup` and the others wait for that value (if the runner is dropped midway, a waiter runs its own).
    /// The flag is true when this call's `lookup` produced the value.
    pub async fn get_or_run(&self, key: K, lookup: impl Future<Output = V>) -> (V, bool) {
        let entry = self.entries.entry(key).or_insert_with(lookup).await;
        let fresh = entry.is_fresh();
        (entry.into_value(), fresh)
    }

    /// Entries held, counting expired or evicted ones not yet swept.
    pub fn len(&self) -> u64 {
        self.entries.entry_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies pending evictions and expirations now (they otherwise run on later reads and writes).
    pub async fn sweep(&self) {
        self.entries.run_pending_tasks().await;
    }
}

/// Idle hosts are dropped from the limiter's map once it holds this many.
pub const LIMITER_PRUNE_AT: usize = 256;

/// At most `per_registry` requests in flight to one registry host. The map of hosts is pruned of idle ones
/// (no request in flight or waiting) whenever it reaches [`LIMITER_PRUNE_AT`], and never holds more than
/// `max_hosts`: a new host beyond that gets no slot until others are done.
pub struct RegistryLimiter {
    per_registry: usize,
    max_hosts: usize,
    semaphores: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl RegistryLimiter {
    pub fn new(per_registry: usize) -> Self {
        Self::bounded(per_registry, 4 * LIMITER_PRUNE_AT)
    }

    /// A limiter tracking at most `max_hosts` hosts at once.
    pub fn bounded(per_registry: usize, max_hosts: usize) -> Self {
        RegistryLimiter {
            per_registry: per_registry.max(1),
            max_hosts: max_hosts.max(1),
            semaphores: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for a slot for `host`; the caller's time budget bounds the wait. `None` when `max_hosts` other
    /// hosts are busy.
    pub async fn acquire(&self, host: &str) -> Option<OwnedSemaphorePermit> {
        let semaphore = {
            let mut map = self
                .semaphores
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if !map.contains_key(host) && map.len() >= LIMITER_PRUNE_AT.min(self.max_hosts) {
                // Held only by the map: nobody holds or waits for a slot of that host.
                map.retain(|_, s| Arc::strong_count(s) > 1);
                if map.len() >= self.max_hosts {
                    return None;
                }
            }
            map.entry(host.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_registry)))
                .clone()
        };
        // The semaphore is never closed.
        semaphore.acquire_owned().await.ok()
    }

    /// Hosts in the map (idle ones included until the next prune).
    pub fn hosts(&self) -> usize {
        self.semaphores
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::future::join_all;

    use super::*;

    type Outcome = Result<u32, &'static str>;

    /// Successes for 30 s, failures for `negative`.
    fn outcomes(negative: Duration) -> ExpiringCache<&'static str, Outcome> {
        ExpiringCache::new(100, move |v: &Outcome| {
            if v.is_ok() {
                Duration::from_secs(30)
            } else {
                negative
            }
        })
    }

    #[tokio::test]
    async fn concurrent_lookups_of_one_key_run_one_lookup() {
        let cache = outcomes(Duration::from_secs(30));
        let runs = AtomicUsize::new(0);
        // One task: every caller is polled (the first starts its lookup, the rest wait on it) before the
        // first lookup is polled again and finishes.
        let answers = join_all((0..8).map(|_| {
            cache.get_or_run("reg/app:latest", async {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                Ok(7)
            })
        }))
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(answers.iter().all(|(v, _)| *v == Ok(7)), "{answers:?}");
        assert_eq!(answers.iter().filter(|(_, fresh)| *fresh).count(), 1);
        // Later lookups are answered from the cache.
        let (again, fresh) = cache.get_or_run("reg/app:latest", async { Ok(8) }).await;
        assert_eq!((again, fresh), (Ok(7), false));
    }

    #[tokio::test]
    async fn failures_expire_on_their_own_lifetime_and_successes_stay() {
        let cache = outcomes(Duration::from_millis(50));
        cache.insert("ok", Ok(1)).await;
        cache.insert("down", Err("unreachable")).await;
        assert_eq!(cache.get(&"down").await, Some(Err("unreachable")));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while cache.get(&"down").await.is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a failure outlived its lifetime"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(cache.get(&"ok").await, Some(Ok(1)));
        let (value, fresh) = cache.get_or_run("down", async { Ok(2) }).await;
        assert_eq!(
            (value, fresh),
            (Ok(2), true),
            "an expired entry is looked up again"
        );
    }

    #[tokio::test]
    async fn a_zero_lifetime_is_never_served() {
        let cache = outcomes(Duration::ZERO);
        let (first, _) = cache.get_or_run("k", async { Err("down") }).await;
        assert_eq!(first, Err("down"));
        assert_eq!(cache.get(&"k").await, None);
        let (second, fresh) = cache.get_or_run("k", async { Ok(3) }).await;
        assert_eq!((second, fresh), (Ok(3), true));
    }

    #[tokio::test]
    async fn capacity_is_bounded() {
        let cache: ExpiringCache<u32, u32> = ExpiringCache::new(10, |_| Duration::from_secs(30));
        for i in 0..200 {
            cache.insert(i, i).await;
        }
        cache.sweep().await;
        assert!(cache.len() <= 10, "{} entries", cache.len());
    }

    #[tokio::test]
    async fn weighed_capacity_is_bytes() {
        let cache: ExpiringCache<u32, String> = ExpiringCache::weighed(
            10_000,
            |_, v: &String| u32::try_from(v.len()).unwrap_or(u32::MAX),
            |_| Duration::from_secs(30),
        );
        for i in 0..100 {
            cache.insert(i, "x".repeat(1000)).await;
        }
        // One entry heavier than the whole cache is never kept.
        cache.insert(1000, "y".repeat(20_000)).await;
        cache.sweep().await;
        assert!(cache.weight() <= 10_000, "{} bytes", cache.weight());
        assert_eq!(cache.get(&1000).await, None);
    }

    #[tokio::test]
    async fn the_limiter_map_is_pruned_and_bounded() {
        let limiter = RegistryLimiter::bounded(1, LIMITER_PRUNE_AT + 4);
        for i in 0..10 * LIMITER_PRUNE_AT {
            let permit = limiter.acquire(&format!("h{i}:443")).await;
            assert!(permit.is_some());
        }
        assert!(
            limiter.hosts() <= LIMITER_PRUNE_AT,
            "{} hosts",
            limiter.hosts()
        );
        // Busy hosts are kept; past `max_hosts` busy ones a new host gets no slot.
        let mut held = Vec::new();
        for i in 0..LIMITER_PRUNE_AT + 4 {
            held.push(limiter.acquire(&format!("busy{i}:443")).await);
        }
        assert!(held.iter().all(Option::is_some));
        assert!(limiter.acquire("one-more:443").await.is_none());
        held.clear();
        assert!(limiter.acquire("one-more:443").await.is_some());
        assert!(limiter.hosts() <= LIMITER_PRUNE_AT);
    }

    #[tokio::test]
    async fn limiter_bounds_concurrency_per_host() {
        let limiter = RegistryLimiter::new(1);
        let held = limiter.acquire("a:1").await;
        // Another host is independent.
        let _other = limiter.acquire("b:1").await;
        let blocked = tokio::time::timeout(Duration::from_millis(50), limiter.acquire("a:1")).await;
        assert!(blocked.is_err(), "a second request to a:1 got a slot");
        drop(held);
        assert!(
            tokio::time::timeout(Duration::from_secs(5), limiter.acquire("a:1"))
                .await
                .is_ok()
        );
    }
}
