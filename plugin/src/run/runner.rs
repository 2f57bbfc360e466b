//! Running one piece of work per downstream cluster: at most `concurrency` at once, each under its
//! own deadline, so a slow or dead cluster costs only its own rows. Shows a progress bar on a
//! terminal and plain lines otherwise.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::IsTerminal;
use std::time::Duration;

use futures::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cluster::clusters::{Downstream, Limits};
use crate::error::PluginError;

/// How progress is shown on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Progress {
    /// A bar when stderr is a terminal, one line per finished cluster otherwise.
    #[default]
    Auto,
    /// Nothing (e.g. `--watch`, which logs instead).
    Quiet,
}

/// What became of one cluster's work.
#[derive(Debug)]
pub struct ClusterResult<T> {
    /// Index into the downstream list.
    pub index: usize,
    /// The work's result, or why the cluster could not be worked on (no credentials, no
    /// connection, a failed listing, the deadline).
    pub outcome: Result<T, PluginError>,
}

/// Runs `work` for every downstream (by index) that `wanted` keeps, bounded and time-limited; one
/// without a client gets the reason as its outcome, one left out gets no result. Registrations
/// claiming one identity run one after the other, in the order given (each under its own
/// deadline): when they do reach one cluster, a later one sees what an earlier one wrote instead
/// of racing it, and a dry run announces them in the same order ([`crate::run::same_cluster`]).
pub async fn for_each_cluster<T, F, Fut>(
    downstreams: &[Downstream],
    wanted: &dyn Fn(usize) -> bool,
    limits: Limits,
    progress: Progress,
    what: &str,
    work: F,
) -> Vec<ClusterResult<T>>
where
    F: Fn(usize, kube::Client) -> Fut,
    Fut: Future<Output = Result<T, PluginError>>,
{
    let groups: Vec<Vec<usize>> = turns(downstreams)
        .into_iter()
        .map(|mut group| {
            group.retain(|&i| wanted(i));
            group
        })
        .filter(|group| !group.is_empty())
        .collect();
    let count: usize = groups.iter().map(Vec::len).sum();
    let (concurrency, deadline) = (limits.concurrency, limits.timeout);
    let bar = match progress {
        Progress::Auto if std::io::stderr().is_terminal() => {
            let bar =
                ProgressBar::with_draw_target(Some(count as u64), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} {prefix} [{bar:30}] {pos}/{len} clusters {wide_msg}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(what.to_string());
            bar.enable_steady_tick(Duration::from_millis(120));
            Some(bar)
        }
        _ => None,
    };
    let lines = progress == Progress::Auto && bar.is_none();
    let work = &work;
    let bar_ref = &bar;
    let one = |index: usize| async move {
        let downstream = &downstreams[index];
        let outcome = match &downstream.client {
            Err(reason) => Err(reason.clone()),
            Ok(client) => match tokio::time::timeout(deadline, work(index, client.clone())).await {
                Ok(outcome) => outcome,
                Err(_) => Err(PluginError::ClusterTimeout { timeout: deadline }),
            },
        };
        let name = downstream.display();
        if let Some(bar) = bar_ref {
            bar.inc(1);
            bar.set_message(name.clone());
        } else if lines {
            match &outcome {
                Ok(_) => eprintln!("{what} {name}: done"),
                Err(reason) => eprintln!("{what} {name}: unreachable: {reason}"),
            }
        }
        ClusterResult { index, outcome }
    };
    let one = &one;
    let mut results: Vec<ClusterResult<T>> = futures::stream::iter(groups)
        .map(|group| async move {
            let mut out = Vec::with_capacity(group.len());
            for index in group {
                out.push(one(index).await);
            }
            out
        })
        .buffer_unordered(concurrency.max(1))
        .flat_map(futures::stream::iter)
        .collect()
        .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    results.sort_by_key(|r| r.index);
    results
}

/// The downstreams (by index) grouped by the identity they claim, in order of first appearance;
/// one whose identity is unknown (or unreachable) is a group of its own.
fn turns(downstreams: &[Downstream]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_identity: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, d) in downstreams.iter().enumerate() {
        let claimed = d.identity.as_deref().filter(|_| d.client.is_ok());
        match claimed.and_then(|id| by_identity.get(id)) {
            Some(&g) => groups[g].push(index),
            None => {
                if let Some(id) = claimed {
                    by_identity.insert(id, groups.len());
                }
                groups.push(vec![index]);
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn reachable(name: &str) -> Downstream {
        Downstream {
            key: format!("https://{name}"),
            name: name.into(),
            identity: None,
            client: Ok(kube::Client::try_from(kube::Config::new(
                format!("https://{name}.invalid").parse().unwrap(),
            ))
            .unwrap()),
        }
    }

    #[tokio::test]
    async fn registrations_claiming_one_identity_take_turns_in_order() {
        let claiming = |name: &str, id: Option<&str>| Downstream {
            identity: id.map(String::from),
            ..reachable(name)
        };
        let downstreams = [
            claiming("a", Some("x")),
            claiming("b", None),
            claiming("c", Some("y")),
            claiming("d", Some("x")),
            claiming("e", None),
            claiming("f", Some("x")),
        ];
        assert_eq!(
            turns(&downstreams),
            [vec![0, 3, 5], vec![1], vec![2], vec![4]]
        );
    }

    #[tokio::test]
    async fn only_the_wanted_clusters_are_worked_on() {
        let downstreams = ["a", "b", "c", "d"].map(reachable);
        let limits = Limits {
            concurrency: 4,
            timeout: Duration::from_secs(5),
        };
        let results = for_each_cluster(
            &downstreams,
            &|index| index % 2 == 1,
            limits,
            Progress::Quiet,
            "test",
            |index, _client| async move { Ok::<_, PluginError>(index * 10) },
        )
        .await;
        let got: Vec<(usize, usize)> = results
            .into_iter()
            .map(|r| (r.index, r.outcome.unwrap_or(usize::MAX)))
            .collect();
        assert_eq!(got, [(1, 10), (3, 30)]);
    }

    #[tokio::test]
    async fn a_hanging_cluster_only_costs_its_own_deadline() {
        let downstreams = vec![
            reachable("fast"),
            reachable("hangs"),
            Downstream {
                key: "cluster:x/nocreds".into(),
                name: "x/nocreds".into(),
                identity: None,
                client: Err(PluginError::KubeconfigSecretAbsent {
                    namespace: "x".into(),
                    name: "k".into(),
                    looked_up: true,
                }),
            },
            reachable("fast2"),
        ];
        let running = Arc::new(AtomicUsize::new(0));
        let max_running = Arc::new(AtomicUsize::new(0));
        let started = std::time::Instant::now();
        let limits = Limits {
            concurrency: 2,
            timeout: Duration::from_millis(300),
        };
        let results = for_each_cluster(
            &downstreams,
            &|_| true,
            limits,
            Progress::Quiet,
            "test",
            |index, _client| {
                let running = running.clone();
                let max_running = max_running.clone();
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    max_running.fetch_max(now, Ordering::SeqCst);
                    if index == 1 {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                    }
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, PluginError>(index)
                }
            },
        )
        .await;
        assert!(started.elapsed() < Duration::from_secs(5));
        let outcomes: Vec<Result<usize, String>> = results
            .into_iter()
            .map(|r| r.outcome.map_err(|e| e.to_string()))
            .collect();
        assert_eq!(outcomes[0], Ok(0));
        assert_eq!(
            outcomes[1],
            Err("no answer within --cluster-timeout 300ms".into())
        );
        assert_eq!(outcomes[2], Err("kubeconfig Secret x/k not found".into()));
        assert_eq!(outcomes[3], Ok(3));
        assert!(max_running.load(Ordering::SeqCst) <= 2);
    }
}
