//! Shared state across resolutions: a bounded TTL cache (positive and negative entries live
//! for different times) and a per-registry concurrency limit, so a burst of requests cannot stampede one
//! registry (or trip its rate limiting).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A bounded map whose entries expire; when full, expired entries go first, then the one expiring soonest.
pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize) -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, (V, Instant)>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn get(&self, key: &K) -> Option<V> {
        self.get_at(key, Instant::now())
    }

    fn get_at(&self, key: &K, now: Instant) -> Option<V> {
        let mut entries = self.lock();
        match entries.get(key) {
            Some((value, expires)) if *expires > now => Some(value.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    pub fn insert(&self, key: K, value: V, ttl: Duration) {
        self.insert_at(key, value, ttl, Instant::now());
    }

    fn insert_at(&self, key: K, value: V, ttl: Duration, now: Instant) {
        let mut entries = self.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= self.capacity
                && let Some(soonest) = entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| k.clone())
            {
                entries.remove(&soonest);
            }
        }
        entries.insert(key, (value, now + ttl));
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// At most `per_registry` requests in flight to one registry host.
pub struct RegistryLimiter {
    per_registry: usize,
    semaphores: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl RegistryLimiter {
    pub fn new(per_registry: usize) -> Self {
        RegistryLimiter {
            per_registry: per_registry.max(1),
            semaphores: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for a slot for `host`; the caller's time budget bounds the wait.
    pub async fn acquire(&self, host: &str) -> Option<OwnedSemaphorePermit> {
        let semaphore = {
            let mut map = self
                .semaphores
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            map.entry(host.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_registry)))
                .clone()
        };
        // The semaphore is never closed; `None` would only let the caller go on unlimited.
        semaphore.acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_capacity_is_bounded() {
        let cache = TtlCache::new(2);
        let t0 = Instant::now();
        cache.insert_at("a", 1, Duration::from_secs(30), t0);
        cache.insert_at("b", 2, Duration::from_secs(10), t0);
        assert_eq!(cache.get_at(&"a", t0), Some(1));
        assert_eq!(cache.get_at(&"b", t0 + Duration::from_secs(11)), None);
        assert_eq!(cache.len(), 1, "an expired entry is dropped when read");
        cache.insert_at("b", 2, Duration::from_secs(10), t0);
        // Full: the entry expiring soonest ("b") makes room.
        cache.insert_at("c", 3, Duration::from_secs(30), t0);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get_at(&"b", t0), None);
        assert_eq!(cache.get_at(&"a", t0), Some(1));
        // Replacing an entry when full evicts nothing else.
        cache.insert_at("a", 9, Duration::from_secs(30), t0);
        assert_eq!(
            (cache.get_at(&"a", t0), cache.get_at(&"c", t0)),
            (Some(9), Some(3))
        );
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
