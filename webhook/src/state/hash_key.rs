//! The cluster hash key, followed by a watch on its one Secret so a key created or rotated after start is
//! picked up without a restart. Missing or unusable keys are a state, never an error: workloads are then
//! admitted unstamped with a warning.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use helmop_core::hash::{HashKey, HashKeyError, ObjectData, ObjectDigest, object_digest};
use helmop_core::podrefs::Keys;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::watch_object;

use crate::config::SecretRef;

/// The hash key as last seen.
#[derive(Clone, Debug)]
pub enum HashKeyState {
    /// The watch has not listed the Secret yet.
    Unknown,
    /// No such Secret.
    Missing,
    /// The Secret exists but holds no usable key (no data key `key`, or too short).
    Invalid(HashKeyError),
    /// Usable. `generation` changes whenever the key does, so digests cached under an older key are
    /// never served.
    Loaded { key: HashKey, generation: u64 },
}

impl HashKeyState {
    /// Why no key is usable, as a user can act on it; `None` when one is loaded. Never shows key bytes.
    pub fn problem(&self, secret: &SecretRef) -> Option<String> {
        match self {
            HashKeyState::Unknown => Some(format!("hash key Secret {secret} not loaded yet")),
            HashKeyState::Missing => Some(format!(
                "hash key Secret {secret} does not exist (create it with at least {} random bytes under data key `{}`)",
                HashKey::MIN_LEN,
                helmop_core::names::HASH_KEY_DATA_KEY
            )),
            HashKeyState::Invalid(e) => Some(format!("hash key Secret {secret} is unusable: {e}")),
            HashKeyState::Loaded { .. } => None,
        }
    }
}

/// Shared, watch-updated holder of the [`HashKeyState`].
#[derive(Clone)]
pub struct KeyStore {
    state: Arc<RwLock<Current>>,
    synced: Arc<AtomicBool>,
}

struct Current {
    state: HashKeyState,
    /// A keyed digest of a fixed input: tells keys apart without keeping their bytes.
    fingerprint: Option<ObjectDigest>,
    generation: u64,
}

impl Default for KeyStore {
    fn default() -> Self {
        KeyStore {
            state: Arc::new(RwLock::new(Current {
                state: HashKeyState::Unknown,
                fingerprint: None,
                generation: 0,
            })),
            synced: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl KeyStore {
    pub fn get(&self) -> HashKeyState {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .state
            .clone()
    }

    /// True once the watch has listed the Secret (present or not).
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Takes `secret` (or its absence) as the current key. Returns true when a different key was loaded.
    pub fn set(&self, secret: Option<&Secret>) -> bool {
        let (next, fingerprint) = match secret.map(HashKey::from_secret) {
            None => (HashKeyState::Missing, None),
            Some(Err(e)) => (HashKeyState::Invalid(e), None),
            Some(Ok(key)) => {
                let fingerprint = object_digest(&key, &ObjectData::default(), &Keys::All);
                (
                    HashKeyState::Loaded { key, generation: 0 },
                    Some(fingerprint),
                )
            }
        };
        let mut current = self.state.write().unwrap_or_else(|p| p.into_inner());
        let rotated = fingerprint.is_some() && fingerprint != current.fingerprint;
        match next {
            HashKeyState::Loaded { key, .. } if rotated => {
                current.generation += 1;
                current.fingerprint = fingerprint;
                current.state = HashKeyState::Loaded {
                    key,
                    generation: current.generation,
                };
            }
            // Same key again (e.g. a label edit on its Secret): keep the generation and the cached digests.
            HashKeyState::Loaded { .. } => {}
            other => {
                current.fingerprint = None;
                current.state = other;
            }
        }
        rotated
    }

    fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }
}

/// Runs until the process ends; `on_rotate` is called after each change of key.
pub(super) async fn watch(
    client: kube::Client,
    name: SecretRef,
    store: KeyStore,
    on_rotate: impl Fn(),
) {
    let api = Api::<Secret>::namespaced(client, &name.namespace);
    // One named object: `None` when it is absent (after every list that did not find it, and on delete).
    let mut stream = std::pin::pin!(watch_object(api, &name.name).default_backoff());
    while let Some(event) = stream.next().await {
        let changed = match event {
            Ok(secret) => {
                let changed = store.set(secret.as_ref());
                store.mark_synced();
                changed
            }
            Err(error) => {
                tracing::warn!(secret = %name, %error, "hash key watch failed, retrying");
                continue;
            }
        };
        match store.get() {
            HashKeyState::Loaded { generation, .. } if changed => {
                on_rotate();
                tracing::info!(secret = %name, generation, "hash key loaded");
            }
            HashKeyState::Loaded { .. } => {}
            other => {
                let problem = other.problem(&name).unwrap_or_default();
                tracing::warn!(secret = %name, %problem, "no usable hash key; workloads are admitted unstamped");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    fn secret_with(key: Option<&[u8]>) -> Secret {
        Secret {
            data: key.map(|k| [("key".to_string(), ByteString(k.to_vec()))].into()),
            ..Default::default()
        }
    }

    fn name() -> SecretRef {
        SecretRef {
            namespace: "helmop-system".into(),
            name: "helmop-hash-key".into(),
        }
    }

    fn generation(store: &KeyStore) -> Option<u64> {
        match store.get() {
            HashKeyState::Loaded { generation, .. } => Some(generation),
            _ => None,
        }
    }

    #[test]
    fn states_and_generations() {
        let store = KeyStore::default();
        assert!(matches!(store.get(), HashKeyState::Unknown));
        assert!(!store.set(None));
        assert!(matches!(store.get(), HashKeyState::Missing));
        assert!(!store.set(Some(&secret_with(None))));
        assert!(matches!(
            store.get(),
            HashKeyState::Invalid(HashKeyError::MissingDataKey)
        ));
        assert!(!store.set(Some(&secret_with(Some(&[1; 31])))));
        assert!(matches!(
            store.get(),
            HashKeyState::Invalid(HashKeyError::TooShort { len: 31 })
        ));

        assert!(store.set(Some(&secret_with(Some(&[1; 32])))));
        assert_eq!(generation(&store), Some(1));
        // The same key again is not a rotation.
        assert!(!store.set(Some(&secret_with(Some(&[1; 32])))));
        assert_eq!(generation(&store), Some(1));
        // A different key is.
        assert!(store.set(Some(&secret_with(Some(&[2; 32])))));
        assert_eq!(generation(&store), Some(2));
        // Deleted, then restored with the old key: a new generation, never a reused one.
        assert!(!store.set(None));
        assert_eq!(generation(&store), None);
        assert!(store.set(Some(&secret_with(Some(&[1; 32])))));
        assert_eq!(generation(&store), Some(3));
    }

    #[test]
    fn problems_name_the_secret_and_never_the_key() {
        let missing = HashKeyState::Missing.problem(&name()).unwrap();
        assert!(
            missing.contains("helmop-system/helmop-hash-key"),
            "{missing}"
        );
        assert!(missing.contains("at least 32"), "{missing}");
        let short = HashKeyState::Invalid(HashKeyError::TooShort { len: 5 })
            .problem(&name())
            .unwrap();
        assert!(short.contains("5 bytes"), "{short}");

        let store = KeyStore::default();
        store.set(Some(&secret_with(Some(
            b"super-secret-key-material-0123456789",
        ))));
        let shown = format!("{:?}", store.get());
        assert!(!shown.contains("super-secret"), "{shown}");
        assert_eq!(store.get().problem(&name()), None);
    }
}
