//! Status churn the way a running Fleet writes it upstream: every Cluster's agent checks in
//! (`status.agent.lastSeen`, Fleet's agent `clusterstatus` ticker) and the HelmOp controller rewrites
//! each HelmOp's status (`status.display`, `status.conditions`). None of it changes what a plan reads, so
//! a `propagate --watch` that starts a run for it wastes a core at fleet scale; the watch benchmark keeps
//! this churn on while it measures.
//!
//! Writes go through the status subresource, spread evenly over the interval (a fleet's check-ins are not
//! synchronised), and every write changes a value so the API server really bumps `resourceVersion` and
//! sends a watch event.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the churn writes and how often.
#[derive(Debug, Clone)]
pub struct ChurnSettings {
    /// Upstream namespace of the Clusters and HelmOps.
    pub namespace: String,
    pub clusters: Vec<String>,
    pub helmops: Vec<String>,
    /// Each Cluster checks in once per interval; each HelmOp's status is rewritten once per interval.
    pub interval: Duration,
}

/// Churn running in the background until [`Churn::stop`].
pub struct Churn {
    stop: watch::Sender<bool>,
    task: JoinHandle<anyhow::Result<()>>,
    writes: Arc<AtomicU64>,
}

fn fleet_api(client: &Client, namespace: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("fleet.cattle.io", "v1alpha1", kind);
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk))
}

/// One status write: what the object is and the merge patch of its status.
fn status_patch(kind: &str, tick: u64, now: &serde_json::Value) -> serde_json::Value {
    match kind {
        "Cluster" => json!({"status": {"agent": {"lastSeen": now}}}),
        _ => json!({"status": {
            "display": {"message": format!("checked {tick}")},
            "lastPollingTriggered": now,
        }}),
    }
}

impl Churn {
    /// Starts writing; the first writes go out within one step (interval / number of objects).
    pub fn start(client: Client, settings: ChurnSettings) -> Churn {
        let (stop, mut stopped) = watch::channel(false);
        let writes = Arc::new(AtomicU64::new(0));
        let counter = writes.clone();
        let task = tokio::spawn(async move {
            let clusters = fleet_api(&client, &settings.namespace, "Cluster");
            let helmops = fleet_api(&client, &settings.namespace, "HelmOp");
            let objects: Vec<(&Api<DynamicObject>, &str, &str)> = settings
                .clusters
                .iter()
                .map(|n| (&clusters, "Cluster", n.as_str()))
                .chain(
                    settings
                        .helmops
                        .iter()
                        .map(|n| (&helmops, "HelmOp", n.as_str())),
                )
                .collect();
            if objects.is_empty() {
                return Ok(());
            }
            let step = settings.interval / u32::try_from(objects.len()).unwrap_or(u32::MAX);
            let mut ticker = tokio::time::interval(step.max(Duration::from_micros(100)));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut tick = 0u64;
            loop {
                tokio::select! {
                    _ = stopped.changed() => return Ok(()),
                    _ = ticker.tick() => {}
                }
                let (api, kind, name) = objects[(tick % objects.len() as u64) as usize];
                // The tick keeps two HelmOp writes within one second distinct (a no-op patch sends no
                // watch event); a Cluster checks in at most once per interval, seconds apart.
                let at = now();
                api.patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(status_patch(kind, tick, &at)),
                )
                .await
                .map_err(|e| anyhow::anyhow!("status churn: {kind} {name}: {e}"))?;
                counter.fetch_add(1, Ordering::Relaxed);
                tick += 1;
            }
        });
        Churn { stop, task, writes }
    }

    /// Status writes so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Stops the writes; an error any write met is returned here.
    pub async fn stop(self) -> anyhow::Result<u64> {
        let _ = self.stop.send(true);
        self.task
            .await
            .map_err(|e| anyhow::anyhow!("status churn task: {e}"))??;
        Ok(self.writes.load(Ordering::Relaxed))
    }
}

/// The current time as `metav1.Time` serialises it (RFC 3339, UTC, whole seconds).
fn now() -> serde_json::Value {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    serde_json::to_value(Time(k8s_openapi::jiff::Timestamp::now())).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_check_ins_touch_only_the_agents_last_seen() {
        let t = json!("2026-12-04T08:00:00Z");
        let p = status_patch("Cluster", 3, &t);
        assert_eq!(
            p,
            json!({"status": {"agent": {"lastSeen": "2026-12-04T08:00:00Z"}}})
        );
    }

    #[test]
    fn helmop_writes_differ_from_tick_to_tick() {
        let t = json!("2026-12-04T08:00:00Z");
        let a = status_patch("HelmOp", 1, &t);
        let b = status_patch("HelmOp", 2, &t);
        assert_ne!(a, b);
        assert!(a.pointer("/status/display/message").is_some());
        assert!(a.get("spec").is_none() && a.get("metadata").is_none());
    }
}
