//! The Fleet Clusters a watcher's Cluster watch has seen, so a run reads them from memory instead
//! of listing them upstream.
//!
//! Why: a run listed every Cluster of its scope, each with the status Fleet's agents keep
//! rewriting. At 1,000 Clusters that list took about 100 ms of a source edit's 250 ms before the
//! first copy was written, and the watcher was already decoding every one of those objects from
//! its own watch (docs/performance.md, "Copies first, and Clusters from the watch").
//!
//! The store is the watch's view, as an informer's is: a run started by a Cluster event sees that
//! event (the store is updated before the event's trigger is sent), and any other run sees every
//! event delivered so far. It serves nothing
//! - before the watch's first listing is complete, and from a re-listing's start until its end;
//! - from a failure of the watch until it has listed again (after a back-off step: the watcher's
//!   watches list again after every failure, `watch::relist`; runs list the Clusters upstream
//!   meanwhile, as every run did before);
//! - to the first run after [`ClusterStore::read_afresh`] (a resync, a new leader, a failed run:
//!   those list the Clusters upstream, as every run did before).
//!
//! Bounded by the fleet: one slim Cluster per Cluster of the scope (no field ownership, none of
//! the status but the two schedule fields a plan reads, [`slim`]). An agent's check-in changes
//! nothing a slim Cluster holds but its resourceVersion, so the watch does not store it again
//! (`watch::triggers`, the same fingerprint that decides whether a change starts a run).
//!
//! The watch decodes each event straight into that slim form ([`WatchedCluster`]): the rest is
//! passed over as the JSON is read, not decoded and then dropped.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use helmop_core::model::{Cluster, ClusterSpec, ClusterStatus, FLEET_API_VERSION};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

use crate::cluster::lean_list::without_managed_fields;

/// What a watch saw, for a store kept by it.
#[derive(Clone, Copy, Debug)]
pub enum Seen<'a, K> {
    /// A (re-)listing starts: nothing is served until it is done.
    Listing,
    /// One object of the listing in progress.
    Listed(&'a K),
    /// The listing is complete: it replaces what was kept, and is served.
    ListedAll,
    /// An object was created or changed.
    Applied(&'a K),
    /// An object was deleted.
    Deleted(&'a K),
    /// The watch failed: nothing is served until it has listed again.
    Failed,
}

impl<'a, K> Seen<'a, K> {
    /// The same sighting of what `part` picks out of each object.
    pub fn map<T>(self, part: impl FnOnce(&'a K) -> &'a T) -> Seen<'a, T> {
        match self {
            Seen::Listing => Seen::Listing,
            Seen::Listed(k) => Seen::Listed(part(k)),
            Seen::ListedAll => Seen::ListedAll,
            Seen::Applied(k) => Seen::Applied(part(k)),
            Seen::Deleted(k) => Seen::Deleted(part(k)),
            Seen::Failed => Seen::Failed,
        }
    }
}

/// A Cluster as the Cluster watch decodes it: [`slim`] of it, read as such. Its field ownership
/// and the rest of its status, which every agent check-in rewrites (67 events a second at 1,000
/// Clusters checking in every 15 s), are passed over unread: decoding them was about half of an
/// idle watcher's CPU under Fleet's churn (docs/performance.md, "Idle under churn").
#[derive(Clone, Debug)]
pub struct WatchedCluster(pub Cluster);

impl<'de> Deserialize<'de> for WatchedCluster {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // No `flatten` (it buffers the whole object first) and no catch-all: what is not named is
        // skipped as it is read.
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire {
            #[serde(default)]
            api_version: Option<String>,
            #[serde(default)]
            kind: Option<String>,
            #[serde(default, deserialize_with = "without_managed_fields")]
            metadata: ObjectMeta,
            #[serde(default)]
            spec: ClusterSpec,
            #[serde(default)]
            status: Option<Schedule>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Schedule {
            #[serde(default)]
            scheduled: Option<bool>,
            #[serde(default)]
            active_schedule: Option<bool>,
        }
        let wire = Wire::deserialize(d)?;
        Ok(WatchedCluster(Cluster {
            api_version: wire
                .api_version
                .unwrap_or_else(|| FLEET_API_VERSION.to_owned()),
            kind: wire.kind.unwrap_or_else(|| Cluster::KIND.to_owned()),
            metadata: wire.metadata,
            spec: wire.spec,
            status: wire.status.map(|s| ClusterStatus {
                scheduled: s.scheduled,
                active_schedule: s.active_schedule,
                extra: Default::default(),
            }),
            extra: Default::default(),
        }))
    }
}

impl kube::Resource for WatchedCluster {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Cluster::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Cluster::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Cluster::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        Cluster::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Cluster::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct ClusterStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Whether the watch has listed, and neither failed nor started listing again since.
    live: bool,
    /// The next run lists upstream instead.
    afresh: bool,
    objects: BTreeMap<(String, String), Cluster>,
    /// A listing in progress, swapped in when it is done.
    listing: Option<BTreeMap<(String, String), Cluster>>,
}

impl ClusterStore {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps what the Cluster watch saw.
    pub fn see(&self, seen: Seen<'_, Cluster>) {
        let mut inner = self.inner();
        match seen {
            Seen::Listing => {
                inner.live = false;
                inner.listing = Some(BTreeMap::new());
            }
            Seen::Listed(cluster) => {
                if let Some(listing) = inner.listing.as_mut() {
                    listing.insert(key(cluster), slim(cluster));
                }
            }
            Seen::ListedAll => {
                if let Some(listing) = inner.listing.take() {
                    inner.objects = listing;
                    inner.live = true;
                }
            }
            Seen::Applied(cluster) => {
                inner.objects.insert(key(cluster), slim(cluster));
            }
            Seen::Deleted(cluster) => {
                inner.objects.remove(&key(cluster));
            }
            Seen::Failed => inner.live = false,
        }
    }

    /// The next run lists the Clusters upstream (a resync reads everything afresh).
    pub fn read_afresh(&self) {
        self.inner().afresh = true;
    }

    /// Every Cluster, in the order a list gives them (namespace, then name), or `None` when the
    /// run must list them itself.
    pub fn snapshot(&self) -> Option<Vec<Cluster>> {
        let mut inner = self.inner();
        if std::mem::take(&mut inner.afresh) || !inner.live {
            return None;
        }
        Some(inner.objects.values().cloned().collect())
    }
}

fn key(cluster: &Cluster) -> (String, String) {
    (
        cluster.metadata.namespace.clone().unwrap_or_default(),
        cluster.metadata.name.clone().unwrap_or_default(),
    )
}

/// What a plan reads of a Cluster: its metadata but field ownership, its spec, and of its
/// status only the schedule fields (`Cluster::off_schedule`); Fleet's agents rewrite the rest.
pub fn slim(cluster: &Cluster) -> Cluster {
    let mut metadata = cluster.metadata.clone();
    metadata.managed_fields = None;
    Cluster {
        api_version: cluster.api_version.clone(),
        kind: cluster.kind.clone(),
        metadata,
        spec: cluster.spec.clone(),
        status: cluster
            .status
            .as_ref()
            .map(|s| helmop_core::model::ClusterStatus {
                scheduled: s.scheduled,
                active_schedule: s.active_schedule,
                extra: Default::default(),
            }),
        extra: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Cluster as an API server sends it after an agent's check-in.
    fn checked_in(with_type: bool) -> serde_json::Value {
        let mut cluster = serde_json::json!({
            "metadata": {
                "name": "c1", "namespace": "fleet-default", "uid": "u1",
                "resourceVersion": "42", "generation": 3,
                "labels": {"env": "prod"},
                "annotations": {"note": "x"},
                "managedFields": [{
                    "manager": "fleet-agent", "operation": "Update", "apiVersion": "fleet.cattle.io/v1alpha1",
                    "fieldsType": "FieldsV1", "subresource": "status",
                    "fieldsV1": {"f:status": {"f:agent": {"f:lastSeen": {}}}},
                }],
            },
            "spec": {"kubeConfigSecret": "c1-kubeconfig", "paused": false, "clientID": "abc",
                     "templateValues": {"region": "eu"}},
            "status": {
                "scheduled": true, "activeSchedule": false,
                "agent": {"lastSeen": "2026-12-06T00:00:00Z", "namespace": "cattle-fleet-system"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "display": {"readyBundles": "3/3"},
            },
            "somethingNew": {"a": 1},
        });
        if with_type {
            cluster["apiVersion"] = "fleet.cattle.io/v1alpha1".into();
            cluster["kind"] = "Cluster".into();
        }
        cluster
    }

    #[test]
    fn the_watch_decodes_exactly_what_the_store_keeps() {
        for with_type in [true, false] {
            let text = checked_in(with_type).to_string();
            let full: Cluster = serde_json::from_str(&text).unwrap_or_default();
            assert!(full.metadata.managed_fields.is_some() && full.status.is_some());
            let watched: WatchedCluster = match serde_json::from_str(&text) {
                Ok(w) => w,
                Err(e) => panic!("{e}"),
            };
            assert_eq!(
                watched.0,
                slim(&full),
                "with apiVersion and kind: {with_type}"
            );
        }
        // Without a status, and with a status that holds neither schedule field.
        let mut none = checked_in(true);
        none.as_object_mut().map(|o| o.remove("status"));
        let watched: Result<WatchedCluster, _> = serde_json::from_value(none);
        assert_eq!(watched.map(|w| w.0.status).ok(), Some(None));
        let mut empty = checked_in(true);
        empty["status"] = serde_json::json!({"agent": {}});
        let watched: Result<WatchedCluster, _> = serde_json::from_value(empty);
        assert_eq!(
            watched.map(|w| w.0.status).ok(),
            Some(Some(ClusterStatus::default()))
        );
    }

    #[test]
    fn a_watched_cluster_that_is_not_one_is_an_error() {
        let wrong = serde_json::json!({"metadata": {"name": 7}});
        assert!(serde_json::from_value::<WatchedCluster>(wrong).is_err());
        let wrong = serde_json::json!({"spec": {"paused": "yes"}});
        assert!(serde_json::from_value::<WatchedCluster>(wrong).is_err());
    }

    fn cluster(ns: &str, name: &str, env: &str) -> Cluster {
        Cluster::new(ns, name, &[("env", env)])
    }

    fn names(store: &ClusterStore) -> Option<Vec<String>> {
        store.snapshot().map(|all| {
            all.iter()
                .map(|c| {
                    let m = &c.metadata;
                    let env = m.labels.as_ref().and_then(|l| l.get("env")).cloned();
                    format!(
                        "{}/{}={}",
                        m.namespace.as_deref().unwrap_or_default(),
                        m.name.as_deref().unwrap_or_default(),
                        env.unwrap_or_default()
                    )
                })
                .collect()
        })
    }

    #[test]
    fn serves_only_a_complete_listing_kept_current_by_events() {
        let store = ClusterStore::default();
        assert_eq!(names(&store), None, "nothing before the first listing");
        store.see(Seen::Listing);
        store.see(Seen::Listed(&cluster("b", "x", "prod")));
        store.see(Seen::Listed(&cluster("a", "z", "prod")));
        assert_eq!(names(&store), None, "nor while it lists");
        store.see(Seen::ListedAll);
        assert_eq!(
            names(&store),
            Some(vec!["a/z=prod".into(), "b/x=prod".into()]),
            "in a list's order"
        );
        store.see(Seen::Applied(&cluster("a", "z", "dev")));
        store.see(Seen::Applied(&cluster("a", "y", "dev")));
        store.see(Seen::Deleted(&cluster("b", "x", "prod")));
        assert_eq!(
            names(&store),
            Some(vec!["a/y=dev".into(), "a/z=dev".into()])
        );
    }

    #[test]
    fn a_failure_or_a_relisting_serves_nothing_until_listed_again() {
        let store = ClusterStore::default();
        store.see(Seen::Listing);
        store.see(Seen::Listed(&cluster("a", "gone", "prod")));
        store.see(Seen::ListedAll);
        store.see(Seen::Failed);
        assert_eq!(names(&store), None);
        store.see(Seen::Listing);
        store.see(Seen::Listed(&cluster("a", "new", "prod")));
        assert_eq!(names(&store), None);
        store.see(Seen::ListedAll);
        assert_eq!(
            names(&store),
            Some(vec!["a/new=prod".into()]),
            "the re-listing replaces what was kept: a Cluster deleted meanwhile is gone"
        );
    }

    #[test]
    fn a_run_after_read_afresh_lists_upstream_once() {
        let store = ClusterStore::default();
        store.see(Seen::Listing);
        store.see(Seen::Listed(&cluster("a", "x", "prod")));
        store.see(Seen::ListedAll);
        store.read_afresh();
        assert_eq!(names(&store), None);
        assert_eq!(names(&store), Some(vec!["a/x=prod".into()]));
    }

    #[test]
    fn slim_keeps_what_a_plan_reads() {
        let mut c = cluster("a", "x", "prod");
        c.metadata.managed_fields = Some(vec![Default::default()]);
        c.metadata.annotations = Some([("k".to_string(), "v".to_string())].into());
        c.spec.kube_config_secret = Some("kc".into());
        let mut extra = serde_json::Map::new();
        extra.insert("agent".into(), serde_json::json!({"lastSeen": "now"}));
        c.status = Some(ClusterStatus {
            scheduled: Some(true),
            active_schedule: Some(false),
            extra: extra.clone(),
        });
        c.extra = extra;
        let s = slim(&c);
        assert_eq!(s.metadata.managed_fields, None);
        assert_eq!(s.metadata.labels, c.metadata.labels);
        assert_eq!(s.metadata.annotations, c.metadata.annotations);
        assert_eq!(s.spec, c.spec);
        assert_eq!(s.off_schedule(), c.off_schedule());
        assert!(s.off_schedule());
        let status = s.status.unwrap_or_default();
        assert!(status.extra.is_empty() && s.extra.is_empty());
    }
}
