//! The states report rows are in (`propagate`, `status`, `prune`, and what `propagate --watch`
//! turns into Events and metrics). The words are part of the interface: tables, `-o json` /
//! `-o yaml`, Event reasons and metric labels show them as written here, so they live only in
//! [`RowState::as_str`].

use std::cmp::Ordering;
use std::fmt;

use serde::{Serialize, Serializer};

/// One row's state. Ordered by its word, so per-state summaries keep the alphabetical order
/// they had as strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowState {
    /// An object there is not helmop's (or is a source); it was not written.
    Conflict,
    /// `propagate --dry-run`: a copy would be created.
    Create,
    Created,
    /// `status`: the workload's stamp lists the copy's current content.
    Current,
    /// `status`: helmop's copy was edited downstream.
    Drifted,
    /// A write (or a read before it) failed.
    Failed,
    /// Fleet copies this object itself; helmop leaves it alone.
    FleetManaged,
    /// A HelmOp's targets or entries are invalid, or Fleet rejects it.
    Invalid,
    Kept,
    /// `propagate`: helmop deleted its copy to create it anew (a `type` change, an immutable
    /// copy) and the create was refused even after retries: the copy is missing until the next
    /// run creates it. Readers of it are not restamped meanwhile.
    Lost,
    /// `status`: no copy yet.
    Missing,
    /// The Cluster is off its Fleet schedule: its copies are frozen until the schedule is
    /// active again.
    OffSchedule,
    /// helmop's copy, not wanted any more, not removed (by this command, or at all).
    Orphaned,
    /// The Cluster or the HelmOp is paused: its copies are frozen.
    Paused,
    /// `prune --dry-run`: the copy would be deleted.
    Prune,
    Pruned,
    /// `propagate --dry-run`: the copy would be deleted and created again.
    Recreate,
    Recreated,
    /// `prune --dry-run`: the copy would lose some owners.
    Release,
    Released,
    /// `propagate --dry-run`: the workload would be restamped.
    Restamp,
    Restamped,
    /// `status`: the workload's stamp does not list the copy's current content yet.
    RolloutPending,
    /// The source Secret or ConfigMap does not exist upstream.
    SourceMissing,
    /// `status`: helmop's copy, older than its source.
    Stale,
    /// `status`: helmop's copy matches its source.
    Synced,
    Unchanged,
    /// The cluster could not be worked on.
    Unreachable,
    /// `propagate --dry-run`: the copy would be updated.
    Update,
    Updated,
}

impl RowState {
    pub fn as_str(self) -> &'static str {
        match self {
            RowState::Conflict => "Conflict",
            RowState::Create => "Create",
            RowState::Created => "Created",
            RowState::Current => "Current",
            RowState::Drifted => "Drifted",
            RowState::Failed => "Failed",
            RowState::FleetManaged => "FleetManaged",
            RowState::Invalid => "Invalid",
            RowState::Kept => "Kept",
            RowState::Lost => "Lost",
            RowState::Missing => "Missing",
            RowState::OffSchedule => "OffSchedule",
            RowState::Orphaned => "Orphaned",
            RowState::Paused => "Paused",
            RowState::Prune => "Prune",
            RowState::Pruned => "Pruned",
            RowState::Recreate => "Recreate",
            RowState::Recreated => "Recreated",
            RowState::Release => "Release",
            RowState::Released => "Released",
            RowState::Restamp => "Restamp",
            RowState::Restamped => "Restamped",
            RowState::RolloutPending => "RolloutPending",
            RowState::SourceMissing => "SourceMissing",
            RowState::Stale => "Stale",
            RowState::Synced => "Synced",
            RowState::Unchanged => "Unchanged",
            RowState::Unreachable => "Unreachable",
            RowState::Update => "Update",
            RowState::Updated => "Updated",
        }
    }
}

/// The states that are a problem of the run, the one classification `propagate --watch`'s metrics
/// and Events both read from, so a new [`RowState`] is classified once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    Conflict,
    SourceMissing,
    Failed,
    /// A copy deleted to be recreated and not created again (`Lost`).
    Lost,
    Invalid,
    Unreachable,
}

impl RowState {
    /// The problem a row in this state is, if it is one.
    pub fn problem(self) -> Option<Problem> {
        match self {
            RowState::Conflict => Some(Problem::Conflict),
            RowState::SourceMissing => Some(Problem::SourceMissing),
            RowState::Failed => Some(Problem::Failed),
            RowState::Lost => Some(Problem::Lost),
            RowState::Invalid => Some(Problem::Invalid),
            RowState::Unreachable => Some(Problem::Unreachable),
            RowState::Create
            | RowState::Created
            | RowState::Current
            | RowState::Drifted
            | RowState::FleetManaged
            | RowState::Kept
            | RowState::Missing
            | RowState::OffSchedule
            | RowState::Orphaned
            | RowState::Paused
            | RowState::Prune
            | RowState::Pruned
            | RowState::Recreate
            | RowState::Recreated
            | RowState::Release
            | RowState::Released
            | RowState::Restamp
            | RowState::Restamped
            | RowState::RolloutPending
            | RowState::Stale
            | RowState::Synced
            | RowState::Unchanged
            | RowState::Update
            | RowState::Updated => None,
        }
    }
}

impl fmt::Display for RowState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RowState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl Ord for RowState {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for RowState {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn words_are_the_variant_names_and_order_is_alphabetical() {
        let states = [
            RowState::Synced,
            RowState::Conflict,
            RowState::RolloutPending,
        ];
        for s in states {
            assert_eq!(format!("{s:?}"), s.as_str());
            assert_eq!(s.to_string(), s.as_str());
        }
        let counts: BTreeMap<RowState, usize> = states.iter().map(|s| (*s, 1)).collect();
        assert_eq!(
            serde_json::to_string(&counts).ok().as_deref(),
            Some(r#"{"Conflict":1,"RolloutPending":1,"Synced":1}"#)
        );
        assert!(RowState::Restamped < RowState::RolloutPending);
    }
}
