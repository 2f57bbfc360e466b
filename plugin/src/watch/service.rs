//! What every long-running `--watch` shares as a service: the leader-election flags and how a
//! watcher joins its scope's election, and the `/metrics` listener. `propagate --watch` and
//! `rollout --watch` flatten [`ServiceArgs`] into their own flags.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use kube::Client;
use tokio::sync::watch;

use super::Signals;
use super::events::Events;
use super::health::{self, Exposition, Health, Listener};
use super::leader::{self, Elector, LeaderHandle, LeaseTimings};
use crate::args::parse_duration;
use crate::error::PluginError;
use crate::humanize::humanize;

/// Namespace of the Lease when neither `--lease-namespace` nor `POD_NAMESPACE` says.
pub const DEFAULT_LEASE_NAMESPACE: &str = helmop_core::names::SYSTEM_NAMESPACE;

/// The leader-election and metrics flags of a `--watch`.
#[derive(Clone, Debug, Args)]
pub struct ServiceArgs {
    /// With --watch: do not elect a leader. Only for a single watcher of this scope: two
    /// watchers without election both write
    #[arg(long, requires = "watch")]
    pub no_leader_election: bool,

    /// With --watch: namespace of the leader-election Lease, on the cluster the command talks to
    /// (default: $POD_NAMESPACE, else helmop-system)
    #[arg(long, value_name = "NAMESPACE", requires = "watch")]
    pub lease_namespace: Option<String>,

    /// With --watch: name of the leader-election Lease (default: kubectl-helmop-propagate or
    /// kubectl-helmop-rollout, plus -ns-NAMESPACE for -n and a hash of a HelmOp's name or of -l,
    /// so watchers of different scopes never stand by for each other; pass the same name to make
    /// them share one)
    #[arg(long, value_name = "NAME", requires = "watch")]
    pub lease_name: Option<String>,

    /// With --watch: how long a leader's claim lasts; a standby takes over this long after the
    /// leader stopped renewing (at once when it shut down cleanly). At least 2s
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "15s", requires = "watch")]
    pub lease_duration: Duration,

    /// With --watch: serve Prometheus /metrics, /livez and /readyz over HTTP on this address
    /// (HOST:PORT, or :PORT for every interface; port 0 picks a free one, printed in the `started`
    /// event). Off by default
    #[arg(long, value_name = "ADDR", value_parser = health::parse_addr, requires = "watch")]
    pub metrics_addr: Option<SocketAddr>,
}

/// A watcher in its scope's election.
pub struct Joined {
    /// `None`: no election (`--no-leader-election`, or a dry run, which writes nothing).
    pub election: Option<LeaderHandle>,
    /// Whether this process leads now (always true without an election).
    pub leading: watch::Receiver<bool>,
    /// Keeps `leading` open without an election: hold it as long as `leading` is read (a closed
    /// channel would wake every `changed()` at once).
    pub keep: watch::Sender<bool>,
}

/// The Lease of a watcher's scope: its name unless `--lease-name` says otherwise, and the labels
/// and annotations the leader keeps on it.
#[derive(Clone, Debug, Default)]
pub struct LeaseMeta {
    pub default_name: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl ServiceArgs {
    /// The namespace of the Lease: `--lease-namespace`, else `$POD_NAMESPACE`, else
    /// [`DEFAULT_LEASE_NAMESPACE`].
    pub fn lease_namespace(&self) -> String {
        self.lease_namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|n| !n.is_empty())
            })
            .unwrap_or_else(|| DEFAULT_LEASE_NAMESPACE.to_owned())
    }

    /// The Lease timings `--lease-duration` gives, checked before anything connects.
    pub fn timings(&self) -> Result<LeaseTimings, PluginError> {
        LeaseTimings::from_lease_duration(self.lease_duration).ok_or_else(|| {
            PluginError::Usage(format!(
                "--lease-duration must be at least {}",
                humanize(leader::MIN_LEASE_DURATION)
            ))
        })
    }

    /// Binds `--metrics-addr`, before connecting, so probes answer (not ready) while start-up is
    /// slow.
    pub async fn listen<M: Exposition>(
        &self,
        metrics: M,
        health: Arc<Health>,
    ) -> Result<Option<Listener>, PluginError> {
        match self.metrics_addr {
            Some(addr) => Ok(Some(health::serve(addr, metrics, health).await?)),
            None => Ok(None),
        }
    }

    /// Joins the election of the Lease `--lease-name` names (else `lease.default_name`, the
    /// scope's) and marks `health` as having joined. `None` when a signal came first: the `stopped`
    /// event is printed and the watcher ends.
    pub async fn join(
        &self,
        client: &Client,
        lease: LeaseMeta,
        dry_run: bool,
        signals: &mut Signals,
        events: &Events,
        health: &Health,
    ) -> Result<Option<Joined>, PluginError> {
        let (always, always_leading) = watch::channel(true);
        let election = if self.no_leader_election || dry_run {
            None
        } else {
            let namespace = self.lease_namespace();
            let name = self.lease_name.clone().unwrap_or(lease.default_name);
            let elector = Elector::new(
                client.clone(),
                &namespace,
                &name,
                &leader::default_identity(),
                self.timings()?,
            )
            .with_metadata(lease.labels, lease.annotations);
            let lease = elector.lease();
            tokio::select! {
                h = LeaderHandle::start(elector) => Some(h.map_err(|e| lease_error(&lease, &e))?),
                signal = signals.recv() => {
                    events.stopped(signal);
                    return Ok(None);
                }
            }
        };
        health.joined_election();
        let leading = match &election {
            Some(h) => h.state(),
            None => always_leading,
        };
        Ok(Some(Joined {
            election,
            leading,
            keep: always,
        }))
    }
}

fn lease_error(lease: &str, e: &kube::Error) -> PluginError {
    let hint = "pass --lease-namespace, or --no-leader-election for a single watcher";
    crate::cluster::api_error::upstream(
        &format!("cannot use the leader-election Lease {lease} ({hint})"),
        e,
    )
}
