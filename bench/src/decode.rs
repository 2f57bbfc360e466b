//! `helmop-bench decode`: decoding the lists a propagation run reads downstream, kube's way (every field,
//! `managedFields` included) against the plugin's (`kubectl_helmop::cluster::lean_list`: `managedFields`
//! skipped as the JSON is read). Same text, same process, alternating rounds.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DynamicObject, ObjectList};
use kube::core::PartialObjectMeta;
use kubectl_helmop::cluster::lean_list;
use serde_json::{Value, json};

use crate::hash::race;

pub struct DecodeRow {
    pub label: &'static str,
    pub items: usize,
    pub bytes: usize,
    pub kube: Duration,
    pub lean: Duration,
}

impl DecodeRow {
    /// kube's time over the plugin's: how many times faster the plugin's decoding is.
    pub fn speedup(&self) -> f64 {
        self.kube.as_secs_f64() / self.lean.as_secs_f64()
    }
}

/// The field-ownership entries a real API server keeps on an object that three writers touched.
fn managed_fields(kind: &str) -> Value {
    let spec = if kind == "Deployment" {
        json!({"f:spec": {"f:replicas": {}, "f:selector": {}, "f:template": {"f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:envFrom": {}, "f:image": {}, "f:name": {}}}}}}})
    } else {
        json!({"f:data": {"f:a": {}, "f:b": {}, "f:c": {}}})
    };
    json!([
        {"manager": "helm", "operation": "Update", "apiVersion": "v1", "time": "2026-12-05T10:00:00Z",
         "fieldsType": "FieldsV1", "fieldsV1": spec},
        {"manager": "kubectl-helmop", "operation": "Apply", "apiVersion": "v1", "time": "2026-12-05T10:00:01Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {"f:helmop.dev/content-hash": {},
         "f:helmop.dev/owners": {}}, "f:labels": {"f:helmop.dev/managed-by": {}}}}},
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": "2026-12-05T10:00:02Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:replicas": {}, "f:conditions": {}}}, "subresource": "status"}
    ])
}

fn metadata(i: usize, kind: &str) -> Value {
    json!({
        "name": format!("obj-{i}"), "namespace": "shop", "uid": format!("00000000-0000-0000-0000-{i:012}"),
        "resourceVersion": format!("{}", 1000 + i), "generation": 2, "creationTimestamp": "2026-12-05T10:00:00Z",
        "labels": {"app": "web", "helmop.dev/managed-by": "kubectl-helmop", "helmop.dev/rollout-on-change": "true"},
        "annotations": {"helmop.dev/content-hash": "v2:hmac-sha256:0123456789abcdef0123456789abcdef", "helmop.dev/owners": "shop/web"},
        "managedFields": managed_fields(kind),
    })
}

/// `n` Deployments as a workload list returns them.
fn deployments(n: usize) -> String {
    let items: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "metadata": metadata(i, "Deployment"),
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": {
                    "metadata": {"labels": {"app": "web"}, "annotations": {"helmop.dev/config-hash": "v2:abc", "helmop.dev/restamp": "x"}},
                    "spec": {"containers": [{"name": "web", "image": "registry/web:1", "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}}},
                "status": {"replicas": 2, "readyReplicas": 2}
            })
        })
        .collect();
    json!({"apiVersion": "apps/v1", "kind": "DeploymentList", "metadata": {"resourceVersion": "5000"}, "items": items})
        .to_string()
}

/// `n` ConfigMaps as a metadata-only list (`as=PartialObjectMetadataList`) returns them.
fn config_map_metadata(n: usize) -> String {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": metadata(i, "ConfigMap")}))
        .collect();
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {"resourceVersion": "5000"}, "items": items})
        .to_string()
}

/// Runs both lists at `items` objects each.
pub fn run(items: usize, rounds: usize) -> anyhow::Result<Vec<DecodeRow>> {
    let iterations = (20_000 / items.max(1)).max(3);
    let mut rows = Vec::new();

    let text = deployments(items);
    // Both readings must agree before either is timed.
    let mut want: ObjectList<DynamicObject> = serde_json::from_str(&text)?;
    want.items
        .iter_mut()
        .for_each(|o| o.metadata.managed_fields = None);
    anyhow::ensure!(
        lean_list::dynamic_items(&text)? == want.items,
        "the two readings of the workload list differ"
    );
    rows.push(timed(
        "workload list (Deployments, DynamicObject)",
        items,
        &text,
        (rounds, iterations),
        |t| {
            let r: Result<ObjectList<DynamicObject>, _> = serde_json::from_str(t);
            std::hint::black_box(r.ok());
        },
        |t| {
            std::hint::black_box(lean_list::dynamic_items(t).ok());
        },
    ));

    let text = config_map_metadata(items);
    let want: ObjectList<PartialObjectMeta<ConfigMap>> = serde_json::from_str(&text)?;
    let (got, _) = lean_list::metadata_items(&text)?;
    anyhow::ensure!(
        got.len() == want.items.len()
            && got.iter().zip(&want.items).all(|(g, w)| {
                let mut w = w.metadata.clone();
                w.managed_fields = None;
                *g == w
            }),
        "the two readings of the metadata list differ"
    );
    rows.push(timed(
        "copy metadata list (ConfigMaps, PartialObjectMetadata)",
        items,
        &text,
        (rounds, iterations),
        |t| {
            let r: Result<ObjectList<PartialObjectMeta<ConfigMap>>, _> = serde_json::from_str(t);
            std::hint::black_box(r.ok());
        },
        |t| {
            std::hint::black_box(lean_list::metadata_items(t).ok());
        },
    ));
    Ok(rows)
}

/// Both readings of `text` raced, `rounds` alternating rounds of `iterations` calls each.
fn timed(
    label: &'static str,
    items: usize,
    text: &str,
    (rounds, iterations): (usize, usize),
    kube: impl Fn(&str),
    lean: impl Fn(&str),
) -> DecodeRow {
    let (kube, lean) = race(rounds, iterations, || kube(text), || lean(text));
    DecodeRow {
        label,
        items,
        bytes: text.len(),
        kube,
        lean,
    }
}

pub fn table(rows: &[DecodeRow]) -> String {
    let mut out = String::from(
        "| list | items | bytes | kube µs per item | helmop µs per item | kube / helmop |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / r.items.max(1) as f64;
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} | **{:.2} x** |\n",
            r.label,
            r.items,
            r.bytes,
            per(r.kube),
            per(r.lean),
            r.speedup()
        ));
    }
    out
}
