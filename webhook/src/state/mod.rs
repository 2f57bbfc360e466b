//! Shared state of the decision logic: configuration, watch-backed caches, the cluster hash key, the
//! bounded digest cache and the image seam. Cheap to clone: everything lives behind one `Arc`.

mod bounded;
pub mod cache;
pub mod coalesce;
mod counts;
pub mod guarded;
mod hash_key;

use std::sync::Arc;

use futures::future::join_all;
use helmop_core::hash::{HashKey, ObjectDigest, reads_digest};
use helmop_core::podrefs::{PodRef, Reads};
use helmop_core::resource::ResourceRef;

use self::bounded::BoundedCache;
use self::cache::{CACHE_DIGESTS, Caches, Version};
use crate::error::Error;
use crate::images::{ImageResolver, NoImages};
use crate::metrics::Metrics;

pub use self::coalesce::DEFAULT_MAX_LIVE_GETS;
pub use self::hash_key::{HashKeyState, KeyStore};
pub use crate::config::{Config, GuardMode, ImageMode, SecretRef};

/// Default bound of the content-digest cache, in entries (one entry is a few hundred bytes).
pub const DEFAULT_DIGEST_CACHE_ENTRIES: usize = 4096;
/// Bound of the content-digest cache in bytes (keys and observations as `observation_weight` counts them):
/// 4 MiB. An observation over [`MAX_CACHED_OBSERVATION_BYTES`] is not kept.
pub const DIGEST_CACHE_BYTES: usize = 4 << 20;
/// The heaviest observation kept (its missing key names are the caller's to choose): 4 KiB.
pub const MAX_CACHED_OBSERVATION_BYTES: usize = 4 << 10;

/// Knobs beyond the command-line [`Config`].
#[derive(Clone)]
pub struct Options {
    /// Bound of the content-digest cache, in entries.
    pub digest_cache_entries: usize,
    /// Live GETs to the API server in flight at once (`--max-live-gets`).
    pub max_live_gets: usize,
    /// The image-digest stage run after the config stamp; [`NoImages`] (no image pinning) unless the
    /// webhook is started with a registry resolver.
    pub images: Arc<dyn ImageResolver>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            digest_cache_entries: DEFAULT_DIGEST_CACHE_ENTRIES,
            max_live_gets: DEFAULT_MAX_LIVE_GETS,
            images: Arc::new(NoImages),
        }
    }
}

/// Identity of one cached per-object digest: the object version, what the pod observes of it (as a
/// SHA-256 fingerprint: the reads are the caller's, as long as its list of prefixes and keys), and which
/// hash key produced it (a rotated key must never be served an old digest).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct DigestKey {
    version: Version,
    reads: [u8; 32],
    key_generation: u64,
}

/// SHA-256 of `reads` as its derived `Hash` writes it (lengths before collections, strings terminated),
/// which covers every field, present and future.
fn reads_fingerprint(reads: &Reads) -> [u8; 32] {
    use sha2::Digest;
    use std::hash::{Hash, Hasher};
    struct Sha(sha2::Sha256);
    impl Hasher for Sha {
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
        fn finish(&self) -> u64 {
            0
        }
    }
    let mut hasher = Sha(sha2::Sha256::new());
    reads.hash(&mut hasher);
    hasher.0.finalize().into()
}

/// What one cache entry holds on the heap, with an allowance for the map's overhead.
fn observation_weight(key: &DigestKey, o: &Observation) -> usize {
    let unmet: usize = o.unmet.iter().map(|(k, _, _)| k.len() + 32).sum();
    key.version.uid.len() + key.version.resource_version.len() + unmet + 192
}

/// What a pod would find in one existing object: the digest of what it reads, and the keys it names
/// but does not find. Key names only, never values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub digest: ObjectDigest,
    /// `(key, required, only in binaryData)` as [`Reads::unmet`] gives them.
    pub unmet: Vec<(String, bool, bool)>,
}

/// The decision logic's view of the cluster. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    caches: Caches,
    hash_key: KeyStore,
    digests: BoundedCache<DigestKey, Observation>,
    images: Arc<dyn ImageResolver>,
    metrics: Metrics,
}

impl AppState {
    /// Starts the watches (HelmOps, Namespaces, Secret/ConfigMap metadata, the hash-key Secret) in the
    /// background and returns at once; [`AppState::ready`] turns true when all have synced.
    pub async fn start(
        client: kube::Client,
        config: Config,
        metrics: &Metrics,
    ) -> Result<Self, Error> {
        Self::start_with(client, config, metrics, Options::default()).await
    }

    /// [`AppState::start`] with explicit [`Options`].
    pub async fn start_with(
        client: kube::Client,
        config: Config,
        metrics: &Metrics,
        options: Options,
    ) -> Result<Self, Error> {
        let caches = Caches::start(client.clone(), metrics, options.max_live_gets);
        let digests = BoundedCache::weighed(
            options.digest_cache_entries,
            DIGEST_CACHE_BYTES,
            observation_weight,
        );
        metrics.set_cache_objects(CACHE_DIGESTS, 0);
        metrics.set_cache_bytes(CACHE_DIGESTS, 0);
        let hash_key = KeyStore::default();
        let state = AppState {
            inner: Arc::new(Inner {
                config,
                caches,
                hash_key: hash_key.clone(),
                digests,
                images: options.images,
                metrics: metrics.clone(),
            }),
        };
        let on_rotate = state.clone();
        hash_key_watch(client, &state, move || on_rotate.clear_digests());
        Ok(state)
    }

    /// True once every watch has delivered its initial list (drives `/readyz`).
    pub fn ready(&self) -> bool {
        self.inner.caches.synced() && self.inner.hash_key.synced()
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn caches(&self) -> &Caches {
        &self.inner.caches
    }

    /// The hash key as last seen by its watch.
    pub fn hash_key(&self) -> HashKeyState {
        self.inner.hash_key.get()
    }

    /// The image stage.
    pub fn images(&self) -> &dyn ImageResolver {
        self.inner.images.as_ref()
    }

    /// Entries in the digest cache.
    pub fn cached_digests(&self) -> usize {
        self.inner.digests.len()
    }

    /// Bytes held by the digest cache (as weighed against [`DIGEST_CACHE_BYTES`]).
    pub fn cached_digest_bytes(&self) -> usize {
        self.inner.digests.bytes()
    }

    /// What a pod reading `r` in `namespace` observes, `None` when the object does not exist.
    ///
    /// The object's version is read live (a metadata-only GET: a stamp must never rest on a watch event
    /// that has not arrived yet); the content is fetched and digested only when that version, read
    /// through these reads with this key generation, is not cached.
    pub async fn observe(
        &self,
        namespace: &str,
        r: &PodRef,
        key: &HashKey,
        key_generation: u64,
    ) -> Result<Option<Observation>, kube::Error> {
        match self
            .inner
            .caches
            .live_version(namespace, &r.resource)
            .await?
        {
            Some(version) => {
                self.observe_version(namespace, r, version, key, key_generation)
                    .await
            }
            None => Ok(None),
        }
    }

    /// [`AppState::observe`] of every reference, in their order, with their versions read together (one LIST
    /// per kind where [`cache::read_plan`] says so, see [`Caches::live_versions`]).
    pub async fn observe_all(
        &self,
        namespace: &str,
        refs: &[PodRef],
        key: &HashKey,
        key_generation: u64,
    ) -> Vec<Result<Option<Observation>, kube::Error>> {
        let resources: Vec<&ResourceRef> = refs.iter().map(|r| &r.resource).collect();
        let versions = self.inner.caches.live_versions(namespace, &resources).await;
        join_all(refs.iter().zip(versions).map(|(r, version)| async move {
            match version? {
                Some(version) => {
                    self.observe_version(namespace, r, version, key, key_generation)
                        .await
                }
                None => Ok(None),
            }
        }))
        .await
    }

    /// What a pod reading `r` observes of it at `version` (just read live): the cached digest of that version, else
    /// the digest of its content read live.
    async fn observe_version(
        &self,
        namespace: &str,
        r: &PodRef,
        version: Version,
        key: &HashKey,
        key_generation: u64,
    ) -> Result<Option<Observation>, kube::Error> {
        let caches = &self.inner.caches;
        let fingerprint = reads_fingerprint(&r.reads);
        let cache_key = DigestKey {
            version,
            reads: fingerprint,
            key_generation,
        };
        if let Some(observation) = self.inner.digests.get(&cache_key) {
            return Ok(Some(observation));
        }
        let Some(object) = caches.live_object(namespace, &r.resource).await? else {
            return Ok(None);
        };
        let data = object.data();
        let observation = Observation {
            digest: reads_digest(key, &data, &r.reads),
            unmet: r.reads.unmet(
                |k| data.data.contains_key(k),
                |k| data.binary_data.contains_key(k),
            ),
        };
        // Keyed by the version actually digested, which may be newer than the one looked up.
        let key = object.version().map(|version| DigestKey {
            version,
            reads: fingerprint,
            key_generation,
        });
        if let Some(key) = key
            && observation_weight(&key, &observation) <= MAX_CACHED_OBSERVATION_BYTES
        {
            self.inner.digests.insert(key, observation.clone());
            self.report_digests();
        }
        Ok(Some(observation))
    }

    fn clear_digests(&self) {
        self.inner.digests.clear();
        self.report_digests();
    }

    fn report_digests(&self) {
        let len = i64::try_from(self.inner.digests.len()).unwrap_or(i64::MAX);
        let bytes = i64::try_from(self.inner.digests.bytes()).unwrap_or(i64::MAX);
        self.inner.metrics.set_cache_objects(CACHE_DIGESTS, len);
        self.inner.metrics.set_cache_bytes(CACHE_DIGESTS, bytes);
    }
}

fn hash_key_watch(client: kube::Client, state: &AppState, on_rotate: impl Fn() + Send + 'static) {
    let store = state.inner.hash_key.clone();
    let name = state.inner.config.hash_key_secret.clone();
    tokio::spawn(hash_key::watch(client, name, store, on_rotate));
}

#[cfg(test)]
mod digest_cache_tests {
    use super::*;

    #[test]
    fn the_cache_keeps_a_fingerprint_of_the_reads_not_the_reads() {
        let mut many = Reads::default();
        for i in 0..20_000 {
            many.env_prefixes.insert(format!("P{i}_"));
        }
        let mut other = many.clone();
        other.env_prefixes.insert("ONE_MORE_".into());
        assert_ne!(reads_fingerprint(&many), reads_fingerprint(&other));
        assert_eq!(reads_fingerprint(&many), reads_fingerprint(&many.clone()));
        // Keys that move between fields, or between a prefix and a key, give another fingerprint.
        let mut files = Reads::default();
        files.files.insert("a".into(), true);
        let mut vars = Reads::default();
        vars.vars.insert("a".into(), true);
        let mut optional = Reads::default();
        optional.files.insert("a".into(), false);
        let prints = [&files, &vars, &optional, &Reads::default()].map(reads_fingerprint);
        for (i, a) in prints.iter().enumerate() {
            for b in &prints[i + 1..] {
                assert_ne!(a, b);
            }
        }
        let key = DigestKey {
            version: Version {
                uid: "u".repeat(36),
                resource_version: "12345".into(),
            },
            reads: reads_fingerprint(&many),
            key_generation: 1,
        };
        let observation = Observation {
            digest: ObjectDigest([0; 32]),
            unmet: Vec::new(),
        };
        assert!(
            observation_weight(&key, &observation) < 512,
            "whatever the reads"
        );
        let heavy = Observation {
            digest: ObjectDigest([0; 32]),
            unmet: (0..1000)
                .map(|i| (format!("missing-{i}"), true, false))
                .collect(),
        };
        assert!(
            observation_weight(&key, &heavy) > MAX_CACHED_OBSERVATION_BYTES,
            "not kept"
        );
    }
}
