//! Command-line options shared by the cluster-facing commands (`propagate`, `status`, `prune`,
//! and `rollout`): kubectl's connection flags, the downstream cluster selection, the output
//! format. Each command flattens the groups it needs, so `validate` stays free of them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::error::{DurationProblem, PluginError};

/// kubectl's connection flags, plus helmop's `--upstream-id`.
#[derive(Clone, Debug, Default, Args)]
pub struct KubeArgs {
    /// Path to the kubeconfig file (default: the files in KUBECONFIG, merged as kubectl does,
    /// else ~/.kube/config, else the in-cluster service account)
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context of the upstream (management) cluster
    #[arg(long, value_name = "CONTEXT")]
    pub context: Option<String>,

    /// Namespace of the HelmOps (default: the context's namespace, else `default`)
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Time to wait for any single API request before giving up, e.g. 30s, 1m; 0 means no
    /// limit (kube's defaults)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0")]
    pub request_timeout: Duration,

    /// Stable name of the upstream cluster, recorded in every copy's owners and source
    /// annotations. Default: `up-` and 12 hex digits of a SHA-256 over the UID of the upstream's
    /// kube-system namespace, so a laptop (whatever proxy, URL or CA) and an in-cluster
    /// propagator agree; copies marked with the id of earlier releases are migrated
    #[arg(long, value_name = "ID")]
    pub upstream_id: Option<String>,

    /// Also read Fleet Clusters' kubeconfig Secrets from this namespace (repeatable). Without it,
    /// a Cluster whose spec.kubeConfigSecretNamespace names a namespace Fleet itself does not read
    /// from (anything but the Cluster's own, Fleet's workspace and system namespaces, cluster-*)
    /// is refused and that Secret is never read, as Fleet does
    #[arg(long = "allow-kubeconfig-namespace", value_name = "NAMESPACE")]
    pub kubeconfig_namespaces: Vec<String>,
}

/// Downstream clusters worked on at once by default. Each cluster's work is a chain of round
/// trips (about nine per cluster and edit), so more at once hides their latency: at 1,000
/// simulated clusters an edit reached every copy in 0.84 x the time it took with 16 at once; 128
/// took 0.94 x of 64 for twice the in-flight plans and sockets (docs/performance.md, "Clusters
/// at once").
pub const DEFAULT_CONCURRENCY: u32 = 64;

/// Which downstream clusters to work on, and how.
#[derive(Clone, Debug, Args)]
pub struct TargetArgs {
    /// Use this context of the local kubeconfig as a downstream cluster instead of Fleet's
    /// Clusters (repeatable). Every selected HelmOp targets every such context, with its root
    /// options, or those of the first target whose clusterName is the context's name
    #[arg(long = "target-context", value_name = "CONTEXT")]
    pub target_contexts: Vec<String>,

    /// How many downstream clusters to work on at once
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,

    /// Time one downstream cluster may take in total before its rows are reported
    /// Unreachable; other clusters are not held up (propagate: its copies, and then its
    /// restamps, each within this time)
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration, default_value = "60s")]
    pub cluster_timeout: Duration,
}

impl Default for TargetArgs {
    fn default() -> Self {
        TargetArgs {
            target_contexts: Vec::new(),
            concurrency: DEFAULT_CONCURRENCY,
            cluster_timeout: Duration::from_secs(60),
        }
    }
}

/// `-o` of the cluster-facing commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// A table (colour only on a terminal, never with NO_COLOR)
    #[default]
    Table,
    /// A table with more columns (reasons, upstream id)
    Wide,
    /// One JSON document
    Json,
    /// One YAML document
    Yaml,
}

/// Reads a duration as kubectl does: `0`, a plain number of seconds, or Go-style units
/// (`500ms`, `30s`, `2m`, `1h30m`).
pub fn parse_duration(s: &str) -> Result<Duration, PluginError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(PluginError::EmptyDuration);
    }
    let invalid = |problem| PluginError::InvalidDuration {
        value: s.to_owned(),
        problem,
    };
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(invalid(DurationProblem::NoNumber));
        }
        let (number, tail) = rest.split_at(digits);
        let number: f64 = number
            .parse()
            .map_err(|_| invalid(DurationProblem::BadNumber(number.to_owned())))?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(invalid(DurationProblem::MissingUnit)),
            other => return Err(invalid(DurationProblem::UnknownUnit(other.to_owned()))),
        };
        let part = Duration::try_from_secs_f64(number * scale)
            .map_err(|_| invalid(DurationProblem::OutOfRange))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| invalid(DurationProblem::OutOfRange))?;
        rest = next;
    }
    Ok(total)
}

fn parse_positive_duration(s: &str) -> Result<Duration, PluginError> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(PluginError::NotPositive);
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0").ok(), Some(Duration::ZERO));
        assert_eq!(parse_duration("15").ok(), Some(Duration::from_secs(15)));
        assert_eq!(
            parse_duration("500ms").ok(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_duration("30s").ok(), Some(Duration::from_secs(30)));
        assert_eq!(
            parse_duration("1h30m").ok(),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(
            parse_duration("1.5s").ok(),
            Some(Duration::from_millis(1500))
        );
        for bad in ["", "s", "10x", "1h30", "-1s", "1e400s", "abc"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_positive_duration("0s").is_err());
        let message = |s: &str| parse_duration(s).map_err(|e| e.to_string()).err();
        assert_eq!(message("").as_deref(), Some("empty duration"));
        assert_eq!(
            message("10x").as_deref(),
            Some(r#"invalid duration "10x": unknown unit "x""#)
        );
        assert_eq!(
            message("1h30").as_deref(),
            Some(r#"invalid duration "1h30": missing unit (ms, s, m, h)"#)
        );
        assert_eq!(
            message("s").as_deref(),
            Some(r#"invalid duration "s": expected a number before the unit"#)
        );
        assert_eq!(
            message("1.2.3s").as_deref(),
            Some(r#"invalid duration "1.2.3s": bad number "1.2.3""#)
        );
    }
}
