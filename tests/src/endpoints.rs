//! The webhook's three endpoints registered for one test namespace, with the rules the manifests
//! give them, and helpers for the workloads the mutating endpoint stamps.

use std::io::Read;
use std::process::Output;

use anyhow::bail;

use k8s_openapi::api::apps::v1::ReplicaSet;
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::{
    ClusterInfo, LocalWebhook, WebhookBinary, WebhookKind, WebhookRegistration, WebhookRule,
    unregister_webhook,
};

/// The webhook configurations of one test; removed by [`Registered::remove`] at the end of a test.
pub struct Registered {
    client: Client,
    names: [(WebhookKind, String); 3],
}

impl Registered {
    fn names(namespace: &str) -> [(WebhookKind, String); 3] {
        [
            (WebhookKind::Validating, format!("{namespace}-helmops")),
            (WebhookKind::Validating, format!("{namespace}-references")),
            (WebhookKind::Mutating, format!("{namespace}-workloads")),
        ]
    }

    pub async fn remove(self) -> anyhow::Result<()> {
        for (kind, name) in &self.names {
            unregister_webhook(&self.client, *kind, name).await?;
        }
        Ok(())
    }
}

impl LocalWebhook {
    /// Registers the three endpoints for `namespace` only, with the rules of
    /// `manifests/base/webhooks.yaml` (plus HelmOp DELETE, to show it is never denied).
    pub async fn register(&self, client: &Client, namespace: &str) -> anyhow::Result<Registered> {
        register_endpoints(client, namespace, &self.url, &self.ca_pem).await
    }
}

impl WebhookBinary {
    /// [`LocalWebhook::register`] for the binary.
    pub async fn register(&self, client: &Client, namespace: &str) -> anyhow::Result<Registered> {
        register_endpoints(client, namespace, &self.url, &self.ca_pem).await
    }
}

async fn register_endpoints(
    client: &Client,
    namespace: &str,
    url: &str,
    ca_pem: &str,
) -> anyhow::Result<Registered> {
    let names = Registered::names(namespace);
    WebhookRegistration::new(
        WebhookKind::Validating,
        &names[0].1,
        &format!("{url}/validate/helmops"),
        ca_pem,
    )
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE", "DELETE"],
        "fleet.cattle.io",
        "v1alpha1",
        &["helmops"],
    ))
    .only_namespace(namespace)
    .register(client)
    .await?;
    WebhookRegistration::new(
        WebhookKind::Validating,
        &names[1].1,
        &format!("{url}/validate/references"),
        ca_pem,
    )
    .rule(WebhookRule::new(
        &["DELETE"],
        "",
        "v1",
        &["secrets", "configmaps"],
    ))
    .only_namespace(namespace)
    .register(client)
    .await?;
    WebhookRegistration::new(
        WebhookKind::Mutating,
        &names[2].1,
        &format!("{url}/mutate/workloads"),
        ca_pem,
    )
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "apps",
        "v1",
        &["deployments", "statefulsets", "daemonsets", "replicasets"],
    ))
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "batch",
        "v1",
        &["jobs"],
    ))
    // Kubernetes 1.20 serves CronJobs as batch/v1beta1 only.
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "batch",
        "v1",
        &["cronjobs"],
    ))
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "batch",
        "v1beta1",
        &["cronjobs"],
    ))
    .only_namespace(namespace)
    .register(client)
    .await?;
    Ok(Registered {
        client: client.clone(),
        names,
    })
}

/// A one-replica Deployment `name` (pods labelled `app=name`) whose container `app` gets the fields
/// of `container` (e.g. `env`, `envFrom`); `labels` go on the Deployment itself.
pub fn deployment_manifest(namespace: &str, name: &str, labels: Value, container: Value) -> Value {
    let mut container = container;
    container["name"] = json!("app");
    container["image"] = json!("registry.example.com/app:1.0");
    let mut d = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container]},
            },
        },
    });
    // An empty map would make every `kubectl apply` send a patch (the server drops empty labels).
    if labels.as_object().is_some_and(|l| !l.is_empty()) {
        d["metadata"]["labels"] = labels;
    }
    d
}

/// How many ReplicaSets of pods labelled `app=<app>` kube-controller-manager has made.
pub async fn replica_sets(client: &Client, namespace: &str, app: &str) -> anyhow::Result<usize> {
    let lp = ListParams::default().labels(&format!("app={app}"));
    Ok(Api::<ReplicaSet>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await?
        .items
        .len())
}

/// 32 random bytes, a usable hash key.
pub fn random_key() -> anyhow::Result<Vec<u8>> {
    let mut key = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    Ok(key)
}

/// Secret `hash-key` in `namespace`: where a test's own webhook reads its hash key (written with
/// [`random_key`] under data key `key`).
pub fn hash_key_in(namespace: &str) -> helmop_webhook::state::SecretRef {
    helmop_webhook::state::SecretRef {
        namespace: namespace.to_owned(),
        name: "hash-key".into(),
    }
}

/// `kubectl apply -f -` of one object given as JSON on `cluster`, with `extra` arguments; fails
/// with kubectl's stderr when kubectl does.
pub async fn kubectl_apply(
    cluster: &ClusterInfo,
    object: &Value,
    extra: &[&str],
) -> anyhow::Result<Output> {
    let mut args = vec!["apply", "-f", "-"];
    args.extend_from_slice(extra);
    cluster.run_kubectl(&args, Some(&object.to_string())).await
}

/// Sets `helmop.dev/restamp=<value>` on `target` (e.g. `deployment/web`) with `kubectl annotate`,
/// which sends the workload through admission again.
pub async fn restamp(
    cluster: &ClusterInfo,
    namespace: &str,
    target: &str,
    value: &str,
) -> anyhow::Result<Output> {
    let annotation = format!("helmop.dev/restamp={value}");
    let out = cluster
        .run_kubectl(
            &[
                "annotate",
                "-n",
                namespace,
                target,
                &annotation,
                "--overwrite",
            ],
            None,
        )
        .await?;
    if !out.status.success() {
        bail!(
            "kubectl annotate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}
