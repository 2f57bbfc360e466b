//! What `propagate --watch` prints: one event per line on stdout. With `-o json` each line is a JSON
//! object (JSON Lines: `time`, `event`, and the event's fields, a run carrying the same report as a
//! one-shot `propagate -o json`); with `-o yaml` one YAML document per event; otherwise a readable
//! line per event and, after a run, the rows that are not `Unchanged`.

use helmop_core::state::RowState;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use serde_json::json;

use crate::args::ReportFormat;
use crate::error::PluginError;
use crate::output;
use crate::output::report::{self, Row};
use crate::run::propagate::Report;

/// Rows in these states are left out of the text output of a run (they are in the JSON).
fn quiet(state: RowState) -> bool {
    matches!(state, RowState::Unchanged | RowState::Synced)
}

pub struct Events {
    format: ReportFormat,
}

impl Events {
    pub fn new(format: ReportFormat) -> Events {
        Events { format }
    }

    /// Prints one event; `fields` (an object) go beside `time` and `event`. Serialized straight
    /// from the borrowed fields: a run's report is never copied into a JSON tree first (at fleet
    /// scale that copy was the biggest allocation of a run).
    pub fn emit<T: Serialize + ?Sized>(&self, event: &str, fields: &T, text: String) {
        #[derive(Serialize)]
        struct Line<'a, T: Serialize + ?Sized> {
            time: String,
            event: &'a str,
            #[serde(flatten)]
            fields: &'a T,
        }
        let now = Timestamp::now();
        let rendered = match self.format {
            ReportFormat::Json | ReportFormat::Yaml => {
                let line = Line {
                    time: now.to_string(),
                    event,
                    fields,
                };
                if self.format == ReportFormat::Json {
                    serde_json::to_string(&line)
                        .map(|mut s| {
                            s.push('\n');
                            s
                        })
                        .map_err(PluginError::from)
                } else {
                    serde_saphyr::to_string(&line)
                        .map(|s| format!("---\n{s}"))
                        .map_err(|e| PluginError::Usage(format!("cannot encode YAML: {e}")))
                }
            }
            ReportFormat::Table | ReportFormat::Wide => Ok(format!("{now} {text}\n")),
        };
        match rendered.and_then(|s| output::emit(&s)) {
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "cannot print a watch event"),
        }
    }

    /// `metrics_addr`: where `/metrics`, `/livez` and `/readyz` are served (the bound address, so
    /// port 0 says which port was picked).
    pub fn started(
        &self,
        identity: Option<&str>,
        lease: Option<&str>,
        scope: &str,
        shard: Option<&str>,
        metrics_addr: Option<std::net::SocketAddr>,
    ) {
        let mut text = match (identity, lease) {
            (Some(id), Some(lease)) => {
                format!("watching {scope}; leader election on Lease {lease} as {id}")
            }
            _ => format!("watching {scope}; no leader election"),
        };
        if let Some(addr) = metrics_addr {
            text.push_str(&format!("; metrics and probes on http://{addr}"));
        }
        self.emit(
            "started",
            &json!({
                "identity": identity,
                "lease": lease,
                "scope": scope,
                "shard": shard,
                "metricsAddr": metrics_addr.map(|a| a.to_string()),
            }),
            text,
        );
    }

    /// Leadership changed; `note` says what it means for writing.
    pub fn leader(&self, leading: bool, identity: &str, lease: &str, note: &str) {
        let state = if leading { "leading" } else { "standing by" };
        self.emit(
            "leader",
            &json!({"leading": leading, "identity": identity, "lease": lease, "note": note}),
            format!("{state} (Lease {lease}, identity {identity}): {note}"),
        );
    }

    /// `retry_in`: when the run's transient problems are tried again with nothing changed.
    pub fn run(&self, number: u64, reasons: &[String], report: &Report, retry_in: Option<&str>) {
        let s = &report.summary;
        let states: Vec<String> = s.states.iter().map(|(k, v)| format!("{v} {k}")).collect();
        let mut text = format!(
            "run {number} ({}): {} HelmOp(s), {} cluster(s) ({} unreachable): {}; {} write(s)",
            reasons.join("; "),
            s.helmops,
            s.clusters,
            s.unreachable_clusters,
            if states.is_empty() {
                "nothing to do".to_owned()
            } else {
                states.join(", ")
            },
            s.writes
        );
        if let Some(wait) = retry_in {
            text.push_str(&format!("; retrying the failed and unreachable in {wait}"));
        }
        let rows: Vec<Row> = report
            .rows
            .iter()
            .filter(|r| !quiet(r.state))
            .cloned()
            .collect();
        if !rows.is_empty() {
            let table = report::table(
                &rows,
                report::Table {
                    reason: true,
                    colour: report::colour_stdout(),
                },
            );
            text.push('\n');
            text.push_str(table.trim_end());
        }
        for p in &report.problems {
            text.push_str(&format!("\nerror: HelmOp {}: {}", p.helmop, p.message));
        }
        #[derive(Serialize)]
        struct Run<'a> {
            run: u64,
            reasons: &'a [String],
            writes: u64,
            #[serde(rename = "retryIn", skip_serializing_if = "Option::is_none")]
            retry_in: Option<&'a str>,
            report: &'a Report,
        }
        self.emit(
            "run",
            &Run {
                run: number,
                reasons,
                writes: s.writes,
                retry_in,
                report,
            },
            text,
        );
    }

    pub fn failed(&self, number: u64, reasons: &[String], error: &PluginError, retry_in: &str) {
        self.emit(
            "failed",
            &json!({"run": number, "reasons": reasons, "error": error.to_string(), "retryIn": retry_in}),
            format!("run {number} failed: {error}; retrying in {retry_in}"),
        );
    }

    pub fn aborted(&self, number: u64, why: &str) {
        self.emit(
            "aborted",
            &json!({"run": number, "why": why}),
            format!("run {number} aborted: {why}"),
        );
    }

    pub fn stopped(&self, signal: &str) {
        self.emit(
            "stopped",
            &json!({"signal": signal}),
            format!("stopped on {signal}"),
        );
    }
}
