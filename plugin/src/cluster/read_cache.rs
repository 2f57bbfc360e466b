//! What a watcher (`propagate --watch`) keeps from one run to the next because its own watches say
//! when it goes stale: the Fleet kubeconfig Secrets it read upstream, and the identity each
//! downstream client claimed.
//!
//! Without it every run, an edit of one source included, read every Cluster's kubeconfig Secret
//! again (1,000 GETs upstream at 1,000 Clusters) and asked every downstream cluster who it is.
//!
//! Stale entries are never used:
//! - a Secret is kept only while the Secret watch of its namespace is live (listed, not failing),
//!   and dropped by the watch event of any change to it ([`ReadCache::invalidate_secret`]); a read
//!   that raced such an event is not kept (every invalidation bumps an epoch a read must match);
//! - an identity is kept per client, and a client is keyed by its kubeconfig's bytes, so a changed
//!   kubeconfig is a new client that is asked again; only a claimed identity is kept (an unknown
//!   or unreachable one is asked again each run);
//! - everything is dropped on a resync, on becoming leader, after a failed run, and whenever a
//!   watch of Secrets or Clusters re-lists or fails ([`ReadCache::clear`]), so the periodic full
//!   run reads everything afresh (its Clusters too: [`crate::cluster::cluster_store`], and the
//!   copies downstream: [`crate::cluster::kept_hashes`], [`crate::cluster::kept_listings`]).
//!
//! Bounded by the fleet: one entry per kubeconfig Secret and per client, dropped with them.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Secret;

use crate::cluster::client_cache::ClientKey;
use crate::cluster::cluster_store::ClusterStore;
use crate::cluster::kept_hashes::KeptHashes;
use crate::cluster::kept_listings::KeptListings;

/// See the module documentation. Holds credentials: never logged, never printed.
pub struct ReadCache {
    /// The namespace whose Secrets are watched; `None`: every namespace.
    scope: Option<String>,
    inner: Mutex<Inner>,
    /// Hashes of the live copies downstream, exact by `resourceVersion`
    /// ([`crate::cluster::kept_hashes`]).
    hashes: KeptHashes,
    /// The last listings of the copies downstream, as the writes since left them
    /// ([`crate::cluster::kept_listings`]).
    listings: KeptListings,
    /// The Fleet Clusters as the Cluster watch sees them ([`crate::cluster::cluster_store`]).
    clusters: ClusterStore,
}

#[derive(Default)]
struct Inner {
    /// Bumped by every invalidation: a read started at another epoch is not kept.
    epoch: u64,
    /// Whether the Secret watch has listed and is not failing.
    live: bool,
    /// `None`: read, and absent.
    secrets: HashMap<(String, String), Option<Secret>>,
    identities: HashMap<ClientKey, String>,
}

impl std::fmt::Debug for ReadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (secrets, identities) = self
            .inner
            .lock()
            .map_or((0, 0), |i| (i.secrets.len(), i.identities.len()));
        f.debug_struct("ReadCache")
            .field("scope", &self.scope)
            .field("secrets", &secrets)
            .field("identities", &identities)
            .finish()
    }
}

impl ReadCache {
    /// A cache for a watcher whose Secret watch covers `scope` (`None`: every namespace). Nothing
    /// is kept until that watch is live ([`ReadCache::set_live`]).
    pub fn new(scope: Option<String>) -> ReadCache {
        ReadCache {
            scope,
            inner: Mutex::new(Inner::default()),
            hashes: KeptHashes::default(),
            listings: KeptListings::default(),
            clusters: ClusterStore::default(),
        }
    }

    /// The epoch a read starts at: pass it to the `store_` call after the read.
    pub fn epoch(&self) -> u64 {
        self.inner.lock().map_or(u64::MAX, |i| i.epoch)
    }

    /// The kept Secret `namespace/name` (`Some(None)`: kept as absent).
    pub fn secret(&self, namespace: &str, name: &str) -> Option<Option<Secret>> {
        let inner = self.inner.lock().ok()?;
        if !inner.live {
            return None;
        }
        inner
            .secrets
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Keeps what a read that started at `epoch` found, unless something was invalidated since or
    /// the namespace is not watched.
    pub fn store_secret(&self, namespace: &str, name: &str, found: Option<Secret>, epoch: u64) {
        if self.scope.as_deref().is_some_and(|s| s != namespace) {
            return;
        }
        if let Ok(mut inner) = self.inner.lock()
            && inner.live
            && inner.epoch == epoch
        {
            inner
                .secrets
                .insert((namespace.to_owned(), name.to_owned()), found);
        }
    }

    /// The identity the client built from `key` claimed.
    pub fn identity(&self, key: &ClientKey) -> Option<String> {
        self.inner.lock().ok()?.identities.get(key).cloned()
    }

    /// Keeps a claimed identity read at `epoch`.
    pub fn store_identity(&self, key: ClientKey, identity: String, epoch: u64) {
        if let Ok(mut inner) = self.inner.lock()
            && inner.epoch == epoch
        {
            inner.identities.insert(key, identity);
        }
    }

    /// The watch saw Secret `namespace/name` change or go.
    pub fn invalidate_secret(&self, namespace: &str, name: &str) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.epoch += 1;
            inner
                .secrets
                .remove(&(namespace.to_owned(), name.to_owned()));
        }
    }

    /// Drops everything (a resync, a new leader, a failed run, a watch re-listing).
    pub fn clear(&self) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.epoch += 1;
            inner.secrets.clear();
            inner.identities.clear();
        }
        self.hashes.clear();
        self.listings.clear();
        self.clusters.read_afresh();
    }

    /// The Fleet Clusters of the watched scope, kept by the Cluster watch.
    pub fn clusters(&self) -> &ClusterStore {
        &self.clusters
    }

    /// Every Fleet Cluster of `namespace` (`None`: all) from the Cluster watch, when it covers
    /// exactly that and may be served ([`ClusterStore::snapshot`]).
    pub fn clusters_of(&self, namespace: Option<&str>) -> Option<Vec<helmop_core::model::Cluster>> {
        if self.scope.as_deref() != namespace {
            return None;
        }
        self.clusters.snapshot()
    }

    /// The hashes of live copies kept between runs.
    pub fn hashes(&self) -> &KeptHashes {
        &self.hashes
    }

    /// The listings of copies kept between runs.
    pub fn listings(&self) -> &KeptListings {
        &self.listings
    }

    /// The Secret watch listed (`true`) or failed (`false`, which drops everything).
    pub fn set_live(&self, live: bool) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.live = live;
            inner.epoch += 1;
            inner.secrets.clear();
            if !live {
                inner.identities.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(v: &str) -> Secret {
        let mut s = Secret::default();
        s.metadata.resource_version = Some(v.to_owned());
        s
    }

    fn version(got: Option<Option<Secret>>) -> Option<Option<String>> {
        got.map(|s| s.and_then(|s| s.metadata.resource_version))
    }

    #[test]
    fn nothing_is_kept_until_the_watch_is_live_and_while_it_fails() {
        let cache = ReadCache::new(None);
        cache.store_secret("fleet", "k", Some(secret("1")), cache.epoch());
        assert_eq!(version(cache.secret("fleet", "k")), None);
        cache.set_live(true);
        cache.store_secret("fleet", "k", Some(secret("1")), cache.epoch());
        assert_eq!(version(cache.secret("fleet", "k")), Some(Some("1".into())));
        cache.set_live(false);
        assert_eq!(version(cache.secret("fleet", "k")), None);
    }

    #[test]
    fn a_read_that_raced_a_change_is_not_kept() {
        let cache = ReadCache::new(None);
        cache.set_live(true);
        let started = cache.epoch();
        // The Secret changed while the GET was in flight: what it returned may be the old one.
        cache.invalidate_secret("fleet", "k");
        cache.store_secret("fleet", "k", Some(secret("1")), started);
        assert_eq!(version(cache.secret("fleet", "k")), None);
        let again = cache.epoch();
        cache.store_secret("fleet", "k", None, again);
        // Kept as absent: a later creation is a watch event, which drops it.
        assert_eq!(version(cache.secret("fleet", "k")), Some(None));
        cache.invalidate_secret("fleet", "k");
        assert_eq!(version(cache.secret("fleet", "k")), None);
    }

    #[test]
    fn only_watched_namespaces_are_kept() {
        let cache = ReadCache::new(Some("fleet".into()));
        cache.set_live(true);
        cache.store_secret("other", "k", Some(secret("1")), cache.epoch());
        assert_eq!(version(cache.secret("other", "k")), None);
        cache.store_secret("fleet", "k", Some(secret("1")), cache.epoch());
        assert!(cache.secret("fleet", "k").is_some());
    }

    #[test]
    fn identities_go_with_a_clear() {
        let cache = ReadCache::new(None);
        let key = ClientKey::Kubeconfig(b"kc".to_vec());
        cache.store_identity(key.clone(), "id-1".into(), cache.epoch());
        assert_eq!(cache.identity(&key).as_deref(), Some("id-1"));
        let started = cache.epoch();
        cache.clear();
        cache.store_identity(key.clone(), "id-2".into(), started);
        assert_eq!(cache.identity(&key), None);
        assert_eq!(
            format!("{cache:?}"),
            "ReadCache { scope: None, secrets: 0, identities: 0 }"
        );
    }
}
