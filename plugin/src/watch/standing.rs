//! Where the fleet stands after the latest runs of a watcher. A focused run
//! ([`crate::run::focus`]) reports only the clusters it covered; what the metrics' copy counts, the
//! Events on HelmOps and the retry of failed writes are decided from must still be the whole fleet,
//! or a focused run would make an unreachable cluster look recovered (and announce it again
//! later), drop its retry, or zero its rows in `helmop_propagator_copies`.
//!
//! So the watcher keeps the report of its last full run and lays each focused run's rows over it:
//! the covered clusters' rows are replaced, the others' kept, and the rows about no cluster (a
//! HelmOp's problems, which every run evaluates in full) come from the newest run. A run that
//! worked on some kinds of copies only ([`crate::run::focus::Focus::kinds`]) replaces its clusters'
//! rows of those kinds and the rows about the cluster as a whole; their copies of the other kinds
//! keep the rows they had.

use std::collections::BTreeSet;

use helmop_core::resource::ResourceKind;

use crate::output::report as table;
use crate::run::propagate::Report;

/// `run` laid over `standing` (see the module documentation). A full run replaces everything.
pub fn merge(standing: &Report, run: &Report) -> Report {
    if run.focus.is_none() {
        return run.clone();
    }
    let covered: BTreeSet<&str> = run.clusters.iter().map(String::as_str).collect();
    let known: BTreeSet<&str> = standing
        .clusters
        .iter()
        .chain(&run.clusters)
        .map(String::as_str)
        .collect();
    let about_a_cluster = |cluster: &str| known.contains(cluster);
    // A row of a copy of a kind the run did not work on; a row about no copy (a cluster that
    // could not be reached, say) is the run's whatever its kinds.
    let other_kind =
        |kind: &str| ResourceKind::parse(kind).is_some_and(|k| !run.kinds.contains(&k));
    let mut rows: Vec<_> = standing
        .rows
        .iter()
        .filter(|r| {
            about_a_cluster(&r.cluster)
                && (!covered.contains(r.cluster.as_str()) || other_kind(&r.kind))
        })
        .chain(
            run.rows
                .iter()
                .filter(|r| !about_a_cluster(&r.cluster) || covered.contains(r.cluster.as_str())),
        )
        .cloned()
        .collect();
    table::sort(&mut rows);
    let unreachable: Vec<String> = standing
        .unreachable
        .iter()
        .filter(|c| !covered.contains(c.as_str()))
        .chain(&run.unreachable)
        .cloned()
        .collect();
    let mut merged = run.clone();
    merged.summary.states = table::counts(&rows);
    merged.summary.clusters = standing.clusters.len();
    merged.summary.unreachable_clusters = unreachable.len();
    merged.rows = rows;
    merged.unreachable = unreachable;
    merged.clusters = standing.clusters.clone();
    merged
}

#[cfg(test)]
mod tests {
    use helmop_core::state::RowState;

    use super::*;
    use crate::watch::fixtures::{report, row};

    fn on(cluster: &str, name: &str, state: RowState) -> crate::output::report::Row {
        let mut r = row(&format!("team/{name}"), state);
        r.cluster = cluster.into();
        r.name = name.into();
        r
    }

    fn states(r: &Report) -> Vec<(String, String, RowState)> {
        r.rows
            .iter()
            .map(|r| (r.cluster.clone(), r.name.clone(), r.state))
            .collect()
    }

    #[test]
    fn a_focused_run_replaces_only_the_clusters_it_covered() {
        let mut full = report(
            vec![
                on("team/d1", "db", RowState::Unchanged),
                on("team/d2", "db", RowState::Unreachable),
                on("", "bad", RowState::Invalid),
            ],
            1,
        );
        full.unreachable = vec!["team/d2".into()];
        let mut focused = report(
            vec![
                on("team/d1", "db", RowState::Updated),
                on("", "bad", RowState::Invalid),
            ],
            0,
        );
        focused.clusters = vec!["team/d1".into()];
        focused.focus = Some(vec!["Secret team/db".into()]);
        let merged = merge(&full, &focused);
        // d2 is still unreachable (the focused run did not look), d1 has the new row, and the
        // HelmOp-level row is the newest run's, once.
        assert_eq!(
            states(&merged),
            [
                ("".to_owned(), "bad".to_owned(), RowState::Invalid),
                ("team/d1".to_owned(), "db".to_owned(), RowState::Updated),
                ("team/d2".to_owned(), "db".to_owned(), RowState::Unreachable),
            ]
        );
        assert_eq!(merged.summary.unreachable_clusters, 1);
        assert_eq!(merged.summary.clusters, 2);
        assert_eq!(merged.summary.states.get(&RowState::Updated), Some(&1));
        assert_eq!(merged.clusters, full.clusters);

        // A focused run over d2 that reaches it clears it.
        let mut back = report(vec![on("team/d2", "db", RowState::Updated)], 0);
        back.clusters = vec!["team/d2".into()];
        back.focus = Some(vec!["Secret team/db".into()]);
        let merged = merge(&merged, &back);
        assert_eq!(merged.summary.unreachable_clusters, 0);
        assert!(
            !merged.rows.iter().any(|r| r.state == RowState::Unreachable),
            "{:?}",
            states(&merged)
        );
        // A full run replaces everything.
        let full_again = report(vec![on("team/d1", "db", RowState::Unchanged)], 0);
        assert_eq!(states(&merge(&merged, &full_again)), states(&full_again));
    }

    #[test]
    fn a_run_over_some_kinds_keeps_the_rows_of_the_others() {
        let config_map = |cluster: &str, name: &str, state: RowState| {
            let mut r = on(cluster, name, state);
            r.kind = "ConfigMap".into();
            r
        };
        let mut unfinished = on("team/d1", "", RowState::Failed);
        unfinished.kind = String::new();
        let mut full = report(
            vec![
                on("team/d1", "db", RowState::Unchanged),
                config_map("team/d1", "cfg", RowState::Unchanged),
                unfinished,
                config_map("team/d2", "cfg", RowState::Unchanged),
            ],
            0,
        );
        full.clusters = vec!["team/d1".into(), "team/d2".into()];
        // A ConfigMap edit's run over d1: its ConfigMap row and whatever it says about d1 as a
        // whole replace the standing ones; d1's Secret row stands.
        let mut focused = report(vec![config_map("team/d1", "cfg", RowState::Updated)], 0);
        focused.clusters = vec!["team/d1".into()];
        focused.focus = Some(vec!["ConfigMap team/cfg".into()]);
        focused.kinds = vec![ResourceKind::ConfigMap];
        let merged = merge(&full, &focused);
        assert_eq!(
            states(&merged),
            [
                ("team/d1".to_owned(), "cfg".to_owned(), RowState::Updated),
                ("team/d1".to_owned(), "db".to_owned(), RowState::Unchanged),
                ("team/d2".to_owned(), "cfg".to_owned(), RowState::Unchanged),
            ]
        );
        // The same run over every kind would have dropped d1's Secret row.
        focused.kinds = ResourceKind::ALL.to_vec();
        assert!(
            !merge(&full, &focused)
                .rows
                .iter()
                .any(|r| r.cluster == "team/d1" && r.name == "db"),
        );
    }
}
