//! Kubernetes Events (`events.k8s.io/v1`, through kube's [`Recorder`]) on the HelmOps, for what a
//! user must act on: a copy refused because the object there is not helmop's (`Conflict`), a
//! cluster that could not be reached (`ClusterUnreachable`), a source Secret/ConfigMap that does
//! not exist (`SourceMissing`), a copy deleted to be recreated whose create was refused
//! (`CopyLost`). All are `Warning`s.
//!
//! One Event per transition: a problem is announced on the first run that finds it, and again only
//! after a run that did not find it (it was fixed, then came back). A process announces what it
//! finds once it leads, since it cannot know what the previous leader said. Notes are built from row
//! reasons, which never hold data (see `helmop_core::plan::Action::reason`).

use std::collections::{BTreeMap, BTreeSet};

use helmop_core::state::Problem;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::cluster::api_error;
use crate::output::report::Row;
use crate::run::propagate::Report;

/// `reportingController` of the Events.
pub const CONTROLLER: &str = "helmop.dev/propagator";
/// `action` of the Events.
const ACTION: &str = "Propagate";
/// The API server refuses notes over 1 kB.
const MAX_NOTE: usize = 1000;

/// What one Event is about: HelmOp (`namespace/name`), reason, and the subject within it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub helmop: String,
    pub reason: &'static str,
    pub subject: String,
}

/// Announces new problems of each run.
pub struct Notices {
    client: Client,
    reporter: Reporter,
    /// What the last run found (and was announced).
    known: BTreeSet<Key>,
}

impl Notices {
    pub fn new(client: Client, identity: &str) -> Notices {
        Notices {
            client,
            reporter: Reporter {
                controller: CONTROLLER.to_owned(),
                instance: Some(identity.to_owned()),
            },
            known: BTreeSet::new(),
        }
    }

    /// Publishes an Event for each problem of `report` the previous run did not have. Returns how
    /// many could not be published (they are tried again after the next run).
    pub async fn publish(&mut self, report: &Report) -> usize {
        let found = problems(report);
        let mut failed = BTreeSet::new();
        for (key, note) in &found {
            if self.known.contains(key) {
                continue;
            }
            let Some(regarding) = report.helmop_refs.get(&key.helmop) else {
                continue;
            };
            if let Err(e) = self.publish_one(key, note, regarding).await {
                tracing::warn!(
                    helmop = %key.helmop,
                    reason = key.reason,
                    error = %api_error::describe(&e),
                    "cannot publish an event"
                );
                failed.insert(key.clone());
            }
        }
        self.known = found.into_keys().filter(|k| !failed.contains(k)).collect();
        failed.len()
    }

    /// Forgets what was announced (on losing leadership: the next leader announces anew).
    pub fn forget(&mut self) {
        self.known.clear();
    }

    async fn publish_one(
        &self,
        key: &Key,
        note: &str,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let event = event(EventType::Warning, key.reason, ACTION, note);
        publish(&self.client, &self.reporter, &event, regarding).await
    }
}

/// An Event whose note is cut to what the API server accepts.
pub fn event(type_: EventType, reason: &str, action: &str, note: &str) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        note: Some(truncate(note, MAX_NOTE)),
        action: action.to_owned(),
        secondary: None,
    }
}

/// Publishes `event` about `regarding` through a fresh recorder: a shared one's cache would merge
/// a second note of the same reason on the same object into the first Event's series, keeping the
/// first note.
pub async fn publish(
    client: &Client,
    reporter: &Reporter,
    event: &Event,
    regarding: &ObjectReference,
) -> Result<(), kube::Error> {
    Recorder::new(client.clone(), reporter.clone())
        .publish(event, regarding)
        .await
}

/// The subject of a copy's Event: `KIND NAMESPACE/NAME on CLUSTER`.
fn copy_on_cluster(row: &Row) -> String {
    format!(
        "{} {}/{} on {}",
        row.kind, row.namespace, row.name, row.cluster
    )
}

/// Every problem of a run worth an Event, with its note.
pub fn problems(report: &Report) -> BTreeMap<Key, String> {
    let mut out = BTreeMap::new();
    for row in &report.rows {
        let (reason, subject, note) = match row.state.problem() {
            Some(Problem::Conflict) => (
                "Conflict",
                copy_on_cluster(row),
                format!(
                    "{} {}/{} on cluster {} was not copied: {}",
                    row.kind, row.namespace, row.name, row.cluster, row.reason
                ),
            ),
            Some(Problem::Unreachable) => (
                "ClusterUnreachable",
                row.cluster.clone(),
                format!(
                    "cluster {} could not be reached, nothing was copied there: {}",
                    row.cluster, row.reason
                ),
            ),
            Some(Problem::Lost) => (
                "CopyLost",
                copy_on_cluster(row),
                format!(
                    "{} {}/{} on cluster {}: {}",
                    row.kind, row.namespace, row.name, row.cluster, row.reason
                ),
            ),
            Some(Problem::SourceMissing) => (
                "SourceMissing",
                format!("{} {}", row.kind, row.name),
                format!(
                    "{} {} was not copied to any cluster: {}",
                    row.kind, row.name, row.reason
                ),
            ),
            // Failed writes and invalid HelmOps are the run's own errors (output, metrics); the
            // rest need nothing from a user.
            Some(Problem::Failed | Problem::Invalid) | None => continue,
        };
        for helmop in &row.helmops {
            out.entry(Key {
                helmop: helmop.clone(),
                reason,
                subject: subject.clone(),
            })
            .or_insert_with(|| note.clone());
        }
    }
    out
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::report::Row;
    use helmop_core::state::RowState;

    fn row(helmops: &[&str], cluster: &str, name: &str, state: RowState) -> Row {
        Row {
            helmops: helmops.iter().map(|s| (*s).to_owned()).collect(),
            cluster: cluster.into(),
            namespace: "apps".into(),
            kind: "Secret".into(),
            name: name.into(),
            workload: None,
            state,
            reason: "why".into(),
            in_sync: None,
            fleet_copy: None,
            hold: None,
        }
    }

    #[test]
    fn one_problem_per_helmop_reason_and_subject() {
        let mut r = crate::run::propagate::Report {
            upstream_id: "up".into(),
            dry_run: false,
            rejected: Vec::new(),
            hash_key: crate::run::hash_key::KeyOrigin::Existing,
            rows: vec![
                row(&["t/a", "t/b"], "t/d1", "db", RowState::Conflict),
                row(&["t/a"], "t/d1", "db", RowState::Created),
                // Two copies wanted on an unreachable cluster: one Event for the cluster.
                row(&["t/a"], "t/d2", "db", RowState::Unreachable),
                row(&["t/a"], "t/d2", "cfg", RowState::Unreachable),
                // A missing source wanted on two clusters: one Event for the source.
                row(&["t/a"], "t/d1", "gone", RowState::SourceMissing),
                row(&["t/a"], "t/d3", "gone", RowState::SourceMissing),
                // A cluster with nothing wanted: no HelmOp to tell.
                row(&[], "t/d4", "", RowState::Unreachable),
            ],
            problems: Vec::new(),
            summary: Default::default(),
            namespaces: Default::default(),
            helmop_refs: Default::default(),
            clusters: Vec::new(),
            unreachable: Vec::new(),
            focus: None,
            kinds: helmop_core::resource::ResourceKind::ALL.to_vec(),
        };
        let found = problems(&r);
        let keys: Vec<(&str, &str, &str)> = found
            .keys()
            .map(|k| (k.helmop.as_str(), k.reason, k.subject.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("t/a", "ClusterUnreachable", "t/d2"),
                ("t/a", "Conflict", "Secret apps/db on t/d1"),
                ("t/a", "SourceMissing", "Secret gone"),
                ("t/b", "Conflict", "Secret apps/db on t/d1"),
            ]
        );
        r.rows.clear();
        assert!(problems(&r).is_empty());
    }

    #[test]
    fn long_notes_are_cut_on_a_char_boundary() {
        let s = "é".repeat(600);
        let t = truncate(&s, MAX_NOTE);
        assert!(t.len() <= MAX_NOTE && t.ends_with("..."));
        assert_eq!(truncate("short", MAX_NOTE), "short");
    }
}
