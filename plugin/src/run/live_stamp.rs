//! Whether a workload's stamp is behind what its pods read right now, decided from live reads the
//! way the webhook would stamp it: the rollout watcher reads objects through [`read_digest`] (one
//! at a time, as their versions change), and `status` and `propagate` decide the readers of
//! Fleet-managed copies with [`decide_now`] (they carry no helmop content hash, so the restamp
//! record cannot tell).
//!
//! Only keyed digests leave this module; the data read is dropped as soon as it is digested.

use helmop_core::hash::{HashKey, ObjectData, ObjectDigest, Observed, missing_keys, reads_digest};
use helmop_core::names::{HASH_KEY_SECRET, SYSTEM_NAMESPACE};
use helmop_core::podrefs::{PodRef, Reads};
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::rollout::{Decision, decide};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};

/// One version of an object: uid and resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub uid: String,
    pub resource_version: String,
}

/// What [`read_digest`] makes of one object: its version, the digest of what is read, and the
/// required keys it lacks ([`missing_keys`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digested {
    pub version: Version,
    pub digest: ObjectDigest,
    pub missing_keys: Vec<String>,
}

/// Reads `resource` in `namespace` and digests what `reads` reads of it; `None` when it does not
/// exist.
pub async fn read_digest(
    client: &Client,
    namespace: &str,
    resource: &ResourceRef,
    key: &HashKey,
    reads: &Reads,
) -> Result<Option<Digested>, kube::Error> {
    let name = &resource.name;
    let (meta, digest, missing_keys) = match resource.kind {
        ResourceKind::Secret => {
            let Some(s) = Api::<Secret>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await?
            else {
                return Ok(None);
            };
            let data = ObjectData::from(&s);
            let digest = reads_digest(key, &data, reads);
            let missing = missing_keys(&data, reads);
            (s.metadata, digest, missing)
        }
        ResourceKind::ConfigMap => {
            let Some(c) = Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await?
            else {
                return Ok(None);
            };
            let data = ObjectData::from(&c);
            let digest = reads_digest(key, &data, reads);
            let missing = missing_keys(&data, reads);
            (c.metadata, digest, missing)
        }
    };
    let version = Version {
        uid: meta.uid.unwrap_or_default(),
        resource_version: meta.resource_version.unwrap_or_default(),
    };
    Ok(Some(Digested {
        version,
        digest,
        missing_keys,
    }))
}

/// The decision for a pod template of `namespace` reading `refs` and stamped `stamp`, reading
/// every referenced object now.
pub async fn decide_now(
    client: &Client,
    namespace: &str,
    refs: &[PodRef],
    stamp: Option<&str>,
    key: &HashKey,
) -> Result<Decision, kube::Error> {
    let mut digests = std::collections::HashMap::new();
    // Above the cap the decision needs no read (the webhook does not stamp it).
    if refs.len() <= helmop_core::rollout::MAX_REFERENCES {
        for r in refs {
            if let Some(d) = read_digest(client, namespace, &r.resource, key, &r.reads).await? {
                digests.insert(&r.resource, d.digest);
            }
        }
    }
    Ok(decide(key, namespace, refs, stamp, |r| {
        match digests.get(&r.resource) {
            Some(d) => Observed::Digest(*d),
            None => Observed::Absent,
        }
    }))
}

/// The cluster's hash key (the webhook's, which stamps its pods), or why it cannot be had.
pub async fn cluster_key(client: &Client) -> Result<HashKey, String> {
    let what = format!("the hash key Secret {SYSTEM_NAMESPACE}/{HASH_KEY_SECRET}");
    match Api::<Secret>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get_opt(HASH_KEY_SECRET)
        .await
    {
        Ok(Some(secret)) => HashKey::from_secret(&secret).map_err(|e| format!("{what}: {e}")),
        Ok(None) => Err(format!("{what} does not exist: is the webhook installed?")),
        Err(e) => Err(format!(
            "cannot read {what}: {}",
            crate::cluster::api_error::describe(&e)
        )),
    }
}
