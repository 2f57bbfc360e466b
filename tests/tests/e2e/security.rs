//! Secret values never leave the objects they live in: known random values are planted in Secrets that HelmOps
//! reference and workloads read (plus the hash key and the downstream clusters' tokens), the webhook binary
//! (RUST_LOG=trace) and the plugin (HELMOP_LOG=trace) are driven through admissions, denials, warnings,
//! conflicts, propagation, staleness and pruning, and then every log line, every output and error, every Event,
//! every label and annotation of the objects involved and every metric is searched for those values, raw,
//! base64 and hex.

use std::time::Duration;

use anyhow::bail;
use base64::Engine;
use helmop_tests::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde_json::json;

fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut buf = vec![0u8; bytes];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Everything that was printed, logged or stored, with where it came from.
#[derive(Default)]
struct Haystack(Vec<(String, String)>);

impl Haystack {
    fn add(&mut self, source: impl Into<String>, text: impl Into<String>) {
        self.0.push((source.into(), text.into()));
    }

    fn add_output(&mut self, source: &str, out: &std::process::Output) {
        self.add(
            format!("{source} stdout"),
            String::from_utf8_lossy(&out.stdout),
        );
        self.add(
            format!("{source} stderr"),
            String::from_utf8_lossy(&out.stderr),
        );
    }

    /// Labels and annotations of an object.
    fn add_meta(&mut self, source: &str, meta: &ObjectMeta) {
        let labels = serde_json::to_string(&meta.labels).unwrap_or_default();
        let annotations = serde_json::to_string(&meta.annotations).unwrap_or_default();
        self.add(format!("labels of {source}"), labels);
        self.add(format!("annotations of {source}"), annotations);
    }

    /// `(needle name, source)` of every place a needle was found.
    fn leaks(&self, needles: &[(String, String)]) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for (name, needle) in needles {
            for (source, text) in &self.0 {
                if text.contains(needle.as_str()) {
                    found.push((name.clone(), source.clone()));
                }
            }
        }
        found
    }

    fn total_bytes(&self) -> usize {
        self.0.iter().map(|(_, t)| t.len()).sum()
    }
}

/// A value in the forms it could leak in: raw, base64 (as the API returns Secret data), hex.
fn forms(name: &str, value: &[u8]) -> Vec<(String, String)> {
    let mut out = vec![
        (
            format!("{name} (base64)"),
            base64::engine::general_purpose::STANDARD.encode(value),
        ),
        (
            format!("{name} (hex)"),
            value.iter().map(|b| format!("{b:02x}")).collect(),
        ),
    ];
    if let Ok(text) = std::str::from_utf8(value) {
        out.push((format!("{name} (raw)"), text.to_owned()));
    }
    out
}

async fn kubectl(
    cluster: &ClusterInfo,
    args: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<std::process::Output> {
    cluster.run_kubectl(args, stdin).await
}

fn helmop_yaml(name: &str, dest: &str, secrets: &[&str]) -> String {
    let resources: String = secrets
        .iter()
        .map(|s| format!("  - {{kind: Secret, name: {s}}}\n"))
        .collect();
    format!(
        "apiVersion: fleet.cattle.io/v1alpha1\nkind: HelmOp\nmetadata:\n  name: {name}\nspec:\n  helm:\n    repo: https://charts.example.com\n    chart: app\n    version: 1.0.0\n  defaultNamespace: {dest}\n  downstreamResources:\n{resources}  targets:\n  - clusterSelector: {{matchLabels: {{env: sec}}}}\n"
    )
}

fn deployment(ns: &str, name: &str, secret: &str) -> String {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:1.0",
                    "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}}],
                    "envFrom": [{"secretRef": {"name": secret}}]}]},
            },
        },
    })
    .to_string()
}

/// The `token:` of a kubeconfig written by the control plane.
fn token_of(kubeconfig_yaml: &str) -> anyhow::Result<String> {
    match kubeconfig_yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
    {
        Some(t) => Ok(t.trim().to_owned()),
        None => bail!("no token in kubeconfig"),
    }
}

async fn collect_objects(
    hay: &mut Haystack,
    cluster: &str,
    client: &Client,
    ns: &str,
) -> anyhow::Result<usize> {
    let lp = ListParams::default();
    let mut n = 0;
    for s in Api::<Secret>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
    {
        hay.add_meta(
            &format!(
                "{cluster} Secret {ns}/{}",
                s.meta().name.as_deref().unwrap_or("")
            ),
            &s.metadata,
        );
        n += 1;
    }
    for c in Api::<ConfigMap>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
    {
        hay.add_meta(
            &format!(
                "{cluster} ConfigMap {ns}/{}",
                c.meta().name.as_deref().unwrap_or("")
            ),
            &c.metadata,
        );
    }
    for d in Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
    {
        let name = format!(
            "{cluster} Deployment {ns}/{}",
            d.meta().name.as_deref().unwrap_or("")
        );
        hay.add_meta(&name, &d.metadata);
        if let Some(template) = d.spec.template.metadata.as_ref() {
            hay.add_meta(&format!("pod template of {name}"), template);
        }
        n += 1;
    }
    for r in Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
    {
        hay.add_meta(
            &format!(
                "{cluster} ReplicaSet {ns}/{}",
                r.meta().name.as_deref().unwrap_or("")
            ),
            &r.metadata,
        );
    }
    for e in Api::<Event>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
    {
        hay.add(
            format!(
                "{cluster} Event {ns}/{}",
                e.meta().name.as_deref().unwrap_or("")
            ),
            serde_json::to_string(&e)?,
        );
    }
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_secret_values_appear_in_no_log_output_event_annotation_or_metric()
-> anyhow::Result<()> {
    let cp = control_plane();
    let upstream_info = cp.upstream();
    let upstream = upstream_info.client().await;
    let down1 = cp.cluster(DOWNSTREAM_1).client().await;
    let hash_key = ensure_hash_key(&upstream).await?;
    let down1_hash_key = ensure_hash_key(&down1).await?;
    let ns = fresh_namespace_with_labels(
        &upstream,
        "sec",
        &[("helmop.dev/rollout-on-change", "enabled")],
    )
    .await?;
    let dest = format!("{ns}-dest");
    let canary = format!("canary-{}", random_hex(16)?);
    let rotated = format!("rotated-{}", random_hex(16)?);
    let taken = format!("taken-{}", random_hex(16)?);
    let squatter = format!("squatter-{}", random_hex(16)?);

    create_secret(&upstream, &ns, "db", &[("password", canary.as_bytes())]).await?;
    create_secret(&upstream, &ns, "taken", &[("password", taken.as_bytes())]).await?;
    for name in [DOWNSTREAM_1, DOWNSTREAM_2] {
        register_fleet_cluster(&upstream, &ns, name, &[("env", "sec")], cp.cluster(name)).await?;
    }
    // A same-named Secret downstream that helmop does not own: a Conflict whose content must not be shown either.
    kubectl(
        cp.cluster(DOWNSTREAM_1),
        &["create", "namespace", &dest],
        None,
    )
    .await?;
    create_secret(&down1, &dest, "taken", &[("password", squatter.as_bytes())]).await?;

    let mut hay = Haystack::default();
    let webhook = WebhookBinary::start(
        &upstream_info.kubeconfig,
        "trace",
        &["--log-format", "json"],
    )
    .await?;
    let registered = webhook.register(&upstream, &ns).await?;

    // Denial naming a missing Secret next to the planted one, then admission.
    let out = kubectl(
        upstream_info,
        &["apply", "--validate=false", "-n", &ns, "-f", "-"],
        Some(&helmop_yaml("app", &dest, &["db", "taken", "missing"])),
    )
    .await?;
    assert!(
        !out.status.success(),
        "HelmOp with a missing Secret admitted"
    );
    hay.add_output("kubectl apply (denied HelmOp)", &out);
    let out = kubectl(
        upstream_info,
        &["apply", "--validate=false", "-n", &ns, "-f", "-"],
        Some(&helmop_yaml("app", &dest, &["db", "taken"])),
    )
    .await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    hay.add_output("kubectl apply (HelmOp)", &out);
    // The guard denies deleting the planted Secret (once its HelmOp cache has the HelmOp).
    let denial = wait_for("the guard to deny", DEFAULT_TIMEOUT, || async {
        let out = kubectl(
            upstream_info,
            &["delete", "-n", &ns, "secret/db", "--dry-run=server"],
            None,
        )
        .await?;
        Ok((!out.status.success()).then_some(out))
    })
    .await?;
    hay.add_output("kubectl delete (guarded)", &denial);
    let out = kubectl(upstream_info, &["delete", "-n", &ns, "secret/db"], None).await?;
    assert!(!out.status.success());
    hay.add_output("kubectl delete", &out);
    // A workload reading the planted Secret is stamped; one reading a missing Secret gets a warning.
    let out = kubectl(
        upstream_info,
        &["apply", "-f", "-"],
        Some(&deployment(&ns, "web", "db")),
    )
    .await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    hay.add_output("kubectl apply (stamped Deployment)", &out);
    let out = kubectl(
        upstream_info,
        &["apply", "-f", "-"],
        Some(&deployment(&ns, "broken", "absent")),
    )
    .await?;
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Warning"),
        "{out:?}"
    );
    hay.add_output("kubectl apply (warned Deployment)", &out);
    let web: Deployment = Api::namespaced(upstream.clone(), &ns).get("web").await?;
    let stamped = web
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .is_some_and(|a| a.contains_key("helmop.dev/config-hash"));
    assert!(
        stamped,
        "the workload was not stamped, the test would prove little"
    );
    // A malformed review carrying the value in a wrongly typed field: the 400 reason must not quote it.
    let mut bad = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Secret"},
        "resource": {"group": "", "version": "v1", "resource": "secrets"}, "operation": "DELETE",
        "userInfo": {}, "name": {"nested": canary}}});
    let (status, body) = webhook.post("/validate/references", &bad).await?;
    assert_eq!(status, 400, "{body}");
    hay.add("webhook 400 response", body.to_string());
    bad["request"]["operation"] = json!(canary);
    let (status, body) = webhook.post("/validate/references", &bad).await?;
    assert_eq!(status, 400, "{body}");
    hay.add("webhook 400 response (operation)", body.to_string());

    // The plugin at trace level: propagate (a Conflict on down1), status, a source change (Stale), propagate,
    // prune after an entry is dropped.
    let kubeconfig = upstream_info.kubeconfig.display().to_string();
    let env = [("HELMOP_LOG", "trace"), ("RUST_LOG", "trace")];
    let plugin = |args: Vec<&str>| {
        let mut full = args;
        full.extend(["--kubeconfig", kubeconfig.as_str()]);
        let full: Vec<String> = full.into_iter().map(str::to_owned).collect();
        async move {
            let refs: Vec<&str> = full.iter().map(String::as_str).collect();
            run_plugin(&refs, &env, Duration::from_secs(180)).await
        }
    };
    for args in [
        vec!["propagate", "app", "-n", &ns, "-o", "json"],
        vec!["propagate", "app", "-n", &ns, "-o", "wide"],
        vec!["status", "app", "-n", &ns, "-o", "yaml"],
    ] {
        let name = args.join(" ");
        let out = plugin(args).await?;
        assert!(!out.stdout.is_empty(), "{name}: no output");
        hay.add_output(&format!("kubectl-helmop {name}"), &out);
    }
    let patch = Secret {
        data: Some(
            [(
                "password".to_owned(),
                ByteString(rotated.as_bytes().to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(upstream.clone(), &ns)
        .patch("db", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    for args in [
        vec!["status", "app", "-n", &ns, "-o", "json"],
        vec!["propagate", "app", "-n", &ns, "--dry-run", "-o", "json"],
        vec!["propagate", "app", "-n", &ns, "-o", "json"],
        vec!["status", "app", "-n", &ns, "-o", "wide"],
    ] {
        let name = args.join(" ");
        let out = plugin(args).await?;
        hay.add_output(&format!("kubectl-helmop {name}"), &out);
    }
    let out = kubectl(
        upstream_info,
        &["apply", "--validate=false", "-n", &ns, "-f", "-"],
        Some(&helmop_yaml("app", &dest, &["db"])),
    )
    .await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for args in [
        vec!["prune", "-n", &ns, "--dry-run", "-o", "json"],
        vec!["prune", "-n", &ns, "-o", "json"],
        vec!["status", "-n", &ns],
    ] {
        let name = args.join(" ");
        let out = plugin(args).await?;
        hay.add_output(&format!("kubectl-helmop {name}"), &out);
    }
    // The copy of the planted Secret really went downstream (so its annotations are part of the check).
    let copy = Api::<Secret>::namespaced(down1.clone(), &dest)
        .get_opt("db")
        .await?;
    assert!(copy.is_some(), "db was not propagated to down1");

    // Everything that was stored or exported.
    hay.add("webhook logs", webhook.logs());
    hay.add("webhook metrics", webhook.metrics().await?);
    let workloads = collect_objects(&mut hay, "upstream", &upstream, &ns).await?;
    assert!(workloads >= 2);
    for name in [DOWNSTREAM_1, DOWNSTREAM_2] {
        let client = cp.cluster(name).client().await;
        collect_objects(&mut hay, name, &client, &dest).await?;
    }
    registered.remove().await?;
    let logs = webhook.logs();
    assert!(
        logs.lines().count() > 20,
        "the webhook logged almost nothing at trace:\n{logs}"
    );

    let mut needles = Vec::new();
    needles.extend(forms("planted Secret value", canary.as_bytes()));
    needles.extend(forms("rotated Secret value", rotated.as_bytes()));
    needles.extend(forms("conflicting source value", taken.as_bytes()));
    needles.extend(forms("unowned downstream value", squatter.as_bytes()));
    needles.extend(forms("hash key", &hash_key));
    needles.extend(forms("down1 hash key", &down1_hash_key));
    for name in [UPSTREAM, DOWNSTREAM_1, DOWNSTREAM_2] {
        let token = token_of(&cp.cluster(name).kubeconfig_yaml())?;
        needles.extend(forms(&format!("{name} API token"), token.as_bytes()));
    }
    let leaks = hay.leaks(&needles);
    eprintln!(
        "searched {} texts, {} bytes, for {} needles",
        hay.0.len(),
        hay.total_bytes(),
        needles.len()
    );
    assert!(
        leaks.is_empty(),
        "secret values found ({} bytes searched):\n{}",
        hay.total_bytes(),
        leaks
            .iter()
            .map(|(what, where_)| format!("  {what} in {where_}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}
