//! Rows of the cluster-facing commands and how they are shown: tables (colour only on a terminal
//! and never with `NO_COLOR`), JSON, YAML.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use helmop_core::check::Hold;
use helmop_core::fleet_copy::AgentCopy;
use helmop_core::state::RowState;
use serde::Serialize;

use crate::args::ReportFormat;
use crate::error::PluginError;
use crate::output;

/// One row: a HelmOp's copy on one cluster (or, with `workload`, a workload reading that copy).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// The HelmOps the row is about (`namespace/name`).
    pub helmops: Vec<String>,
    /// The downstream cluster, as users call it.
    pub cluster: String,
    /// Namespace downstream.
    pub namespace: String,
    /// `Secret` or `ConfigMap`; empty for a row about a whole cluster or HelmOp.
    pub kind: String,
    pub name: String,
    /// `Kind/name` of a workload reading the copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    pub state: RowState,
    /// Why, in words a user can act on. Never any data.
    pub reason: String,
    /// For `FleetManaged` status rows: whether Fleet's copy matches the source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_sync: Option<bool>,
    /// For `FleetManaged` status rows: whether Fleet's agent has copied the latest content
    /// (`current`, `pending`, `blocked`, `unknown`; shown as `FleetManaged (current)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet_copy: Option<AgentCopy>,
    /// For `status` workload rows: what the rollout watcher holds back on the workload, from its
    /// newest Event among its holds and `Restamped` (shown as `RolloutPending (held: missing)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
}

impl Row {
    /// A row about no particular resource: a whole cluster (`namespace` empty) or one namespace
    /// on it.
    pub fn about(cluster: String, namespace: &str, state: RowState, reason: String) -> Row {
        Row {
            helmops: Vec::new(),
            cluster,
            namespace: namespace.to_owned(),
            kind: String::new(),
            name: String::new(),
            workload: None,
            state,
            reason,
            in_sync: None,
            fleet_copy: None,
            hold: None,
        }
    }

    /// A row about `workload` reading the copy of `resource` on `cluster` in `namespace`.
    pub fn workload(
        helmops: Vec<String>,
        cluster: String,
        namespace: &str,
        resource: &helmop_core::resource::ResourceRef,
        workload: String,
        state: RowState,
        reason: String,
    ) -> Row {
        Row {
            helmops,
            cluster,
            namespace: namespace.to_owned(),
            kind: resource.kind.as_str().to_owned(),
            name: resource.name.clone(),
            workload: Some(workload),
            state,
            reason,
            in_sync: None,
            fleet_copy: None,
            hold: None,
        }
    }

    /// `secret/db`, or `-` for rows about no particular resource.
    pub fn resource(&self) -> String {
        if self.kind.is_empty() {
            "-".into()
        } else {
            format!("{}/{}", self.kind.to_ascii_lowercase(), self.name)
        }
    }
}

/// Sorts rows for display: by cluster, namespace, resource, workload, HelmOps.
pub fn sort(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        (
            &a.cluster,
            &a.namespace,
            a.kind.to_ascii_lowercase(),
            &a.name,
            &a.workload,
            &a.helmops,
        )
            .cmp(&(
                &b.cluster,
                &b.namespace,
                b.kind.to_ascii_lowercase(),
                &b.name,
                &b.workload,
                &b.helmops,
            ))
    });
}

/// How many rows are in each state.
pub fn counts(rows: &[Row]) -> BTreeMap<RowState, usize> {
    let mut out = BTreeMap::new();
    for r in rows {
        *out.entry(r.state).or_insert(0) += 1;
    }
    out
}

/// Whether to colour stdout: a terminal, and `NO_COLOR` unset or empty (no-color.org).
pub fn colour_stdout() -> bool {
    let no_colour = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_colour && std::io::stdout().is_terminal()
}

/// The colour of a state cell on a terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Colour {
    Green,
    Yellow,
    Red,
}

impl Colour {
    fn code(self) -> &'static str {
        match self {
            Colour::Green => "32",
            Colour::Yellow => "33",
            Colour::Red => "31",
        }
    }
}

/// The colour a row's state is shown in: green when nothing needs doing, yellow when something
/// will or should happen, red when helmop could not or would not act. Fleet's own copy
/// (`FleetManaged (current)`) is coloured by where the copy stands when that is known.
fn colour_of(state: RowState, fleet_copy: Option<AgentCopy>) -> Option<Colour> {
    match fleet_copy {
        Some(AgentCopy::Current) => return Some(Colour::Green),
        Some(AgentCopy::Blocked) => return Some(Colour::Red),
        Some(AgentCopy::Pending | AgentCopy::Unknown) | None => {}
    }
    match state {
        RowState::Synced
        | RowState::Unchanged
        | RowState::Created
        | RowState::Updated
        | RowState::Recreated
        | RowState::Current
        | RowState::Kept
        | RowState::Pruned
        | RowState::Released
        | RowState::Restamped => Some(Colour::Green),
        RowState::Stale
        | RowState::Drifted
        | RowState::Missing
        | RowState::Orphaned
        | RowState::RolloutPending
        | RowState::Create
        | RowState::Update
        | RowState::Recreate
        | RowState::Prune
        | RowState::Release
        | RowState::Restamp
        | RowState::FleetManaged => Some(Colour::Yellow),
        RowState::Conflict
        | RowState::SourceMissing
        | RowState::Unreachable
        | RowState::Failed
        | RowState::Lost
        | RowState::Invalid => Some(Colour::Red),
        // Frozen on purpose: nothing is wrong and nothing will happen until it is unpaused, or
        // until the Cluster's schedule is active again.
        RowState::Paused | RowState::OffSchedule => None,
    }
}

/// Table options.
#[derive(Clone, Copy, Debug, Default)]
pub struct Table {
    /// Show the REASON column.
    pub reason: bool,
    pub colour: bool,
}

/// A kubectl-style table: upper-case headers, columns padded with spaces, no borders.
pub fn table(rows: &[Row], opts: Table) -> String {
    let workloads = rows.iter().any(|r| r.workload.is_some());
    let mut headers = vec!["HELMOP", "CLUSTER", "NAMESPACE", "RESOURCE"];
    if workloads {
        headers.push("WORKLOAD");
    }
    headers.push("STATE");
    if opts.reason {
        headers.push("REASON");
    }
    let state_col = headers.iter().position(|h| *h == "STATE").unwrap_or(0);
    let cells: Vec<(Vec<String>, Option<Colour>)> = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                if r.helmops.is_empty() {
                    "-".into()
                } else {
                    r.helmops.join(",")
                },
                r.cluster.clone(),
                if r.namespace.is_empty() {
                    "-".into()
                } else {
                    r.namespace.clone()
                },
                r.resource(),
            ];
            if workloads {
                c.push(r.workload.clone().unwrap_or_else(|| "-".into()));
            }
            let mut state = match r.fleet_copy {
                Some(f) => format!("{} ({})", r.state, f.as_str()),
                None => r.state.to_string(),
            };
            if let Some(h) = &r.hold {
                state.push_str(&format!(" (held: {})", h.label()));
            }
            c.push(state);
            if opts.reason {
                c.push(match &r.hold {
                    Some(h) => format!("held ({}): {}; {}", h.label(), h.note, r.reason),
                    None => r.reason.clone(),
                });
            }
            let colour = opts
                .colour
                .then(|| colour_of(r.state, r.fleet_copy))
                .flatten()
                // A hold is a warning: never green.
                .map(|c| match (c, &r.hold) {
                    (Colour::Green, Some(_)) => Colour::Yellow,
                    (c, _) => c,
                });
            (c, colour)
        })
        .collect();
    grid(&headers, &cells, state_col)
}

/// A kubectl-style table of `cells` under `headers` (padded with spaces, no borders); the cell of
/// column `state_col` of a row with a colour is shown in it.
pub fn grid(headers: &[&str], cells: &[(Vec<String>, Option<Colour>)], state_col: usize) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for (row, _) in cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String], colour: Option<Colour>| {
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            match colour.filter(|_| i == state_col) {
                Some(c) => out.push_str(&format!("\x1b[{}m{cell}\x1b[0m", c.code())),
                None => out.push_str(cell),
            }
            if i < last {
                out.push_str(&" ".repeat(pad + 3));
            }
        }
        out.push('\n');
    };
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    line(&mut out, &header, None);
    for (row, colour) in cells {
        line(&mut out, row, *colour);
    }
    out
}

/// Writes `report` in `format`: JSON and YAML show the whole document, tables its rows followed
/// by `footer` lines.
pub fn emit<T: Serialize>(
    format: ReportFormat,
    report: &T,
    rows: &[Row],
    reason_in_table: bool,
    footer: &[String],
) -> Result<(), PluginError> {
    let text = match format {
        ReportFormat::Json => output::json(report)?,
        ReportFormat::Yaml => serde_saphyr::to_string(report)
            .map_err(|e| PluginError::Usage(format!("cannot encode YAML: {e}")))?,
        ReportFormat::Table | ReportFormat::Wide => {
            let opts = Table {
                reason: reason_in_table || format == ReportFormat::Wide,
                colour: colour_stdout(),
            };
            let mut text = if rows.is_empty() {
                "No rows.\n".to_string()
            } else {
                table(rows, opts)
            };
            for line in footer {
                text.push_str(line);
                text.push('\n');
            }
            text
        }
    };
    output::emit(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cluster: &str, name: &str, state: RowState) -> Row {
        Row {
            helmops: vec!["team/app".into()],
            cluster: cluster.into(),
            namespace: "apps".into(),
            kind: "Secret".into(),
            name: name.into(),
            workload: None,
            state,
            reason: "in sync".into(),
            in_sync: None,
            fleet_copy: None,
            hold: None,
        }
    }

    #[test]
    fn plain_table() {
        let rows = [
            row("fleet/down1", "db", RowState::Synced),
            row("fleet/down2", "database", RowState::Stale),
        ];
        let t = table(&rows, Table::default());
        assert_eq!(
            t,
            "HELMOP     CLUSTER       NAMESPACE   RESOURCE          STATE\n\
             team/app   fleet/down1   apps        secret/db         Synced\n\
             team/app   fleet/down2   apps        secret/database   Stale\n"
        );
    }

    #[test]
    fn wide_table_with_workloads_and_colour() {
        let mut w = row("c", "db", RowState::RolloutPending);
        w.workload = Some("Deployment/web".into());
        let t = table(
            &[row("c", "db", RowState::Synced), w],
            Table {
                reason: true,
                colour: true,
            },
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "HELMOP     CLUSTER   NAMESPACE   RESOURCE    WORKLOAD         STATE            REASON"
        );
        assert!(lines[1].contains("\x1b[32mSynced\x1b[0m"), "{}", lines[1]);
        assert!(lines[2].contains("Deployment/web   \x1b[33mRolloutPending\x1b[0m   in sync"));
        let plain = table(
            &[row("c", "db", RowState::Synced)],
            Table {
                reason: false,
                colour: false,
            },
        );
        assert!(!plain.contains('\x1b'));
    }

    #[test]
    fn a_held_workload_says_so_in_its_state_and_reason_and_is_never_green() {
        let mut w = row("c", "db", RowState::Current);
        w.workload = Some("Deployment/web".into());
        w.hold = Some(Hold {
            reason: "RestampHeld".into(),
            note: "secret/db lacks key password".into(),
        });
        let t = table(
            std::slice::from_ref(&w),
            Table {
                reason: true,
                colour: true,
            },
        );
        let line = t.lines().nth(1).unwrap_or_default();
        assert!(
            line.contains("\x1b[33mCurrent (held: missing)\x1b[0m"),
            "{line}"
        );
        assert!(
            line.ends_with("held (missing): secret/db lacks key password; in sync"),
            "{line}"
        );
        let plain = table(&[w], Table::default());
        assert!(plain.contains("Current (held: missing)\n"), "{plain}");
        assert!(!plain.contains("lacks key"), "{plain}");
    }

    #[test]
    fn sorting_and_counts() {
        let mut rows = vec![
            row("b", "x", RowState::Stale),
            row("a", "y", RowState::Synced),
            row("a", "x", RowState::Synced),
        ];
        sort(&mut rows);
        let order: Vec<(String, String)> = rows
            .iter()
            .map(|r| (r.cluster.clone(), r.name.clone()))
            .collect();
        assert_eq!(
            order,
            [
                ("a".into(), "x".into()),
                ("a".into(), "y".into()),
                ("b".into(), "x".into())
            ]
        );
        assert_eq!(
            counts(&rows),
            BTreeMap::from([(RowState::Stale, 1), (RowState::Synced, 2)])
        );
    }
}
