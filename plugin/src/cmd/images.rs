//! `kubectl helmop images [-A] [--watch]`: the command line of [`crate::images`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use helmop_registry::client::{RegistryClient, RegistrySettings};
use helmop_registry::tags::MutableTags;
use serde::Serialize;

use crate::api_error;
use crate::args::{KubeArgs, ReportFormat, parse_duration};
use crate::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::images::model::{ImageRow, ImageState, short_digest};
use crate::images::scan::{Scan, scan};
use crate::images::watch;
use crate::output;
use crate::report;

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

/// Everything one pass needs.
pub struct Setup {
    pub ctx: Ctx,
    pub registry: RegistryClient,
    pub tags: MutableTags,
    /// `None`: every namespace.
    pub namespace: Option<String>,
    pub timeout: Duration,
}

impl Setup {
    pub async fn new(args: &ImagesArgs) -> Result<Setup, PluginError> {
        if args.registry_timeout.is_zero() {
            return Err(PluginError::Usage(
                "--registry-timeout must be greater than 0".into(),
            ));
        }
        let settings = match &args.registry_config {
            Some(path) => RegistrySettings::load(path)
                .map_err(|e| PluginError::Usage(format!("--registry-config: {e}")))?,
            None => RegistrySettings::default(),
        };
        let registry = RegistryClient::new(settings, helmop_core::names::MANAGER)
            .map_err(PluginError::Usage)?;
        let ctx = Ctx::connect(&args.kube).await?;
        let namespace = (!args.all_namespaces).then(|| ctx.namespace.clone());
        Ok(Setup {
            ctx,
            registry,
            tags: MutableTags::new(&args.mutable_tags),
            namespace,
            timeout: args.registry_timeout,
        })
    }

    /// One pass over the workloads; an API error is the command's error (unreachable: exit 3).
    pub async fn scan(&self) -> Result<Scan, PluginError> {
        scan(
            &self.ctx.upstream,
            &self.registry,
            self.namespace.as_deref(),
            &self.tags,
            self.timeout,
        )
        .await
        .map_err(|e| api_error::upstream(&format!("listing workloads {}", self.scope()), &e))
    }

    /// `in namespace apps` / `in all namespaces`.
    pub fn scope(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "in all namespaces".to_owned(),
        }
    }
}

/// The JSON/YAML document of one pass.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImagesReport<'a> {
    pub rows: &'a [ImageRow],
    /// Rows per state.
    pub summary: std::collections::BTreeMap<&'static str, usize>,
    /// Pull secrets that could not be used.
    pub warnings: &'a [String],
}

pub fn report(scan: &Scan) -> ImagesReport<'_> {
    let mut summary = std::collections::BTreeMap::new();
    for r in &scan.rows {
        *summary.entry(r.state.as_str()).or_insert(0) += 1;
    }
    ImagesReport {
        rows: &scan.rows,
        summary,
        warnings: &scan.warnings,
    }
}

pub async fn run(args: &ImagesArgs) -> Result<ExitStatus, PluginError> {
    if args.watch && args.interval.is_zero() {
        return Err(PluginError::Usage(
            "--interval must be greater than 0".into(),
        ));
    }
    if args.watch {
        return watch::run(args).await;
    }
    let setup = Setup::new(args).await?;
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

/// 0 when the registry answered for every row (Outdated and Unpinned are states, not errors), 2 when
/// some rows are Unresolvable.
pub fn exit_status(rows: &[ImageRow]) -> ExitStatus {
    if rows.iter().any(|r| r.state == ImageState::Unresolvable) {
        ExitStatus::Partial
    } else {
        ExitStatus::Ok
    }
}

/// NAMESPACE WORKLOAD CONTAINER IMAGE PINNED CURRENT STATUS, wide: full digests and REASON.
pub fn table(rows: &[ImageRow], wide: bool, colour: bool) -> String {
    let mut headers = vec![
        "NAMESPACE",
        "WORKLOAD",
        "CONTAINER",
        "IMAGE",
        "PINNED",
        "CURRENT",
        "STATUS",
    ];
    if wide {
        headers.push("REASON");
    }
    let digest = |d: &Option<String>| match d {
        Some(d) if wide => d.clone(),
        Some(d) => short_digest(d),
        None => "-".to_owned(),
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                r.namespace.clone(),
                r.workload.clone(),
                r.container.clone(),
                image_name(&r.image),
                digest(&r.pinned),
                digest(&r.current),
                r.state.as_str().to_owned(),
            ];
            if wide {
                c.push(r.reason.clone());
            } else if r.state == ImageState::Unresolvable {
                c[6] = format!("{} ({})", r.state.as_str(), r.reason);
            }
            c
        })
        .collect();
    report::grid(&headers, &cells, 6, colour)
}

/// The image without its digest: the PINNED column shows that.
fn image_name(image: &str) -> String {
    image
        .split_once('@')
        .map_or(image, |(name, _)| name)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn row(state: ImageState, current: Option<&str>, reason: &str) -> ImageRow {
        ImageRow {
            namespace: "apps".into(),
            workload: "deployment/web".into(),
            container: "app".into(),
            image: format!("127.0.0.1:5000/demo/app:latest@{D1}"),
            pinned: Some(D1.into()),
            current: current.map(str::to_owned),
            state,
            reason: reason.into(),
        }
    }

    #[test]
    fn table_shows_short_digests_and_why_unresolvable() {
        let rows = [
            row(ImageState::Outdated, Some(D2), "moved"),
            row(
                ImageState::Unresolvable,
                None,
                "registry unreachable (connection refused)",
            ),
        ];
        let t = table(&rows, false, false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "NAMESPACE   WORKLOAD         CONTAINER   IMAGE                            PINNED                CURRENT               STATUS"
        );
        assert_eq!(
            lines[1],
            "apps        deployment/web   app         127.0.0.1:5000/demo/app:latest   sha256:111111111111   sha256:222222222222   Outdated"
        );
        assert!(
            lines[2].ends_with(
                "-                     Unresolvable (registry unreachable (connection refused))"
            ),
            "{}",
            lines[2]
        );
        let wide = table(&rows, true, false);
        assert!(wide.contains(D2) && wide.contains("REASON") && wide.contains("moved"));
    }

    #[test]
    fn unresolvable_rows_are_a_partial_failure() {
        assert_eq!(exit_status(&[]), ExitStatus::Ok);
        assert_eq!(
            exit_status(&[
                row(ImageState::Outdated, Some(D2), ""),
                row(ImageState::Unpinned, Some(D2), "")
            ]),
            ExitStatus::Ok
        );
        assert_eq!(
            exit_status(&[row(ImageState::Unresolvable, None, "")]),
            ExitStatus::Partial
        );
    }

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
