//! A bounded map for the content-digest cache.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

/// A bounded map with approximately-least-recently-used eviction: two generations, the young one takes
/// inserts and promoted hits; when it is full the old generation is dropped whole. Lookups and inserts
/// are O(1), and at most `capacity` entries are ever held.
pub(crate) struct BoundedCache<K, V> {
    inner: Mutex<Generations<K, V>>,
    half: usize,
}

struct Generations<K, V> {
    young: HashMap<K, V>,
    old: HashMap<K, V>,
}

impl<K: Eq + Hash, V: Clone> BoundedCache<K, V> {
    /// A cache holding at most `capacity` entries (at least 2).
    pub(crate) fn new(capacity: usize) -> Self {
        BoundedCache {
            inner: Mutex::new(Generations {
                young: HashMap::new(),
                old: HashMap::new(),
            }),
            half: (capacity / 2).max(1),
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
        Self::insert_young(&mut g, self.half, key.clone(), v.clone());
        Some(v)
    }

    pub(crate) fn insert(&self, key: K, value: V) {
        let mut g = self.lock();
        g.old.remove(&key);
        Self::insert_young(&mut g, self.half, key, value);
    }

    fn insert_young(g: &mut Generations<K, V>, half: usize, key: K, value: V) {
        if g.young.len() >= half && !g.young.contains_key(&key) {
            g.old = std::mem::take(&mut g.young);
        }
        g.young.insert(key, value);
    }

    pub(crate) fn len(&self) -> usize {
        let g = self.lock();
        g.young.len() + g.old.len()
    }

    pub(crate) fn clear(&self) {
        let mut g = self.lock();
        g.young.clear();
        g.old.clear();
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

    #[test]
    fn tiny_capacity_still_works() {
        let c = BoundedCache::new(0);
        c.insert(1, 1);
        c.insert(2, 2);
        assert!(c.len() <= 2);
        assert_eq!(c.get(&2), Some(2));
    }
}
