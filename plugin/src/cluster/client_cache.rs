//! Downstream clients kept from one run to the next of a long-running caller (`propagate --watch`).
//!
//! Without it every run built a new `kube::Client` per downstream cluster (its own rustls
//! configuration, connection pool and TLS handshake), twice: once to identify the cluster, once
//! to work on it. A watcher handling many edits over a large fleet paid that per edit in CPU,
//! sockets and allocator churn. A client is keyed by exactly what it was built from (the
//! kubeconfig bytes of a Fleet Secret, or the name of a local context: the local kubeconfig is
//! read once per process), so a rotated credential is a new key and gets a new client.
//!
//! Bounded by the fleet: each enumeration ([`ClientCache::sweep`]) drops the clients that the
//! previous enumeration did not use (a removed Cluster, a rotated Secret), which closes their
//! connections.

use std::collections::HashMap;
use std::sync::Mutex;

/// What a client was built from. Holds credentials: never logged, never printed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum ClientKey {
    /// The `value` of a Fleet kubeconfig Secret.
    Kubeconfig(Vec<u8>),
    /// A context of the local kubeconfig (`--target-context`).
    Context(String),
}

#[derive(Default)]
pub struct ClientCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    generation: u64,
    clients: HashMap<ClientKey, (kube::Client, u64)>,
}

impl std::fmt::Debug for ClientCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCache")
            .field("clients", &self.len())
            .finish()
    }
}

impl ClientCache {
    /// The client built from `key`, if one is kept; marks it used by this enumeration.
    pub fn get(&self, key: &ClientKey) -> Option<kube::Client> {
        let mut inner = self.inner.lock().ok()?;
        let generation = inner.generation;
        inner.clients.get_mut(key).map(|(client, used)| {
            *used = generation;
            client.clone()
        })
    }

    /// Keeps `client` for `key` (a concurrent insert of the same key simply wins or loses).
    pub fn insert(&self, key: ClientKey, client: kube::Client) {
        if let Ok(mut inner) = self.inner.lock() {
            let generation = inner.generation;
            inner.clients.insert(key, (client, generation));
        }
    }

    /// A new enumeration starts: drops the clients the previous one did not use.
    pub fn sweep(&self) {
        if let Ok(mut inner) = self.inner.lock() {
            let previous = inner.generation;
            inner.clients.retain(|_, (_, used)| *used >= previous);
            inner.generation += 1;
        }
    }

    /// Clients kept.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.clients.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> kube::Client {
        kube::Client::try_from(kube::Config::new(
            "https://127.0.0.1:1".parse().expect("a valid URL"),
        ))
        .expect("a client")
    }

    #[tokio::test]
    async fn clients_live_while_used_and_go_one_enumeration_after_their_last_use() {
        let cache = ClientCache::default();
        let a = ClientKey::Kubeconfig(b"a".to_vec());
        let b = ClientKey::Context("b".into());
        cache.sweep();
        cache.insert(a.clone(), client());
        cache.insert(b.clone(), client());
        assert_eq!(cache.len(), 2);
        // Next enumeration uses only `a`: `b` is still kept (used by the previous one).
        cache.sweep();
        assert!(cache.get(&a).is_some());
        assert_eq!(cache.len(), 2);
        // The one after: `b` was not used by the previous enumeration, so it goes.
        cache.sweep();
        assert_eq!(cache.len(), 1);
        assert!(cache.get(&b).is_none());
        assert!(cache.get(&a).is_some());
        // However many enumerations reuse `a`, one client is kept for it.
        for _ in 0..100 {
            cache.sweep();
            assert!(cache.get(&a).is_some());
        }
        assert_eq!(cache.len(), 1);
        assert_eq!(format!("{cache:?}"), "ClientCache { clients: 1 }");
    }
}
