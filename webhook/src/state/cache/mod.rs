//! Watch-backed lookups: [`Caches`] holds the reflector stores and the live-read bounds. Existence
//! checks, namespace labels and the delete guard are answered from stores filled by long-running
//! watches (`watches`: metadata-only for Secrets, ConfigMaps and Namespaces; `index`: the questions
//! asked of them); a miss falls back to one live GET, so an object created a moment ago is still
//! found. The live reads a stamp needs (`live`) are GETs, or, for several objects of one kind in a
//! namespace the cache says holds few of that kind, one metadata LIST as fresh as those GETs
//! ([`read_plan`]), all bounded in number and shared by concurrent callers asking for the same thing
//! (see [`super::coalesce`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::join_all;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{Api, ApiResource, GroupVersionKind, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::{Client, Resource};

use helmop_core::hash::ObjectData;
use helmop_core::model::Policy;
use helmop_core::names::PREFIX;
use helmop_core::resource::{ResourceKind, ResourceRef};

use super::coalesce::Coalescer;
use super::counts::NamespaceCounts;
use super::guarded::GuardedHelmOp;
use crate::metrics::Metrics;

mod index;
mod live;
mod watches;

pub use live::{LIST_SPREAD, Listed, ReadPlan, fresh_list, read_plan};
use live::{LiveGets, unshare};
use watches::*;

/// Label values of `helmop_webhook_cache_objects`.
pub const CACHE_SECRETS: &str = "secrets";
pub const CACHE_CONFIGMAPS: &str = "configmaps";
pub const CACHE_NAMESPACES: &str = "namespaces";
/// `live_gets_total` kind of the image stage's ServiceAccount reads (not cached: read per admission,
/// shared by concurrent ones).
pub const LIVE_SERVICEACCOUNTS: &str = "serviceaccounts";
pub const CACHE_HELMOPS: &str = "helmops";
pub const CACHE_POLICIES: &str = "policies";
pub const CACHE_DIGESTS: &str = "digests";

/// Fleet's HelmOp, read as a dynamic object: the webhook needs only a few fields and must not drop
/// or reject fields a newer Fleet adds.
pub fn helmop_api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("fleet.cattle.io", "v1alpha1", "HelmOp"),
        "helmops",
    )
}

/// HelmOps per page of the HelmOp cache's list (kube's default is 500): a page is read whole before it is
/// decoded, and one HelmOp may be as large as the API server stores (1.5 MiB by etcd's default), so this
/// bounds a list page to about 15 MiB whatever the HelmOps carry.
pub const HELMOP_PAGE_SIZE: u32 = 10;

/// How often the webhook asks the API server again whether it serves HelmOps, while it does not.
pub const HELMOP_DISCOVERY_PERIOD: Duration = Duration::from_secs(10);

/// `uid` and `resourceVersion` of an object: together they name one version of its content.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub uid: String,
    pub resource_version: String,
}

impl Version {
    fn of(meta: &kube::api::ObjectMeta) -> Option<Version> {
        Some(Version {
            uid: meta.uid.clone()?,
            resource_version: meta.resource_version.clone()?,
        })
    }
}

// Index of each watch in `Caches::synced`.
const SYNCED_SECRETS: usize = 0;
const SYNCED_CONFIGMAPS: usize = 1;
const SYNCED_NAMESPACES: usize = 2;
const SYNCED_HELMOPS: usize = 3;

/// The reflector stores and their sync state.
#[derive(Clone)]
pub struct Caches {
    client: Client,
    secrets: Store<PartialObjectMeta<Secret>>,
    config_maps: Store<PartialObjectMeta<ConfigMap>>,
    /// Secrets and ConfigMaps per namespace in those two caches, for [`read_plan`].
    secret_counts: NamespaceCounts,
    config_map_counts: NamespaceCounts,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    helmops: Store<GuardedHelmOp>,
    /// Fleet Policies: only for admission warnings, so readiness never waits for them.
    policies: Store<Policy>,
    policies_synced: Arc<[AtomicBool; 1]>,
    live: LiveGets,
    synced: Arc<[AtomicBool; 4]>,
    /// True while discovery says the API server serves no HelmOps (no Fleet CRD): then there are no
    /// HelmOps, so the empty HelmOp cache is complete and the delete guard has nothing to protect.
    helmops_absent: Arc<AtomicBool>,
}

impl Caches {
    /// Starts the four watches on the runtime; they run (and retry with backoff) until the process ends.
    /// At most `max_live_gets` live GETs are in flight at once.
    pub fn start(client: Client, metrics: &Metrics, max_live_gets: usize) -> Caches {
        let synced: Arc<[AtomicBool; 4]> = Arc::new(Default::default());

        let (secret_counts, config_map_counts) = Default::default();
        let secrets = spawn_reflector(
            (
                Api::<PartialObjectMeta<Secret>>::all(client.clone()),
                watcher::Config::default(),
            ),
            reflector::store::Writer::default(),
            strip_object_meta,
            CACHE_SECRETS,
            metrics.clone(),
            (synced.clone(), SYNCED_SECRETS),
            counting(&secret_counts),
        );
        let config_maps = spawn_reflector(
            (
                Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
                watcher::Config::default(),
            ),
            reflector::store::Writer::default(),
            strip_object_meta,
            CACHE_CONFIGMAPS,
            metrics.clone(),
            (synced.clone(), SYNCED_CONFIGMAPS),
            counting(&config_map_counts),
        );
        let namespaces = spawn_reflector(
            (
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                watcher::Config::default(),
            ),
            reflector::store::Writer::default(),
            strip_namespace,
            CACHE_NAMESPACES,
            metrics.clone(),
            (synced.clone(), SYNCED_NAMESPACES),
            |_, _| {},
        );
        let ar = helmop_api_resource();
        let helmops_absent = Arc::new(AtomicBool::new(false));
        let writer = reflector::store::Writer::new(ar.clone());
        let helmops = writer.as_reader();
        // The HelmOp watch starts only once the API server serves HelmOps: on a cluster without Fleet's
        // CRD (every downstream cluster) a watch would fail forever and readiness would wait for it.
        tokio::spawn(watch_helmops_when_served(
            client.clone(),
            ar,
            writer,
            metrics.clone(),
            synced.clone(),
            helmops_absent.clone(),
        ));
        let policies_synced: Arc<[AtomicBool; 1]> = Arc::new(Default::default());
        let policy_writer = reflector::store::Writer::default();
        let policies = policy_writer.as_reader();
        tokio::spawn(watch_policies_when_served(
            client.clone(),
            policy_writer,
            metrics.clone(),
            policies_synced.clone(),
        ));
        Caches {
            client,
            secrets,
            config_maps,
            secret_counts,
            config_map_counts,
            namespaces,
            helmops,
            policies,
            policies_synced,
            live: LiveGets::new(max_live_gets, metrics),
            synced,
            helmops_absent,
        }
    }

    /// True once every watch has delivered its initial list (the HelmOp one counts as delivered
    /// while the API server serves no HelmOps).
    pub fn synced(&self) -> bool {
        self.synced.iter().enumerate().all(|(i, s)| {
            s.load(Ordering::Acquire) || (i == SYNCED_HELMOPS && self.helmops_absent())
        })
    }

    /// True once the HelmOp cache is complete (the delete guard needs only that one): its watch has
    /// delivered its initial list, or the API server serves no HelmOps at all.
    pub fn helmops_synced(&self) -> bool {
        self.synced[SYNCED_HELMOPS].load(Ordering::Acquire) || self.helmops_absent()
    }

    /// True while the last discovery found no HelmOp resource (and its watch has not started).
    pub fn helmops_absent(&self) -> bool {
        self.helmops_absent.load(Ordering::Acquire)
    }

    /// Live discovery confirms there are still no HelmOps: the guard asks before allowing on an absent
    /// CRD, so a CRD created since the last periodic check (and a HelmOp in it) is never missed. A
    /// failed discovery is no confirmation.
    pub async fn helmops_still_absent(&self) -> bool {
        matches!(
            served(&self.client, &helmop_api_resource()).await,
            Ok(false)
        )
    }
}

/// What the opt-in decision and the delete guard read from a Namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub labels: BTreeMap<String, String>,
    /// Only helmop's own (`helmop.dev/...`), e.g. per-namespace overrides.
    pub annotations: BTreeMap<String, String>,
    pub terminating: bool,
}

impl NamespaceInfo {
    fn of(meta: &kube::api::ObjectMeta) -> NamespaceInfo {
        NamespaceInfo {
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: helmop_annotations(meta),
            terminating: meta.deletion_timestamp.is_some(),
        }
    }
}

fn helmop_annotations(meta: &kube::api::ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A ConfigMap or Secret read live, to be digested and dropped (shared by the callers of one coalesced GET).
pub enum Fetched {
    Secret(Secret),
    ConfigMap(ConfigMap),
}

impl Fetched {
    pub fn version(&self) -> Option<Version> {
        match self {
            Fetched::Secret(s) => Version::of(&s.metadata),
            Fetched::ConfigMap(c) => Version::of(&c.metadata),
        }
    }

    /// What a pod can read of it, in the form the core hash takes.
    pub fn data(&self) -> ObjectData<'_> {
        match self {
            Fetched::Secret(s) => ObjectData::from(s),
            Fetched::ConfigMap(c) => ObjectData::from(c),
        }
    }
}

// Only what the lookups read is kept: annotations can be large (and, for a Secret applied with kubectl,
// `last-applied-configuration` holds its data), managed fields are large and never needed.

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_keep_labels_and_only_helmop_annotations() {
        let mut ns = PartialObjectMeta::<Namespace> {
            metadata: kube::api::ObjectMeta {
                name: Some("team".into()),
                labels: Some(
                    [(
                        "helmop.dev/rollout-on-change".to_string(),
                        "enabled".to_string(),
                    )]
                    .into(),
                ),
                annotations: Some(
                    [
                        ("helmop.dev/image-mode".to_string(), "annotate".to_string()),
                        (
                            "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                            "{..}".to_string(),
                        ),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        strip_namespace(&mut ns);
        let info = NamespaceInfo::of(&ns.metadata);
        assert_eq!(
            info.labels
                .get("helmop.dev/rollout-on-change")
                .map(String::as_str),
            Some("enabled")
        );
        assert_eq!(
            info.annotations.keys().collect::<Vec<_>>(),
            ["helmop.dev/image-mode"]
        );
        assert!(!info.terminating);
    }
}
