//! The content hashes of live copies a watcher (`propagate --watch`) read whole in one run and
//! need not read again in the next: an object whose `uid` and `resourceVersion` are those it had
//! when it was hashed holds the same content, since any change to it takes a new
//! `resourceVersion`. So an entry is used only when the run's listing shows the object at exactly
//! that `uid` and `resourceVersion`, hashed with the same upstream key; anything else is read
//! whole again, as without it.
//!
//! Why: a run reads each of its copies on a cluster whole to find drift, although all but the
//! edited one are unchanged; at 1,000 clusters with 4 copies each that was 4 of the 13 requests
//! per cluster an edit costs (docs/performance.md, "Watching a fleet").
//!
//! A write keeps what it left too ([`KeptHashes::record`]): the server's answer to a create or an
//! apply is the object whole at its new `resourceVersion`, so the run after an edit does not read
//! back the copy the edit wrote (it did: 1.17 whole reads per cluster and edit, issue 27).
//!
//! Bounded by the fleet: each observation of a cluster replaces that cluster's entries of the
//! kinds it listed with the ones it saw (one per copy of this upstream at a wanted place), a write
//! adds at most the one copy it wrote, and the watcher drops all of them with its other kept reads
//! (resync, new leadership, a failed run: [`crate::cluster::read_cache::ReadCache::clear`]). Holds
//! hashes only, never content.

use std::collections::HashMap;
use std::sync::Mutex;

use helmop_core::resource::{ResourceKind, ResourceRef};

/// What a whole read of a copy found: what the plan needs of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveHash {
    pub hash: String,
    pub type_: Option<String>,
    pub immutable: bool,
}

/// The object a hash was taken of, and with which key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub uid: String,
    pub resource_version: String,
    /// Tells the upstream key apart (a keyed hash of nothing): a new key hashes differently.
    pub key: String,
}

/// A place on a cluster: (namespace, resource).
pub type Place = (String, ResourceRef);

/// The hashes taken on one cluster, by place.
pub type Hashed = HashMap<Place, (Taken, LiveHash)>;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct KeptHashes {
    clusters: Mutex<HashMap<String, Hashed>>,
}

impl KeptHashes {
    /// The hash kept for `place` on `cluster`, if it was taken of exactly `taken`.
    pub fn get(&self, cluster: &str, place: &Place, taken: &Taken) -> Option<LiveHash> {
        let clusters = self.clusters.lock().ok()?;
        let (kept, live) = clusters.get(cluster)?.get(place)?;
        (kept == taken && !taken.resource_version.is_empty()).then(|| live.clone())
    }

    /// What an observation of `cluster` that listed `kinds` hashed (read now or kept): replaces
    /// what was kept for it of those kinds (a run over some kinds did not look at the others).
    pub fn keep(&self, cluster: &str, kinds: &[ResourceKind], seen: Hashed) {
        let Ok(mut clusters) = self.clusters.lock() else {
            return;
        };
        let mut kept = clusters.remove(cluster).unwrap_or_default();
        kept.retain(|(_, resource), _| !kinds.contains(&resource.kind));
        kept.extend(seen);
        if !kept.is_empty() {
            clusters.insert(cluster.to_owned(), kept);
        }
    }

    /// What a write on `cluster` left at `place`, hashed from the server's answer (the object
    /// whole, at the version the write gave it): the next observation finds the copy at exactly
    /// that version and need not read it again.
    pub fn record(&self, cluster: &str, place: Place, taken: Taken, live: LiveHash) {
        if let Ok(mut clusters) = self.clusters.lock() {
            clusters
                .entry(cluster.to_owned())
                .or_default()
                .insert(place, (taken, live));
        }
    }

    pub fn clear(&self) {
        if let Ok(mut clusters) = self.clusters.lock() {
            clusters.clear();
        }
    }

    /// Hashes kept, over every cluster.
    pub fn len(&self) -> usize {
        self.clusters
            .lock()
            .map_or(0, |c| c.values().map(HashMap::len).sum())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[ResourceKind] = &ResourceKind::ALL;

    fn taken(version: &str, key: &str) -> Taken {
        Taken {
            uid: "u1".into(),
            resource_version: version.into(),
            key: key.into(),
        }
    }

    fn live(hash: &str) -> LiveHash {
        LiveHash {
            hash: hash.into(),
            type_: None,
            immutable: false,
        }
    }

    #[test]
    fn a_hash_is_used_only_for_the_same_object_version_and_key() {
        let kept = KeptHashes::default();
        let place: Place = ("apps".into(), ResourceRef::secret("db"));
        kept.keep(
            "c1",
            ALL,
            HashMap::from([(place.clone(), (taken("7", "k1"), live("h")))]),
        );
        assert_eq!(kept.get("c1", &place, &taken("7", "k1")), Some(live("h")));
        // Changed since (a new resourceVersion), recreated (a new uid), another key, another
        // cluster, another place: read again.
        assert_eq!(kept.get("c1", &place, &taken("8", "k1")), None);
        let recreated = Taken {
            uid: "u2".into(),
            ..taken("7", "k1")
        };
        assert_eq!(kept.get("c1", &place, &recreated), None);
        assert_eq!(kept.get("c1", &place, &taken("7", "k2")), None);
        assert_eq!(kept.get("c2", &place, &taken("7", "k1")), None);
        let other: Place = ("apps".into(), ResourceRef::config_map("db"));
        assert_eq!(kept.get("c1", &other, &taken("7", "k1")), None);
        // A version the server did not give is never a match.
        kept.keep(
            "c1",
            ALL,
            HashMap::from([(place.clone(), (taken("", "k1"), live("h")))]),
        );
        assert_eq!(kept.get("c1", &place, &taken("", "k1")), None);
        // The next observation of a cluster replaces its entries: bounded by what it saw.
        kept.keep("c1", ALL, HashMap::new());
        assert!(kept.is_empty());
        kept.keep(
            "c1",
            ALL,
            HashMap::from([(place.clone(), (taken("7", "k1"), live("h")))]),
        );
        kept.clear();
        assert_eq!(kept.len(), 0);
    }

    #[test]
    fn a_write_is_kept_at_the_version_it_made_until_the_next_observation() {
        let kept = KeptHashes::default();
        let place: Place = ("apps".into(), ResourceRef::config_map("app"));
        let other: Place = ("apps".into(), ResourceRef::secret("db"));
        kept.keep(
            "c1",
            ALL,
            HashMap::from([(place.clone(), (taken("7", "k1"), live("old")))]),
        );
        // A created copy on a cluster nothing was kept for yet, and an update over an entry.
        kept.record("c2", other.clone(), taken("3", "k1"), live("new"));
        kept.record("c1", place.clone(), taken("9", "k1"), live("new"));
        kept.record("c1", other.clone(), taken("10", "k1"), live("db"));
        assert_eq!(kept.get("c2", &other, &taken("3", "k1")), Some(live("new")));
        assert_eq!(kept.get("c1", &place, &taken("9", "k1")), Some(live("new")));
        assert_eq!(kept.get("c1", &place, &taken("7", "k1")), None);
        assert_eq!(kept.len(), 3);
        // The next observation decides again what stays.
        kept.keep("c1", ALL, HashMap::new());
        assert_eq!(kept.len(), 1);
    }

    #[test]
    fn an_observation_of_some_kinds_replaces_only_theirs() {
        let kept = KeptHashes::default();
        let secret: Place = ("apps".into(), ResourceRef::secret("db"));
        let config: Place = ("apps".into(), ResourceRef::config_map("app"));
        kept.keep(
            "c1",
            ALL,
            HashMap::from([
                (secret.clone(), (taken("7", "k1"), live("s"))),
                (config.clone(), (taken("8", "k1"), live("c"))),
            ]),
        );
        // A run over ConfigMaps saw the ConfigMap at a new version: the Secret's hash stays.
        kept.keep(
            "c1",
            &[ResourceKind::ConfigMap],
            HashMap::from([(config.clone(), (taken("9", "k1"), live("c2")))]),
        );
        assert_eq!(kept.get("c1", &secret, &taken("7", "k1")), Some(live("s")));
        assert_eq!(kept.get("c1", &config, &taken("9", "k1")), Some(live("c2")));
        assert_eq!(kept.len(), 2);
        // One that saw no ConfigMap drops the ConfigMap's, and still not the Secret's.
        kept.keep("c1", &[ResourceKind::ConfigMap], HashMap::new());
        assert_eq!(kept.get("c1", &secret, &taken("7", "k1")), Some(live("s")));
        assert_eq!(kept.len(), 1);
        kept.keep("c1", &[ResourceKind::Secret], HashMap::new());
        assert!(kept.is_empty());
    }
}
