//! `kubectl helmop prune [HELMOP] [-A]`: the command line of [`crate::run::prune`].

use clap::Args;

use crate::args::{KubeArgs, ReportFormat, TargetArgs};
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::output::report;
use crate::run::prune::{PruneOpts, prune};
use crate::run::runner::Progress;
use crate::run::scope::Scope;

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Prune only what this HelmOp no longer wants (it may already be deleted); default: every
    /// HelmOp of the namespace, including deleted ones
    #[arg(value_name = "HELMOP", conflicts_with = "all_namespaces")]
    pub helmop: Option<String>,

    /// Prune for the HelmOps of every namespace
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Show what would be pruned and delete nothing
    #[arg(long)]
    pub dry_run: bool,

    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t = ReportFormat::Table)]
    pub output: ReportFormat,

    #[command(flatten)]
    pub targets: TargetArgs,

    #[command(flatten)]
    pub kube: KubeArgs,
}

pub async fn run(args: &PruneArgs) -> Result<ExitStatus, PluginError> {
    let ctx = Ctx::connect_identified(&args.kube).await?;
    let opts = PruneOpts {
        scope: Scope::from_args(
            &ctx,
            args.helmop.as_deref(),
            args.all_namespaces,
            &args.targets,
            Progress::Auto,
        ),
        dry_run: args.dry_run,
    };
    let report = prune(&ctx, &opts).await?;
    let states: Vec<String> = report
        .summary
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    let footer = vec![
        String::new(),
        format!(
            "{}{}; {} write(s)",
            if report.dry_run { "dry run: " } else { "" },
            if states.is_empty() {
                "nothing to prune".to_string()
            } else {
                states.join(", ")
            },
            report.writes
        ),
    ];
    report::emit(args.output, &report, &report.rows, true, &footer)?;
    Ok(report.exit_status())
}
