//! Where a workload's rollout stands, read from its status the way `kubectl rollout status`
//! reads it (`k8s.io/kubectl/pkg/polymorphichelpers/rollout_status.go`), and Argo Rollouts' phase.
//!
//! The rollout watcher's roll budget counts a workload as rolling from its restamp until this says
//! [`RollState::Complete`] or [`RollState::Stalled`]; an Argo Rollout that is aborted or mid-canary
//! is never restamped (a restamp would put it back on its bad revision or restart its steps).

use serde_json::Value;

use crate::workload::WorkloadKind;

/// Where a workload's rollout stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RollState {
    /// Every replica runs the current template and is available (or the kind does not roll: a
    /// CronJob's next Job, an `OnDelete` update strategy).
    Complete,
    /// The controller is still rolling (or has not seen the new template yet); why, for reports.
    Progressing(&'static str),
    /// The rollout failed for good until someone acts: a Deployment past its progress deadline, a
    /// degraded Argo Rollout.
    Stalled(&'static str),
    /// An Argo Rollout that was aborted (it runs its stable revision on purpose).
    Aborted,
}

impl RollState {
    /// Whether the rollout is over, well or not (a budget slot is given back).
    pub fn is_over(&self) -> bool {
        matches!(self, RollState::Complete | RollState::Stalled(_))
    }
}

/// The state of the rollout of an object of `kind` at `generation` (its `metadata.generation`),
/// from `obj`'s `spec` and `status` (a whole object, or the `data` of a `DynamicObject`).
pub fn roll_state(kind: WorkloadKind, generation: Option<i64>, obj: &Value) -> RollState {
    let status = obj.get("status").unwrap_or(&Value::Null);
    let observed = observed_generation(status);
    let seen = match (generation, observed) {
        (Some(g), Some(o)) => o >= g,
        // No generation (a hand-made object in a test): only the status counts.
        (None, _) => true,
        (Some(_), None) => false,
    };
    match kind {
        // None of these replaces pods when its template changes (the watcher never restamps them).
        WorkloadKind::CronJob
        | WorkloadKind::ReplicaSet
        | WorkloadKind::Job
        | WorkloadKind::Pod => RollState::Complete,
        WorkloadKind::Deployment => deployment(obj, status, seen),
        WorkloadKind::StatefulSet => stateful_set(obj, status, seen),
        WorkloadKind::DaemonSet => daemon_set(obj, status, seen),
        WorkloadKind::Rollout => argo_rollout(status, seen),
    }
}

fn deployment(obj: &Value, status: &Value, seen: bool) -> RollState {
    if !seen {
        return RollState::Progressing("waiting for the new template to be observed");
    }
    let deadline = status
        .get("conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Progressing")
                && c.get("reason").and_then(Value::as_str) == Some("ProgressDeadlineExceeded")
        });
    if deadline {
        return RollState::Stalled("it exceeded its progress deadline");
    }
    let replicas = int(obj, &["spec", "replicas"]).unwrap_or(1);
    let updated = int(status, &["updatedReplicas"]).unwrap_or(0);
    let total = int(status, &["replicas"]).unwrap_or(0);
    let available = int(status, &["availableReplicas"]).unwrap_or(0);
    if updated < replicas {
        RollState::Progressing("new replicas are being updated")
    } else if total > updated {
        RollState::Progressing("old replicas are pending termination")
    } else if available < updated {
        RollState::Progressing("updated replicas are not available yet")
    } else {
        RollState::Complete
    }
}

fn rolling_update(obj: &Value) -> bool {
    // RollingUpdate is the default of both kinds when the type is absent.
    obj.pointer("/spec/updateStrategy/type")
        .and_then(Value::as_str)
        .is_none_or(|t| t == "RollingUpdate")
}

fn stateful_set(obj: &Value, status: &Value, seen: bool) -> RollState {
    if !rolling_update(obj) {
        return RollState::Complete;
    }
    if !seen || int(status, &["observedGeneration"]).unwrap_or(0) == 0 {
        return RollState::Progressing("waiting for the new template to be observed");
    }
    let replicas = int(obj, &["spec", "replicas"]).unwrap_or(1);
    if int(status, &["readyReplicas"]).unwrap_or(0) < replicas {
        return RollState::Progressing("replicas are not ready yet");
    }
    if let Some(partition) = int(
        obj,
        &["spec", "updateStrategy", "rollingUpdate", "partition"],
    ) {
        return if int(status, &["updatedReplicas"]).unwrap_or(0) < replicas - partition {
            RollState::Progressing("the partitioned rollout is in progress")
        } else {
            RollState::Complete
        };
    }
    let update = status.get("updateRevision").and_then(Value::as_str);
    let current = status.get("currentRevision").and_then(Value::as_str);
    if update != current {
        RollState::Progressing("replicas run the previous revision")
    } else {
        RollState::Complete
    }
}

fn daemon_set(obj: &Value, status: &Value, seen: bool) -> RollState {
    if !rolling_update(obj) {
        return RollState::Complete;
    }
    if !seen {
        return RollState::Progressing("waiting for the new template to be observed");
    }
    let desired = int(status, &["desiredNumberScheduled"]).unwrap_or(0);
    if int(status, &["updatedNumberScheduled"]).unwrap_or(0) < desired {
        RollState::Progressing("nodes are being updated")
    } else if int(status, &["numberAvailable"]).unwrap_or(0) < desired {
        RollState::Progressing("updated pods are not available yet")
    } else {
        RollState::Complete
    }
}

fn argo_rollout(status: &Value, seen: bool) -> RollState {
    if status.get("abort").and_then(Value::as_bool) == Some(true) {
        return RollState::Aborted;
    }
    if status.as_object().is_none_or(serde_json::Map::is_empty) {
        // Never reconciled (no Argo Rollouts controller yet): nothing is rolling.
        return RollState::Complete;
    }
    if !seen {
        return RollState::Progressing("waiting for the new template to be observed");
    }
    let current = status.get("currentPodHash").and_then(Value::as_str);
    let stable = status.get("stableRS").and_then(Value::as_str);
    match status.get("phase").and_then(Value::as_str) {
        Some("Degraded") => RollState::Stalled("the Rollout is degraded"),
        Some("Paused") => RollState::Progressing("the Rollout is paused between steps"),
        _ if current.is_some() && stable.is_some() && current != stable => {
            RollState::Progressing("a canary of a new revision is in progress")
        }
        Some("Healthy") | None => RollState::Complete,
        _ => RollState::Progressing("the Rollout is progressing"),
    }
}

/// `status.observedGeneration`: a number, or a string (older Argo Rollouts write it so).
fn observed_generation(status: &Value) -> Option<i64> {
    match status.get("observedGeneration")? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn int(v: &Value, path: &[&str]) -> Option<i64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_i64()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(replicas: i64, generation: i64, status: Value) -> (Option<i64>, Value) {
        (
            Some(generation),
            json!({"spec": {"replicas": replicas}, "status": status}),
        )
    }

    #[test]
    fn a_deployment_is_complete_when_every_replica_is_updated_and_available() {
        let d = |(g, s): (Option<i64>, Value)| roll_state(WorkloadKind::Deployment, g, &s);
        let done = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        assert_eq!(d(deployment(2, 2, done.clone())), RollState::Complete);
        // The restamp bumped the generation: the old complete status says nothing yet.
        assert!(matches!(
            d(deployment(2, 3, done)),
            RollState::Progressing(_)
        ));
        let surge = json!({"observedGeneration": 3, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 2});
        assert!(matches!(
            d(deployment(2, 3, surge)),
            RollState::Progressing("old replicas are pending termination")
        ));
        let unavailable = json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 1});
        assert!(matches!(
            d(deployment(2, 3, unavailable)),
            RollState::Progressing(_)
        ));
        let stalled = json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 1,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]});
        assert_eq!(
            d(deployment(2, 3, stalled)),
            RollState::Stalled("it exceeded its progress deadline")
        );
        assert!(RollState::Stalled("x").is_over() && !RollState::Aborted.is_over());
        // Scaled to zero: nothing to wait for once observed.
        let zero = json!({"observedGeneration": 4});
        assert_eq!(d(deployment(0, 4, zero)), RollState::Complete);
    }

    #[test]
    fn stateful_sets_follow_revisions_and_partitions() {
        let s = |v| roll_state(WorkloadKind::StatefulSet, Some(5), &v);
        let base = |strategy: Value, status: Value| json!({"metadata": {"generation": 5}, "spec": {"replicas": 3, "updateStrategy": strategy}, "status": status});
        let rolling = json!({"type": "RollingUpdate"});
        let behind = json!({"observedGeneration": 5, "readyReplicas": 3, "updateRevision": "b", "currentRevision": "a"});
        assert!(matches!(
            s(base(rolling.clone(), behind.clone())),
            RollState::Progressing(_)
        ));
        assert_eq!(
            s(base(json!({"type": "OnDelete"}), behind)),
            RollState::Complete
        );
        let current = json!({"observedGeneration": 5, "readyReplicas": 3, "updateRevision": "b", "currentRevision": "b"});
        assert_eq!(s(base(rolling, current)), RollState::Complete);
        let partitioned = json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 2}});
        let one = json!({"observedGeneration": 5, "readyReplicas": 3, "updatedReplicas": 1});
        assert_eq!(s(base(partitioned, one)), RollState::Complete);
    }

    #[test]
    fn daemon_sets_rollouts_and_cron_jobs() {
        let ds = json!({"spec": {},
            "status": {"observedGeneration": 2, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberAvailable": 1}});
        assert!(matches!(
            roll_state(WorkloadKind::DaemonSet, Some(2), &ds),
            RollState::Progressing(_)
        ));
        assert_eq!(
            roll_state(WorkloadKind::CronJob, None, &json!({})),
            RollState::Complete
        );
        let rollout =
            |status: Value| roll_state(WorkloadKind::Rollout, Some(7), &json!({"status": status}));
        assert_eq!(
            rollout(json!({"observedGeneration": "7", "phase": "Healthy"})),
            RollState::Complete
        );
        assert_eq!(
            rollout(json!({"observedGeneration": "7", "phase": "Paused"})),
            RollState::Progressing("the Rollout is paused between steps")
        );
        assert_eq!(
            rollout(json!({"observedGeneration": 7, "phase": "Degraded", "abort": true})),
            RollState::Aborted
        );
        assert!(matches!(
            rollout(json!({"observedGeneration": "6", "phase": "Healthy"})),
            RollState::Progressing(_)
        ));
        assert_eq!(
            rollout(json!({"observedGeneration": "7", "phase": "Progressing",
                "currentPodHash": "new", "stableRS": "old"})),
            RollState::Progressing("a canary of a new revision is in progress")
        );
        assert_eq!(rollout(json!({})), RollState::Complete, "never reconciled");
    }
}
