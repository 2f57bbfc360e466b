//! `propagate --watch` as an in-cluster service, with the real binary against the shared control
//! plane: `/metrics` follows what the runs did (copies by state, conflicts, unreachable clusters,
//! leadership of a leader and a standby, last success per cluster), `/readyz` is 503 until the
//! watches have synced, and the leader puts one Kubernetes Event per problem on the HelmOp
//! (Conflict, ClusterUnreachable, SourceMissing), not one per run.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use helmop_tests::*;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const LEASE_FLAG: &str = "5s";
const BOUND: Duration = Duration::from_secs(20);
/// A value no Event note may contain.
const SECRET_VALUE: &str = "s3cret-value-never-in-events";

/// Metric samples by `name{labels}` as printed.
pub(crate) fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

pub(crate) async fn get(
    http: &reqwest::Client,
    addr: &str,
    path: &str,
) -> anyhow::Result<(u16, String)> {
    let resp = http
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .with_context(|| format!("GET {path} on {addr}"))?;
    let code = resp.status().as_u16();
    Ok((code, resp.text().await?))
}

pub(crate) async fn scrape(
    http: &reqwest::Client,
    addr: &str,
) -> anyhow::Result<BTreeMap<String, f64>> {
    let (code, text) = get(http, addr, "/metrics").await?;
    if code != 200 {
        bail!("/metrics answered {code}: {text}");
    }
    Ok(samples(&text))
}

pub(crate) fn metric(m: &BTreeMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

fn reasons(events: &[Event]) -> Vec<String> {
    let mut r: Vec<String> = events
        .iter()
        .map(|e| e.reason.clone().unwrap_or_default())
        .collect();
    r.sort();
    r
}

pub(crate) fn addr_of(started: &Value) -> anyhow::Result<String> {
    Ok(started["metricsAddr"]
        .as_str()
        .context("the started event names no metricsAddr")?
        .to_owned())
}

#[tokio::test]
async fn watch_serves_metrics_probes_and_events() -> anyhow::Result<()> {
    let cp = control_plane();
    let upstream = cp.upstream().client().await;
    let kubeconfig = cp.upstream().kubeconfig.display().to_string();
    let ns = fresh_namespace(&upstream, "propsvc").await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;

    // Sources: `db` (copied), `taken` (a foreign object of that name downstream: Conflict), and
    // `absent` is named by the HelmOp but does not exist (SourceMissing).
    create_secret(
        &upstream,
        &ns,
        "db",
        &[("password", SECRET_VALUE.as_bytes())],
    )
    .await?;
    create_secret(&upstream, &ns, "taken", &[("k", SECRET_VALUE.as_bytes())]).await?;
    let down1 = cp.cluster(DOWNSTREAM_1).client().await;
    Api::<Namespace>::all(down1.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.clone()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .context("creating the namespace on down1")?;
    create_secret(&down1, &ns, "taken", &[("k", b"someone else's")]).await?;
    register_fleet_cluster(
        &upstream,
        &ns,
        "d1",
        &[("helmop-test", &ns)],
        cp.cluster(DOWNSTREAM_1),
    )
    .await?;
    // A Cluster whose API server is a closed port: Unreachable.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    create_secret(
        &upstream,
        &ns,
        "gone-kubeconfig",
        &[("value", closed_kubeconfig(closed).as_bytes())],
    )
    .await?;
    create_fleet_object(
        &upstream,
        &ns,
        &cluster_resource(),
        json!({"metadata": {"name": "gone", "labels": {"helmop-test": ns}}, "spec": {"kubeConfigSecret": "gone-kubeconfig"}}),
    )
    .await?;
    let doc = copying_helmop(
        "app",
        &ns,
        &[("Secret", "db"), ("Secret", "taken"), ("Secret", "absent")],
        ("helmop-test", &ns),
    );
    apply_helmop(&upstream, &ns, &doc.to_string()).await?;

    let dir = tempfile::tempdir()?;
    let release = dir.path().join("release");
    let pause = format!("before-watches:{}", release.display());
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "propagate",
            "-n",
            &ns,
            "--watch",
            "--kubeconfig",
            &kubeconfig,
            "--lease-namespace",
            &ns,
            "--lease-duration",
            LEASE_FLAG,
            "--debounce",
            "200ms",
            "--cluster-timeout",
            "5s",
            "--metrics-addr",
            "127.0.0.1:0",
            "-o",
            "json",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        a
    };
    let a_args = args(&[]);
    let refs: Vec<&str> = a_args.iter().map(String::as_str).collect();
    let mut a = PluginProcess::spawn(
        &refs,
        &[("HELMOP_LOG", "info"), ("HELMOP_TEST_PAUSE", &pause)],
    )?;
    let started = a
        .wait_event("A to start", BOUND, 0, |e| e["event"] == "started")
        .await?;
    let a_addr = addr_of(&started)?;

    // Held before its watches start: alive, not ready.
    let (code, body) = get(&http, &a_addr, "/readyz").await?;
    assert_eq!(code, 503, "/readyz before the watches synced: {body}");
    assert!(body.contains("watches synced"), "{body}");
    let (code, _) = get(&http, &a_addr, "/livez").await?;
    assert_eq!(code, 200);
    std::fs::write(&release, b"")?;
    wait_until("A's /readyz to answer 200", BOUND, || async {
        Ok(get(&http, &a_addr, "/readyz").await?.0 == 200)
    })
    .await?;

    let first = a
        .wait_event("A's first run", BOUND, 0, |e| e["event"] == "run")
        .await?;
    let after_first = Timestamp::now().as_second() as f64;
    let m = scrape(&http, &a_addr).await?;
    let d1 = format!("{ns}/d1");
    let gone = format!("{ns}/gone");
    assert_eq!(metric(&m, "helmop_propagator_leader"), 1.0, "{m:?}");
    assert_eq!(
        metric(&m, r#"helmop_propagator_copies{state="Created"}"#),
        1.0,
        "{m:?}\n{first}"
    );
    assert_eq!(
        metric(&m, r#"helmop_propagator_copies{state="Conflict"}"#),
        1.0,
        "{m:?}"
    );
    assert!(
        metric(&m, r#"helmop_propagator_copies{state="Unreachable"}"#) >= 1.0,
        "{m:?}"
    );
    assert!(
        metric(&m, r#"helmop_propagator_errors_total{kind="conflict"}"#) >= 1.0,
        "{m:?}"
    );
    assert!(
        metric(&m, r#"helmop_propagator_errors_total{kind="unreachable"}"#) >= 1.0,
        "{m:?}"
    );
    assert!(
        metric(
            &m,
            r#"helmop_propagator_errors_total{kind="source_missing"}"#
        ) >= 1.0,
        "{m:?}"
    );
    assert!(
        metric(&m, r#"helmop_propagator_runs_total{result="partial"}"#) >= 1.0,
        "{m:?}"
    );
    let last_d1 = metric(
        &m,
        &format!(r#"helmop_propagator_last_success_timestamp_seconds{{cluster="{d1}"}}"#),
    );
    assert!(
        last_d1 > after_first - 60.0 && last_d1 <= after_first,
        "last success on d1 {last_d1}, run ended by {after_first}: {m:?}"
    );
    assert_eq!(
        metric(
            &m,
            &format!(r#"helmop_propagator_last_success_timestamp_seconds{{cluster="{gone}"}}"#)
        ),
        0.0,
        "an unreachable cluster never succeeded: {m:?}"
    );
    assert!(
        m.keys()
            .any(|k| k.starts_with("helmop_propagator_build_info{version=")),
        "{m:?}"
    );

    // One Event per problem, on the HelmOp, with the right reason and type; no Secret value.
    let want = ["ClusterUnreachable", "Conflict", "SourceMissing"];
    wait_until("the three Events on the HelmOp", BOUND, || async {
        Ok(reasons(&propagator_events(&upstream, &ns, "app").await?) == want)
    })
    .await?;

    // More runs with the same problems: the copy follows its source, the problems are counted
    // again, and still one Event each.
    let conflicts_before = metric(&m, r#"helmop_propagator_errors_total{kind="conflict"}"#);
    let seen = a.events().len();
    Api::<Secret>::namespaced(upstream.clone(), &ns)
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": format!("{SECRET_VALUE}-2")}})),
        )
        .await?;
    a.wait_event("a run for the change", BOUND, seen, |e| {
        e["event"] == "run" && e["writes"].as_u64().unwrap_or(0) > 0
    })
    .await?;
    let m = scrape(&http, &a_addr).await?;
    assert_eq!(
        metric(&m, r#"helmop_propagator_copies{state="Updated"}"#),
        1.0,
        "{m:?}"
    );
    assert_eq!(
        metric(&m, r#"helmop_propagator_copies{state="Created"}"#),
        0.0,
        "the states are the last run's: {m:?}"
    );
    assert!(
        metric(&m, r#"helmop_propagator_errors_total{kind="conflict"}"#) > conflicts_before,
        "the conflict is counted on every run: {m:?}"
    );
    // Completed runs (a run that failed or was aborted prints another event).
    let runs: f64 = ["ok", "partial", "invalid"]
        .iter()
        .map(|r| {
            metric(
                &m,
                &format!(r#"helmop_propagator_runs_total{{result="{r}"}}"#),
            )
        })
        .sum();
    let run_events = a.events_named("run").len() as f64;
    assert_eq!(runs, run_events, "every run counted once: {m:?}");
    assert!(runs >= 2.0);

    // A standby: ready, not leading, no Events of its own.
    let b_args = args(&[]);
    let refs: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let mut b = PluginProcess::spawn(&refs, &[("HELMOP_LOG", "info")])?;
    let b_started = b
        .wait_event("B to start", BOUND, 0, |e| e["event"] == "started")
        .await?;
    let b_addr = addr_of(&b_started)?;
    b.wait_event("B to stand by", BOUND, 0, |e| {
        e["event"] == "leader" && e["leading"] == false
    })
    .await?;
    wait_until("B's /readyz to answer 200", BOUND, || async {
        Ok(get(&http, &b_addr, "/readyz").await?.0 == 200)
    })
    .await?;
    let mb = scrape(&http, &b_addr).await?;
    assert_eq!(metric(&mb, "helmop_propagator_leader"), 0.0, "{mb:?}");
    assert_eq!(
        mb.iter()
            .filter(|(k, _)| k.starts_with("helmop_propagator_runs_total"))
            .count(),
        0,
        "a standby does not run: {mb:?}"
    );
    let ma = scrape(&http, &a_addr).await?;
    assert_eq!(metric(&ma, "helmop_propagator_leader"), 1.0, "{ma:?}");

    // Another run of the leader (a resync-like trigger: the HelmOp is touched).
    let seen = a.events().len();
    Api::<Secret>::namespaced(upstream.clone(), &ns)
        .patch(
            "taken",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await?;
    a.wait_event("a run for the touch", BOUND, seen, |e| e["event"] == "run")
        .await?;
    let events = propagator_events(&upstream, &ns, "app").await?;
    assert_eq!(reasons(&events), want, "not one Event per run: {events:?}");
    for e in &events {
        assert_eq!(e.type_.as_deref(), Some("Warning"), "{e:?}");
        assert!(e.series.is_none(), "an Event repeated: {e:?}");
        let note = e.note.clone().unwrap_or_default();
        assert!(
            !note.contains(SECRET_VALUE),
            "a Secret value in an Event: {note}"
        );
        let subject = match e.reason.as_deref() {
            Some("Conflict") => format!("Secret {ns}/taken on cluster {d1}"),
            Some("ClusterUnreachable") => format!("cluster {gone}"),
            _ => "Secret absent".to_owned(),
        };
        assert!(note.contains(&subject), "{note:?} should name {subject:?}");
        assert!(
            e.reporting_instance
                .as_deref()
                .is_some_and(|i| started["identity"].as_str() == Some(i)),
            "only the leader A reports: {e:?}"
        );
    }

    // The conflict is resolved (the foreign object goes): the copy is made, the gauge drops.
    Api::<Secret>::namespaced(down1.clone(), &ns)
        .delete("taken", &Default::default())
        .await?;
    let seen = a.events().len();
    Api::<Secret>::namespaced(upstream.clone(), &ns)
        .patch(
            "taken",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "again"}}})),
        )
        .await?;
    a.wait_event("a run after the fix", BOUND, seen, |e| {
        e["event"] == "run" && e["writes"].as_u64().unwrap_or(0) > 0
    })
    .await?;
    let m = scrape(&http, &a_addr).await?;
    assert_eq!(
        metric(&m, r#"helmop_propagator_copies{state="Conflict"}"#),
        0.0,
        "{m:?}"
    );

    for w in [&mut a, &mut b] {
        w.signal(libc::SIGTERM)?;
        assert_eq!(
            w.wait_exit(Duration::from_secs(15)).await?.code(),
            Some(0),
            "{}",
            w.context()
        );
    }
    Ok(())
}

fn closed_kubeconfig(port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n"
    )
}
