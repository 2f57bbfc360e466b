//! The equivalence scenario: the same propagate / unchanged rerun / source edit / prune / status sequence
//! against any set of downstream clusters (real API servers behind counting proxies, or simulated ones),
//! recording per step the requests each cluster saw and the plugin's JSON output with the cluster-specific
//! parts (upstream namespace, `kube-system` UIDs, endpoints) normalised, so two runs can be compared.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use helmop_tests::{
    ClusterInfo, apply_helmop, create_config_map, create_secret, register_fleet_cluster,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::sim::{Counter, Counts};

/// Destination namespace of every copy.
pub const DEST: &str = "app";

/// One side of the comparison.
pub struct Side<'a> {
    /// Upstream namespace of this side's HelmOp, Clusters and sources.
    pub namespace: String,
    /// What the plugin reaches each downstream cluster with (registered as Fleet Clusters).
    pub targets: &'a [ClusterInfo],
    /// Requests seen by each cluster, in the order of `targets`.
    pub counters: Vec<Counter>,
}

/// What one step did.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub name: &'static str,
    pub exit_code: i32,
    /// Requests per cluster during the step, by (verb, resource).
    pub requests: Vec<Counts>,
    /// The plugin's JSON output, normalised.
    pub output: Value,
}

impl Step {
    /// Writes per cluster, by (verb, resource).
    pub fn writes(&self) -> Vec<Counts> {
        self.requests
            .iter()
            .map(|c| {
                c.iter()
                    .filter(|((v, _), _)| super::route::is_write(v))
                    .map(|(k, n)| (k.clone(), *n))
                    .collect()
            })
            .collect()
    }
}

fn delta(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// Replaces every string occurrence of the keys of `names` by their values, recursively.
fn normalise(value: &mut Value, names: &BTreeMap<String, String>) {
    match value {
        Value::String(s) => {
            for (from, to) in names {
                if s.contains(from.as_str()) {
                    *s = s.replace(from.as_str(), to);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| normalise(v, names)),
        Value::Object(map) => map.values_mut().for_each(|v| normalise(v, names)),
        _ => {}
    }
}

/// Rows in a stable order (the plugin sorts by cluster, which is named differently on each side).
fn sort_rows(value: &mut Value) {
    if let Some(rows) = value.get_mut("rows").and_then(Value::as_array_mut) {
        rows.sort_by_key(|r| r.to_string());
    } else if let Some(rows) = value.as_array_mut() {
        rows.sort_by_key(|r| r.to_string());
    }
}

async fn plugin(
    plugin_bin: &Path,
    upstream: &ClusterInfo,
    args: &[&str],
) -> anyhow::Result<(i32, Value)> {
    let output = tokio::process::Command::new(plugin_bin)
        .args(args)
        .arg("--kubeconfig")
        .arg(&upstream.kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .with_context(|| format!("kubectl-helmop {args:?} did not finish within 120 s"))?
        .with_context(|| format!("running {}", plugin_bin.display()))?;
    let code = output.status.code().unwrap_or(-1);
    let value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "kubectl-helmop {args:?} exited {code} without JSON on stdout: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    Ok((code, value))
}

fn helmop(side: &Side<'_>, resources: &[(&str, &str)]) -> Value {
    let targets: Vec<Value> = (0..side.targets.len())
        .map(
            |i| json!({"name": format!("c{i}"), "clusterName": format!("c{i}"), "namespace": DEST}),
        )
        .collect();
    let entries: Vec<Value> = resources
        .iter()
        .map(|(k, n)| json!({"kind": k, "name": n}))
        .collect();
    json!({
        "metadata": {"name": "app"},
        "spec": {
            "helm": {"repo": "https://charts.example.com/stable", "chart": "app", "version": "1.2.3"},
            "downstreamResources": entries,
            "targets": targets,
        },
    })
}

/// Downstream objects the plugin must find: on the first cluster, the destination namespace with a foreign
/// Secret `s2` (a `Conflict`) and an opted-in Deployment reading `s1` (restamped when `s1` changes).
async fn seed_first_cluster(target: &ClusterInfo) -> anyhow::Result<()> {
    let client = target.client().await;
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(DEST.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .context("creating the destination namespace")?;
    create_secret(&client, DEST, "s2", &[("k", b"not helmop's")]).await?;
    let deployment = helmop_tests::deployment_manifest(
        DEST,
        "web",
        json!({"helmop.dev/rollout-on-change": "true"}),
        json!({"envFrom": [{"secretRef": {"name": "s1"}}]}),
    );
    let deployment: Deployment = serde_json::from_value(deployment)?;
    Api::<Deployment>::namespaced(client, DEST)
        .create(&PostParams::default(), &deployment)
        .await
        .context("creating Deployment web")?;
    Ok(())
}

/// Runs the scenario on one side; `upstream` holds the HelmOp, the Clusters and the sources.
pub async fn run(
    plugin_bin: &Path,
    upstream: &ClusterInfo,
    side: &Side<'_>,
) -> anyhow::Result<Vec<Step>> {
    let up = upstream.client().await;
    let ns = side.namespace.as_str();
    crate::fixtures::create_namespace(&up, ns, &[]).await?;
    create_secret(&up, ns, "s1", &[("password", b"one")]).await?;
    create_config_map(&up, ns, "c1", &[("setting", "on")]).await?;
    create_secret(&up, ns, "s2", &[("token", b"two")]).await?;
    let mut names = BTreeMap::from([(ns.to_owned(), "NS".to_owned())]);
    for (i, target) in side.targets.iter().enumerate() {
        register_fleet_cluster(&up, ns, &format!("c{i}"), &[], target).await?;
        let client = target.client().await;
        let uid = Api::<Namespace>::all(client)
            .get("kube-system")
            .await?
            .metadata
            .uid
            .unwrap_or_default();
        names.insert(uid, format!("UID{i}"));
        names.insert(target.server.clone(), format!("SERVER{i}"));
    }
    if let Some(first) = side.targets.first() {
        seed_first_cluster(first).await?;
    }
    let all = [("Secret", "s1"), ("ConfigMap", "c1"), ("Secret", "s2")];
    apply_helmop(&up, ns, &helmop(side, &all).to_string()).await?;

    let mut steps = Vec::new();
    let propagate = ["propagate", "-n", ns, "-o", "json"];
    for name in [
        "cold propagate",
        "unchanged propagate",
        "source edit",
        "prune",
        "status",
    ] {
        match name {
            "source edit" => {
                let patch = json!({"data": {"password": base64_of(b"two")}});
                Api::<Secret>::namespaced(up.clone(), ns)
                    .patch("s1", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .context("editing source s1")?;
            }
            "prune" => {
                apply_helmop(&up, ns, &helmop(side, &[all[0], all[2]]).to_string()).await?;
            }
            _ => {}
        }
        let args: Vec<&str> = match name {
            "prune" => vec!["prune", "-n", ns, "-o", "json"],
            "status" => vec!["status", "-n", ns, "-o", "json"],
            _ => propagate.to_vec(),
        };
        let before: Vec<Counts> = side.counters.iter().map(Counter::counts).collect();
        let (exit_code, mut output) = plugin(plugin_bin, upstream, &args).await?;
        let requests = side
            .counters
            .iter()
            .zip(&before)
            .map(|(c, b)| delta(&c.counts(), b))
            .collect();
        normalise(&mut output, &names);
        sort_rows(&mut output);
        steps.push(Step {
            name,
            exit_code,
            requests,
            output,
        });
    }
    Ok(steps)
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
