//! The flags of `rollout --watch`, and the brakes' settings they make, checked together.

use std::time::Duration;

use clap::Args;

use super::breaker::FlapLimits;
use super::budget::Limits;
use super::queue::Pacing;
use crate::args::parse_duration;
use crate::error::PluginError;
use crate::watch::service::ServiceArgs;

/// The `--watch` flags of `rollout`.
#[derive(Clone, Debug, Args)]
pub struct RolloutWatchArgs {
    /// Keep running: restamp every opted-in workload whose stamp no longer matches what its pods
    /// read, whoever changed it (kubectl, an operator, Fleet's agent), until SIGINT/SIGTERM. Prints
    /// one event per line (-o json: JSON Lines)
    #[arg(long)]
    pub watch: bool,

    /// With --watch: watch the workloads of every namespace
    #[arg(short = 'A', long, requires = "watch")]
    pub all_namespaces: bool,

    /// With --watch: only workloads matching this label selector (e.g. app=web,tier!=cache)
    #[arg(short = 'l', long, value_name = "SELECTOR", requires = "watch")]
    pub selector: Option<String>,

    /// With --watch: restamps (and the reads they need) in flight at once
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256), requires = "watch")]
    pub max_concurrent: u16,

    /// With --watch: the quiet period: a change of what a workload reads is restamped once nothing
    /// it reads changed for this long (a burst of edits rolls it once, with the final content)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "250ms", requires = "watch")]
    pub debounce: Duration,

    /// With --watch: the longest a change waits for its quiet period (a source that never stops
    /// changing still rolls its readers this often, unless its flap breaker opens)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s", requires = "watch")]
    pub max_wait: Duration,

    /// With --watch: after a restamp, the same workload is not restamped again for this long; what
    /// changes meanwhile is restamped together, once, after it
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s", requires = "watch")]
    pub min_roll_interval: Duration,

    /// With --watch: the roll budget: at most this many workloads restamped by the watcher are
    /// rolling at once (from the restamp until every replica is updated and available, or its
    /// progress deadline passed); the rest wait their turn, round robin over namespaces
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..), requires = "watch")]
    pub max_rolling: u32,

    /// With --watch: at most this many of them in one namespace
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..), requires = "watch")]
    pub max_rolling_per_namespace: u32,

    /// With --watch: a rollout still going after this no longer counts against the budget (a
    /// Warning Event says so)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10m", requires = "watch")]
    pub roll_timeout: Duration,

    /// With --watch: the flap breaker: a Secret or ConfigMap that changes more than this many times
    /// within --flap-window stops rolling its readers until it is quiet for --flap-release or
    /// `kubectl helmop rollout --resume` releases it; 0 disables the breaker
    #[arg(long, value_name = "N", default_value_t = 5, requires = "watch")]
    pub flap_changes: u32,

    /// With --watch: the window of --flap-changes
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1m", requires = "watch")]
    pub flap_window: Duration,

    /// With --watch: an open flap breaker closes by itself once its source was quiet this long
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5m", requires = "watch")]
    pub flap_release: Duration,

    /// With --watch: decide every workload again this often without changes; 0 disables it
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10m", requires = "watch")]
    pub resync: Duration,

    /// With --watch: the cluster's hash key Secret, NAMESPACE/NAME (the webhook's
    /// --hash-key-secret): the stamp is recomputed with it to decide, never written
    #[arg(
        long,
        value_name = "NAMESPACE/NAME",
        default_value = "helmop-system/helmop-hash-key",
        requires = "watch"
    )]
    pub hash_key_secret: String,

    /// With --watch: the MutatingWebhookConfiguration that stamps workloads; workloads it does not
    /// send to the webhook (its namespace and object selectors) are never stamped, so never
    /// restamped: they are skipped with one event per namespace. "" reads none
    #[arg(
        long,
        value_name = "NAME",
        default_value = "helmop-webhook",
        requires = "watch"
    )]
    pub webhook_configuration: String,

    #[command(flatten)]
    pub service: ServiceArgs,

    /// With --watch: also poll the registry for the mutable image tags of opted-in workloads and
    /// restamp those whose tag moved, as `images --watch` does, under the same leader election (a
    /// standby polls nothing): one process covers everything that changes what pods run
    #[arg(long, requires = "watch")]
    pub images: bool,

    /// With --images: time between registry polls (each +-10%); a moved tag is restamped once
    /// its new digest stayed the same for one interval
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s", requires = "images")]
    pub image_interval: Duration,

    /// With --images: registry configuration (insecure registries, mirrors): the webhook's
    /// --registry-config file
    #[arg(long, value_name = "FILE", requires = "images")]
    pub registry_config: Option<std::path::PathBuf>,

    /// With --images: extra image tags treated as mutable besides `latest` and no tag (comma
    /// separated or repeated; `*` and `?` globs): the webhook's --mutable-tags
    #[arg(
        long,
        value_name = "PATTERN",
        value_delimiter = ',',
        requires = "images"
    )]
    pub mutable_tags: Vec<String>,
}

/// The brakes' settings from the flags, checked together.
pub fn brakes(args: &RolloutWatchArgs) -> Result<(Pacing, Limits, FlapLimits), PluginError> {
    if args.max_wait < args.debounce {
        return Err(PluginError::Usage(format!(
            "--max-wait ({}) must not be shorter than --debounce ({})",
            crate::humanize::humanize(args.max_wait),
            crate::humanize::humanize(args.debounce)
        )));
    }
    if args.max_rolling_per_namespace > args.max_rolling {
        return Err(PluginError::Usage(format!(
            "--max-rolling-per-namespace ({}) must not exceed --max-rolling ({})",
            args.max_rolling_per_namespace, args.max_rolling
        )));
    }
    if args.roll_timeout.is_zero() || args.flap_window.is_zero() || args.flap_release.is_zero() {
        return Err(PluginError::Usage(
            "--roll-timeout, --flap-window and --flap-release must be greater than 0".into(),
        ));
    }
    let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
    Ok((
        Pacing {
            quiet: args.debounce,
            max_wait: args.max_wait,
            min_interval: args.min_roll_interval,
        },
        Limits {
            cluster: count(args.max_rolling),
            namespace: count(args.max_rolling_per_namespace),
            timeout: args.roll_timeout,
        },
        FlapLimits {
            changes: args.flap_changes,
            window: args.flap_window,
            release: args.flap_release,
        },
    ))
}
