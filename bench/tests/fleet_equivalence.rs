//! fleetsim is equivalent to real API servers on helmop's scenarios: the same propagate / unchanged rerun /
//! source edit / prune / status sequence against three real kube-apiservers (behind counting proxies) and
//! three simulated clusters makes the same requests per cluster (writes and reads, by verb and resource),
//! exits the same way and prints the same JSON (normalised for cluster names, UIDs and endpoints).

use helmop_bench::fleet::proxy::Proxy;
use helmop_bench::fleet::scenario::{self, Side};
use helmop_bench::fleet::sim::{Counts, Fleet};
use helmop_tests::{ControlPlane, plugin_binary};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_clusters_behave_like_real_api_servers_for_helmop() {
    let started = std::time::Instant::now();
    let plugin = plugin_binary().expect("kubectl-helmop is built");
    let cp = tokio::task::spawn_blocking(|| {
        ControlPlane::start(&["upstream", "down1", "down2", "down3"])
    })
    .await
    .expect("control plane task")
    .expect("control plane starts");
    let upstream = cp.clusters[0].clone();
    eprintln!("control plane up after {:?}", started.elapsed());
    // Both sides find the upstream hash key in place (the first run on an upstream without one also
    // looks at every cluster before creating it).
    helmop_tests::ensure_hash_key(&upstream.client().await)
        .await
        .expect("upstream hash key");
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut proxies = Vec::new();
    for real in &cp.clusters[1..] {
        proxies.push(Proxy::start(real, dir.path()).await.expect("proxy starts"));
    }
    let real_targets: Vec<_> = proxies.iter().map(|p| p.info.clone()).collect();
    let real = Side {
        namespace: "eq-real".into(),
        targets: &real_targets,
        counters: proxies.iter().map(|p| p.counter.clone()).collect(),
    };
    let fleet = Fleet::start(3).await.expect("fleetsim starts");
    let sim = Side {
        namespace: "eq-sim".into(),
        targets: &fleet.infos,
        counters: fleet.clusters.iter().map(|c| c.counter.clone()).collect(),
    };
    let real_steps = scenario::run(&plugin, &upstream, &real)
        .await
        .expect("scenario on real API servers");
    let sim_steps = scenario::run(&plugin, &upstream, &sim)
        .await
        .expect("scenario on fleetsim");
    eprintln!("both scenarios ran after {:?}", started.elapsed());
    for (r, s) in real_steps.iter().zip(&sim_steps) {
        eprintln!(
            "{}: exit {} / {}; writes {:?}\n{:#}",
            r.name,
            r.exit_code,
            s.exit_code,
            r.writes(),
            r.output
        );
        assert_eq!(
            r.writes(),
            s.writes(),
            "{}: writes per cluster differ (real, then fleetsim)",
            r.name
        );
        assert_eq!(
            r.requests, s.requests,
            "{}: requests per cluster differ (real, then fleetsim)",
            r.name
        );
        assert_eq!(r.exit_code, s.exit_code, "{}: exit codes differ", r.name);
        assert_eq!(
            r.output, s.output,
            "{}: output differs\nreal: {:#}\nfleetsim: {:#}",
            r.name, r.output, s.output
        );
    }
    let by_name = |name: &str| {
        real_steps
            .iter()
            .find(|s| s.name == name)
            .expect("step ran")
    };
    // The scenario exercises what it claims: copies written cold, none unchanged, one copy per cluster
    // re-applied after the edit, the dropped ConfigMap pruned everywhere.
    let total = |step: &scenario::Step| step.writes().iter().flat_map(|c| c.values()).sum::<u64>();
    assert!(
        total(by_name("cold propagate")) >= 8,
        "{:?}",
        by_name("cold propagate").writes()
    );
    assert_eq!(
        total(by_name("unchanged propagate")),
        0,
        "{:?}",
        by_name("unchanged propagate").writes()
    );
    assert!(
        total(by_name("source edit")) >= 3,
        "{:?}",
        by_name("source edit").writes()
    );
    // A cold cluster costs its identity, the two lists of copies, one read of the destination namespace
    // (shared by observation and the write), the namespace and the copies: no per-copy GETs in a namespace
    // that does not exist, and no workload lists in the namespace the run itself created.
    let cold: Counts = [
        (("GET", "namespaces"), 2),
        (("LIST", "secrets"), 1),
        (("LIST", "configmaps"), 1),
        (("POST", "namespaces"), 1),
        (("POST", "secrets"), 2),
        (("POST", "configmaps"), 1),
    ]
    .into_iter()
    .map(|((v, r), n)| ((v.to_owned(), r.to_owned()), n))
    .collect();
    for cluster in &by_name("cold propagate").requests[1..] {
        assert_eq!(cluster, &cold, "requests of a cold cluster");
    }
    for cluster in by_name("prune").writes() {
        assert_eq!(
            cluster.get(&("DELETE".to_owned(), "configmaps".to_owned())),
            Some(&1),
            "{cluster:?}"
        );
    }
    assert_eq!(real_steps.len(), 5);
}
