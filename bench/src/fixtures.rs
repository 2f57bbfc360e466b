//! The cluster side of the benchmarks: a private control plane and the objects the scenarios read.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use helmop_tests::{ClusterInfo, ControlPlane};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// Namespace of the webhook scenarios.
pub const NAMESPACE: &str = "bench";
/// Name of the 1 MiB ConfigMap and the three Secrets the Deployment reads.
pub const BIG_CONFIG_MAP: &str = "big";
pub const SECRETS: [&str; 3] = ["db", "api", "tls"];

/// A private control plane (torn down on drop) and a client for its first cluster.
pub struct Cluster {
    pub cp: ControlPlane,
    pub client: Client,
}

impl Cluster {
    pub fn info(&self) -> &ClusterInfo {
        &self.cp.clusters[0]
    }

    /// The pid of a component the harness started for cluster `name`, from its pid file
    /// (`DIR/NAME/COMPONENT.pid`: `etcd`, `apiserver`, `controller-manager`), checked to still run
    /// `executable` (so a recycled pid is never taken for it).
    pub fn component_pid(
        &self,
        name: &str,
        component: &str,
        executable: &str,
    ) -> anyhow::Result<u32> {
        let pid_file = self.cp.dir.join(name).join(format!("{component}.pid"));
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("reading {}", pid_file.display()))?
            .trim()
            .parse()
            .with_context(|| format!("{} holds no pid", pid_file.display()))?;
        if !runs(pid, executable) {
            anyhow::bail!("pid {pid} of {} is not a {executable}", pid_file.display());
        }
        Ok(pid)
    }
}

/// Whether process `pid` runs the executable named `executable`.
fn runs(pid: u32, executable: &str) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .is_some_and(|e| e.file_name().is_some_and(|f| f == executable))
}

/// Starts a control plane with the given cluster names (about 20-60 s).
pub async fn start(names: &[&str]) -> anyhow::Result<Cluster> {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let cp = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        ControlPlane::start(&refs)
    })
    .await??;
    let client = cp.clusters[0].client().await;
    Ok(Cluster { cp, client })
}

fn meta(namespace: Option<&str>, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: (!labels.is_empty()).then(|| {
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        }),
        ..Default::default()
    }
}

pub async fn create_namespace(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<()> {
    let ns = Namespace {
        metadata: meta(None, name, labels),
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

pub fn secret(namespace: &str, name: &str, data: BTreeMap<String, Vec<u8>>) -> Secret {
    Secret {
        metadata: meta(Some(namespace), name, &[]),
        type_: Some("Opaque".to_owned()),
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect()),
        ..Default::default()
    }
}

pub fn config_map(namespace: &str, name: &str, data: BTreeMap<String, String>) -> ConfigMap {
    ConfigMap {
        metadata: meta(Some(namespace), name, &[]),
        data: Some(data),
        ..Default::default()
    }
}

/// The hash-key Secret the webhook reads (`helmop-system/helmop-hash-key`, 32 bytes under `key`).
pub async fn create_hash_key(client: &Client) -> anyhow::Result<()> {
    create_namespace(client, "helmop-system", &[]).await?;
    let key: Vec<u8> = (0..32u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    let s = secret(
        "helmop-system",
        "helmop-hash-key",
        BTreeMap::from([("key".to_owned(), key)]),
    );
    Api::<Secret>::namespaced(client.clone(), "helmop-system")
        .create(&PostParams::default(), &s)
        .await
        .context("creating the hash key Secret")?;
    Ok(())
}

/// Namespace `bench` (opted in to stamping), the 1 MiB ConfigMap and the three Secrets.
pub async fn create_scenario_objects(client: &Client) -> anyhow::Result<()> {
    create_namespace(
        client,
        NAMESPACE,
        &[(helmop_core::names::LABEL_ROLLOUT_ON_CHANGE, "enabled")],
    )
    .await?;
    let big = "x".repeat(1 << 20);
    Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .create(
            &PostParams::default(),
            &config_map(
                NAMESPACE,
                BIG_CONFIG_MAP,
                BTreeMap::from([("payload".to_owned(), big)]),
            ),
        )
        .await
        .context("creating the 1 MiB ConfigMap")?;
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    for name in SECRETS {
        let data = BTreeMap::from([
            ("username".to_owned(), b"bench".to_vec()),
            (
                "password".to_owned(),
                format!("{name}-password-0123456789").into_bytes(),
            ),
        ]);
        secrets
            .create(&PostParams::default(), &secret(NAMESPACE, name, data))
            .await
            .with_context(|| format!("creating Secret {NAMESPACE}/{name}"))?;
    }
    Ok(())
}

/// Name of the `i`-th small Secret the mutate-versus-GET scenarios read.
pub fn ref_secret(i: usize) -> String {
    format!("ref-{i}")
}

/// `n` small Secrets `ref-0` .. in the scenario namespace.
pub async fn create_ref_secrets(client: &Client, n: usize) -> anyhow::Result<()> {
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    for i in 0..n {
        let name = ref_secret(i);
        let data = BTreeMap::from([(
            "token".to_owned(),
            format!("{name}-0123456789").into_bytes(),
        )]);
        secrets
            .create(&PostParams::default(), &secret(NAMESPACE, &name, data))
            .await
            .with_context(|| format!("creating Secret {NAMESPACE}/{name}"))?;
    }
    Ok(())
}

/// Creates `per_kind` Secrets and as many ConfigMaps spread over `namespaces` namespaces, `parallel`
/// requests at a time. Returns the time it took.
pub async fn create_many(
    client: &Client,
    per_kind: usize,
    namespaces: usize,
    parallel: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let namespaces = namespaces.max(1);
    for n in 0..namespaces {
        create_namespace(client, &format!("mem-{n}"), &[]).await?;
    }
    let value = "v".repeat(256);
    futures::stream::iter(0..per_kind * 2)
        .map(|i| {
            let client = client.clone();
            let value = value.clone();
            async move {
                let ns = format!("mem-{}", i % namespaces);
                let name = format!("obj-{}", i / 2);
                if i % 2 == 0 {
                    let s = secret(
                        &ns,
                        &name,
                        BTreeMap::from([("value".to_owned(), value.into_bytes())]),
                    );
                    Api::<Secret>::namespaced(client, &ns)
                        .create(&PostParams::default(), &s)
                        .await
                        .map(|_| ())
                } else {
                    let c = config_map(&ns, &name, BTreeMap::from([("value".to_owned(), value)]));
                    Api::<ConfigMap>::namespaced(client, &ns)
                        .create(&PostParams::default(), &c)
                        .await
                        .map(|_| ())
                }
            }
        })
        .buffer_unordered(parallel.max(1))
        .try_for_each(|()| async { Ok(()) })
        .await
        .context("creating Secrets and ConfigMaps")?;
    Ok(started.elapsed())
}

/// Fails with a hint when the release plugin binary a benchmark drives is missing.
pub fn require_plugin(plugin_bin: &std::path::Path) -> anyhow::Result<()> {
    if !plugin_bin.is_file() {
        anyhow::bail!(
            "{} not found: build it first with `cargo build --release -p kubectl-helmop`",
            plugin_bin.display()
        );
    }
    Ok(())
}

/// A private control plane of an upstream and `apiservers` (at least 1) downstream API servers.
pub async fn start_with_downstreams(apiservers: usize) -> anyhow::Result<Cluster> {
    let mut names = vec!["upstream".to_owned()];
    names.extend((1..=apiservers.max(1)).map(|i| format!("down{i}")));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    eprintln!(
        "starting a private control plane with {} API servers ...",
        refs.len()
    );
    start(&refs).await
}

/// `resources` sources `res-N` in `namespace` upstream, alternating a Secret (1 KiB) and a
/// ConfigMap whose `value` is `config_value`; the `downstreamResources` entries naming them.
pub async fn create_sources(
    upstream: &Client,
    namespace: &str,
    resources: usize,
    config_value: &str,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut entries = Vec::new();
    for r in 0..resources {
        let name = format!("res-{r}");
        if r % 2 == 0 {
            let data = BTreeMap::from([("value".to_owned(), vec![b's'; 1024])]);
            Api::namespaced(upstream.clone(), namespace)
                .create(&PostParams::default(), &secret(namespace, &name, data))
                .await?;
            entries.push(serde_json::json!({"kind": "Secret", "name": name}));
        } else {
            let data = BTreeMap::from([("value".to_owned(), config_value.to_owned())]);
            Api::namespaced(upstream.clone(), namespace)
                .create(&PostParams::default(), &config_map(namespace, &name, data))
                .await?;
            entries.push(serde_json::json!({"kind": "ConfigMap", "name": name}));
        }
    }
    Ok(entries)
}

/// One `kubectl-helmop propagate -n NAMESPACE -o json` against `kubeconfig`, timed.
pub async fn timed_propagate(
    plugin_bin: &std::path::Path,
    kubeconfig: &std::path::Path,
    namespace: &str,
    concurrency: usize,
) -> anyhow::Result<(std::process::Output, Duration)> {
    let started = Instant::now();
    let output = tokio::process::Command::new(plugin_bin)
        .args(["propagate", "-n", namespace, "-o", "json", "--concurrency"])
        .arg(concurrency.to_string())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {}", plugin_bin.display()))?;
    Ok((output, started.elapsed()))
}

/// The name of the HelmOp [`apply_app_helmop`] writes.
pub const APP_HELMOP: &str = "app";

/// HelmOp `app` in `namespace` upstream: a fixed chart, `entries` as its downstream resources and
/// `targets` as its targets (JSON, as the scenarios build them).
pub async fn apply_app_helmop(
    upstream: &Client,
    namespace: &str,
    entries: &[serde_json::Value],
    targets: &[serde_json::Value],
) -> anyhow::Result<()> {
    apply_chart_helmop(upstream, namespace, APP_HELMOP, &[], entries, targets).await
}

/// HelmOp `name` with `labels` in `namespace` upstream, otherwise as [`apply_app_helmop`] writes it
/// (e.g. one shard's HelmOp, labelled `fleet.cattle.io/shard-ref`).
pub async fn apply_chart_helmop(
    upstream: &Client,
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    entries: &[serde_json::Value],
    targets: &[serde_json::Value],
) -> anyhow::Result<()> {
    let mut metadata = serde_json::json!({"name": name});
    if !labels.is_empty() {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        metadata["labels"] = serde_json::Value::Object(labels);
    }
    let helmop = serde_json::json!({
        "metadata": metadata,
        "spec": {
            "helm": {"repo": "https://charts.example.com/stable", "chart": "app", "version": "1.2.3"},
            "downstreamResources": entries,
            "targets": targets,
        },
    });
    helmop_tests::apply_helmop(upstream, namespace, &helmop.to_string()).await?;
    Ok(())
}
