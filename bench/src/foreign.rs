//! `helmop-bench foreign`: peak memory of one `kubectl-helmop propagate -A` (the built binary,
//! `VmHWM` polled from `/proc/PID/status`) while a tenant namespace downstream holds N ConfigMaps
//! of K KiB that carry helmop's `managed-by` label but belong to another upstream. Those objects
//! are none of this run's business: its peak must stay flat in N (docs/performance.md). With
//! `--baseline-bin` an earlier build runs side by side on the same objects.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use helmop_tests::register_fleet_cluster;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::fixtures;
use crate::machine::hwm_kib;
use crate::stats::mib;

#[derive(Debug, Clone)]
pub struct ForeignSettings {
    pub plugin_bin: PathBuf,
    pub baseline_bin: Option<PathBuf>,
    /// Foreign labelled ConfigMaps present, one measurement per value (ascending).
    pub objects: Vec<usize>,
    /// Size of each foreign ConfigMap's data.
    pub object_kib: usize,
    /// Sources the HelmOp copies (this upstream's own copies).
    pub resources: usize,
}

/// One measurement: N foreign objects, one binary.
#[derive(Debug, Clone)]
pub struct Sample {
    pub objects: usize,
    pub binary: &'static str,
    pub peak_kib: u64,
    pub wall: Duration,
    pub exit_code: i32,
}

const UPSTREAM_NS: &str = "bench-foreign";
const TENANT_NS: &str = "tenant";

pub async fn run(settings: &ForeignSettings) -> anyhow::Result<Vec<Sample>> {
    fixtures::require_plugin(&settings.plugin_bin)?;
    if let Some(b) = &settings.baseline_bin {
        fixtures::require_plugin(b)?;
    }
    let cluster = fixtures::start_with_downstreams(1).await?;
    let upstream = cluster.client.clone();
    let down = cluster.cp.clusters[1].clone();
    let down_client = down.client().await;
    fixtures::create_namespace(&upstream, UPSTREAM_NS, &[]).await?;
    let entries = fixtures::create_sources(&upstream, UPSTREAM_NS, settings.resources, "c").await?;
    register_fleet_cluster(&upstream, UPSTREAM_NS, "c0", &[], &down).await?;
    let targets = [json!({"clusterName": "c0", "namespace": "apps"})];
    fixtures::apply_app_helmop(&upstream, UPSTREAM_NS, &entries, &targets).await?;
    fixtures::create_namespace(&down_client, TENANT_NS, &[]).await?;
    let kubeconfig = cluster.info().kubeconfig.clone();
    // The copies exist before the first measurement: every measured run is an unchanged one.
    let (code, _, _) = measure(&settings.plugin_bin, &kubeconfig).await?;
    if code != 0 {
        bail!("the first propagate exited {code}");
    }
    let mut created = 0;
    let mut samples = Vec::new();
    let mut objects = settings.objects.clone();
    objects.sort_unstable();
    for n in objects {
        eprintln!(
            "foreign: {n} labelled ConfigMaps of {} KiB ...",
            settings.object_kib
        );
        create_foreign(&down_client, created, n, settings.object_kib).await?;
        created = created.max(n);
        let mut binaries = vec![("this build", settings.plugin_bin.as_path())];
        if let Some(b) = &settings.baseline_bin {
            binaries.push(("baseline", b.as_path()));
        }
        for (binary, path) in binaries {
            let (exit_code, peak_kib, wall) = measure(path, &kubeconfig).await?;
            samples.push(Sample {
                objects: n,
                binary,
                peak_kib,
                wall,
                exit_code,
            });
        }
    }
    Ok(samples)
}

/// ConfigMaps `foreign-FROM..foreign-TO` in the tenant namespace: helmop's label, another
/// upstream's markers, `kib` KiB of data each.
async fn create_foreign(client: &Client, from: usize, to: usize, kib: usize) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), TENANT_NS);
    let value = "x".repeat(kib * 1024);
    for i in from..to {
        let name = format!("foreign-{i}");
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(TENANT_NS.into()),
                labels: Some(BTreeMap::from([(
                    "helmop.dev/managed-by".to_string(),
                    "kubectl-helmop".to_string(),
                )])),
                annotations: Some(BTreeMap::from([
                    (
                        "helmop.dev/owners".to_string(),
                        "up-other/t/app".to_string(),
                    ),
                    (
                        "helmop.dev/source".to_string(),
                        format!("up-other/t/ConfigMap/{name}"),
                    ),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([("value".to_string(), value.clone())])),
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &cm)
            .await
            .with_context(|| format!("creating ConfigMap {TENANT_NS}/{name}"))?;
    }
    Ok(())
}

/// Runs `propagate -A` once: exit code, peak RSS (KiB), wall time.
async fn measure(bin: &Path, kubeconfig: &Path) -> anyhow::Result<(i32, u64, Duration)> {
    let started = Instant::now();
    let mut child = tokio::process::Command::new(bin)
        .args(["propagate", "-A", "-o", "json", "--kubeconfig"])
        .arg(kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {}", bin.display()))?;
    let pid = child.id().map(|p| p.to_string()).unwrap_or_default();
    let mut peak = 0;
    let status = loop {
        if let Some(hwm) = hwm_kib(&pid) {
            peak = peak.max(hwm);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    Ok((status.code().unwrap_or(-1), peak, started.elapsed()))
}

/// A markdown table: peak per N and binary, and its ratio to the same binary at the smallest N.
pub fn table(samples: &[Sample], settings: &ForeignSettings) -> String {
    let mut out = format!(
        "Peak RSS of `propagate -A` ({} own copies) with N foreign labelled ConfigMaps of {} KiB \
         in one tenant namespace; {}\n\n| N | binary | peak RSS MiB | vs N={} | wall | exit |\n|---|---|---|---|---|---|\n",
        settings.resources,
        settings.object_kib,
        crate::machine::describe(),
        samples.first().map_or(0, |s| s.objects),
    );
    for s in samples {
        let base = samples
            .iter()
            .find(|b| b.binary == s.binary)
            .map_or(s.peak_kib, |b| b.peak_kib)
            .max(1);
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.2} s | {} |\n",
            s.objects,
            s.binary,
            mib(s.peak_kib),
            s.peak_kib as f64 / base as f64,
            s.wall.as_secs_f64(),
            s.exit_code
        ));
    }
    out
}
