//! What is downstream: the metadata of every copy helmop made on a cluster, and of every object
//! standing where a copy is wanted. Given the upstream hash key, the objects are read whole and
//! their content hashed in memory (drift detection, `type`, `immutable`): the data itself is
//! dropped right there, never kept, logged or printed.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};
use helmop_core::hash::{HashKey, ObjectData, content_hash};
use helmop_core::names;
use helmop_core::plan::{LiveFacts, ObservedCopy};
use helmop_core::resource::{ResourceKind, ResourceRef};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client};

/// The copies found on one cluster.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    pub copies: Vec<ObservedCopy>,
    /// `resourceVersion` per (namespace, resource), for write preconditions.
    pub versions: BTreeMap<(String, ResourceRef), String>,
    /// What a write must know of the live objects (read only when a hash key was given).
    pub live: BTreeMap<(String, ResourceRef), LiveFacts>,
    /// The destination namespaces read while looking for objects at wanted places, as found
    /// then: a run writing there need not read them again.
    pub namespaces: BTreeMap<String, NamespaceState>,
}

/// A destination namespace as this run knows it: as read, or as the run left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceState {
    Absent,
    Active,
    /// Being deleted: the API server refuses new objects in it.
    Terminating,
    /// Created by this run: it was empty when made, so nothing in it can have read a copy yet.
    Created,
}

/// The state of `namespace` (one metadata GET).
pub async fn namespace_state(
    client: &Client,
    namespace: &str,
) -> Result<NamespaceState, kube::Error> {
    let found = Api::<Namespace>::all(client.clone())
        .get_metadata_opt(namespace)
        .await?;
    Ok(match found {
        None => NamespaceState::Absent,
        Some(ns) if ns.metadata.deletion_timestamp.is_some() => NamespaceState::Terminating,
        Some(_) => NamespaceState::Active,
    })
}

impl Observation {
    pub fn get(&self, namespace: &str, resource: &ResourceRef) -> Option<&ObservedCopy> {
        self.copies
            .iter()
            .find(|o| o.namespace == namespace && &o.resource == resource)
    }

    pub fn version(&self, namespace: &str, resource: &ResourceRef) -> Option<&str> {
        self.versions
            .get(&(namespace.to_string(), resource.clone()))
            .map(String::as_str)
    }

    pub fn live(&self, namespace: &str, resource: &ResourceRef) -> Option<&LiveFacts> {
        self.live.get(&(namespace.to_string(), resource.clone()))
    }

    fn add(&mut self, cluster: &str, kind: ResourceKind, meta: ObjectMeta, live: Option<Live>) {
        let (Some(name), Some(namespace)) = (meta.name, meta.namespace) else {
            return;
        };
        let resource = ResourceRef::new(kind, name);
        let key = (namespace.clone(), resource.clone());
        if self.versions.contains_key(&key) {
            return;
        }
        let version = meta.resource_version.unwrap_or_default();
        self.versions.insert(key.clone(), version.clone());
        let data_hash = live.as_ref().map(|l| l.hash.clone());
        if let Some(l) = live {
            self.live.insert(
                key,
                LiveFacts {
                    type_: l.type_,
                    immutable: l.immutable,
                    resource_version: version,
                    data_hash: Some(l.hash),
                },
            );
        }
        self.copies.push(ObservedCopy {
            cluster: cluster.to_string(),
            namespace,
            resource,
            uid: meta.uid.unwrap_or_default(),
            labels: meta.labels.unwrap_or_default(),
            annotations: meta.annotations.unwrap_or_default(),
            data_hash,
        });
    }
}

/// What is kept of a live object read whole: never its data.
struct Live {
    hash: String,
    type_: Option<String>,
    immutable: bool,
}

fn secret_live(key: &HashKey, s: Secret) -> (ObjectMeta, Live) {
    let live = Live {
        hash: content_hash(key, ResourceKind::Secret, &ObjectData::from(&s)),
        type_: s.type_.clone(),
        immutable: s.immutable.unwrap_or(false),
    };
    (s.metadata, live)
}

fn config_map_live(key: &HashKey, c: ConfigMap) -> (ObjectMeta, Live) {
    let live = Live {
        hash: content_hash(key, ResourceKind::ConfigMap, &ObjectData::from(&c)),
        type_: None,
        immutable: c.immutable.unwrap_or(false),
    };
    (c.metadata, live)
}

/// Lists helmop's copies on the cluster (label `helmop.dev/managed-by`, all namespaces) and reads
/// whatever exists at each `wanted` place. `cluster` is the plan's key. With `key` the objects
/// are read whole and hashed in memory ([`Observation::live`], [`ObservedCopy::data_hash`]);
/// without, only their metadata is read.
pub async fn observe(
    client: &Client,
    cluster: &str,
    wanted: &BTreeSet<(String, ResourceRef)>,
    key: Option<&HashKey>,
) -> Result<Observation, kube::Error> {
    let mut obs = Observation::default();
    let selector = format!("{}={}", names::LABEL_MANAGED_BY, names::MANAGER);
    if let Some(key) = key {
        for s in list_full::<Secret>(client, &selector).await? {
            let (meta, live) = secret_live(key, s);
            obs.add(cluster, ResourceKind::Secret, meta, Some(live));
        }
        for c in list_full::<ConfigMap>(client, &selector).await? {
            let (meta, live) = config_map_live(key, c);
            obs.add(cluster, ResourceKind::ConfigMap, meta, Some(live));
        }
    } else {
        for meta in list_metadata::<Secret>(client, &selector).await? {
            obs.add(cluster, ResourceKind::Secret, meta, None);
        }
        for meta in list_metadata::<ConfigMap>(client, &selector).await? {
            obs.add(cluster, ResourceKind::ConfigMap, meta, None);
        }
    }
    let missing: Vec<&(String, ResourceRef)> = wanted
        .iter()
        .filter(|(ns, r)| obs.get(ns, r).is_none())
        .collect();
    // Nothing can stand in a namespace that does not exist: one GET of the namespace saves a GET per
    // wanted place in it (all of them on a cold cluster).
    let namespaces: BTreeSet<&str> = missing.iter().map(|(ns, _)| ns.as_str()).collect();
    for ns in namespaces {
        let state = namespace_state(client, ns).await?;
        obs.namespaces.insert(ns.to_string(), state);
    }
    let missing: Vec<&(String, ResourceRef)> = missing
        .into_iter()
        .filter(|(ns, _)| obs.namespaces.get(ns) != Some(&NamespaceState::Absent))
        .collect();
    type Found = Option<(ResourceKind, ObjectMeta, Option<Live>)>;
    let found: Vec<Found> = futures::stream::iter(missing)
        .map(|(ns, resource)| async move {
            let secrets = Api::<Secret>::namespaced(client.clone(), ns);
            let config_maps = Api::<ConfigMap>::namespaced(client.clone(), ns);
            let name = &resource.name;
            let got = match (resource.kind, key) {
                (ResourceKind::Secret, Some(key)) => secrets
                    .get_opt(name)
                    .await?
                    .map(|s| secret_live(key, s))
                    .map(|(m, l)| (m, Some(l))),
                (ResourceKind::ConfigMap, Some(key)) => config_maps
                    .get_opt(name)
                    .await?
                    .map(|c| config_map_live(key, c))
                    .map(|(m, l)| (m, Some(l))),
                (ResourceKind::Secret, None) => secrets
                    .get_metadata_opt(name)
                    .await?
                    .map(|m| (m.metadata, None)),
                (ResourceKind::ConfigMap, None) => config_maps
                    .get_metadata_opt(name)
                    .await?
                    .map(|m| (m.metadata, None)),
            };
            Ok::<_, kube::Error>(got.map(|(m, l)| (resource.kind, m, l)))
        })
        .buffer_unordered(8)
        .try_collect()
        .await?;
    for (kind, meta, live) in found.into_iter().flatten() {
        obs.add(cluster, kind, meta, live);
    }
    obs.copies.sort_by(|a, b| {
        (&a.namespace, a.resource.kind.lower(), &a.resource.name).cmp(&(
            &b.namespace,
            b.resource.kind.lower(),
            &b.resource.name,
        ))
    });
    Ok(obs)
}

async fn list_metadata<K>(client: &Client, selector: &str) -> Result<Vec<ObjectMeta>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    paged(selector, |params| {
        let api = api.clone();
        async move {
            let page = api.list_metadata(&params).await?;
            let items = page.items.into_iter().map(|m| m.metadata).collect();
            Ok((items, page.metadata.continue_))
        }
    })
    .await
}

async fn list_full<K>(client: &Client, selector: &str) -> Result<Vec<K>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    paged(selector, |params| {
        let api = api.clone();
        async move {
            let page = api.list(&params).await?;
            Ok((page.items, page.metadata.continue_))
        }
    })
    .await
}

/// Every item of a labelled list, 500 per page, following continue tokens (a large cluster's list
/// must never be cut at the first page: what is not seen cannot be judged).
async fn paged<T, F, Fut>(selector: &str, mut page: F) -> Result<Vec<T>, kube::Error>
where
    F: FnMut(ListParams) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, Option<String>), kube::Error>>,
{
    let mut params = ListParams::default().labels(selector).limit(500);
    let mut out = Vec::new();
    loop {
        let (items, token) = page(params.clone()).await?;
        out.extend(items);
        match token.filter(|t| !t.is_empty()) {
            Some(t) => params = params.continue_token(&t),
            None => return Ok(out),
        }
    }
}
