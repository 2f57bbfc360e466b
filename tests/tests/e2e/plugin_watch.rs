//! `kubectl helmop propagate --watch` end to end, with the real binary against the shared control
//! plane (upstream, down1, down2): changes propagate without a rerun, leader election keeps two
//! watchers from both writing (hand-over on SIGTERM at once, on a crash after the lease duration),
//! the propagator manifests' RBAC is enough and no more, a write the downstream refused is retried
//! with nothing changed upstream, and (on a private control plane) the watcher survives an upstream
//! API server restart.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use helmop_tests::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// Lease duration the watchers in these tests use: short, so hand-overs are quick to observe, and
/// long enough that a loaded machine does not make a leader miss its renew deadline (2/3 of it).
const LEASE: Duration = Duration::from_secs(5);
const LEASE_FLAG: &str = "5s";
/// "Within seconds": the longest a change may take to reach a downstream cluster.
const PROPAGATION_BOUND: Duration = Duration::from_secs(10);

/// A HelmOp `app` in a fresh upstream namespace, with Secret `db` as its downstream resource and
/// targeting the Fleet Clusters labelled `helmop-test=<namespace>`; copies go to the namespace of
/// the same name downstream.
struct Fixture {
    ns: String,
    upstream: Client,
    kubeconfig: String,
}

impl Fixture {
    async fn new(prefix: &str) -> anyhow::Result<Fixture> {
        let cp = control_plane();
        let upstream = cp.upstream().client().await;
        let ns = fresh_namespace(&upstream, prefix).await?;
        create_secret(&upstream, &ns, "db", &[("password", b"one")]).await?;
        let f = Fixture {
            ns,
            upstream,
            kubeconfig: cp.upstream().kubeconfig.display().to_string(),
        };
        f.register(DOWNSTREAM_1).await?;
        f.apply_helmop(&[("Secret", "db")]).await?;
        Ok(f)
    }

    async fn register(&self, cluster: &str) -> anyhow::Result<()> {
        register_fleet_cluster(
            &self.upstream,
            &self.ns,
            cluster,
            &[("helmop-test", &self.ns)],
            control_plane().cluster(cluster),
        )
        .await?;
        Ok(())
    }

    async fn apply_helmop(&self, resources: &[(&str, &str)]) -> anyhow::Result<()> {
        let doc = copying_helmop("app", &self.ns, resources, ("helmop-test", &self.ns));
        apply_helmop(&self.upstream, &self.ns, &doc.to_string()).await?;
        Ok(())
    }

    /// A watcher serving its metrics on a free port, once started, and that port's address.
    async fn spawn_serving_watcher(&self) -> anyhow::Result<(PluginProcess, String)> {
        use crate::propagator_service::addr_of;
        let mut w = self.spawn_watcher(&["--metrics-addr", "127.0.0.1:0"])?;
        let started = w
            .wait_event("the started event", PROPAGATION_BOUND, 0, |e| {
                e["event"] == "started"
            })
            .await?;
        let addr = addr_of(&started)?;
        Ok((w, addr))
    }

    /// Creates a Secret no HelmOp names, and returns the run it starts: one over every cluster
    /// and kind.
    async fn unrelated_secret_run(&self, w: &mut PluginProcess) -> anyhow::Result<Value> {
        let seen = w.events().len();
        create_secret(&self.upstream, &self.ns, "unrelated", &[("k", b"v")]).await?;
        w.wait_event(
            "the run for the unrelated Secret",
            PROPAGATION_BOUND,
            seen,
            |e| is_run_for(e, &format!("Secret {}/unrelated changed", self.ns)),
        )
        .await
    }

    async fn set_source(&self, value: &str) -> anyhow::Result<()> {
        Api::<Secret>::namespaced(self.upstream.clone(), &self.ns)
            .patch(
                "db",
                &PatchParams::default(),
                &Patch::Merge(json!({"stringData": {"password": value}})),
            )
            .await
            .context("updating the source Secret")?;
        Ok(())
    }

    /// Sets the source to `value` and waits for the copy on down1 and the run for the edit, whose
    /// row for the copy must be `state` and none `Failed`; returns the run.
    async fn edit_and_run(
        &self,
        w: &mut PluginProcess,
        value: &str,
        state: &str,
    ) -> anyhow::Result<Value> {
        let seen = w.events().len();
        self.set_source(value).await?;
        wait_copy(DOWNSTREAM_1, &self.ns, value, PROPAGATION_BOUND).await?;
        let run = w
            .wait_event("the run for the edit", PROPAGATION_BOUND, seen, |e| {
                is_run_for(e, &format!("Secret {}/db changed", self.ns))
            })
            .await?;
        let rows = rows_on(&run, &format!("{}/{DOWNSTREAM_1}", self.ns));
        assert!(
            rows.iter()
                .any(|r| r["name"] == "db" && r["state"] == state),
            "expected {state}: {run}"
        );
        assert!(rows.iter().all(|r| r["state"] != "Failed"), "{run}");
        Ok(run)
    }

    /// ConfigMap `cfg` (`mode: a`) upstream, copied by `app` along with `db`.
    async fn copy_a_config_map_too(&self) -> anyhow::Result<()> {
        create_config_map(&self.upstream, &self.ns, "cfg", &[("mode", "a")]).await?;
        self.apply_helmop(&[("Secret", "db"), ("ConfigMap", "cfg")])
            .await
    }

    async fn set_config_map(&self, mode: &str) -> anyhow::Result<()> {
        Api::<ConfigMap>::namespaced(self.upstream.clone(), &self.ns)
            .patch(
                "cfg",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"mode": mode}})),
            )
            .await
            .context("editing the ConfigMap source")?;
        Ok(())
    }

    /// `propagate --watch` flags shared by the tests; the Lease lives in the test's namespace.
    fn watch_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [
            "propagate",
            "-n",
            &self.ns,
            "--watch",
            "--kubeconfig",
            &self.kubeconfig,
            "--lease-namespace",
            &self.ns,
            // One Lease for every watcher of these tests, whatever its scope.
            "--lease-name",
            "kubectl-helmop-propagate",
            "--lease-duration",
            LEASE_FLAG,
            "--debounce",
            "200ms",
            "-o",
            "json",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    }

    fn spawn_watcher(&self, extra: &[&str]) -> anyhow::Result<PluginProcess> {
        self.spawn_watcher_logging(extra, "info")
    }

    /// A watcher logging at `log` (`HELMOP_LOG`).
    fn spawn_watcher_logging(&self, extra: &[&str], log: &str) -> anyhow::Result<PluginProcess> {
        let args = self.watch_args(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        PluginProcess::spawn(&refs, &[("HELMOP_LOG", log)])
    }

    async fn lease(&self) -> anyhow::Result<Option<Lease>> {
        Ok(Api::<Lease>::namespaced(self.upstream.clone(), &self.ns)
            .get_opt("kubectl-helmop-propagate")
            .await?)
    }
}

/// Every `renewTime` the propagator's Lease shows while `holder` holds it, until another holder
/// takes it over. A watch delivers each update in order, so the last one is the holder's last
/// renewal, even one that landed after the holder was killed.
async fn renewals_until_handed_over(
    api: Api<Lease>,
    holder: String,
) -> anyhow::Result<Vec<Timestamp>> {
    use futures::StreamExt;
    use kube::runtime::watcher;

    let config = watcher::Config::default().fields("metadata.name=kubectl-helmop-propagate");
    let mut events = std::pin::pin!(watcher(api, config));
    let mut seen = Vec::new();
    while let Some(event) = events.next().await {
        let (watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) = event? else {
            continue;
        };
        let Some(spec) = lease.spec else { continue };
        match spec.holder_identity {
            Some(h) if h == holder => seen.extend(spec.renew_time.map(|t| t.0)),
            Some(_) => return Ok(seen),
            None => {}
        }
    }
    bail!("the Lease's watch ended")
}

/// The copy of Secret `db` on `cluster`, as text.
async fn copy_value(cluster: &str, ns: &str) -> anyhow::Result<Option<String>> {
    let client = control_plane().cluster(cluster).client().await;
    let secret = Api::<Secret>::namespaced(client, ns).get_opt("db").await?;
    Ok(secret
        .and_then(|s| s.data)
        .and_then(|d| d.get("password").cloned())
        .map(|b| String::from_utf8_lossy(&b.0).into_owned()))
}

async fn wait_copy(cluster: &str, ns: &str, want: &str, timeout: Duration) -> anyhow::Result<()> {
    wait_until(
        &format!("Secret {ns}/db on {cluster} to read {want:?}"),
        timeout,
        || async move { Ok(copy_value(cluster, ns).await?.as_deref() == Some(want)) },
    )
    .await
}

fn time_of(event: &Value) -> anyhow::Result<Timestamp> {
    event["time"]
        .as_str()
        .context("event without time")?
        .parse()
        .context("event time is not RFC 3339")
}

fn writes(run: &Value) -> u64 {
    run["writes"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn watch_propagates_changes_within_seconds_without_a_rerun() -> anyhow::Result<()> {
    let f = Fixture::new("watch").await?;
    let mut w = f.spawn_watcher(&["app"])?;
    w.wait_event("the start-up run", PROPAGATION_BOUND, 0, |e| {
        e["event"] == "run"
    })
    .await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;

    // A source change: no command is run, the watch sees it.
    let seen = w.events().len();
    let started = Instant::now();
    f.set_source("two").await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "two", PROPAGATION_BOUND).await?;
    let took = started.elapsed();
    let run = w
        .wait_event(
            "a run for the Secret change",
            PROPAGATION_BOUND,
            seen,
            |e| is_run_for(e, &format!("Secret {}/db changed", f.ns)),
        )
        .await?;
    assert!(writes(&run) >= 1, "{run}");
    eprintln!("source change propagated in {took:?}");

    // A HelmOp change: a new entry (its source created first) reaches the cluster.
    create_config_map(&f.upstream, &f.ns, "settings", &[("mode", "fast")]).await?;
    f.apply_helmop(&[("Secret", "db"), ("ConfigMap", "settings")])
        .await?;
    let down1 = control_plane().cluster(DOWNSTREAM_1).client().await;
    let configmaps: Api<ConfigMap> = Api::namespaced(down1, &f.ns);
    wait_until("ConfigMap settings on down1", PROPAGATION_BOUND, || async {
        Ok(configmaps
            .get_opt("settings")
            .await?
            .and_then(|c| c.data)
            .is_some_and(|d| d.get("mode").map(String::as_str) == Some("fast")))
    })
    .await?;

    // A new Cluster matching the target: the copies appear there too.
    f.register(DOWNSTREAM_2).await?;
    wait_copy(DOWNSTREAM_2, &f.ns, "two", PROPAGATION_BOUND).await?;

    // SIGINT: a clean exit, the Lease released.
    w.signal(libc::SIGINT)?;
    let status = w.wait_exit(Duration::from_secs(15)).await?;
    assert_eq!(status.code(), Some(0), "{}", w.context());
    let stopped = w.events_named("stopped");
    assert_eq!(stopped.len(), 1, "{}", w.context());
    assert_eq!(stopped[0]["signal"], "SIGINT");
    let lease = f.lease().await?.context("the Lease exists")?;
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder, None, "the Lease is released on exit");
    Ok(())
}

/// The watcher keeps the kubeconfig Secrets it read between runs; a change to one is seen by its
/// Secret watch, so the very next run reaches the cluster the Secret now names, not the one it
/// named before (and the cluster it no longer names gets nothing new).
#[tokio::test]
async fn a_rotated_kubeconfig_secret_is_used_by_the_next_run() -> anyhow::Result<()> {
    let f = Fixture::new("rotate").await?;
    let mut w = f.spawn_watcher(&[])?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;
    // A second run, from what it kept.
    f.set_source("two").await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "two", PROPAGATION_BOUND).await?;

    // The Cluster's kubeconfig Secret now names down2.
    let seen = w.events().len();
    let down2 = control_plane().cluster(DOWNSTREAM_2).kubeconfig_yaml();
    Api::<Secret>::namespaced(f.upstream.clone(), &f.ns)
        .patch(
            &format!("{DOWNSTREAM_1}-kubeconfig"),
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"value": down2}})),
        )
        .await
        .context("rotating the kubeconfig Secret")?;
    w.wait_event(
        "a run for the kubeconfig change",
        PROPAGATION_BOUND,
        seen,
        |e| {
            is_run_for(
                e,
                &format!("Secret {}/{DOWNSTREAM_1}-kubeconfig changed", f.ns),
            )
        },
    )
    .await?;
    wait_copy(DOWNSTREAM_2, &f.ns, "two", PROPAGATION_BOUND).await?;
    f.set_source("three").await?;
    wait_copy(DOWNSTREAM_2, &f.ns, "three", PROPAGATION_BOUND).await?;
    assert_eq!(
        copy_value(DOWNSTREAM_1, &f.ns).await?.as_deref(),
        Some("two"),
        "the cluster the Secret no longer names was written"
    );
    w.signal(libc::SIGTERM)?;
    assert_eq!(w.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));
    Ok(())
}

/// After an edit of nothing but one source, the watcher's run covers only the clusters copying it
/// (its report says which source, and names no other cluster); the metrics still count every
/// cluster's copies (the other clusters' rows stand from the runs before); and a change to a Secret
/// no HelmOp names makes a run over every cluster again.
#[tokio::test]
async fn a_source_edit_runs_over_the_clusters_copying_it() -> anyhow::Result<()> {
    use crate::propagator_service::{metric, scrape};

    // `app` copies `db` to down1 (the fixture); `other` copies `other-src` to down2 only.
    let f = Fixture::new("focus").await?;
    let cp = control_plane();
    register_fleet_cluster(
        &f.upstream,
        &f.ns,
        DOWNSTREAM_2,
        &[("focus-other", &f.ns)],
        cp.cluster(DOWNSTREAM_2),
    )
    .await?;
    create_secret(&f.upstream, &f.ns, "other-src", &[("password", b"x1")]).await?;
    let other = copying_helmop(
        "other",
        &f.ns,
        &[("Secret", "other-src")],
        ("focus-other", &f.ns),
    );
    apply_helmop(&f.upstream, &f.ns, &other.to_string()).await?;
    let (mut w, addr) = f.spawn_serving_watcher().await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;
    let down2 = control_plane().cluster(DOWNSTREAM_2).client().await;
    wait_until("other-src on down2", PROPAGATION_BOUND, || async {
        Ok(Api::<Secret>::namespaced(down2.clone(), &f.ns)
            .get_opt("other-src")
            .await?
            .is_some())
    })
    .await?;

    let seen = w.events().len();
    f.set_source("two").await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "two", PROPAGATION_BOUND).await?;
    let source = format!("Secret {}/db", f.ns);
    let run = w
        .wait_event("the run for the edit", PROPAGATION_BOUND, seen, |e| {
            is_run_for(e, &format!("{source} changed"))
        })
        .await?;
    assert_eq!(run["report"]["focus"], json!([source]), "{run}");
    assert_eq!(run["report"]["summary"]["clusters"], 1, "{run}");
    let down1_name = format!("{}/{DOWNSTREAM_1}", f.ns);
    assert_eq!(
        clusters_of(&run),
        BTreeSet::from([down1_name.clone()]),
        "{run}"
    );
    // The copy counts are the fleet's: down2's row stands from the run before.
    let m = scrape(&reqwest::Client::new(), &addr).await?;
    assert_eq!(fleet_copies(&m), 2.0, "{m:?}");
    assert_eq!(
        metric(&m, r#"helmop_propagator_copies{state="Updated"}"#),
        1.0,
        "{m:?}"
    );

    // A Secret no HelmOp names: a run over every cluster.
    let full = f.unrelated_secret_run(&mut w).await?;
    assert!(full["report"].get("focus").is_none(), "{full}");
    assert_eq!(full["report"]["summary"]["clusters"], 2, "{full}");
    // Every copy is current: nothing is written (a kept hash of an older version of a copy
    // would make it look changed).
    assert_eq!(full["report"]["summary"]["writes"], 0, "{full}");

    // Someone edits down1's copy by hand. The watcher kept its hash from the runs before, but
    // the copy's resourceVersion changed: the next run over down1 reads it again and repairs it.
    let down1 = control_plane().cluster(DOWNSTREAM_1).client().await;
    tamper_copy(&down1, &f.ns).await?;

    // An edit of `app` alone (a second source): a run over down1 only, which copies it there.
    let seen = w.events().len();
    f.apply_helmop(&[("Secret", "db"), ("Secret", "other-src")])
        .await?;
    let app = format!("HelmOp {}/app", f.ns);
    let run = w
        .wait_event(
            "the run for the HelmOp edit",
            PROPAGATION_BOUND,
            seen,
            |e| is_run_for(e, &format!("{app} changed")),
        )
        .await?;
    assert_eq!(run["report"]["focus"], json!([app]), "{run}");
    assert_eq!(run["report"]["summary"]["clusters"], 1, "{run}");
    assert_eq!(
        clusters_of(&run),
        BTreeSet::from([down1_name.clone()]),
        "{run}"
    );
    assert_repaired(&run, &f.ns, "two").await?;
    assert!(
        Api::<Secret>::namespaced(down1.clone(), &f.ns)
            .get_opt("other-src")
            .await?
            .is_some(),
        "the HelmOp's new source was not copied by its focused run: {run}"
    );

    // `other` moves from down2 to down1: its run covers where it stood (down2) and where it
    // wants copies now (down1), and its copy on down2 is no longer its own.
    let seen = w.events().len();
    let moved = copying_helmop(
        "other",
        &f.ns,
        &[("Secret", "other-src")],
        ("helmop-test", &f.ns),
    );
    apply_helmop(&f.upstream, &f.ns, &moved.to_string()).await?;
    let other = format!("HelmOp {}/other", f.ns);
    let run = w
        .wait_event(
            "the run for the moved HelmOp",
            PROPAGATION_BOUND,
            seen,
            |e| is_run_for(e, &format!("{other} changed")),
        )
        .await?;
    assert_eq!(run["report"]["focus"], json!([other]), "{run}");
    assert_eq!(run["report"]["summary"]["clusters"], 2, "{run}");
    let on_down2: Vec<&Value> = rows_on(&run, &format!("{}/{DOWNSTREAM_2}", f.ns));
    assert!(
        on_down2
            .iter()
            .any(|r| r["name"] == "other-src" && r["state"] == "Orphaned"),
        "the copy `other` left on down2 is not reported: {run}"
    );

    // A deleted HelmOp: a run over every cluster.
    let seen = w.events().len();
    Api::<DynamicObject>::namespaced_with(f.upstream.clone(), &f.ns, &helmop_resource())
        .delete("other", &Default::default())
        .await
        .context("deleting HelmOp other")?;
    let full = w
        .wait_event(
            "the run for the deleted HelmOp",
            PROPAGATION_BOUND,
            seen,
            |e| is_run_for(e, &format!("{other} deleted")),
        )
        .await?;
    assert!(full["report"].get("focus").is_none(), "{full}");
    assert_eq!(full["report"]["summary"]["clusters"], 2, "{full}");
    w.signal(libc::SIGTERM)?;
    assert_eq!(w.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));
    Ok(())
}

/// After an edit of a ConfigMap source alone, the watcher's run works on ConfigMap copies only: its
/// rows are the ConfigMaps', a Secret copy edited by hand on the same cluster is left as it stands
/// (the next run over Secrets repairs it), and the metrics still count the Secret copy from the run
/// before.
#[tokio::test]
async fn a_source_edit_works_on_the_copies_of_its_kind() -> anyhow::Result<()> {
    use crate::propagator_service::scrape;

    let f = Fixture::new("kinds").await?;
    f.copy_a_config_map_too().await?;
    let down1 = control_plane().cluster(DOWNSTREAM_1).client().await;
    let config_maps = Api::<ConfigMap>::namespaced(down1.clone(), &f.ns);
    let cfg_mode = || async {
        anyhow::Ok(
            config_maps
                .get_opt("cfg")
                .await?
                .and_then(|c| c.data)
                .and_then(|d| d.get("mode").cloned()),
        )
    };
    let (mut w, addr) = f.spawn_serving_watcher().await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;
    wait_until("ConfigMap cfg on down1", PROPAGATION_BOUND, || async {
        Ok(cfg_mode().await?.as_deref() == Some("a"))
    })
    .await?;

    // Someone edits the Secret copy by hand, then the ConfigMap source changes.
    tamper_copy(&down1, &f.ns).await?;
    let seen = w.events().len();
    f.set_config_map("b").await?;
    let source = format!("ConfigMap {}/cfg", f.ns);
    let run = w
        .wait_event("the run for the edit", PROPAGATION_BOUND, seen, |e| {
            is_run_for(e, &format!("{source} changed"))
        })
        .await?;
    assert_eq!(run["report"]["focus"], json!([source]), "{run}");
    let down1_name = format!("{}/{DOWNSTREAM_1}", f.ns);
    let rows = rows_on(&run, &down1_name);
    assert!(
        rows.iter()
            .any(|r| r["name"] == "cfg" && r["state"] == "Updated"),
        "{run}"
    );
    assert!(
        rows.iter().all(|r| r["kind"] == "ConfigMap"),
        "a ConfigMap edit's run worked on other kinds: {run}"
    );
    assert_eq!(cfg_mode().await?.as_deref(), Some("b"));
    assert_eq!(
        copy_value(DOWNSTREAM_1, &f.ns).await?.as_deref(),
        Some("tampered"),
        "the ConfigMap edit's run wrote the Secret copy"
    );
    // The copy counts are still the fleet's: the Secret's row stands from the run before.
    let m = scrape(&reqwest::Client::new(), &addr).await?;
    assert_eq!(fleet_copies(&m), 2.0, "{m:?}");

    // A run over every kind (a Secret no HelmOp names) repairs the Secret copy.
    let full = f.unrelated_secret_run(&mut w).await?;
    assert!(full["report"].get("focus").is_none(), "{full}");
    assert_repaired(&full, &f.ns, "one").await?;
    w.signal(libc::SIGTERM)?;
    assert_eq!(w.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));
    Ok(())
}

/// A run after a source edit plans a cluster from the listing the watcher kept (no list request)
/// when all it writes there is an update of an existing copy. A copy deleted by hand since makes
/// that update fail, and the run lists the cluster again and creates the copy; one edited by hand
/// since is repaired the same way. No row says Failed either time.
#[tokio::test]
async fn a_source_edit_plans_from_the_kept_listing_and_lists_again_when_a_write_fails()
-> anyhow::Result<()> {
    let f = Fixture::new("kept").await?;
    let mut w = f.spawn_watcher_logging(&[], "kubectl_helmop=debug")?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;
    let down1 = control_plane().cluster(DOWNSTREAM_1).client().await;
    let secrets = Api::<Secret>::namespaced(down1.clone(), &f.ns);
    let down1_name = format!("{}/{DOWNSTREAM_1}", f.ns);
    let planned_from_kept = |w: &PluginProcess| {
        w.stderr()
            .lines()
            .filter(|l| l.contains("planned from the kept listing") && l.contains(&down1_name))
            .count()
    };
    let listed_again = |w: &PluginProcess| {
        w.stderr()
            .lines()
            .filter(|l| l.contains("listing the cluster again") && l.contains(&down1_name))
            .count()
    };
    // The start-up run listed; the edit's run plans from what it kept.
    f.edit_and_run(&mut w, "two", "Updated").await?;
    assert_eq!(planned_from_kept(&w), 1, "{}", w.stderr());
    assert_eq!(listed_again(&w), 0, "{}", w.stderr());

    // The copy is deleted by hand: the update from the kept listing fails, the run lists again
    // and creates it.
    secrets
        .delete("db", &DeleteParams::default())
        .await
        .context("deleting the copy downstream")?;
    f.edit_and_run(&mut w, "three", "Created").await?;
    assert_eq!(listed_again(&w), 1, "{}", w.stderr());

    // Edited by hand (a new resourceVersion): the same, and the copy holds the source again.
    tamper_copy(&down1, &f.ns).await?;
    f.edit_and_run(&mut w, "four", "Updated").await?;
    assert_eq!(listed_again(&w), 2, "{}", w.stderr());
    assert_eq!(
        copy_value(DOWNSTREAM_1, &f.ns).await?.as_deref(),
        Some("four")
    );

    // With nothing changed by hand, the next edit plans from the kept listing again.
    f.edit_and_run(&mut w, "five", "Updated").await?;
    assert_eq!(planned_from_kept(&w), 2, "{}", w.stderr());
    assert_eq!(listed_again(&w), 2, "{}", w.stderr());
    w.signal(libc::SIGTERM)?;
    assert_eq!(w.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));
    Ok(())
}

/// A source edit's run plans from the inventory the run before it enumerated; a new Cluster is a
/// run that enumerates, and the next edit's run plans from that inventory, so it reaches the new
/// Cluster too.
#[tokio::test]
async fn a_source_edit_plans_from_the_last_inventory_and_a_new_cluster_replaces_it()
-> anyhow::Result<()> {
    let f = Fixture::new("inventory").await?;
    let mut w = f.spawn_watcher_logging(&[], "kubectl_helmop=debug")?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;
    let kept = |w: &PluginProcess| {
        w.stderr()
            .lines()
            .filter(|l| l.contains("planned from the kept inventory"))
            .count()
    };
    f.edit_and_run(&mut w, "two", "Updated").await?;
    assert_eq!(kept(&w), 1, "{}", w.stderr());

    let seen = w.events().len();
    f.register(DOWNSTREAM_2).await?;
    wait_copy(DOWNSTREAM_2, &f.ns, "two", PROPAGATION_BOUND).await?;
    w.wait_event(
        "the run for the new Cluster",
        PROPAGATION_BOUND,
        seen,
        |e| e["event"] == "run",
    )
    .await?;
    assert_eq!(kept(&w), 1, "a new Cluster enumerates: {}", w.stderr());

    let run = f.edit_and_run(&mut w, "three", "Updated").await?;
    wait_copy(DOWNSTREAM_2, &f.ns, "three", PROPAGATION_BOUND).await?;
    assert_eq!(kept(&w), 2, "{}", w.stderr());
    let on_down2 = rows_on(&run, &format!("{}/{DOWNSTREAM_2}", f.ns));
    assert!(
        on_down2
            .iter()
            .any(|r| r["name"] == "db" && r["state"] == "Updated"),
        "{run}"
    );
    w.signal(libc::SIGTERM)?;
    assert_eq!(w.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));
    Ok(())
}

/// A ConfigMap edit's run does not list the Secret copies, so it does not see one deleted by hand;
/// restamping a reader that requires it would roll pods that cannot start. The run holds that
/// restamp back (its row says why, `Failed`), and the retry, a run over every kind, creates the
/// Secret copy and then restamps the reader.
#[tokio::test]
async fn a_restamp_waits_for_a_copy_the_run_did_not_see() -> anyhow::Result<()> {
    let f = Fixture::new("holdback").await?;
    f.copy_a_config_map_too().await?;
    let mut w = f.spawn_watcher(&[])?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;
    let down1 = control_plane().cluster(DOWNSTREAM_1).client().await;
    // A reader opted in to rollouts, requiring both copies.
    create_reader(&down1, &f.ns, "db", "cfg").await?;
    Api::<Secret>::namespaced(down1.clone(), &f.ns)
        .delete("db", &DeleteParams::default())
        .await
        .context("deleting the Secret copy downstream")?;

    let seen = w.events().len();
    f.set_config_map("b").await?;
    let run = w
        .wait_event("the run for the edit", PROPAGATION_BOUND, seen, |e| {
            is_run_for(e, &format!("ConfigMap {}/cfg changed", f.ns))
        })
        .await?;
    let down1_name = format!("{}/{DOWNSTREAM_1}", f.ns);
    let held = rows_on(&run, &down1_name)
        .into_iter()
        .find(|r| r["workload"] == "Deployment/web")
        .with_context(|| format!("no row for the reader: {run}"))?
        .clone();
    assert_eq!(held["state"], "Failed", "{run}");
    assert!(
        held["reason"]
            .as_str()
            .is_some_and(|r| r.contains("it requires secret/db, which is missing")),
        "{run}"
    );
    let retry = w
        .wait_event("the retry", PROPAGATION_BOUND, seen, |e| {
            is_run_for(e, "retry")
        })
        .await?;
    assert!(retry["report"].get("focus").is_none(), "{retry}");
    let rows = rows_on(&retry, &down1_name);
    assert!(
        rows.iter()
            .any(|r| r["name"] == "db" && r["state"] == "Created"),
        "{retry}"
    );
    assert!(
        rows.iter()
            .any(|r| r["workload"] == "Deployment/web" && r["state"] == "Restamped"),
        "{retry}"
    );
    assert_eq!(
        copy_value(DOWNSTREAM_1, &f.ns).await?.as_deref(),
        Some("one")
    );
    w.signal(libc::SIGTERM)?;
    assert_eq!(w.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));
    Ok(())
}

/// The copies `helmop_propagator_copies` counts, over every state.
fn fleet_copies(metrics: &std::collections::BTreeMap<String, f64>) -> f64 {
    metrics
        .iter()
        .filter(|(k, _)| k.starts_with("helmop_propagator_copies{"))
        .map(|(_, v)| v)
        .sum()
}

/// `run` repaired the copy of `db` on down1 that [`tamper_copy`] edited: it says so, and the copy
/// holds the source's `value` again.
async fn assert_repaired(run: &Value, ns: &str, value: &str) -> anyhow::Result<()> {
    assert!(
        rows_on(run, &format!("{ns}/{DOWNSTREAM_1}"))
            .iter()
            .any(|r| r["name"] == "db" && r["state"] == "Updated"),
        "the copy edited downstream was not repaired: {run}"
    );
    assert_eq!(copy_value(DOWNSTREAM_1, ns).await?.as_deref(), Some(value));
    Ok(())
}

/// Someone edits the copy of `db` in `ns` by hand, on the cluster of `client`.
async fn tamper_copy(client: &Client, ns: &str) -> anyhow::Result<()> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": "tampered"}})),
        )
        .await
        .context("editing the copy downstream")?;
    Ok(())
}

/// The clusters a run's rows name.
fn clusters_of(run: &Value) -> BTreeSet<String> {
    run["report"]["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["cluster"].as_str())
        .map(str::to_owned)
        .collect()
}

/// A run's rows on `cluster`.
fn rows_on<'a>(run: &'a Value, cluster: &str) -> Vec<&'a Value> {
    run["report"]["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["cluster"] == cluster)
        .collect()
}

/// A copy whose write the downstream API server refused (a validating webhook that nothing answers,
/// `failurePolicy: Fail`) is written once the refusal is gone, with nothing changed upstream: a
/// run's failed writes are tried again with back-off, not left for the next change or the resync
/// (10 minutes).
#[tokio::test]
async fn a_refused_write_is_retried_with_nothing_changed_upstream() -> anyhow::Result<()> {
    let f = Fixture::new("watch-retry").await?;
    let down1_info = control_plane().cluster(DOWNSTREAM_1);
    let down1 = down1_info.client().await;
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {
        "name": f.ns,
        "labels": {TEST_NAMESPACE_LABEL: f.ns},
    }}))?;
    Api::<Namespace>::all(down1.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .context("creating the destination namespace downstream")?;
    let hook = format!("{}-refuse", f.ns);
    WebhookRegistration::new(
        WebhookKind::Validating,
        &hook,
        "https://127.0.0.1:1/refuse",
        &down1_info.ca_pem(),
    )
    .rule(WebhookRule::new(&["CREATE"], "", "v1", &["secrets"]))
    .only_namespace(&f.ns)
    .register(&down1)
    .await?;
    // The API server reads webhook configurations through a cache: wait until it refuses.
    let secrets: Api<Secret> = Api::namespaced(down1.clone(), &f.ns);
    wait_until(
        "the webhook to refuse new Secrets",
        PROPAGATION_BOUND,
        || {
            let secrets = secrets.clone();
            async move {
                let probe: Secret = serde_json::from_value(json!({"metadata": {"name": "probe"}}))?;
                match secrets.create(&PostParams::default(), &probe).await {
                    Ok(_) => {
                        secrets.delete("probe", &DeleteParams::default()).await?;
                        Ok(false)
                    }
                    Err(kube::Error::Api(_)) => Ok(true),
                    Err(e) => Err(e.into()),
                }
            }
        },
    )
    .await?;

    let mut w = f.spawn_watcher(&["app"])?;
    let failed = |e: &Value| {
        e["report"]["summary"]["states"]["Failed"]
            .as_u64()
            .unwrap_or(0)
    };
    let refused = w
        .wait_event(
            "a run whose write is refused, with a retry",
            PROPAGATION_BOUND,
            0,
            |e| e["event"] == "run" && failed(e) >= 1,
        )
        .await?;
    assert!(refused["retryIn"].is_string(), "no retry: {refused}");
    // Tried again on its own, while still refused.
    let seen = w.events().len();
    w.wait_event("a retry run", PROPAGATION_BOUND, seen, |e| {
        is_run_for(e, "retry") && failed(e) >= 1
    })
    .await?;
    assert_eq!(copy_value(DOWNSTREAM_1, &f.ns).await?, None);

    // The refusal goes; nothing upstream changes, and the copy arrives within the back-off cap.
    unregister_webhook(&down1, WebhookKind::Validating, &hook).await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", Duration::from_secs(90)).await?;
    let done = w
        .wait_event("the clean retry run", PROPAGATION_BOUND, seen, |e| {
            is_run_for(e, "retry") && failed(e) == 0
        })
        .await?;
    assert!(
        done.get("retryIn").is_none(),
        "a clean run schedules another retry: {done}"
    );
    w.signal(libc::SIGINT)?;
    let status = w.wait_exit(Duration::from_secs(15)).await?;
    assert_eq!(status.code(), Some(0), "{}", w.context());
    Ok(())
}

/// Sockets a process holds open (`/proc/PID/fd` links to `socket:[...]`).
fn open_sockets(pid: u32) -> anyhow::Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(link) = std::fs::read_link(entry?.path()) else {
            continue;
        };
        n += usize::from(link.to_string_lossy().starts_with("socket:"));
    }
    Ok(n)
}

/// What a watcher holds must not grow with the edits it handles: one downstream client per
/// cluster (kept between runs, not rebuilt per run), whatever the number of runs; sockets bounded
/// by the clusters and watches, not by the runs. (Counts, not timings or RSS.)
#[tokio::test]
async fn watch_holds_one_client_per_cluster_however_many_edits() -> anyhow::Result<()> {
    let f = Fixture::new("watchcost").await?;
    f.register(DOWNSTREAM_2).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let mut w = f.spawn_watcher(&["--no-leader-election", "--metrics-addr", "127.0.0.1:0"])?;
    let started = w
        .wait_event("the started event", PROPAGATION_BOUND, 0, |e| {
            e["event"] == "started"
        })
        .await?;
    let addr = crate::propagator_service::addr_of(&started)?;
    w.wait_event("the start-up run", PROPAGATION_BOUND, 0, |e| {
        e["event"] == "run"
    })
    .await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;
    wait_copy(DOWNSTREAM_2, &f.ns, "one", PROPAGATION_BOUND).await?;

    const EDITS: usize = 12;
    let mut sockets = Vec::new();
    for edit in 0..EDITS {
        let seen = w.events().len();
        let value = format!("edit-{edit}");
        f.set_source(&value).await?;
        let reason = format!("Secret {}/db changed", f.ns);
        w.wait_event("the run of the edit", PROPAGATION_BOUND, seen, |e| {
            is_run_for(e, &reason)
        })
        .await?;
        wait_copy(DOWNSTREAM_1, &f.ns, &value, PROPAGATION_BOUND).await?;
        wait_copy(DOWNSTREAM_2, &f.ns, &value, PROPAGATION_BOUND).await?;
        let m = crate::propagator_service::scrape(&http, &addr).await?;
        let clients = crate::propagator_service::metric(&m, "helmop_propagator_downstream_clients");
        assert_eq!(
            clients, 2.0,
            "after edit {edit}: one client per downstream cluster, kept between runs"
        );
        sockets.push(open_sockets(w.pid())?);
    }
    let runs = w.events_named("run").len();
    assert!(runs > EDITS, "every edit ran: {runs} runs\n{}", w.context());
    // Connections are reused: a client per run would add a pool per run (at least one socket per
    // cluster per edit, idle for 90 s), so the last edits would hold at least 2 x 9 more sockets
    // than the first three. Parallel requests within a run may open a few more connections in a
    // pool, which is bounded by the concurrency, not by the runs: fewer than one per edit.
    let early = sockets[..3].iter().copied().max().unwrap_or(0);
    let late = sockets[EDITS - 3..].iter().copied().max().unwrap_or(0);
    assert!(
        late < early + (EDITS - 3),
        "sockets grow with the edits handled: {sockets:?}"
    );
    w.signal(libc::SIGTERM)?;
    let status = w.wait_exit(Duration::from_secs(15)).await?;
    assert_eq!(status.code(), Some(0), "{}", w.context());
    Ok(())
}

/// `[from, to)` intervals in which a watcher considered itself leader, from its events; `end` closes
/// an interval still open (the process was killed).
fn leadership(events: &[Value], end: Timestamp) -> anyhow::Result<Vec<(Timestamp, Timestamp)>> {
    let mut out = Vec::new();
    let mut since = None;
    for e in events {
        let t = time_of(e)?;
        match (e["event"].as_str(), e["leading"].as_bool(), since) {
            (Some("leader"), Some(true), None) => since = Some(t),
            (Some("leader"), Some(false), Some(s)) | (Some("stopped"), _, Some(s)) => {
                out.push((s, t));
                since = None;
            }
            _ => {}
        }
    }
    if let Some(s) = since {
        out.push((s, end));
    }
    Ok(out)
}

/// Runs with writes must fall inside the process's leadership.
fn writes_only_while_leading(events: &[Value], end: Timestamp) -> anyhow::Result<()> {
    let intervals = leadership(events, end)?;
    for run in events
        .iter()
        .filter(|e| e["event"] == "run" && writes(e) > 0)
    {
        let t = time_of(run)?;
        if !intervals.iter().any(|(a, b)| *a <= t && t <= *b) {
            bail!("a run with writes at {t} outside leadership {intervals:?}: {run}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn two_watchers_never_both_write() -> anyhow::Result<()> {
    let f = Fixture::new("leader").await?;
    let mut a = f.spawn_watcher(&[])?;
    let a_leads = a
        .wait_event("watcher A to lead", PROPAGATION_BOUND, 0, |e| {
            e["event"] == "leader" && e["leading"] == true
        })
        .await?;
    let a_identity = a_leads["identity"].as_str().context("identity")?.to_owned();
    a.wait_event("A's first run", PROPAGATION_BOUND, 0, |e| {
        e["event"] == "run"
    })
    .await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;

    let mut b = f.spawn_watcher(&[])?;
    let b_standby = b
        .wait_event("watcher B to stand by", PROPAGATION_BOUND, 0, |e| {
            e["event"] == "leader" && e["leading"] == false
        })
        .await?;
    let b_identity = b_standby["identity"]
        .as_str()
        .context("identity")?
        .to_owned();
    assert_ne!(a_identity, b_identity);

    // Changes while A leads: A propagates them, B does not even run.
    for value in ["two", "three"] {
        f.set_source(value).await?;
        wait_copy(DOWNSTREAM_1, &f.ns, value, PROPAGATION_BOUND).await?;
    }
    // B stays a standby while A renews: wait for two renewals by A, then look.
    let mut last = f
        .lease()
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.renew_time);
    for _ in 0..2 {
        last = Some(
            wait_for("A to renew the Lease", 3 * LEASE, || {
                let (lease, last, a) = (f.lease(), last.clone(), a_identity.clone());
                async move {
                    Ok(lease.await?.and_then(|l| l.spec).and_then(|s| {
                        (s.holder_identity.as_deref() == Some(a.as_str()) && s.renew_time != last)
                            .then_some(s.renew_time)
                            .flatten()
                    }))
                }
            })
            .await?,
        );
    }
    assert!(b.events_named("run").is_empty(), "B ran: {}", b.context());
    // Renewals are not news: one leadership event each, no flapping.
    assert_eq!(a.events_named("leader").len(), 1, "{}", a.context());
    assert_eq!(b.events_named("leader").len(), 1, "{}", b.context());
    assert!(
        a.events_named("run").iter().map(writes).sum::<u64>() >= 3,
        "{}",
        a.context()
    );
    let holder = f
        .lease()
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some(a_identity.as_str()));

    // SIGTERM: A releases the Lease and B takes over at once, not after the lease duration.
    a.signal(libc::SIGTERM)?;
    assert_eq!(a.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));
    let a_stopped = time_of(&a.events_named("stopped")[0])?;
    let b_leads = b
        .wait_event("B to take over", PROPAGATION_BOUND, 0, |e| {
            e["event"] == "leader" && e["leading"] == true
        })
        .await?;
    let hand_over = time_of(&b_leads)?.duration_since(a_stopped);
    assert!(
        hand_over.unsigned_abs() < LEASE,
        "hand-over took {hand_over:?} after a clean shutdown"
    );
    // B catches up (nothing to write: A left everything in sync), then propagates new changes.
    let b_first = b
        .wait_event("B's first run", PROPAGATION_BOUND, 0, |e| {
            e["event"] == "run"
        })
        .await?;
    assert_eq!(writes(&b_first), 0, "{b_first}");
    f.set_source("four").await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "four", PROPAGATION_BOUND).await?;

    // A crash (SIGKILL, no release): standby C waits out the lease before it takes over.
    let mut c = f.spawn_watcher(&[])?;
    c.wait_event("watcher C to stand by", PROPAGATION_BOUND, 0, |e| {
        e["event"] == "leader" && e["leading"] == false
    })
    .await?;
    // A renewal B had in flight may land after it died: the Lease's watch sees every one.
    let renewals = tokio::spawn(renewals_until_handed_over(
        Api::<Lease>::namespaced(f.upstream.clone(), &f.ns),
        b_identity.clone(),
    ));
    b.signal(libc::SIGKILL)?;
    let killed = Timestamp::now();
    b.wait_exit(Duration::from_secs(10)).await?;
    let c_leads = c
        .wait_event("C to take over", Duration::from_secs(30), 0, |e| {
            e["event"] == "leader" && e["leading"] == true
        })
        .await?;
    let last_renewal = tokio::time::timeout(DEFAULT_TIMEOUT, renewals)
        .await
        .context("the Lease's watch did not see C take over")???
        .into_iter()
        .max()
        .context("a renewal by B")?;
    // C counts the lease from when it saw B's last renewal, so never earlier than a full lease
    // after it (one clock: all processes run on this machine).
    let waited = time_of(&c_leads)?.duration_since(last_renewal);
    assert!(
        waited.unsigned_abs() >= LEASE && !waited.is_negative(),
        "C took over {waited:?} after B's last renewal, before the lease ran out"
    );
    let after_kill = time_of(&c_leads)?.duration_since(killed).unsigned_abs();
    assert!(
        after_kill <= LEASE + Duration::from_secs(5),
        "C took {after_kill:?} to take over"
    );
    f.set_source("five").await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "five", PROPAGATION_BOUND).await?;

    // No two watchers ever led at the same time, and each wrote only while leading.
    let end = Timestamp::now();
    let a_int = leadership(&a.events(), end)?;
    let b_int = leadership(&b.events(), killed)?;
    let c_int = leadership(&c.events(), end)?;
    for (x, y) in [(&a_int, &b_int), (&a_int, &c_int), (&b_int, &c_int)] {
        for (s1, e1) in x.iter() {
            for (s2, e2) in y.iter() {
                assert!(
                    e1 <= s2 || e2 <= s1,
                    "overlapping leadership {s1}..{e1} and {s2}..{e2}"
                );
            }
        }
    }
    writes_only_while_leading(&a.events(), end)?;
    writes_only_while_leading(&b.events(), killed)?;
    writes_only_while_leading(&c.events(), end)?;
    c.signal(libc::SIGTERM)?;
    assert_eq!(c.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));
    Ok(())
}

#[tokio::test]
async fn propagator_manifests_grant_enough_and_no_more() -> anyhow::Result<()> {
    let cp = control_plane();
    let up = cp.upstream();
    let client = up.client().await;
    ensure_hash_key(&client).await?;
    // Install the manifests as a user would (server-side validated), with the shards component;
    // the pods stay Pending on a control plane without nodes, which is fine: the watchers run
    // here, as their ServiceAccount.
    let overlay = tempfile::tempdir()?;
    let manifests = manifests_dir();
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "resources:\n  - {}\ncomponents:\n  - {}\n",
            relative_path(overlay.path(), &manifests.join("propagator"))?.display(),
            relative_path(overlay.path(), &manifests.join("propagator-shards"))?.display(),
        ),
    )?;
    let rendered = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(overlay.path())
        .output()?;
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let mut apply = up.kubectl();
    apply
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped());
    apply
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = apply.spawn()?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().context("stdin")?;
        stdin.write_all(&rendered.stdout)?;
    }
    let applied = child.wait_with_output()?;
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );

    // What the ServiceAccount may do (kubectl auth can-i, impersonating it).
    let sa = "system:serviceaccount:helmop-system:helmop-propagator";
    let can = |args: &[&str]| -> anyhow::Result<bool> {
        let out = up
            .kubectl()
            .args(["auth", "can-i"])
            .args(args)
            .args(["--as", sa])
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim() == "yes")
    };
    for allowed in [
        &["list", "helmops.fleet.cattle.io", "-A"][..],
        &["watch", "clusters.fleet.cattle.io", "-A"],
        &["list", "clustergroups.fleet.cattle.io", "-A"],
        &["list", "namespaces"],
        &["get", "secrets", "-n", "fleet-default"],
        &["watch", "configmaps", "-A"],
        &[
            "create",
            "leases.coordination.k8s.io",
            "-n",
            "helmop-system",
        ],
        &[
            "update",
            "leases.coordination.k8s.io/kubectl-helmop-propagate",
            "-n",
            "helmop-system",
        ],
        &["create", "events.events.k8s.io", "-n", "fleet-default"],
        &[
            "update",
            "leases.coordination.k8s.io/kubectl-helmop-propagate-shard-shard0",
            "-n",
            "helmop-system",
        ],
        &[
            "get",
            "leases.coordination.k8s.io/kubectl-helmop-propagate-shard-shard1",
            "-n",
            "helmop-system",
        ],
    ] {
        assert!(
            can(allowed)?,
            "the propagator should be allowed to {allowed:?}"
        );
    }
    for denied in [
        &["create", "secrets", "-n", "fleet-default"][..],
        &["update", "secrets", "-n", "helmop-system"],
        &["update", "helmops.fleet.cattle.io", "-A"],
        &["delete", "configmaps", "-A"],
        &[
            "update",
            "leases.coordination.k8s.io/other",
            "-n",
            "helmop-system",
        ],
        &["create", "leases.coordination.k8s.io", "-n", "default"],
        &[
            "update",
            "leases.coordination.k8s.io/kubectl-helmop-propagate-shard-shard2",
            "-n",
            "helmop-system",
        ],
        &["create", "namespaces"],
        &["update", "namespaces/default"],
        &["patch", "events.events.k8s.io", "-n", "fleet-default"],
        &["delete", "events.events.k8s.io", "-n", "fleet-default"],
        &["create", "events", "-n", "fleet-default"],
    ] {
        assert!(
            !can(denied)?,
            "the propagator must not be allowed to {denied:?}"
        );
    }

    // BundleNamespaceMappings are not served here, so `kubectl auth can-i` cannot resolve them:
    // ask the authorizer directly.
    for (verb, allowed) in [("list", true), ("watch", true), ("update", false)] {
        assert_eq!(
            may_on_mappings(&client, sa, verb).await?,
            allowed,
            "the propagator {verb} BundleNamespaceMappings"
        );
    }

    // And it is enough: `propagate --watch` as the ServiceAccount copies a source downstream and
    // holds the Lease the manifests name.
    let f = Fixture::new("propagator").await?;
    let token = sa_token(&client, "helmop-system", "helmop-propagator").await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("propagator.kubeconfig");
    std::fs::write(
        &kubeconfig,
        token_kubeconfig(&up.server, &up.ca_file, &token),
    )?;
    let kubeconfig = kubeconfig.display().to_string();
    let mut w = PluginProcess::spawn(
        &[
            "propagate",
            "-n",
            &f.ns,
            "--watch",
            "--kubeconfig",
            &kubeconfig,
            // The name the manifests' Role grants (the in-cluster propagator runs -A, whose default
            // it is; this test watches one namespace).
            "--lease-name",
            "kubectl-helmop-propagate",
            "--lease-duration",
            LEASE_FLAG,
            "--debounce",
            "200ms",
            "-o",
            "json",
        ],
        &[("POD_NAMESPACE", "helmop-system")],
    )?;
    let leads = w
        .wait_event("the propagator to lead", PROPAGATION_BOUND, 0, |e| {
            e["event"] == "leader" && e["leading"] == true
        })
        .await?;
    assert_eq!(leads["lease"], "helmop-system/kubectl-helmop-propagate");
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;
    f.set_source("two").await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "two", PROPAGATION_BOUND).await?;
    assert!(w.events_named("failed").is_empty(), "{}", w.context());
    w.signal(libc::SIGTERM)?;
    assert_eq!(w.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));

    // A shard's Deployment runs `-A --watch --shard-id=shard0` as the same ServiceAccount: the
    // Lease it derives is the one its Role grants, and it takes over the HelmOp once labelled for
    // it (only HelmOps labelled shard0 anywhere, so -A touches no other test's).
    let shard_args = shard_deployment_args(&rendered.stdout, "helmop-propagator-shard0")?;
    assert!(
        shard_args.iter().any(|a| a == "--shard-id=shard0"),
        "{shard_args:?}"
    );
    assert!(
        shard_args.iter().any(|a| a == "--all-namespaces"),
        "{shard_args:?}"
    );
    Api::<kube::core::DynamicObject>::namespaced_with(
        client.clone(),
        &f.ns,
        &helmop_resource(),
    )
    .patch(
        "app",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {helmop_core::names::FLEET_SHARD_REF_LABEL: "shard0"}}})),
    )
    .await?;
    let mut shard = PluginProcess::spawn(
        &[
            "propagate",
            "--all-namespaces",
            "--watch",
            "--shard-id=shard0",
            "--kubeconfig",
            &kubeconfig,
            "--lease-duration",
            LEASE_FLAG,
            "--debounce",
            "200ms",
            "-o",
            "json",
        ],
        &[("POD_NAMESPACE", "helmop-system")],
    )?;
    let leads = shard
        .wait_event("shard0 to lead", PROPAGATION_BOUND, 0, |e| {
            e["event"] == "leader" && e["leading"] == true
        })
        .await?;
    assert_eq!(
        leads["lease"],
        "helmop-system/kubectl-helmop-propagate-shard-shard0"
    );
    f.set_source("three").await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "three", PROPAGATION_BOUND).await?;
    assert!(
        shard.events_named("failed").is_empty(),
        "{}",
        shard.context()
    );
    shard.signal(libc::SIGTERM)?;
    assert_eq!(
        shard.wait_exit(Duration::from_secs(15)).await?.code(),
        Some(0)
    );
    Ok(())
}

/// The container args of the Deployment `name` in rendered manifests.
fn shard_deployment_args(rendered: &[u8], name: &str) -> anyhow::Result<Vec<String>> {
    let text = String::from_utf8_lossy(rendered);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).context("rendered YAML")?;
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == name)
        .with_context(|| format!("no Deployment {name}"))?;
    Ok(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect(),
    )
}

/// Whether `user` may `verb` BundleNamespaceMappings in every namespace (a SubjectAccessReview).
async fn may_on_mappings(client: &Client, user: &str, verb: &str) -> anyhow::Result<bool> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            resource_attributes: Some(ResourceAttributes {
                group: Some("fleet.cattle.io".into()),
                resource: Some("bundlenamespacemappings".into()),
                verb: Some(verb.into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&kube::api::PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The token of a ServiceAccount (Kubernetes 1.20 creates a token Secret for each).
async fn sa_token(client: &Client, ns: &str, name: &str) -> anyhow::Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let secret_name = wait_for(
        &format!("a token Secret for {ns}/{name}"),
        DEFAULT_TIMEOUT,
        || async {
            Ok(accounts
                .get_opt(name)
                .await?
                .and_then(|sa| sa.secrets)
                .and_then(|s| s.into_iter().find_map(|r| r.name)))
        },
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    wait_for("the token to be filled in", DEFAULT_TIMEOUT, || async {
        Ok(secrets
            .get_opt(&secret_name)
            .await?
            .and_then(|s| s.data)
            .and_then(|d| d.get("token").cloned())
            .map(|t| String::from_utf8_lossy(&t.0).into_owned()))
    })
    .await
}

fn token_kubeconfig(server: &str, ca_file: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {}\n\
contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
users:\n- name: u\n  user:\n    token: {token}\n",
        ca_file.display()
    )
}

/// A watch that failed while its API server stayed up (an outage of the load balancer in front of it:
/// kube could resume each watch from where it was, without listing) lists again, and the runs after
/// it read the Clusters from the Cluster watch again instead of listing them upstream for the rest of
/// the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_watch_lists_again_and_runs_read_the_cluster_watch_again() -> anyhow::Result<()> {
    use helmop_tests::proxy::{StallingProxy, kubeconfig_through, server_addr};

    let f = Fixture::new("watchcut").await?;
    let upstream = control_plane().upstream();
    let proxy = StallingProxy::start(server_addr(upstream)?).await?;
    let through = kubeconfig_through(upstream, &proxy)?;
    let mut args = f.watch_args(&["--no-leader-election"]);
    let at = args
        .iter()
        .position(|a| a == "--kubeconfig")
        .context("the watch arguments name no kubeconfig")?;
    args[at + 1] = through.path().display().to_string();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut w = PluginProcess::spawn(
        &refs,
        &[("HELMOP_LOG", "info,kubectl_helmop::run::inventory=debug")],
    )?;
    w.wait_event("the start-up run", PROPAGATION_BOUND, 0, |e| {
        e["event"] == "run"
    })
    .await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;

    // The Cluster and Secret watches are the ones whose store and cache stop serving on a failure.
    let logged = |what: String, since: usize| {
        let w = &w;
        move || {
            let text = w.stderr().get(since..).unwrap_or_default().to_owned();
            let what = what.clone();
            async move { Ok(text.contains(&what)) }
        }
    };
    let before = w.stderr().len();
    proxy.outage(true);
    for kind in ["Cluster", "Secret"] {
        let line = format!("watch failed; retrying with back-off kind=\"{kind}\"");
        wait_until(
            &format!("the {kind} watch to fail"),
            PROPAGATION_BOUND,
            logged(line, before),
        )
        .await
        .with_context(|| w.context())?;
    }
    proxy.outage(false);
    for kind in ["Cluster", "Secret"] {
        let line = format!("watch reconnected kind=\"{kind}\"");
        wait_until(
            &format!("the {kind} watch to list again"),
            // kube's back-off after the failures: 0.8 s doubling, jittered.
            Duration::from_secs(30),
            logged(line, before),
        )
        .await
        .with_context(|| w.context())?;
    }
    let since_cut = w.stderr().len();
    let seen = w.events().len();
    f.set_source("two").await?;
    let reason = format!("Secret {}/db changed", f.ns);
    w.wait_event("the run of the edit", PROPAGATION_BOUND, seen, |e| {
        is_run_for(e, &reason)
    })
    .await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "two", PROPAGATION_BOUND).await?;
    let after = w.stderr().get(since_cut..).unwrap_or_default().to_owned();
    assert!(
        after.contains("Clusters read from the Cluster watch"),
        "the run after the cut listed the Clusters upstream: {}",
        w.context()
    );
    w.signal(libc::SIGTERM)?;
    w.wait_exit(Duration::from_secs(15)).await?;
    Ok(())
}

#[tokio::test]
async fn watch_survives_an_upstream_api_server_restart() -> anyhow::Result<()> {
    // A private control plane: stopping the shared upstream would disturb every other test.
    let cp = ControlPlane::start(&["wup", "wdown"])?;
    let up = cp.cluster("wup");
    let upstream = up.client().await;
    let ns = fresh_namespace(&upstream, "restart").await?;
    create_secret(&upstream, &ns, "db", &[("password", b"one")]).await?;
    register_fleet_cluster(
        &upstream,
        &ns,
        "wdown",
        &[("env", "x")],
        cp.cluster("wdown"),
    )
    .await?;
    let doc = copying_helmop("app", &ns, &[("Secret", "db")], ("env", "x"));
    apply_helmop(&upstream, &ns, &doc.to_string()).await?;
    let kubeconfig = up.kubeconfig.display().to_string();
    let mut w = PluginProcess::spawn(
        &[
            "propagate",
            "-A",
            "--watch",
            "--kubeconfig",
            &kubeconfig,
            "--lease-namespace",
            &ns,
            "--lease-duration",
            LEASE_FLAG,
            "--debounce",
            "200ms",
            "-o",
            "json",
        ],
        &[("HELMOP_LOG", "info")],
    )?;
    let down = cp.cluster("wdown").client().await;
    let copy = |value: &'static str| {
        let secrets: Api<Secret> = Api::namespaced(down.clone(), &ns);
        move || {
            let secrets = secrets.clone();
            async move {
                Ok(secrets
                    .get_opt("db")
                    .await?
                    .and_then(|s| s.data)
                    .and_then(|d| d.get("password").cloned())
                    .is_some_and(|b| b.0 == value.as_bytes()))
            }
        }
    };
    wait_until("the first copy", PROPAGATION_BOUND, copy("one")).await?;

    let seen = w.events().len();
    // (Blocking calls: the watcher is another process, nothing else runs on this runtime.)
    cp.stop_cluster("wup")?;
    // Without its API server the leader cannot renew: it steps down (and so never writes blind).
    w.wait_event(
        "the leader to step down",
        Duration::from_secs(15),
        seen,
        |e| e["event"] == "leader" && e["leading"] == false,
    )
    .await?;
    cp.start_cluster("wup")?;
    w.wait_event("leadership again", Duration::from_secs(30), seen, |e| {
        e["event"] == "leader" && e["leading"] == true
    })
    .await?;
    // The watches reconnected: a change is seen without a rerun.
    let upstream = up.client().await;
    Api::<Secret>::namespaced(upstream, &ns)
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": "two"}})),
        )
        .await?;
    wait_until(
        "the change after the restart",
        Duration::from_secs(20),
        copy("two"),
    )
    .await?;
    w.signal(libc::SIGTERM)?;
    assert_eq!(w.wait_exit(Duration::from_secs(15)).await?.code(), Some(0));
    Ok(())
}

/// Watchers of different scopes have their own Lease by default: a `-n` watcher left running (on a
/// laptop, say) never makes another scope's watcher stand by, even with the Leases in one namespace.
#[tokio::test]
async fn watchers_of_different_scopes_lead_at_once() -> anyhow::Result<()> {
    let a = Fixture::new("scope-a").await?;
    let b = Fixture::new("scope-b").await?;
    let spawn = |f: &Fixture| {
        PluginProcess::spawn(
            &[
                "propagate",
                "-n",
                &f.ns,
                "--watch",
                "--kubeconfig",
                &f.kubeconfig,
                "--lease-namespace",
                &a.ns,
                "--lease-duration",
                LEASE_FLAG,
                "-o",
                "json",
            ],
            &[],
        )
    };
    let mut wa = spawn(&a)?;
    let mut wb = spawn(&b)?;
    for (w, f) in [(&mut wa, &a), (&mut wb, &b)] {
        let lead = w
            .wait_event("the watcher to lead", PROPAGATION_BOUND, 0, |e| {
                e["event"] == "leader" && e["leading"] == true
            })
            .await?;
        assert_eq!(
            lead["lease"],
            format!("{}/kubectl-helmop-propagate-ns-{}", a.ns, f.ns),
            "{lead}"
        );
    }
    wait_copy(DOWNSTREAM_1, &a.ns, "one", PROPAGATION_BOUND).await?;
    wait_copy(DOWNSTREAM_1, &b.ns, "one", PROPAGATION_BOUND).await?;
    Ok(())
}

/// A source that carries helmop's label (another management cluster's copy, used here as a source)
/// is watched like any other: its change propagates at once, not at the resync.
#[tokio::test]
async fn a_source_carrying_helmops_label_is_watched() -> anyhow::Result<()> {
    let f = Fixture::new("watch-labelled").await?;
    let secrets: Api<Secret> = Api::namespaced(f.upstream.clone(), &f.ns);
    let labelled: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": "relayed",
            "labels": {"helmop.dev/managed-by": "kubectl-helmop"},
            "annotations": {"helmop.dev/source": "up-elsewhere/team/Secret/relayed"},
        },
        "stringData": {"token": "first"},
    }))?;
    secrets.create(&Default::default(), &labelled).await?;
    f.apply_helmop(&[("Secret", "db"), ("Secret", "relayed")])
        .await?;
    let mut w = f.spawn_watcher(&["--resync", "0"])?;
    w.wait_event("the start-up run", PROPAGATION_BOUND, 0, |e| {
        e["event"] == "run"
    })
    .await?;
    let down1 = control_plane().cluster(DOWNSTREAM_1).client().await;
    let copies: Api<Secret> = Api::namespaced(down1, &f.ns);
    let token = |s: Option<Secret>| {
        s.and_then(|s| s.data).and_then(|d| {
            d.get("token")
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        })
    };
    wait_until("the labelled source copied", PROPAGATION_BOUND, || async {
        Ok(token(copies.get_opt("relayed").await?).as_deref() == Some("first"))
    })
    .await?;
    let seen = w.events().len();
    secrets
        .patch(
            "relayed",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"token": "second"}})),
        )
        .await?;
    w.wait_event(
        "a run for the labelled source",
        PROPAGATION_BOUND,
        seen,
        |e| is_run_for(e, &format!("Secret {}/relayed changed", f.ns)),
    )
    .await?;
    wait_until(
        "the change copied without a resync",
        PROPAGATION_BOUND,
        || async { Ok(token(copies.get_opt("relayed").await?).as_deref() == Some("second")) },
    )
    .await?;
    Ok(())
}

/// Fleet rewrites HelmOp and Cluster status all the time (conditions, agent check-ins): a
/// status-only write starts no run, a change of what a plan reads still does.
#[tokio::test]
async fn status_only_writes_start_no_run() -> anyhow::Result<()> {
    let f = Fixture::new("watchstatus").await?;
    let args = f.watch_args(&["--no-leader-election"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut w = PluginProcess::spawn(
        &refs,
        &[(
            "HELMOP_LOG",
            "info,kubectl_helmop::watch::triggers=trace,kubectl_helmop::run::inventory=debug",
        )],
    )?;
    w.wait_event("the start-up run", PROPAGATION_BOUND, 0, |e| {
        e["event"] == "run"
    })
    .await?;
    wait_copy(DOWNSTREAM_1, &f.ns, "one", PROPAGATION_BOUND).await?;
    let seen = w.events().len();
    let helmops = fleet_api(&f.upstream, &f.ns, &helmop_resource());
    const WRITES: usize = 10;
    for i in 0..WRITES {
        helmops
            .patch_status(
                "app",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": [{
                    "type": "Ready", "status": "False", "message": format!("check-in {i}"),
                }]}})),
            )
            .await?;
    }
    // Fleet's agent checks in on its Cluster (status.agent.lastSeen) every few seconds.
    let clusters = fleet_api(&f.upstream, &f.ns, &cluster_resource());
    for i in 0..WRITES {
        clusters
            .patch_status(
                DOWNSTREAM_1,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"agent": {
                    "lastSeen": format!("2026-01-01T00:00:{i:02}Z"),
                }}})),
            )
            .await?;
    }
    // A label change after them on each watch: once both runs come, every status write was seen
    // before them (each watch delivers its events in order).
    let sentinel = json!({"metadata": {"labels": {"sentinel": "1"}}});
    helmops
        .patch("app", &PatchParams::default(), &Patch::Merge(&sentinel))
        .await?;
    clusters
        .patch(
            DOWNSTREAM_1,
            &PatchParams::default(),
            &Patch::Merge(&sentinel),
        )
        .await?;
    let reasons = [
        format!("HelmOp {}/app changed", f.ns),
        format!("Cluster {}/{DOWNSTREAM_1} changed", f.ns),
    ];
    for reason in &reasons {
        w.wait_event("the run of a label change", PROPAGATION_BOUND, seen, |e| {
            is_run_for(e, reason)
        })
        .await?;
    }
    let filtered = w.stderr().matches("status-only change: no run").count();
    assert_eq!(filtered, 2 * WRITES, "{}", w.context());
    // Those runs read the Clusters from the Cluster watch, not from a list upstream.
    assert!(
        w.stderr().contains("Clusters read from the Cluster watch"),
        "{}",
        w.context()
    );
    for reason in &reasons {
        let runs = w.events()[seen..]
            .iter()
            .filter(|e| is_run_for(e, reason))
            .count();
        assert_eq!(runs, 1, "only the label change ran: {}", w.context());
    }
    w.signal(libc::SIGTERM)?;
    w.wait_exit(Duration::from_secs(15)).await?;
    Ok(())
}
