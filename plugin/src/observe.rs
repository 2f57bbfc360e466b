//! What is downstream: the metadata (never the data) of every copy helmop made on a cluster, and
//! of every object standing where a copy is wanted.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};
use helmop_core::names;
use helmop_core::plan::ObservedCopy;
use helmop_core::resource::{ResourceKind, ResourceRef};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client};

/// The copies found on one cluster.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    pub copies: Vec<ObservedCopy>,
    /// `resourceVersion` per (namespace, resource), for write preconditions.
    pub versions: BTreeMap<(String, ResourceRef), String>,
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

    fn add(&mut self, cluster: &str, kind: ResourceKind, meta: ObjectMeta) {
        let (Some(name), Some(namespace)) = (meta.name, meta.namespace) else {
            return;
        };
        let resource = ResourceRef::new(kind, name);
        let key = (namespace.clone(), resource.clone());
        if self.versions.contains_key(&key) {
            return;
        }
        self.versions
            .insert(key, meta.resource_version.unwrap_or_default());
        self.copies.push(ObservedCopy {
            cluster: cluster.to_string(),
            namespace,
            resource,
            uid: meta.uid.unwrap_or_default(),
            labels: meta.labels.unwrap_or_default(),
            annotations: meta.annotations.unwrap_or_default(),
        });
    }
}

/// Lists helmop's copies on the cluster (label `helmop.dev/managed-by`, all namespaces) and reads
/// the metadata of whatever exists at each `wanted` place. `cluster` is the plan's key.
pub async fn observe(
    client: &Client,
    cluster: &str,
    wanted: &BTreeSet<(String, ResourceRef)>,
) -> Result<Observation, kube::Error> {
    let mut obs = Observation::default();
    let selector = format!("{}={}", names::LABEL_MANAGED_BY, names::MANAGER);
    for meta in list_metadata::<Secret>(client, &selector).await? {
        obs.add(cluster, ResourceKind::Secret, meta);
    }
    for meta in list_metadata::<ConfigMap>(client, &selector).await? {
        obs.add(cluster, ResourceKind::ConfigMap, meta);
    }
    let missing: Vec<&(String, ResourceRef)> = wanted
        .iter()
        .filter(|(ns, r)| obs.get(ns, r).is_none())
        .collect();
    let found: Vec<Option<(ResourceKind, ObjectMeta)>> = futures::stream::iter(missing)
        .map(|(ns, resource)| async move {
            let meta = match resource.kind {
                ResourceKind::Secret => Api::<Secret>::namespaced(client.clone(), ns)
                    .get_metadata_opt(&resource.name)
                    .await?
                    .map(|m| m.metadata),
                ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), ns)
                    .get_metadata_opt(&resource.name)
                    .await?
                    .map(|m| m.metadata),
            };
            Ok::<_, kube::Error>(meta.map(|m| (resource.kind, m)))
        })
        .buffer_unordered(8)
        .try_collect()
        .await?;
    for (kind, meta) in found.into_iter().flatten() {
        obs.add(cluster, kind, meta);
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
    let mut params = ListParams::default().labels(selector).limit(500);
    let mut out = Vec::new();
    loop {
        let page = api.list_metadata(&params).await?;
        let token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
        out.extend(page.items.into_iter().map(|m| m.metadata));
        match token {
            Some(t) => params = params.continue_token(&t),
            None => return Ok(out),
        }
    }
}
