//! `helmop-bench webhook`: the real webhook (live `AppState` against a private control plane, real `Server`)
//! against two baselines, bare axum + rustls and the same decoding and encoding the AdmissionReview, scenario by
//! scenario, in one run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use helmop_core::podrefs::{Keys, PodRef};
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_webhook::state::{AppState, Config, HashKeyState, Options};
use helmop_webhook::{Metrics, ServeOptions, Server};

use crate::fixtures::{self, BIG_CONFIG_MAP, NAMESPACE};
use crate::load::{self, Load, Outcome, Target};
use crate::pki::{Pki, SecretVolume};
use crate::stats::ms;
use crate::{baseline, scenarios};

#[derive(Debug, Clone)]
pub struct Settings {
    /// Each scenario runs once per connection count (1 shows latency without queueing, 8 throughput).
    pub connections: Vec<usize>,
    pub duration: Duration,
    pub warmup: Duration,
    /// `duration` and `warmup` are split into this many rounds, the contenders alternating.
    pub rounds: u32,
    /// Where the webhook's JSON log lines go (production logs one line per request; its cost is included).
    pub log_file: Option<std::path::PathBuf>,
    /// Run only the scenarios whose name starts with this (`validate`, `mutate`).
    pub only: Option<String>,
}

pub struct Row {
    pub scenario: &'static str,
    pub connections: usize,
    pub baseline: Outcome,
    /// The baseline that also decodes the review and encodes its answer.
    pub decoding: Outcome,
    pub webhook: Outcome,
    pub response_bytes: usize,
}

/// Mutate against its floor: a Deployment reading `refs` Secrets through the webhook, and one metadata GET of
/// one of those Secrets by a bare kube client, at the same concurrency against the same API server.
pub struct FloorRow {
    pub refs: usize,
    pub concurrency: usize,
    pub get: Outcome,
    /// `refs` metadata GETs sent together by the bare client, one per Secret (for `refs` > 1): what reading every
    /// reference afresh costs without the webhook.
    pub gets: Option<Outcome>,
    pub mutate: Outcome,
    /// Live GETs the webhook sent per measured admission (its own count, `helmop_webhook_live_gets_total`).
    pub gets_per_admission: f64,
    /// Live LISTs the webhook sent per measured admission (`helmop_webhook_live_lists_total`).
    pub lists_per_admission: f64,
}

/// Reference counts of the floor scenarios.
pub const FLOOR_REFS: [usize; 2] = [1, 8];

pub struct Report {
    pub rows: Vec<Row>,
    pub floor: Vec<FloorRow>,
    pub digest_hit: Duration,
    pub digest_miss: Duration,
}

/// Logs as production does (`--log-format json`, level info, the same subscriber) into a file.
fn init_logging(path: &std::path::Path) -> anyhow::Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    helmop_webhook::app::init_tracing_to(
        helmop_webhook::cli::LogFormat::Json,
        Mutex::new(file),
        false,
    );
    Ok(())
}

async fn wait_ready(state: &AppState, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !state.ready() {
        if Instant::now() > deadline {
            bail!("the webhook caches did not sync within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Average time of `AppState::observe` on the 1 MiB ConfigMap: with the digest cached (live metadata GET +
/// cache hit) and uncached (live GET of the object + digest), each over `n` calls.
async fn digest_costs(state: &AppState, n: u32) -> anyhow::Result<(Duration, Duration)> {
    let HashKeyState::Loaded { key, generation } = state.hash_key() else {
        bail!("the hash key is not loaded");
    };
    let r = PodRef::new(
        ResourceRef::new(ResourceKind::ConfigMap, BIG_CONFIG_MAP),
        Keys::All,
        false,
    );
    state.observe(NAMESPACE, &r, &key, generation).await?;
    let start = Instant::now();
    for _ in 0..n {
        state.observe(NAMESPACE, &r, &key, generation).await?;
    }
    let hit = start.elapsed() / n;
    let start = Instant::now();
    for i in 0..n {
        // A key generation never used before: a guaranteed miss.
        state
            .observe(NAMESPACE, &r, &key, u64::MAX - u64::from(i))
            .await?;
    }
    let miss = start.elapsed() / n;
    Ok((hit, miss))
}

pub async fn run(settings: &Settings) -> anyhow::Result<Report> {
    let log_dir = tempfile::Builder::new()
        .prefix("helmop-bench-log-")
        .tempdir()?;
    let log_path = settings
        .log_file
        .clone()
        .unwrap_or_else(|| log_dir.path().join("webhook.log"));
    init_logging(&log_path)?;

    eprintln!("starting a private control plane ...");
    let cluster = fixtures::start(&["bench"]).await?;
    fixtures::create_hash_key(&cluster.client).await?;
    fixtures::create_scenario_objects(&cluster.client).await?;
    let max_refs = FLOOR_REFS.into_iter().max().unwrap_or(0);
    fixtures::create_ref_secrets(&cluster.client, max_refs).await?;

    let metrics = Metrics::new();
    // Options::default(): no image resolver; the scenario's image has a fixed tag so production would not
    // ask a registry either.
    let state = AppState::start_with(
        cluster.client.clone(),
        Config::default(),
        &metrics,
        Options::default(),
    )
    .await?;
    wait_ready(&state, Duration::from_secs(60)).await?;

    let pki = Pki::new()?;
    let leaf = pki.leaf("helmop-webhook")?;
    let volume = SecretVolume::new(&leaf)?;
    let options = ServeOptions {
        listen: "127.0.0.1:0".parse()?,
        admin_listen: "127.0.0.1:0".parse()?,
        tls_cert: volume.cert(),
        tls_key: volume.key(),
        ..ServeOptions::default()
    };
    let server = Server::bind(options, Arc::new(state.clone()), metrics.clone()).await?;
    let webhook_addr = server.webhook_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let tls = pki.client_config()?;

    let cases = [
        (
            "validate HelmOp (cached lookups)",
            "/validate/helmops",
            scenarios::validate_helmop(),
            scenarios::clean_allow(),
        ),
        (
            "mutate Deployment (1 MiB ConfigMap + 3 Secrets, digests cached)",
            "/mutate/workloads",
            scenarios::mutate_deployment(),
            scenarios::patched(),
        ),
    ];
    let mut rows = Vec::new();
    for (scenario, path, body, check) in cases {
        if settings
            .only
            .as_deref()
            .is_some_and(|o| !scenario.starts_with(o))
        {
            continue;
        }
        let target = Target {
            addr: webhook_addr,
            tls: tls.clone(),
            path: path.to_owned(),
            body,
            check,
        };
        // The webhook's real answer, also the baseline's fixed answer (same size on the wire).
        let answer = load::probe(&target)
            .await
            .with_context(|| format!("probing {scenario}"))?;
        anyhow::ensure!(
            (target.check)(&answer),
            "{scenario}: unexpected answer {}",
            String::from_utf8_lossy(&answer)
        );
        let base = baseline::start(&leaf, answer.clone(), baseline::Mode::Bare).await?;
        let base_target = Target {
            addr: base.addr,
            ..target.clone()
        };
        let decoding = baseline::start(&leaf, answer.clone(), baseline::Mode::Decoding).await?;
        let decoding_target = Target {
            addr: decoding.addr,
            ..target.clone()
        };
        for &connections in &settings.connections {
            let load = round_load(settings, connections);
            eprintln!(
                "{scenario}, {connections} connection(s): baseline and webhook, {} rounds ...",
                settings.rounds
            );
            let (mut baseline, mut decoded, mut webhook) =
                (Outcome::default(), Outcome::default(), Outcome::default());
            for _ in 0..settings.rounds {
                baseline.absorb(load::run(&base_target, &load).await);
                decoded.absorb(load::run(&decoding_target, &load).await);
                webhook.absorb(load::run(&target, &load).await);
            }
            rows.push(Row {
                scenario,
                connections,
                baseline,
                decoding: decoded,
                webhook,
                response_bytes: answer.len(),
            });
        }
        drop(base);
        drop(decoding);
    }
    let floor = if settings
        .only
        .as_deref()
        .is_none_or(|o| "floor".starts_with(o))
    {
        floor_rows(&cluster, &tls, webhook_addr, &metrics, settings).await?
    } else {
        Vec::new()
    };
    let (digest_hit, digest_miss) = digest_costs(&state, 200).await?;

    let _ = stop.send(());
    let _ = serving.await;
    Ok(Report {
        rows,
        floor,
        digest_hit,
        digest_miss,
    })
}

/// One round of a contender: the measured seconds and the warm-up divided by the number of rounds.
fn round_load(settings: &Settings, connections: usize) -> Load {
    Load {
        connections,
        duration: settings.duration / settings.rounds,
        warmup: settings.warmup / settings.rounds,
        requests_per_connection: None,
    }
}

/// Each floor scenario: the bare GET loop, the N GETs at once, then the webhook, in alternating rounds, at each
/// concurrency.
async fn floor_rows(
    cluster: &fixtures::Cluster,
    tls: &Arc<rustls::ClientConfig>,
    webhook_addr: std::net::SocketAddr,
    metrics: &Metrics,
    settings: &Settings,
) -> anyhow::Result<Vec<FloorRow>> {
    // Its own client, built like the webhook's (same kubeconfig, same kube client stack), so neither shares the
    // other's connections.
    let client = cluster.info().client().await;
    let mut rows = Vec::new();
    for refs in FLOOR_REFS {
        let target = Target {
            addr: webhook_addr,
            tls: tls.clone(),
            path: "/mutate/workloads".to_owned(),
            body: scenarios::mutate_reading(refs),
            check: scenarios::patched(),
        };
        let answer = load::probe(&target)
            .await
            .with_context(|| format!("probing mutate with {refs} references"))?;
        anyhow::ensure!(
            (target.check)(&answer),
            "mutate with {refs} references: unexpected answer {}",
            String::from_utf8_lossy(&answer)
        );
        for &concurrency in &settings.connections {
            let load = round_load(settings, concurrency);
            eprintln!(
                "floor, {refs} reference(s), concurrency {concurrency}: GETs and webhook, {} rounds ...",
                settings.rounds
            );
            let (mut get, mut gets, mut mutate) =
                (Outcome::default(), None::<Outcome>, Outcome::default());
            let (mut sent, mut listed, mut answered) = (0, 0, 0);
            for _ in 0..settings.rounds {
                let api = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
                    client.clone(),
                    fixtures::NAMESPACE,
                );
                let name = fixtures::ref_secret(0);
                get.absorb(
                    load::run_calls(&load, move || {
                        let (api, name) = (api.clone(), name.clone());
                        async move {
                            api.get_metadata(&name)
                                .await
                                .map(|m| {
                                    std::hint::black_box(m);
                                })
                                .map_err(|e| e.to_string())
                        }
                    })
                    .await,
                );
                if refs > 1 {
                    let api = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
                        client.clone(),
                        fixtures::NAMESPACE,
                    );
                    let round = load::run_calls(&load, move || {
                        let api = api.clone();
                        async move {
                            let all = (0..refs).map(|i| {
                                let api = api.clone();
                                async move { api.get_metadata(&fixtures::ref_secret(i)).await }
                            });
                            for result in futures::future::join_all(all).await {
                                std::hint::black_box(result.map_err(|e| e.to_string())?);
                            }
                            Ok(())
                        }
                    })
                    .await;
                    gets.get_or_insert_with(Outcome::default).absorb(round);
                }
                let before = metrics.live_gets("secrets");
                let lists_before = metrics.live_lists("secrets");
                let requests_before =
                    metrics.requests("workloads", helmop_webhook::metrics::Outcome::Patched);
                mutate.absorb(load::run(&target, &load).await);
                sent += metrics.live_gets("secrets") - before;
                listed += metrics.live_lists("secrets") - lists_before;
                answered += metrics
                    .requests("workloads", helmop_webhook::metrics::Outcome::Patched)
                    - requests_before;
            }
            rows.push(FloorRow {
                refs,
                concurrency,
                get,
                gets,
                mutate,
                gets_per_admission: sent as f64 / (answered.max(1)) as f64,
                lists_per_admission: listed as f64 / (answered.max(1)) as f64,
            });
        }
    }
    Ok(rows)
}

pub fn floor_table(report: &Report) -> String {
    let mut out = String::from(
        "Mutate against its floor: a Deployment reading N small Secrets (envFrom) through the webhook, against one \
         metadata GET of one of those Secrets by a bare kube client (same kubeconfig, same client stack), at the \
         same concurrency against the same API server, in the same run.\n\n\
         For N > 1 the bare client also sends the N GETs at once (one per Secret, what a fresh read of every \
         reference costs without the webhook).\n\n\
         | references | concurrency | one GET: req/s | p50 ms | p99 ms | N GETs at once: p50 ms | p99 ms | mutate: req/s | p50 ms | p99 ms | live GETs per admission | live LISTs per admission | errors (GET / N GETs / mutate) | p50 ratio to one GET (goal <= 1.25) | p99 ratio | p50 ratio to N GETs |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n",
    );
    for row in &report.floor {
        let ratio = |q: f64| {
            row.mutate.latencies.quantile(q).as_secs_f64()
                / row.get.latencies.quantile(q).as_secs_f64().max(1e-9)
        };
        let gets = |f: &dyn Fn(&Outcome) -> String| row.gets.as_ref().map_or("-".to_owned(), f);
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {:.0} | {} | {} | {:.2} | {:.2} | {} / {} / {} | {:.2} | {:.2} | {} |\n",
            row.refs,
            row.concurrency,
            row.get.per_second(),
            ms(row.get.latencies.quantile(0.5)),
            ms(row.get.latencies.quantile(0.99)),
            gets(&|o| ms(o.latencies.quantile(0.5))),
            gets(&|o| ms(o.latencies.quantile(0.99))),
            row.mutate.per_second(),
            ms(row.mutate.latencies.quantile(0.5)),
            ms(row.mutate.latencies.quantile(0.99)),
            row.gets_per_admission,
            row.lists_per_admission,
            errors(&row.get),
            gets(&errors),
            errors(&row.mutate),
            ratio(0.5),
            ratio(0.99),
            gets(&|o| format!(
                "{:.2}",
                row.mutate.latencies.quantile(0.5).as_secs_f64()
                    / o.latencies.quantile(0.5).as_secs_f64().max(1e-9)
            )),
        ));
    }
    out
}

fn errors(o: &Outcome) -> String {
    match &o.first_error {
        Some(e) if o.errors > 0 => {
            format!("{} ({})", o.errors, e.chars().take(80).collect::<String>())
        }
        _ => o.errors.to_string(),
    }
}

pub fn table(report: &Report, settings: &Settings) -> String {
    let mut out = format!(
        "Keep-alive HTTP/1.1 connections over TLS 1.3 on loopback (closed loop: each connection sends its next request \
         when the answer is in), {} s measured after {} s warm-up per server and connection count, split into {} \
         rounds with the three servers alternating; load generator, servers and the kube-apiserver share the \
         same 2 CPUs.\n\n\
         CPU µs/request is this process's CPU time (load generator and server together, nothing else runs in it) \
         over the requests answered; its ratio (baseline / webhook) is the throughput ratio the two would reach on \
         CPUs of their own, which this shared machine does not give.\n\n\
         Ratios are the webhook's against each baseline: throughput (webhook / baseline req/s) and CPU (baseline \
         / webhook µs per request). The goal is against the decoding baseline, the least any webhook does.\n\n\
         | scenario | connections | server | req/s | p50 ms | p99 ms | p99.9 ms | errors | CPU µs/request | throughput ratio to bare | CPU ratio to bare | throughput ratio to decoding (goal >= 0.8) | CPU ratio to decoding (goal >= 0.8) |\n\
         |---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        settings.duration.as_secs(),
        settings.warmup.as_secs(),
        settings.rounds
    );
    let ratios = |base: &Outcome, row: &Row| {
        (
            format!(
                "{:.3}",
                row.webhook.per_second() / base.per_second().max(1e-9)
            ),
            format!(
                "{:.3}",
                base.cpu_us_per_request() / row.webhook.cpu_us_per_request().max(1e-9)
            ),
        )
    };
    for row in &report.rows {
        for (server, o) in [
            ("baseline (bare)", &row.baseline),
            ("baseline (decoding)", &row.decoding),
            ("helmop-webhook", &row.webhook),
        ] {
            let ((bare, bare_cpu), (decoding, decoding_cpu)) = if server == "helmop-webhook" {
                (ratios(&row.baseline, row), ratios(&row.decoding, row))
            } else {
                Default::default()
            };
            out.push_str(&format!(
                "| {} ({} B answer) | {} | {server} | {:.0} | {} | {} | {} | {} | {:.1} | {bare} | {bare_cpu} | {decoding} | {decoding_cpu} |\n",
                row.scenario,
                row.response_bytes,
                row.connections,
                o.per_second(),
                ms(o.latencies.quantile(0.5)),
                ms(o.latencies.quantile(0.99)),
                ms(o.latencies.quantile(0.999)),
                errors(o),
                o.cpu_us_per_request(),
            ));
        }
    }
    out.push_str(&format!(
        "\nDigest of the 1 MiB ConfigMap through `AppState::observe`: cached {} µs per call (live metadata GET + cache hit), \
         uncached {} µs per call (live GET of the object + keyed digest).\n",
        report.digest_hit.as_micros(),
        report.digest_miss.as_micros()
    ));
    out
}
