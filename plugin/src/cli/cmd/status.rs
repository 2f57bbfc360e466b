//! `kubectl helmop status [HELMOP] [-A]`: the command line of [`crate::run::status`].

use clap::Args;

use crate::args::{KubeArgs, ReportFormat, TargetArgs};
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::output::report;
use crate::run::runner::Progress;
use crate::run::scope::Scope;
use crate::run::status::{StatusOpts, status};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The HelmOp to show (default: every HelmOp in the namespace)
    #[arg(value_name = "HELMOP", conflicts_with = "all_namespaces")]
    pub helmop: Option<String>,

    /// Show the HelmOps of every namespace
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Output format (wide adds the reason of every row)
    #[arg(short = 'o', long, value_enum, default_value_t = ReportFormat::Table)]
    pub output: ReportFormat,

    #[command(flatten)]
    pub targets: TargetArgs,

    #[command(flatten)]
    pub kube: KubeArgs,
}

pub async fn run(args: &StatusArgs) -> Result<ExitStatus, PluginError> {
    let ctx = Ctx::connect_identified(&args.kube).await?;
    let opts = StatusOpts {
        scope: Scope::from_args(
            &ctx,
            args.helmop.as_deref(),
            args.all_namespaces,
            &args.targets,
            Progress::Auto,
        ),
    };
    let report = status(&ctx, &opts).await?;
    let footer: Vec<String> = report
        .problems
        .iter()
        .map(|p| format!("error: HelmOp {}: {}", p.helmop, p.message))
        .chain(report.notes.iter().map(|n| format!("note: {n}")))
        .collect();
    report::emit(args.output, &report, &report.rows, false, &footer)?;
    Ok(report.exit_status())
}
