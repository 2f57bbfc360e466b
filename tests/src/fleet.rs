//! Fleet objects (HelmOp, Cluster, ClusterGroup, BundleNamespaceMapping, Bundle, BundleDeployment) as
//! dynamic objects.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::controlplane::ClusterInfo;
use crate::objects::create_secret;

/// `apiVersion` of every Fleet kind.
pub const FLEET_API_VERSION: &str = "fleet.cattle.io/v1alpha1";
const FIELD_MANAGER: &str = "helmop-tests";

fn fleet_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "fleet.cattle.io".to_owned(),
        version: "v1alpha1".to_owned(),
        api_version: FLEET_API_VERSION.to_owned(),
        kind: kind.to_owned(),
        plural: plural.to_owned(),
    }
}

pub fn helmop_resource() -> ApiResource {
    fleet_resource("HelmOp", "helmops")
}
pub fn cluster_resource() -> ApiResource {
    fleet_resource("Cluster", "clusters")
}
pub fn cluster_group_resource() -> ApiResource {
    fleet_resource("ClusterGroup", "clustergroups")
}
pub fn bundle_namespace_mapping_resource() -> ApiResource {
    fleet_resource("BundleNamespaceMapping", "bundlenamespacemappings")
}
pub fn policy_resource() -> ApiResource {
    fleet_resource("Policy", "policies")
}
pub fn bundle_resource() -> ApiResource {
    fleet_resource("Bundle", "bundles")
}
pub fn bundle_deployment_resource() -> ApiResource {
    fleet_resource("BundleDeployment", "bundledeployments")
}

/// A HelmOp object (JSON) with `spec.helm` and `spec.downstreamResources`.
pub fn helmop_object(
    namespace: &str,
    name: &str,
    helm: Value,
    downstream_resources: Value,
) -> Value {
    json!({
        "apiVersion": FLEET_API_VERSION,
        "kind": "HelmOp",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"helm": helm, "downstreamResources": downstream_resources},
    })
}

/// A HelmOp document for [`apply_helmop`]: `name` copies `resources` (kind, name) into `default_namespace`
/// on every Cluster labelled `selector` (one label, key and value).
pub fn copying_helmop(
    name: &str,
    default_namespace: &str,
    resources: &[(&str, &str)],
    selector: (&str, &str),
) -> Value {
    let resources: Vec<Value> = resources
        .iter()
        .map(|(kind, name)| json!({"kind": kind, "name": name}))
        .collect();
    let (key, value) = selector;
    json!({
        "metadata": {"name": name},
        "spec": {
            "helm": {"repo": "https://charts.example.com", "chart": "app", "version": "1.0.0"},
            "defaultNamespace": default_namespace,
            "downstreamResources": resources,
            "targets": [{"clusterSelector": {"matchLabels": {key: value}}}],
        },
    })
}

/// A namespaced API for one of the Fleet kinds above.
pub fn fleet_api(client: &Client, namespace: &str, resource: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, resource)
}

/// Creates a Fleet object from JSON (`apiVersion`/`kind` filled in when absent, namespace set).
pub async fn create_fleet_object(
    client: &Client,
    namespace: &str,
    resource: &ApiResource,
    mut object: Value,
) -> anyhow::Result<DynamicObject> {
    complete(&mut object, namespace, resource)?;
    let obj: DynamicObject = serde_json::from_value(object)?;
    let name = obj.metadata.name.clone().unwrap_or_default();
    fleet_api(client, namespace, resource)
        .create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating {} {namespace}/{name}", resource.kind))
}

/// Creates or updates (server-side apply, field manager `helmop-tests`) a HelmOp given as YAML
/// or JSON. Its namespace is `namespace`; a document naming another namespace is an error.
pub async fn apply_helmop(
    client: &Client,
    namespace: &str,
    document: &str,
) -> anyhow::Result<DynamicObject> {
    let mut object: Value = match serde_json::from_str(document) {
        Ok(v) => v,
        Err(_) => serde_saphyr::from_str(document).context("HelmOp is neither JSON nor YAML")?,
    };
    let resource = helmop_resource();
    complete(&mut object, namespace, &resource)?;
    let name = match object.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) => n.to_owned(),
        None => bail!("HelmOp has no metadata.name"),
    };
    fleet_api(client, namespace, &resource)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .with_context(|| format!("applying HelmOp {namespace}/{name}"))
}

/// Registers `target` as a Fleet Cluster `name` in `namespace` of the upstream cluster: a
/// Secret `<name>-kubeconfig` whose key `value` holds the target's kubeconfig, and a Cluster
/// with `spec.kubeConfigSecret` pointing at it and the given labels.
pub async fn register_fleet_cluster(
    upstream: &Client,
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    target: &ClusterInfo,
) -> anyhow::Result<DynamicObject> {
    let secret = format!("{name}-kubeconfig");
    create_secret(
        upstream,
        namespace,
        &secret,
        &[("value", target.kubeconfig_yaml().as_bytes())],
    )
    .await?;
    create_fleet_object(
        upstream,
        namespace,
        &cluster_resource(),
        json!({
            "metadata": {"name": name, "labels": label_map(labels)},
            "spec": {"kubeConfigSecret": secret},
        }),
    )
    .await
}

/// Creates a ClusterGroup selecting Clusters by `match_labels`, itself labelled `labels`.
pub async fn create_cluster_group(
    client: &Client,
    namespace: &str,
    name: &str,
    match_labels: &[(&str, &str)],
    labels: &[(&str, &str)],
) -> anyhow::Result<DynamicObject> {
    create_fleet_object(
        client,
        namespace,
        &cluster_group_resource(),
        json!({
            "metadata": {"name": name, "labels": label_map(labels)},
            "spec": {"selector": {"matchLabels": label_map(match_labels)}},
        }),
    )
    .await
}

fn label_map(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn complete(object: &mut Value, namespace: &str, resource: &ApiResource) -> anyhow::Result<()> {
    let Some(map) = object.as_object_mut() else {
        bail!("a {} must be a mapping", resource.kind);
    };
    let api_version = map
        .entry("apiVersion")
        .or_insert_with(|| Value::from(resource.api_version.clone()));
    if api_version != resource.api_version.as_str() {
        bail!("apiVersion {api_version} is not {}", resource.api_version);
    }
    let kind = map
        .entry("kind")
        .or_insert_with(|| Value::from(resource.kind.clone()));
    if kind != resource.kind.as_str() {
        bail!("kind {kind} is not {}", resource.kind);
    }
    let Some(meta) = map
        .entry("metadata")
        .or_insert_with(|| json!({}))
        .as_object_mut()
    else {
        bail!("metadata must be a mapping");
    };
    match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if ns != namespace => {
            bail!("document is for namespace {ns}, expected {namespace}")
        }
        _ => {
            meta.insert("namespace".to_owned(), Value::from(namespace));
        }
    }
    Ok(())
}

/// The Events the propagator (`reportingController: helmop.dev/propagator`) put on HelmOp `ns/helmop`.
pub async fn propagator_events(
    client: &Client,
    ns: &str,
    helmop: &str,
) -> anyhow::Result<Vec<Event>> {
    controller_events(client, ns, "HelmOp", helmop, "helmop.dev/propagator").await
}

/// The Events (events.k8s.io) that `controller` (their `reportingController`) put on the object
/// `ns/name` of kind `kind`.
pub async fn controller_events(
    client: &Client,
    ns: &str,
    kind: &str,
    name: &str,
    controller: &str,
) -> anyhow::Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    Ok(events
        .list(&Default::default())
        .await
        .with_context(|| format!("listing Events in {ns}"))?
        .items
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
                && e.reporting_controller.as_deref() == Some(controller)
        })
        .collect())
}

/// `vendor/fleet-crds/` in this repository: Fleet's CRDs as the harness `cp` installs them
/// (SOURCE.md there says where each comes from).
pub fn fleet_crds_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vendor/fleet-crds")
}

/// Installs the Fleet CRD `<plural>.fleet.cattle.io` from [`fleet_crds_dir`] on a
/// cluster started without it (the harness installs only the kinds most tests need), and waits
/// until the API server serves it. Installing it twice is fine: tests of one binary share the
/// control plane.
pub async fn install_fleet_crd(client: &Client, plural: &str) -> anyhow::Result<()> {
    let path = fleet_crds_dir().join(format!("{plural}.fleet.cattle.io.yaml"));
    crate::crds::install_crd(client, &path).await?;
    Ok(())
}
