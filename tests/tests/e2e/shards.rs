//! `propagate --watch --shard-id` end to end, with the real binary against the shared control plane:
//! three watchers (shards `a` and `b`, and the unsharded one) each copy only their own HelmOps and
//! lead on their own Lease; a copy two shards share survives one of them letting go; killing one
//! shard's leader leaves the other shards' work alone; a HelmOp relabelled to another shard moves
//! without a gap or a deletion. A watch on the downstream cluster sees every version of every copy
//! all along, so "never deleted" and "never without its owner" are checked on each write, not
//! sampled.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use helmop_core::names::{ANN_OWNERS, FLEET_SHARD_REF_LABEL};
use helmop_tests::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{Value, json};

/// Short, so a killed leader's successor is quick to observe; long enough for a loaded machine.
const LEASE_FLAG: &str = "5s";
/// The longest a change may take to reach the downstream cluster with four watchers running.
const BOUND: Duration = Duration::from_secs(20);

/// One version of a downstream copy as the watch saw it.
#[derive(Clone, Debug)]
enum Seen {
    Version { name: String, owners: String },
    Deleted { name: String },
}

/// Every version of every Secret in `ns` on `DOWNSTREAM_1`, from now until dropped.
struct Downstream {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Downstream {
    async fn watch(ns: &str) -> Downstream {
        let client = control_plane().cluster(DOWNSTREAM_1).client().await;
        let api: Api<Secret> = Api::namespaced(client, ns);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let out = seen.clone();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Some(event) = events.next().await {
                let entry = match event {
                    Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => Seen::Version {
                        name: s.metadata.name.clone().unwrap_or_default(),
                        owners: s
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(ANN_OWNERS))
                            .cloned()
                            .unwrap_or_default(),
                    },
                    Ok(watcher::Event::Delete(s)) => Seen::Deleted {
                        name: s.metadata.name.clone().unwrap_or_default(),
                    },
                    _ => continue,
                };
                if let Ok(mut seen) = out.lock() {
                    seen.push(entry);
                }
            }
        });
        Downstream { seen, task }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// `name` was never deleted.
    fn never_deleted(&self, name: &str) {
        let seen = self.seen();
        assert!(
            !seen
                .iter()
                .any(|s| matches!(s, Seen::Deleted { name: n } if n == name)),
            "{name} was deleted downstream: {seen:?}"
        );
    }

    /// Once `name` listed `owner` among its owners, every later version did too.
    fn never_dropped(&self, name: &str, owner: &str) {
        let seen = self.seen();
        let versions: Vec<&str> = seen
            .iter()
            .filter_map(|s| match s {
                Seen::Version { name: n, owners } if n == name => Some(owners.as_str()),
                _ => None,
            })
            .collect();
        let first = versions.iter().position(|o| has_owner(o, owner));
        assert!(first.is_some(), "{name} never listed {owner}: {versions:?}");
        for o in versions.iter().skip(first.unwrap_or_default()) {
            assert!(has_owner(o, owner), "{name} lost {owner}: {versions:?}");
        }
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether an owners annotation lists the HelmOp `namespace/name` (of any upstream id).
fn has_owner(owners: &str, key: &str) -> bool {
    owners.split(',').any(|o| o.ends_with(&format!("/{key}")))
}

struct Fixture {
    ns: String,
    upstream: Client,
    kubeconfig: String,
}

impl Fixture {
    /// A HelmOp `name` copying `resources` (Secrets) to the namespace of the same name on
    /// `DOWNSTREAM_1`, in `shard` (`None`: unlabelled).
    async fn helmop(
        &self,
        name: &str,
        shard: Option<&str>,
        resources: &[&str],
    ) -> anyhow::Result<()> {
        let labels: BTreeMap<&str, &str> = shard
            .map(|s| (FLEET_SHARD_REF_LABEL, s))
            .into_iter()
            .collect();
        let resources: Vec<(&str, &str)> = resources.iter().map(|r| ("Secret", *r)).collect();
        let mut doc = copying_helmop(name, &self.ns, &resources, ("helmop-test", &self.ns));
        doc["metadata"]["labels"] = json!(labels);
        apply_helmop(&self.upstream, &self.ns, &doc.to_string()).await?;
        Ok(())
    }

    async fn set_source(&self, name: &str, value: &str) -> anyhow::Result<()> {
        Api::<Secret>::namespaced(self.upstream.clone(), &self.ns)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"stringData": {"value": value}})),
            )
            .await
            .with_context(|| format!("updating source {name}"))?;
        Ok(())
    }

    /// `propagate -n NS --watch` of `shard` (`None`: the unsharded HelmOps), on the Lease its
    /// scope and shard derive (in the test's namespace).
    fn watcher(&self, shard: Option<&str>) -> anyhow::Result<PluginProcess> {
        let mut args = vec![
            "propagate",
            "-n",
            &self.ns,
            "--watch",
            "--kubeconfig",
            &self.kubeconfig,
            "--lease-namespace",
            &self.ns,
            "--lease-duration",
            LEASE_FLAG,
            "--debounce",
            "200ms",
            "-o",
            "json",
        ];
        if let Some(id) = shard {
            args.extend(["--shard-id", id]);
        }
        PluginProcess::spawn(&args, &[("HELMOP_LOG", "info")])
    }

    async fn copy(&self, name: &str) -> anyhow::Result<Option<(String, String)>> {
        let client = control_plane().cluster(DOWNSTREAM_1).client().await;
        let secret = Api::<Secret>::namespaced(client, &self.ns)
            .get_opt(name)
            .await?;
        Ok(secret.map(|s| {
            let value = s
                .data
                .and_then(|d| d.get("value").cloned())
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .unwrap_or_default();
            let owners = s
                .metadata
                .annotations
                .and_then(|a| a.get(ANN_OWNERS).cloned())
                .unwrap_or_default();
            (value, owners)
        }))
    }

    /// Waits until copy `name` reads `value` and its owners are exactly the HelmOps `owners`.
    async fn wait_copy(&self, name: &str, value: &str, owners: &[&str]) -> anyhow::Result<()> {
        let want: Vec<String> = owners.iter().map(|o| format!("{}/{o}", self.ns)).collect();
        wait_until(
            &format!("copy {name} to read {value:?}, owned by {want:?}"),
            BOUND,
            || async {
                Ok(self.copy(name).await?.is_some_and(|(v, o)| {
                    let listed = o.split(',').filter(|x| !x.is_empty()).count();
                    v == value && listed == want.len() && want.iter().all(|w| has_owner(&o, w))
                }))
            },
        )
        .await
    }

    async fn holder(&self, lease: &str) -> anyhow::Result<Option<String>> {
        Ok(Api::<Lease>::namespaced(self.upstream.clone(), &self.ns)
            .get_opt(lease)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity))
    }
}

/// The HelmOps (`namespace/name`) the rows of a watcher's runs were about.
fn helmops_run(p: &PluginProcess) -> Vec<String> {
    let mut out: Vec<String> = p
        .events_named("run")
        .iter()
        .flat_map(|e| e["report"]["rows"].as_array().cloned().unwrap_or_default())
        .flat_map(|r| r["helmops"].as_array().cloned().unwrap_or_default())
        .filter_map(|h| h.as_str().map(str::to_owned))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The Lease a watcher said it elects on, and its identity, once it leads.
async fn leads(p: &mut PluginProcess, what: &str) -> anyhow::Result<(String, String)> {
    let e = p
        .wait_event(what, BOUND, 0, |e| {
            e["event"] == "leader" && e["leading"] == true
        })
        .await?;
    Ok((
        e["lease"].as_str().context("lease")?.to_owned(),
        e["identity"].as_str().context("identity")?.to_owned(),
    ))
}

#[tokio::test]
async fn shards_split_the_helmops_and_hand_them_over_without_a_gap() -> anyhow::Result<()> {
    let cp = control_plane();
    let upstream = cp.upstream().client().await;
    let ns = fresh_namespace(&upstream, "shards").await?;
    let f = Fixture {
        ns: ns.clone(),
        upstream: upstream.clone(),
        kubeconfig: cp.upstream().kubeconfig.display().to_string(),
    };
    for (name, value) in [
        ("db", "one"),
        ("only-a", "a1"),
        ("only-b", "b1"),
        ("plain", "p1"),
    ] {
        create_secret(&upstream, &ns, name, &[("value", value.as_bytes())]).await?;
    }
    register_fleet_cluster(
        &upstream,
        &ns,
        DOWNSTREAM_1,
        &[("helmop-test", &ns)],
        cp.cluster(DOWNSTREAM_1),
    )
    .await?;
    f.helmop("app-a", Some("a"), &["db", "only-a"]).await?;
    f.helmop("app-b", Some("b"), &["db", "only-b"]).await?;
    f.helmop("app-plain", None, &["plain"]).await?;
    let down = Downstream::watch(&ns).await;

    // Each shard leads on its own Lease and copies only its own HelmOps; the shared copy lists both.
    let mut a = f.watcher(Some("a"))?;
    let mut b = f.watcher(Some("b"))?;
    let mut plain = f.watcher(None)?;
    let (lease_a, id_a) = leads(&mut a, "shard a to lead").await?;
    let (lease_b, id_b) = leads(&mut b, "shard b to lead").await?;
    let (lease_plain, _) = leads(&mut plain, "the unsharded watcher to lead").await?;
    assert_eq!(
        lease_a,
        format!("{ns}/kubectl-helmop-propagate-ns-{ns}-shard-a")
    );
    assert_eq!(
        lease_b,
        format!("{ns}/kubectl-helmop-propagate-ns-{ns}-shard-b")
    );
    assert_eq!(
        lease_plain,
        format!("{ns}/kubectl-helmop-propagate-ns-{ns}")
    );
    f.wait_copy("db", "one", &["app-a", "app-b"]).await?;
    f.wait_copy("only-a", "a1", &["app-a"]).await?;
    f.wait_copy("only-b", "b1", &["app-b"]).await?;
    f.wait_copy("plain", "p1", &["app-plain"]).await?;
    // A run's event comes when the run has ended, which may be after its copies landed.
    for p in [&mut a, &mut b, &mut plain] {
        p.wait_event("a first run", BOUND, 0, |e| e["event"] == "run")
            .await?;
    }
    for (p, own) in [(&a, "app-a"), (&b, "app-b"), (&plain, "app-plain")] {
        assert_eq!(
            helmops_run(p),
            [format!("{ns}/{own}")],
            "a watcher ran another shard's HelmOp: {}",
            p.context()
        );
    }
    for p in [&a, &b, &plain] {
        let started = &p.events_named("started")[0];
        assert!(
            started["scope"]
                .as_str()
                .is_some_and(|s| s.contains(FLEET_SHARD_REF_LABEL)),
            "{started}"
        );
    }

    // Killing shard a's leader (no release) leaves shard b and the unsharded HelmOps served, and
    // shard a's copies where they are.
    a.signal(libc::SIGKILL)?;
    a.wait_exit(Duration::from_secs(10)).await?;
    f.set_source("only-b", "b2").await?;
    f.set_source("plain", "p2").await?;
    f.set_source("db", "two").await?;
    f.wait_copy("only-b", "b2", &["app-b"]).await?;
    f.wait_copy("plain", "p2", &["app-plain"]).await?;
    // Shard b owns the shared copy too, so it carries the change; both ownerships stay.
    f.wait_copy("db", "two", &["app-a", "app-b"]).await?;
    assert_eq!(
        f.holder(&format!("kubectl-helmop-propagate-ns-{ns}-shard-b"))
            .await?,
        Some(id_b.clone())
    );
    assert_eq!(
        f.copy("only-a").await?.map(|(v, _)| v).as_deref(),
        Some("a1")
    );
    // A new leader of shard a (after the lease ran out) catches up.
    f.set_source("only-a", "a2").await?;
    let mut a2 = f.watcher(Some("a"))?;
    let (_, id_a2) = leads(&mut a2, "a new leader of shard a").await?;
    assert_ne!(id_a, id_a2);
    f.wait_copy("only-a", "a2", &["app-a"]).await?;

    // Shard a's HelmOp goes: its copies are left for prune (propagate never deletes), which
    // deletes only what nobody wants and keeps the shared copy with shard b's ownership.
    fleet_api(&upstream, &ns, &helmop_resource())
        .delete("app-a", &Default::default())
        .await?;
    a2.wait_event("shard a to see app-a go", BOUND, 0, |e| {
        is_run_for(e, &format!("HelmOp {ns}/app-a deleted"))
    })
    .await?;
    f.wait_copy("db", "two", &["app-a", "app-b"]).await?;
    let pruned = run_plugin(
        &[
            "prune",
            "-n",
            &ns,
            "--kubeconfig",
            &f.kubeconfig,
            "-o",
            "json",
        ],
        &[],
        BOUND,
    )
    .await?;
    assert!(
        pruned.status.success(),
        "prune: {}",
        String::from_utf8_lossy(&pruned.stderr)
    );
    wait_until("only-a to be pruned", BOUND, || async {
        Ok(f.copy("only-a").await?.is_none())
    })
    .await?;
    f.wait_copy("db", "two", &["app-b"]).await?;

    // app-b moves to shard a: shard b stops speaking for it from the moment its watch sees it
    // leave, shard a takes it over, and the copies are never deleted nor without app-b as their
    // owner in between.
    fleet_api(&upstream, &ns, &helmop_resource())
        .patch(
            "app-b",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {FLEET_SHARD_REF_LABEL: "a"}}})),
        )
        .await?;
    let left = format!("HelmOp {ns}/app-b deleted");
    b.wait_event("shard b to see app-b leave", BOUND, 0, |e| {
        is_run_for(e, &left)
    })
    .await?;
    f.set_source("only-b", "b3").await?;
    f.wait_copy("only-b", "b3", &["app-b"]).await?;
    f.wait_copy("db", "two", &["app-b"]).await?;
    let moved = json!(format!("{ns}/app-b"));
    a2.wait_event("shard a to run app-b", BOUND, 0, |e| {
        e["event"] == "run"
            && e["report"]["rows"].as_array().is_some_and(|rows| {
                rows.iter()
                    .any(|r| r["helmops"].as_array().is_some_and(|h| h.contains(&moved)))
            })
    })
    .await?;
    let runs_b = b.events_named("run");
    let since = runs_b
        .iter()
        .position(|e| is_run_for(e, &left))
        .context("shard b's run for app-b leaving")?;
    let b_after: Vec<&Value> = runs_b[since..]
        .iter()
        .flat_map(|e| e["report"]["rows"].as_array().into_iter().flatten())
        .filter(|r| r["helmops"].as_array().is_some_and(|h| !h.is_empty()))
        .collect();
    assert!(
        b_after.is_empty(),
        "shard b spoke for a HelmOp it no longer handles: {b_after:?}"
    );
    for name in ["db", "only-b", "plain"] {
        down.never_deleted(name);
    }
    down.never_dropped("db", &format!("{ns}/app-b"));
    down.never_dropped("only-b", &format!("{ns}/app-b"));
    down.never_dropped("plain", &format!("{ns}/app-plain"));

    for p in [&a2, &b, &plain] {
        p.signal(libc::SIGTERM)?;
    }
    for mut p in [a2, b, plain] {
        assert_eq!(p.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));
    }
    Ok(())
}
