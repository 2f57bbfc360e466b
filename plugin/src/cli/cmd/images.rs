//! `kubectl helmop images [-A] [--watch]`: the command line of [`crate::images`].

use std::path::PathBuf;
use std::time::Duration;

use crate::args::{KubeArgs, ReportFormat, parse_duration};
use crate::error::{ExitStatus, PluginError};
use crate::images::pass::{Setup, SetupOptions, exit_status, report, table};
use crate::images::watch;
use crate::output;
use crate::output::report;
use clap::Args;

#[derive(Debug, Args)]
pub struct ImagesArgs {
    /// Show the workloads of every namespace
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Output format (wide adds full digests and the reason of every row)
    #[arg(short = 'o', long, value_enum, default_value_t = ReportFormat::Table)]
    pub output: ReportFormat,

    /// Keep polling the registry and restamp (helmop.dev/restamp) the workloads whose tags moved,
    /// once per burst of pushes, until SIGINT/SIGTERM. Prints one event per line (-o json: JSON Lines)
    #[arg(long)]
    pub watch: bool,

    /// With --watch: time between polls of the registry (each one +-10% at random, so many
    /// watchers do not poll in step)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s", requires = "watch")]
    pub interval: Duration,

    /// With --watch: how long a tag's new digest must stay the same before its workloads are
    /// restamped (pushes meanwhile are rolled out together, once); default: the interval
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "watch")]
    pub debounce: Option<Duration>,

    /// With --watch: report what would be restamped, write nothing
    #[arg(long, requires = "watch")]
    pub dry_run: bool,

    /// Extra image tags treated as mutable besides `latest` and no tag (comma separated or
    /// repeated; `*` and `?` globs): use the webhook's --mutable-tags
    #[arg(long, value_name = "PATTERN", value_delimiter = ',')]
    pub mutable_tags: Vec<String>,

    /// Registry configuration (insecure registries, mirrors): the webhook's --registry-config file,
    /// e.g. `{insecure: ["127.0.0.1:5000"], mirrors: {"docker.io": ["mirror.example.com"]}}`
    #[arg(long, value_name = "FILE")]
    pub registry_config: Option<PathBuf>,

    /// Time one registry lookup may take before its rows are Unresolvable
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub registry_timeout: Duration,

    #[command(flatten)]
    pub kube: KubeArgs,
}

pub async fn run(args: &ImagesArgs) -> Result<ExitStatus, PluginError> {
    if args.watch && args.interval.is_zero() {
        return Err(PluginError::Usage(
            "--interval must be greater than 0".into(),
        ));
    }
    if args.watch {
        return watch::run(watch_options(args), setup_options(args)).await;
    }
    let setup = Setup::new(setup_options(args)).await?;
    let scan = setup.scan().await?;
    let text = match args.output {
        ReportFormat::Json => output::json(&report(&scan))?,
        ReportFormat::Yaml => serde_saphyr::to_string(&report(&scan))
            .map_err(|e| PluginError::Usage(format!("cannot encode YAML: {e}")))?,
        ReportFormat::Table | ReportFormat::Wide => {
            let mut text = if scan.rows.is_empty() {
                format!(
                    "No opted-in workloads with mutable image tags {}.\n",
                    setup.scope()
                )
            } else {
                table(
                    &scan.rows,
                    args.output == ReportFormat::Wide,
                    report::colour_stdout(),
                )
            };
            for w in &scan.warnings {
                text.push_str(&format!("warning: {w}\n"));
            }
            text
        }
    };
    output::emit(&text)?;
    Ok(exit_status(&scan.rows))
}

fn setup_options(args: &ImagesArgs) -> SetupOptions<'_> {
    SetupOptions {
        kube: &args.kube,
        registry_config: args.registry_config.as_deref(),
        mutable_tags: &args.mutable_tags,
        all_namespaces: args.all_namespaces,
        selector: None,
        registry_timeout: args.registry_timeout,
    }
}

fn watch_options(args: &ImagesArgs) -> watch::WatchOptions {
    watch::WatchOptions {
        interval: args.interval,
        debounce: args.debounce.unwrap_or(args.interval),
        output: args.output,
        dry_run: args.dry_run,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn flags() {
        let parse = |argv: &[&str]| {
            let mut full = vec!["kubectl-helmop", "images"];
            full.extend(argv);
            Cli::try_parse_from(full).map(|c| match c.command {
                Command::Images(a) => a,
                _ => panic!("parsed as another command"),
            })
        };
        let a = parse(&[
            "-A",
            "--watch",
            "--interval",
            "1s",
            "--mutable-tags",
            "main,dev-*",
            "-o",
            "json",
        ])
        .unwrap();
        assert!(a.all_namespaces && a.watch);
        assert_eq!(a.interval, Duration::from_secs(1));
        assert_eq!(a.mutable_tags, ["main", "dev-*"]);
        assert_eq!(a.output, ReportFormat::Json);
        let a = parse(&["-n", "apps"]).unwrap();
        assert_eq!(a.kube.namespace.as_deref(), Some("apps"));
        assert_eq!(a.interval, Duration::from_secs(30));
        for bad in [
            &["--interval", "1s"][..],
            &["--debounce", "1s"],
            &["--dry-run"],
            &["-o", "xml"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
