//! `kubectl helmop propagate [HELMOP] [-A]`: the command line of [`crate::run::propagate`].

use clap::Args;
use helmop_core::sharding::{Shard, parse_shard_id};

use crate::args::{KubeArgs, ReportFormat, TargetArgs};
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::output::report;
use crate::run::propagate::{PropagateOpts, Report, propagate_once};
use crate::run::runner::Progress;
use crate::run::scope::Scope;

#[derive(Debug, Args)]
pub struct PropagateArgs {
    /// The HelmOp to propagate (default: every HelmOp in the namespace)
    #[arg(value_name = "HELMOP", conflicts_with = "all_namespaces")]
    pub helmop: Option<String>,

    /// Propagate the HelmOps of every namespace
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Print the plan (create / update / unchanged / conflict per cluster) and write nothing
    #[arg(long)]
    pub dry_run: bool,

    /// Take over same-named objects helmop did not create (never Fleet's own copies)
    #[arg(long)]
    pub adopt: bool,

    /// Create a new upstream hash key although copies hashed with the missing one exist
    /// (rewrites every such copy's hash annotation)
    #[arg(long)]
    pub new_hash_key: bool,

    /// Handle only the HelmOps labelled fleet.cattle.io/shard-ref=ID, as Fleet's controllers of
    /// that shard do. Without it, --watch handles only the HelmOps without that label (Fleet's
    /// unsharded controller) and a one-shot run every HelmOp. With --watch, each shard elects its
    /// own leader
    #[arg(long, value_name = "ID", value_parser = parse_shard_id)]
    pub shard_id: Option<String>,

    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t = ReportFormat::Table)]
    pub output: ReportFormat,

    #[command(flatten)]
    pub watch: crate::watch::WatchArgs,

    #[command(flatten)]
    pub targets: TargetArgs,

    #[command(flatten)]
    pub kube: KubeArgs,
}

impl PropagateArgs {
    /// The library options these flags stand for.
    pub fn opts(&self, ctx: &Ctx, progress: Progress) -> PropagateOpts {
        let mut scope = Scope::from_args(
            ctx,
            self.helmop.as_deref(),
            self.all_namespaces,
            &self.targets,
            progress,
        );
        scope.shard = self.shard();
        PropagateOpts {
            scope,
            adopt: self.adopt,
            dry_run: self.dry_run,
            new_hash_key: self.new_hash_key,
        }
    }

    /// Which HelmOps these flags handle: `--shard-id`'s; without it, a watcher is Fleet's
    /// unsharded controller and a one-shot run speaks for every HelmOp it lists.
    pub fn shard(&self) -> Shard {
        match (&self.shard_id, self.watch.watch) {
            (Some(id), _) => Shard::Id(id.clone()),
            (None, true) => Shard::Unlabelled,
            (None, false) => Shard::Every,
        }
    }
}

pub async fn run(args: &PropagateArgs) -> Result<ExitStatus, PluginError> {
    if args.watch.watch {
        let opts = |ctx: &Ctx| args.opts(ctx, Progress::Quiet);
        return crate::watch::run(&args.kube, args.output, opts, &args.watch).await;
    }
    let ctx = Ctx::connect_identified(&args.kube).await?;
    let opts = args.opts(&ctx, Progress::Auto);
    let report = propagate_once(&ctx, &opts).await?;
    emit(&report, args.output)?;
    Ok(report.exit_status())
}

/// Prints a report (also used by `--watch` for each run it logs as a table).
pub fn emit(report: &Report, format: crate::args::ReportFormat) -> Result<(), PluginError> {
    let s = &report.summary;
    let states: Vec<String> = s.states.iter().map(|(k, v)| format!("{v} {k}")).collect();
    let mut footer = vec![
        String::new(),
        format!(
            "{}{} HelmOp(s), {} cluster(s) ({} unreachable): {}; {} write(s)",
            if report.dry_run { "dry run: " } else { "" },
            s.helmops,
            s.clusters,
            s.unreachable_clusters,
            if states.is_empty() {
                "nothing to do".to_string()
            } else {
                states.join(", ")
            },
            s.writes
        ),
    ];
    for p in &report.problems {
        footer.push(format!("error: HelmOp {}: {}", p.helmop, p.message));
    }
    report::emit(format, report, &report.rows, true, &footer)
}
