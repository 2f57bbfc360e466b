//! What a cluster-facing run (`propagate`, `status`, `prune`) covers - which HelmOps, which
//! downstream clusters - and how it walks those clusters. The three commands differ only in the
//! work done per cluster, so the selection, enumeration and row gathering live here once.

use std::future::Future;
use std::time::Duration;

use helmop_core::sharding::Shard;

use crate::args::TargetArgs;
use crate::cluster::clusters::{Downstream, Limits};
use crate::cluster::context::Ctx;
use crate::error::PluginError;
use crate::run::inventory::{self, Inventory, Selection};
use crate::run::runner::{self, Progress};

#[derive(Clone, Debug)]
pub struct Scope {
    pub selection: Selection,
    /// Of the selected HelmOps, those this process handles (`propagate --shard-id`, or the
    /// unsharded ones for `propagate --watch`); every one for the other commands.
    pub shard: Shard,
    /// `--target-context`: these contexts instead of Fleet Clusters.
    pub target_contexts: Vec<String>,
    pub concurrency: usize,
    pub cluster_timeout: Duration,
    pub progress: Progress,
}

impl Scope {
    /// The scope a command's `[HELMOP] [-A]` and target flags stand for.
    pub fn from_args(
        ctx: &Ctx,
        helmop: Option<&str>,
        all_namespaces: bool,
        targets: &TargetArgs,
        progress: Progress,
    ) -> Scope {
        Scope {
            selection: Selection::new(helmop, all_namespaces, &ctx.namespace),
            shard: Shard::Every,
            target_contexts: targets.target_contexts.clone(),
            concurrency: targets.concurrency as usize,
            cluster_timeout: targets.cluster_timeout,
            progress,
        }
    }

    /// Clusters at once (`--concurrency`) and the deadline of each (`--cluster-timeout`).
    pub fn limits(&self) -> Limits {
        Limits {
            concurrency: self.concurrency,
            timeout: self.cluster_timeout,
        }
    }

    /// Enumerates the HelmOps, clusters and desired copies in scope (see
    /// [`inventory::enumerate`] for `for_prune`).
    pub async fn inventory(&self, ctx: &Ctx, for_prune: bool) -> Result<Inventory, PluginError> {
        let limits = self.limits();
        inventory::enumerate(
            ctx,
            &self.selection,
            &self.shard,
            &self.target_contexts,
            for_prune,
            limits,
        )
        .await
    }

    /// Runs `work` on every downstream cluster of `inv` (bounded, each under its deadline) and
    /// gathers its rows; a cluster that could not be worked on gets `unreachable`'s rows instead.
    /// Returns the rows and the clusters that were unreachable (as rows name them).
    pub async fn rows_per_cluster<'a, T, F, Fut, U>(
        &self,
        inv: &'a Inventory,
        what: &str,
        work: F,
        unreachable: U,
    ) -> (Vec<T>, Vec<String>)
    where
        F: Fn(&'a Downstream, kube::Client) -> Fut,
        Fut: Future<Output = Result<Vec<T>, PluginError>>,
        U: Fn(&Downstream, &str) -> Vec<T>,
    {
        self.rows_per_cluster_where(inv, what, |_| true, work, unreachable)
            .await
    }

    /// [`Scope::rows_per_cluster`] over the downstream clusters `wanted` keeps.
    pub async fn rows_per_cluster_where<'a, T, W, F, Fut, U>(
        &self,
        inv: &'a Inventory,
        what: &str,
        wanted: W,
        work: F,
        unreachable: U,
    ) -> (Vec<T>, Vec<String>)
    where
        W: Fn(&Downstream) -> bool,
        F: Fn(&'a Downstream, kube::Client) -> Fut,
        Fut: Future<Output = Result<Vec<T>, PluginError>>,
        U: Fn(&Downstream, &str) -> Vec<T>,
    {
        let limits = self.limits();
        let results = runner::for_each_cluster(
            &inv.downstreams,
            &|index| wanted(&inv.downstreams[index]),
            limits,
            self.progress,
            what,
            |index, client| work(&inv.downstreams[index], client),
        )
        .await;
        let mut rows = Vec::new();
        let mut unreachable_clusters = Vec::new();
        for result in results {
            let downstream = &inv.downstreams[result.index];
            match result.outcome {
                Ok(mut r) => rows.append(&mut r),
                Err(reason) => {
                    unreachable_clusters.push(downstream.display());
                    rows.extend(unreachable(downstream, &reason.to_string()));
                }
            }
        }
        (rows, unreachable_clusters)
    }
}
