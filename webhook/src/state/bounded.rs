//! A bounded map for the content-digest cache, bounded in entries and in bytes.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

/// A bounded map with approximately-least-recently-used eviction: two generations, the young one takes
/// inserts and promoted hits; when it is full (in entries or in bytes) the old generation is dropped whole.
/// Lookups and inserts are O(1), and at most `capacity` entries and `max_bytes` bytes (as `weigh` counts
/// them) are ever held; an entry weighing more than half of `max_bytes` is not kept.
pub(crate) struct BoundedCache<K, V> {
    inner: Mutex<Generations<K, V>>,
    half: usize,
    half_bytes: usize,
    weigh: fn(&K, &V) -> usize,
}

struct Generations<K, V> {
    young: HashMap<K, V>,
    old: HashMap<K, V>,
    young_bytes: usize,
    old_bytes: usize,
}

impl<K: Eq + Hash, V: Clone> BoundedCache<K, V> {
    /// A cache holding at most `capacity` entries (at least 2).
    #[cfg(test)]
    pub(crate) fn new(capacity: usize) -> Self {
        Self::weighed(capacity, usize::MAX, |_, _| 0)
    }

    /// A cache holding at most `capacity` entries (at least 2) and `max_bytes` as `weigh` counts them.
    pub(crate) fn weighed(capacity: usize, max_bytes: usize, weigh: fn(&K, &V) -> usize) -> Self {
        BoundedCache {
            inner: Mutex::new(Generations {
                young: HashMap::new(),
                old: HashMap::new(),
                young_bytes: 0,
                old_bytes: 0,
            }),
            half: (capacity / 2).max(1),
            half_bytes: (max_bytes / 2).max(1),
            weigh,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generations<K, V>> {
        // A panic while holding the lock cannot leave the maps inconsistent for this use: keep going.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self, key: &K) -> Option<V>
    where
        K: Clone,
    {
        let mut g = self.lock();
        if let Some(v) = g.young.get(key) {
            return Some(v.clone());
        }
        let v = g.old.remove(key)?;
        let weight = (self.weigh)(key, &v);
        g.old_bytes = g.old_bytes.saturating_sub(weight);
        self.insert_young(&mut g, key.clone(), v.clone(), weight);
        Some(v)
    }

    pub(crate) fn insert(&self, key: K, value: V) {
        let weight = (self.weigh)(&key, &value);
        let mut g = self.lock();
        if let Some(old) = g.old.remove(&key) {
            let w = (self.weigh)(&key, &old);
            g.old_bytes = g.old_bytes.saturating_sub(w);
        }
        if weight > self.half_bytes {
            if let Some(young) = g.young.remove(&key) {
                let w = (self.weigh)(&key, &young);
                g.young_bytes = g.young_bytes.saturating_sub(w);
            }
            return;
        }
        self.insert_young(&mut g, key, value, weight);
    }

    fn insert_young(&self, g: &mut Generations<K, V>, key: K, value: V, weight: usize) {
        if let Some(previous) = g.young.remove(&key) {
            let w = (self.weigh)(&key, &previous);
            g.young_bytes = g.young_bytes.saturating_sub(w);
        }
        if g.young.len() >= self.half || g.young_bytes + weight > self.half_bytes {
            g.old = std::mem::take(&mut g.young);
            g.old_bytes = std::mem::take(&mut g.young_bytes);
        }
        g.young.insert(key, value);
        g.young_bytes += weight;
    }

    /// Bytes held, as `weigh` counts them.
    pub(crate) fn bytes(&self) -> usize {
        let g = self.lock();
        g.young_bytes + g.old_bytes
    }

    pub(crate) fn len(&self) -> usize {
        let g = self.lock();
        g.young.len() + g.old.len()
    }

    pub(crate) fn clear(&self) {
        let mut g = self.lock();
        g.young.clear();
        g.old.clear();
        g.young_bytes = 0;
        g.old_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_cache_never_exceeds_capacity() {
        let c = BoundedCache::new(10);
        for i in 0..1000 {
            c.insert(i, i * 2);
            assert!(c.len() <= 10, "len {} after {i}", c.len());
        }
        assert_eq!(c.get(&999), Some(1998));
        assert_eq!(c.get(&0), None);
    }

    #[test]
    fn bounded_cache_keeps_recently_used_entries() {
        let c = BoundedCache::new(4);
        c.insert("a", 1);
        c.insert("b", 2);
        // "a" and "b" move to the old generation when "c" arrives.
        c.insert("c", 3);
        // A hit promotes "a" back into the young generation ...
        assert_eq!(c.get(&"a"), Some(1));
        // ... so the next rollover drops "b", not "a".
        c.insert("d", 4);
        c.insert("e", 5);
        assert_eq!(c.get(&"a"), Some(1));
        assert_eq!(c.get(&"b"), None);
        assert!(c.len() <= 4);
    }

    #[test]
    fn bounded_cache_replaces_and_clears() {
        let c = BoundedCache::new(4);
        c.insert("k", 1);
        c.insert("k", 2);
        assert_eq!(c.get(&"k"), Some(2));
        assert_eq!(c.len(), 1);
        c.clear();
        assert_eq!(c.len(), 0);
        assert_eq!(c.get(&"k"), None);
    }

    // The cache's weigher type is `fn(&K, &V)`, `V = String`.
    #[allow(clippy::ptr_arg)]
    fn weight(_: &u32, v: &String) -> usize {
        v.len()
    }

    #[test]
    fn weighed_cache_never_exceeds_its_bytes() {
        let c = BoundedCache::weighed(1_000_000, 10_000, weight);
        for i in 0..1000u32 {
            c.insert(i, "x".repeat((i as usize % 7) * 300));
            assert!(c.bytes() <= 10_000, "{} bytes after {i}", c.bytes());
            let held: usize = {
                let g = c.lock();
                g.young
                    .values()
                    .chain(g.old.values())
                    .map(String::len)
                    .sum()
            };
            assert_eq!(held, c.bytes(), "the count matches what is held");
        }
        // An entry heavier than half the bound is not kept, and replaces nothing.
        c.insert(5000, "y".repeat(6_000));
        assert_eq!(c.get(&5000), None);
        c.insert(999, "z".repeat(10));
        c.insert(999, "z".repeat(6_000));
        assert_eq!(
            c.get(&999),
            None,
            "a replaced entry too heavy to keep is dropped"
        );
        c.clear();
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn tiny_capacity_still_works() {
        let c = BoundedCache::new(0);
        c.insert(1, 1);
        c.insert(2, 2);
        assert!(c.len() <= 2);
        assert_eq!(c.get(&2), Some(2));
    }
}
