//! `kubectl helmop check`: an install doctor for the cluster of the current (or `--context`)
//! context. The checks are in [`crate::check`], the verdicts in [`helmop_core::check`].

use clap::Args;
use helmop_core::check::{Report, Verdict};
use helmop_core::names;

use crate::args::{KubeArgs, ReportFormat, parse_duration};
use crate::check::{CheckOpts, check};
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::output;
use crate::output::report::{Colour, colour_stdout, grid};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Name of the validating and the mutating webhook configuration (an overlay's namePrefix
    /// changes it)
    #[arg(long, value_name = "NAME", default_value = "helmop-webhook")]
    pub webhook_configuration: String,

    /// The hash-key Secret the webhook reads, as given to its --hash-key-secret (only whether it
    /// exists is checked; its data is never read)
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = "helmop-system/helmop-hash-key", value_parser = parse_secret_ref)]
    pub hash_key_secret: (String, String),

    /// Namespace of the propagator's and the rollout watcher's Leases (their pods' namespace)
    #[arg(long, value_name = "NAMESPACE", default_value = names::SYSTEM_NAMESPACE)]
    pub lease_namespace: String,

    /// How long the TLS handshake with a webhook registered by URL may take
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub tls_timeout: std::time::Duration,

    /// Output format (wide adds the fix of every finding as a column)
    #[arg(short = 'o', long, value_enum, default_value_t = ReportFormat::Table)]
    pub output: ReportFormat,

    #[command(flatten)]
    pub kube: KubeArgs,
}

fn parse_secret_ref(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}

pub async fn run(args: &CheckArgs) -> Result<ExitStatus, PluginError> {
    let ctx = Ctx::connect(&args.kube).await?;
    let opts = CheckOpts {
        configuration: args.webhook_configuration.clone(),
        hash_key: args.hash_key_secret.clone(),
        lease_namespace: args.lease_namespace.clone(),
        namespace: ctx.namespace.clone(),
        namespace_given: args.kube.namespace.is_some(),
        handshake_timeout: args.tls_timeout,
    };
    let report = check(&ctx.upstream, &opts).await?;
    let text = match args.output {
        ReportFormat::Json => output::json(&report)?,
        ReportFormat::Yaml => serde_saphyr::to_string(&report)
            .map_err(|e| PluginError::Usage(format!("cannot encode YAML: {e}")))?,
        ReportFormat::Table | ReportFormat::Wide => {
            table(&report, args.output == ReportFormat::Wide, colour_stdout())
        }
    };
    output::emit(&text)?;
    Ok(exit_status(&report))
}

/// 1 when a problem was found; warnings alone are 0.
pub fn exit_status(report: &Report) -> ExitStatus {
    if report.result == Verdict::Problem {
        ExitStatus::Invalid
    } else {
        ExitStatus::Ok
    }
}

/// CHECK, SUBJECT, RESULT, MESSAGE (and FIX when wide); then one `fix:` line per finding that
/// has one (unless wide), and the counts.
pub fn table(report: &Report, wide: bool, colour: bool) -> String {
    let mut headers = vec!["CHECK", "SUBJECT", "RESULT", "MESSAGE"];
    if wide {
        headers.push("FIX");
    }
    let cells: Vec<(Vec<String>, Option<Colour>)> = report
        .findings
        .iter()
        .map(|f| {
            let mut row = vec![
                f.check.to_string(),
                f.subject.clone(),
                f.verdict.to_string(),
                f.message.clone(),
            ];
            if wide {
                row.push(f.fix.clone().unwrap_or_else(|| "-".into()));
            }
            let c = colour.then_some(match f.verdict {
                Verdict::Ok => Colour::Green,
                Verdict::Warning => Colour::Yellow,
                Verdict::Problem => Colour::Red,
            });
            (row, c)
        })
        .collect();
    let mut out = grid(&headers, &cells, 2);
    if !wide {
        let fixes: Vec<String> = report
            .findings
            .iter()
            .filter(|f| f.verdict != Verdict::Ok)
            .filter_map(|f| {
                f.fix
                    .as_ref()
                    .map(|fix| format!("fix {}: {fix}", f.subject))
            })
            .collect();
        if !fixes.is_empty() {
            out.push('\n');
            for line in fixes {
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    let s = report.summary;
    out.push_str(&format!(
        "\n{} ok, {} warning(s), {} problem(s)\n",
        s.ok, s.warning, s.problem
    ));
    out
}

#[cfg(test)]
mod tests {
    use helmop_core::check::{self as v, LeaseFact, LeaseRole, Presence};

    use super::*;

    #[test]
    fn table_lists_fixes_of_problems_and_warnings() {
        let report = Report::new(
            None,
            vec![
                v::hash_key("helmop-system/helmop-hash-key", &Presence::Absent),
                v::lease(
                    LeaseRole::Propagator,
                    "helmop-system/kubectl-helmop-propagate",
                    &LeaseFact::Absent,
                    0,
                ),
            ],
        );
        let text = table(&report, false, false);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("CHECK      SUBJECT"), "{text}");
        assert!(
            lines[1].starts_with("hash-key   secret/helmop-system/helmop-hash-key"),
            "{text}"
        );
        assert!(lines[1].contains("   problem   missing:"), "{text}");
        assert!(
            text.contains("\nfix secret/helmop-system/helmop-hash-key: kubectl -n helmop-system rollout restart deployment helmop-webhook"),
            "{text}"
        );
        assert!(
            text.ends_with("\n1 ok, 0 warning(s), 1 problem(s)\n"),
            "{text}"
        );
        assert_eq!(exit_status(&report), ExitStatus::Invalid);
        let wide = table(&report, true, false);
        assert!(
            wide.lines().next().unwrap_or_default().ends_with("FIX"),
            "{wide}"
        );
        assert!(!wide.contains("\nfix "), "{wide}");
    }

    #[test]
    fn warnings_alone_exit_0() {
        let report = Report::new(
            None,
            vec![v::hash_key(
                "a/b",
                &Presence::Unreadable("forbidden".into()),
            )],
        );
        assert_eq!(exit_status(&report), ExitStatus::Ok);
    }

    #[test]
    fn secret_refs() {
        assert_eq!(
            parse_secret_ref("ns/name"),
            Ok(("ns".into(), "name".into()))
        );
        for bad in ["name", "/name", "ns/", "a/b/c"] {
            assert!(parse_secret_ref(bad).is_err(), "{bad}");
        }
    }
}
