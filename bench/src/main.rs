//! `helmop-bench`: the measurements behind docs/performance.md. Every subcommand prints Markdown (the machine
//! first) ready to paste; progress goes to stderr.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use helmop_bench::fleet::bench::{self as fleet, FleetSettings};
use helmop_bench::foreign::{self, ForeignSettings};
use helmop_bench::hostile::{self, HostileSettings};
use helmop_bench::memory::{self, MemorySettings};
use helmop_bench::propagate::{self, PropagateSettings};
use helmop_bench::rollout_budget::{self, RolloutBudgetSettings};
use helmop_bench::rollout_watch::{self, RolloutWatchSettings};
use helmop_bench::soak::{self, SoakSettings};
use helmop_bench::watch::{self, WatchSettings};
use helmop_bench::{decode, hash, machine, webhook};

#[derive(Parser)]
#[command(
    name = "helmop-bench",
    version,
    about = "helmop benchmarks, load and soak runs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Webhook throughput and latency over TLS against two baselines, bare axum + rustls and the same decoding and encoding the review (private control plane).
    Webhook {
        /// Connection counts, each a separate run (comma separated).
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        connections: Vec<usize>,
        /// Measured seconds per server and scenario.
        #[arg(long, default_value_t = 15)]
        seconds: u64,
        #[arg(long, default_value_t = 3)]
        warmup_seconds: u64,
        /// Rounds the measured seconds are split into, the servers alternating, so that a change of
        /// the machine's load (other processes) hits each alike; the warm-up is split the same way.
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// Keep the webhook's JSON log here (default: a temporary file).
        #[arg(long)]
        log_file: Option<PathBuf>,
        /// Only the scenarios starting with this: `validate`, `mutate` or `floor` (mutate against one GET).
        #[arg(long)]
        only: Option<String>,
    },
    /// Decoding the lists a run reads downstream: kube's way against the plugin's (no `managedFields`).
    Decode {
        /// Objects per list.
        #[arg(long, default_value_t = 50)]
        items: usize,
        #[arg(long, default_value_t = 9)]
        rounds: usize,
    },
    /// Keyed hash throughput against raw HMAC-SHA256 over the same bytes.
    Hash {
        #[arg(long, default_value_t = 9)]
        rounds: usize,
    },
    /// Propagation wall time and API-server-counted writes, cold and unchanged.
    Propagate {
        /// `kubectl-helmop` to run (default: next to this binary).
        #[arg(long)]
        plugin_bin: Option<PathBuf>,
        #[arg(long, default_value_t = 2)]
        apiservers: usize,
        /// Cluster counts (comma separated).
        #[arg(long, value_delimiter = ',', default_value = "4,16,32")]
        clusters: Vec<usize>,
        #[arg(long, default_value_t = 10)]
        resources: usize,
        #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
        concurrency: Vec<usize>,
    },
    /// `propagate --watch`: edit-to-copies and edit-to-rollout latency, RSS over edits, idle CPU, open sockets.
    Watch {
        /// `kubectl-helmop` to run (default: next to this binary).
        #[arg(long)]
        plugin_bin: Option<PathBuf>,
        /// What the Fleet Clusters point at: real kube-apiservers (with the webhook and a controller-manager,
        /// so readers roll) or one simulated cluster each (fleetsim: N = 100 or 1000 on one machine).
        #[arg(long, value_enum, default_value = "apiservers")]
        downstream: watch::Downstream,
        /// Real downstream API servers (`--downstream apiservers`).
        #[arg(long, default_value_t = 2)]
        apiservers: usize,
        /// Cluster counts (comma separated).
        #[arg(long, value_delimiter = ',', default_value = "2")]
        clusters: Vec<usize>,
        #[arg(long, default_value_t = 4)]
        resources: usize,
        /// Source edits per (clusters, debounce).
        #[arg(long, default_value_t = 20)]
        edits: usize,
        /// `--debounce` values for the watcher (comma separated).
        #[arg(long, value_delimiter = ',', default_value = "1s")]
        debounce: Vec<String>,
        /// Shard counts K (comma separated), each a separate row: K > 1 splits the Clusters over K
        /// HelmOps labelled fleet.cattle.io/shard-ref=shardI (cluster c to shard c % K), one watcher per
        /// shard (`--shard-id shardI`); 1 is one unlabelled HelmOp and one watcher without `--shard-id`.
        #[arg(long, value_delimiter = ',', default_value = "1")]
        shards: Vec<usize>,
        /// Seconds of each idle CPU measurement.
        #[arg(long, default_value_t = 20)]
        idle_seconds: u64,
        /// Milliseconds between one edit's rollout and the next edit.
        #[arg(long, default_value_t = 500)]
        gap_ms: u64,
        /// Extra flag for the watcher, e.g. `--watcher-arg=--resync=0` (repeatable).
        #[arg(long = "watcher-arg", allow_hyphen_values = true)]
        watcher_args: Vec<String>,
        /// Seconds between two check-ins of each Cluster's agent (and two status writes of the HelmOp)
        /// upstream while measuring, as a running Fleet writes them; 0 for a quiet fleet.
        #[arg(long, default_value_t = 15)]
        churn_seconds: u64,
    },
    /// `rollout -A --watch`: change -> restamp latency, RSS against a watcher caching every Secret and
    /// ConfigMap whole, idle CPU, in a cluster of many Secrets and ConfigMaps mostly read by no workload.
    RolloutWatch {
        /// `kubectl-helmop` to run (default: next to this binary).
        #[arg(long)]
        plugin_bin: Option<PathBuf>,
        /// The baseline `helmop-bench-reflector` (default: next to this binary).
        #[arg(long)]
        baseline_bin: Option<PathBuf>,
        /// Opted-in workload counts (comma separated), each a separate watcher.
        #[arg(long, value_delimiter = ',', default_value = "100")]
        workloads: Vec<usize>,
        /// Secrets created, and as many ConfigMaps.
        #[arg(long, default_value_t = 1000)]
        objects: usize,
        #[arg(long, default_value_t = 20)]
        namespaces: usize,
        /// Requests in flight while creating objects and workloads.
        #[arg(long, default_value_t = 32)]
        parallel: usize,
        /// Rounds of changes (RSS is sampled after each).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Changes per round, one at a time.
        #[arg(long, default_value_t = 20)]
        changes: usize,
        /// Seconds of each idle CPU measurement.
        #[arg(long, default_value_t = 30)]
        idle_seconds: u64,
        /// Milliseconds between one restamp landing and the next change.
        #[arg(long, default_value_t = 100)]
        gap_ms: u64,
        /// Rounds of changes the baseline gets (default: --rounds). A long soak of the watcher
        /// (`--rounds 12 --changes 60 --gap-ms 5000`: an hour) need not be repeated for the baseline,
        /// whose RSS holds every object whatever changes.
        #[arg(long)]
        baseline_rounds: Option<usize>,
        /// Extra flag for the watcher, e.g. `--watcher-arg=--max-concurrent=16`, or
        /// `--watcher-arg=--images` as the manifest runs it (repeatable). The brakes are off unless
        /// a flag here names them.
        #[arg(long = "watcher-arg", allow_hyphen_values = true)]
        watcher_args: Vec<String>,
    },
    /// `rollout -A --watch` with its brakes as shipped against a change every workload reads (a CA
    /// bundle rotated in every namespace), with a controller-manager ending the rollouts: time until
    /// every workload rolled, the most rolling at once against the roll budget, the watcher's RSS and CPU.
    RolloutBudget {
        /// `kubectl-helmop` to run (default: next to this binary).
        #[arg(long)]
        plugin_bin: Option<PathBuf>,
        /// Opted-in Deployments (replicas 0), spread over the namespaces.
        #[arg(long, default_value_t = 200)]
        workloads: usize,
        #[arg(long, default_value_t = 20)]
        namespaces: usize,
        /// Requests in flight while creating the Deployments.
        #[arg(long, default_value_t = 32)]
        parallel: usize,
        /// The watcher's `--max-rolling` (default: the watcher's, 10).
        #[arg(long)]
        max_rolling: Option<u32>,
        /// The watcher's `--max-rolling-per-namespace` (default: the watcher's, 3).
        #[arg(long)]
        max_rolling_per_namespace: Option<u32>,
        /// The kube-controller-manager's `--kube-api-qps` (burst twice that), through
        /// HELMOP_CP_KCM_QPS; 0 keeps its default (20 requests/s per controller: the deployment
        /// controller then finished 5 rollouts a second, docs/performance.md section 8). The bench
        /// runs itself again with the variable set when it differs.
        #[arg(long, default_value_t = 500)]
        kcm_qps: u32,
        /// Seconds of each idle CPU measurement of the watcher.
        #[arg(long, default_value_t = 30)]
        idle_seconds: u64,
        /// The longest one change may take until every workload rolled.
        #[arg(long, default_value_t = 3600)]
        timeout_seconds: u64,
        /// Cluster-wide changes, one after the other (RSS after each).
        #[arg(long, default_value_t = 1)]
        changes: usize,
        /// Seconds between one change having rolled everything and the next (longer than the
        /// watcher's --min-roll-interval, 30 s, so that none is held back by it).
        #[arg(long, default_value_t = 35)]
        pause_seconds: u64,
        /// Extra flag for the watcher, e.g. `--watcher-arg=--images` (repeatable).
        #[arg(long = "watcher-arg", allow_hyphen_values = true)]
        watcher_args: Vec<String>,
    },
    /// Cold propagate over N distinct (simulated) clusters against a bare client loop writing the same objects
    /// at the same concurrency, then the unchanged rerun; real kube-apiservers as the reference.
    Fleet {
        /// `kubectl-helmop` to run (default: next to this binary).
        #[arg(long)]
        plugin_bin: Option<PathBuf>,
        /// Simulated cluster counts (comma separated).
        #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
        clusters: Vec<usize>,
        #[arg(long, default_value_t = 10)]
        resources: usize,
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Real downstream kube-apiservers for the reference run (0 skips it).
        #[arg(long, default_value_t = 3)]
        real: usize,
    },
    /// Peak memory of `propagate -A` against N foreign labelled objects downstream.
    Foreign {
        #[arg(long)]
        plugin_bin: Option<PathBuf>,
        /// An earlier build to run side by side.
        #[arg(long)]
        baseline_bin: Option<PathBuf>,
        #[arg(long, value_delimiter = ',', default_value = "0,50,200")]
        objects: Vec<usize>,
        #[arg(long, default_value_t = 900)]
        object_kib: usize,
        #[arg(long, default_value_t = 4)]
        resources: usize,
    },
    /// Webhook process RSS with many Secrets and ConfigMaps cached, then under a soak with certificate rotations.
    Memory {
        /// `helmop-webhook` to run (default: next to this binary).
        #[arg(long)]
        webhook_bin: Option<PathBuf>,
        /// Secrets created, and as many ConfigMaps.
        #[arg(long, default_value_t = 10_000)]
        objects: usize,
        #[arg(long, default_value_t = 20)]
        namespaces: usize,
        #[arg(long, default_value_t = 32)]
        parallel: usize,
        /// Soak length after the caches are full (600 for the documented 10-minute soak; 0 skips it).
        #[arg(long, default_value_t = 60)]
        soak_seconds: u64,
        #[arg(long, default_value_t = 8)]
        connections: usize,
        #[arg(long, default_value_t = 15)]
        rotate_every_seconds: u64,
    },
    /// Webhook process RSS under hostile input: concurrent 7 MiB bodies, then HelmOps with 1 MiB of values.
    Hostile {
        /// `helmop-webhook` to run (default: next to this binary).
        #[arg(long)]
        webhook_bin: Option<PathBuf>,
        #[arg(long, default_value_t = 50)]
        bodies: usize,
        #[arg(long, default_value_t = 7 * 1024 * 1024)]
        body_bytes: usize,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[arg(long, default_value_t = 50)]
        helmops: usize,
        #[arg(long, default_value_t = 1024 * 1024)]
        values_bytes: usize,
        /// Extra flag for the webhook, e.g. `--webhook-arg=--max-in-flight-bytes=1099511627776` (repeatable).
        #[arg(long = "webhook-arg", allow_hyphen_values = true)]
        webhook_args: Vec<String>,
        /// Dense lists (`[0,0,...]`) instead of one long string, in the values and the bodies (UPDATEs).
        #[arg(long)]
        dense: bool,
        /// Pin the webhook to one CPU (`taskset`), as `limits.cpu: "1"` gives it.
        #[arg(long)]
        one_cpu: bool,
    },
    /// The in-process soak (real server, stub decisions, certificate rotations); `--check` fails on any error.
    Soak {
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        #[arg(long, default_value_t = 8)]
        connections: usize,
        #[arg(long, default_value_t = 5)]
        rotate_every_seconds: u64,
        /// Exit 1 unless there were zero errors, every rotation was picked up and RSS stayed within 16 MiB.
        #[arg(long)]
        check: bool,
    },
}

fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// `rollout-budget` starts its control plane with `HELMOP_CP_KCM_QPS` in the environment (the harness's
/// `cp up` inherits this process's), which safe Rust cannot change in a running process: when it differs
/// from what `--kcm-qps` asks, the same command line runs again with it set, and its exit is this one's.
fn rerun_with(key: &str, want: Option<String>) -> Option<std::process::ExitCode> {
    if std::env::var(key).ok() == want {
        return None;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("helmop-bench: cannot find this executable to set {key}: {e}");
            return Some(std::process::ExitCode::FAILURE);
        }
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(std::env::args_os().skip(1));
    match &want {
        Some(v) => cmd.env(key, v),
        None => cmd.env_remove(key),
    };
    Some(match cmd.status() {
        Ok(status) => status.code().and_then(|c| u8::try_from(c).ok()).map_or(
            std::process::ExitCode::FAILURE,
            std::process::ExitCode::from,
        ),
        Err(e) => {
            eprintln!("helmop-bench: running again with {key} set: {e}");
            std::process::ExitCode::FAILURE
        }
    })
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Command::RolloutBudget { kcm_qps, .. } = &cli.command
        && let Some(code) = rerun_with(
            rollout_budget::KCM_QPS_ENV,
            rollout_budget::kcm_qps_env(*kcm_qps),
        )
    {
        return code;
    }
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("helmop-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    println!("Machine: {}\n", machine::describe());
    match cli.command {
        Command::Webhook {
            connections,
            seconds,
            warmup_seconds,
            rounds,
            log_file,
            only,
        } => {
            let settings = webhook::Settings {
                connections,
                duration: Duration::from_secs(seconds),
                warmup: Duration::from_secs(warmup_seconds),
                rounds: rounds.max(1),
                log_file,
                only,
            };
            let report = webhook::run(&settings).await?;
            println!("{}", webhook::table(&report, &settings));
            if !report.floor.is_empty() {
                println!("{}", webhook::floor_table(&report));
            }
        }
        Command::Decode { items, rounds } => {
            let rows = tokio::task::spawn_blocking(move || decode::run(items, rounds)).await??;
            println!("{}", decode::table(&rows));
        }
        Command::Hash { rounds } => {
            let rows = tokio::task::spawn_blocking(move || hash::run(rounds)).await??;
            println!("{}", hash::table(&rows));
        }
        Command::Propagate {
            plugin_bin,
            apiservers,
            clusters,
            resources,
            concurrency,
        } => {
            let settings = PropagateSettings {
                plugin_bin: plugin_bin.unwrap_or_else(|| sibling("kubectl-helmop")),
                apiservers,
                clusters,
                resources,
                concurrency,
            };
            let rows = propagate::run(&settings).await?;
            println!("{}", propagate::table(&rows, &settings));
        }
        Command::Watch {
            plugin_bin,
            downstream,
            apiservers,
            clusters,
            resources,
            edits,
            debounce,
            shards,
            idle_seconds,
            gap_ms,
            watcher_args,
            churn_seconds,
        } => {
            let settings = WatchSettings {
                plugin_bin: plugin_bin.unwrap_or_else(|| sibling("kubectl-helmop")),
                downstream,
                apiservers,
                clusters,
                resources,
                edits,
                debounces: debounce,
                shards,
                idle: Duration::from_secs(idle_seconds),
                gap: Duration::from_millis(gap_ms),
                extra_args: watcher_args,
                churn: (churn_seconds > 0).then(|| Duration::from_secs(churn_seconds)),
            };
            let rows = watch::run(&settings).await?;
            println!("{}", watch::table(&rows, &settings));
        }
        Command::RolloutWatch {
            plugin_bin,
            baseline_bin,
            workloads,
            objects,
            namespaces,
            parallel,
            rounds,
            changes,
            idle_seconds,
            gap_ms,
            baseline_rounds,
            watcher_args,
        } => {
            let settings = RolloutWatchSettings {
                plugin_bin: plugin_bin.unwrap_or_else(|| sibling("kubectl-helmop")),
                baseline_bin: baseline_bin.unwrap_or_else(|| sibling("helmop-bench-reflector")),
                workloads,
                objects,
                namespaces,
                parallel,
                rounds,
                changes: changes.max(1),
                idle: Duration::from_secs(idle_seconds),
                gap: Duration::from_millis(gap_ms),
                baseline_rounds: baseline_rounds.unwrap_or(rounds),
                extra_args: watcher_args,
            };
            let report = rollout_watch::run(&settings).await?;
            println!("{}", rollout_watch::table(&report, &settings));
        }
        Command::RolloutBudget {
            plugin_bin,
            workloads,
            namespaces,
            parallel,
            max_rolling,
            max_rolling_per_namespace,
            kcm_qps: _,
            idle_seconds,
            timeout_seconds,
            changes,
            pause_seconds,
            watcher_args,
        } => {
            let mut extra_args = Vec::new();
            if let Some(m) = max_rolling {
                extra_args.extend(["--max-rolling".to_owned(), m.to_string()]);
            }
            if let Some(m) = max_rolling_per_namespace {
                extra_args.extend(["--max-rolling-per-namespace".to_owned(), m.to_string()]);
            }
            extra_args.extend(watcher_args);
            let settings = RolloutBudgetSettings {
                plugin_bin: plugin_bin.unwrap_or_else(|| sibling("kubectl-helmop")),
                workloads,
                namespaces,
                parallel,
                idle: Duration::from_secs(idle_seconds),
                timeout: Duration::from_secs(timeout_seconds),
                changes: changes.max(1),
                pause: Duration::from_secs(pause_seconds),
                extra_args,
            };
            let report = rollout_budget::run(&settings).await?;
            println!("{}", rollout_budget::table(&report, &settings));
        }
        Command::Fleet {
            plugin_bin,
            clusters,
            resources,
            concurrency,
            real,
        } => {
            let settings = FleetSettings {
                plugin_bin: plugin_bin.unwrap_or_else(|| sibling("kubectl-helmop")),
                clusters,
                resources,
                concurrency,
                real,
            };
            let rows = fleet::run(&settings).await?;
            println!("{}", fleet::table(&rows, &settings));
        }
        Command::Foreign {
            plugin_bin,
            baseline_bin,
            objects,
            object_kib,
            resources,
        } => {
            let settings = ForeignSettings {
                plugin_bin: plugin_bin.unwrap_or_else(|| sibling("kubectl-helmop")),
                baseline_bin,
                objects,
                object_kib,
                resources,
            };
            let samples = foreign::run(&settings).await?;
            println!("{}", foreign::table(&samples, &settings));
        }
        Command::Memory {
            webhook_bin,
            objects,
            namespaces,
            parallel,
            soak_seconds,
            connections,
            rotate_every_seconds,
        } => {
            let settings = MemorySettings {
                webhook_bin: webhook_bin.unwrap_or_else(|| sibling("helmop-webhook")),
                per_kind: objects,
                namespaces,
                parallel,
                soak: SoakSettings {
                    duration: Duration::from_secs(soak_seconds),
                    connections,
                    rotate_every: Duration::from_secs(rotate_every_seconds),
                    sample_every: Duration::from_secs(1),
                    ..SoakSettings::default()
                },
            };
            let report = memory::run(&settings).await?;
            println!("{}", memory::table(&report, &settings));
        }
        Command::Hostile {
            webhook_bin,
            bodies,
            body_bytes,
            rounds,
            helmops,
            values_bytes,
            webhook_args,
            dense,
            one_cpu,
        } => {
            let settings = HostileSettings {
                webhook_bin: webhook_bin.unwrap_or_else(|| sibling("helmop-webhook")),
                bodies,
                body_bytes,
                rounds,
                helmops,
                values_bytes,
                webhook_args,
                dense,
                one_cpu,
            };
            let report = hostile::run(&settings).await?;
            println!("{}", hostile::table(&report, &settings));
        }
        Command::Soak {
            seconds,
            connections,
            rotate_every_seconds,
            check,
        } => {
            let settings = SoakSettings {
                duration: Duration::from_secs(seconds),
                connections,
                rotate_every: Duration::from_secs(rotate_every_seconds),
                ..SoakSettings::default()
            };
            let report = soak::check(&settings).await?;
            println!(
                "In-process soak ({seconds} s, {connections} connections): {}",
                report.summary()
            );
            if check && let Some(problem) = soak_problem(&report) {
                eprintln!("helmop-bench soak --check: {problem}");
                return Ok(std::process::ExitCode::FAILURE);
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn soak_problem(report: &soak::SoakReport) -> Option<String> {
    helmop_bench::soak::problems(report, 16 * 1024)
        .first()
        .cloned()
}
