//! Reports of runs for the watch modules' unit tests.

use std::collections::BTreeSet;

use helmop_core::state::RowState;

use crate::output::report::Row;
use crate::run::hash_key::KeyOrigin;
use crate::run::propagate::{Report, Summary};

pub fn row(cluster: &str, state: RowState) -> Row {
    Row {
        helmops: vec!["team/app".into()],
        cluster: cluster.into(),
        namespace: "apps".into(),
        kind: "Secret".into(),
        name: "db".into(),
        workload: None,
        state,
        reason: String::new(),
        in_sync: None,
        fleet_copy: None,
        hold: None,
    }
}

pub fn report(rows: Vec<Row>, unreachable: usize) -> Report {
    Report {
        upstream_id: "up".into(),
        dry_run: false,
        rejected: Vec::new(),
        hash_key: KeyOrigin::Existing,
        summary: Summary {
            helmops: 1,
            clusters: 2,
            unreachable_clusters: unreachable,
            states: crate::output::report::counts(&rows),
            writes: 0,
        },
        rows,
        problems: Vec::new(),
        namespaces: BTreeSet::new(),
        helmop_refs: Default::default(),
        clusters: vec!["team/d1".into(), "team/d2".into()],
        unreachable: Vec::new(),
        focus: None,
        kinds: helmop_core::resource::ResourceKind::ALL.to_vec(),
    }
}
