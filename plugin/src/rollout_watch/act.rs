//! Deciding one workload and, when it is due, asking the webhook to restamp it: the watcher's only
//! I/O besides its watches. The data of a Secret or ConfigMap is read only here, only for an object
//! an opted-in workload reads whose digest for this version is not known yet, and dropped as soon
//! as it is digested (only the keyed digest is kept, see [`DigestCache`]).
//!
//! The restamp is the one `rollout` and `propagate` write: a new `helmop.dev/restamp` value, an
//! UPDATE on which the webhook recomputes the stamp from what the pods read right now. The value
//! lists helmop's copies the workload reads with their content hashes (so `propagate` knows the
//! workload was restamped for that content) and ends with `watch:<time>`, so it is always new.

use std::collections::HashMap;
use std::sync::Arc;

use helmop_core::hash::{HashKey, ObjectDigest, Observed};
use helmop_core::names;
use helmop_core::podrefs::{PodRef, Reads};
use helmop_core::resource::ResourceRef;
use helmop_core::rollout::{Decision, decide};
use helmop_core::workload::pod_template;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{EventType, Reporter};
use kube::{Api, Client};
use serde_json::json;
use tokio::time::Instant;

use super::index::{ObjectKey, Reason, Version, WorkloadKey};
use super::queue::{Outcome, Ticket};
use crate::cluster::api_error;
use crate::run::workloads::restamp_value;
use crate::watch::notices;

/// `reportingController` of the watcher's Events.
pub const CONTROLLER: &str = "helmop.dev/rollout-watcher";

/// The digests of what workloads read, per object and version: a new version replaces the old
/// one, so this holds one entry per object some opted-in workload reads (times the distinct ways
/// it is read), whatever the cluster's other Secrets and ConfigMaps.
#[derive(Default)]
pub struct DigestCache {
    entries: HashMap<ObjectKey, (Version, Vec<(Reads, ObjectDigest)>)>,
}

impl DigestCache {
    pub fn get(
        &self,
        object: &ObjectKey,
        version: &Version,
        reads: &Reads,
    ) -> Option<ObjectDigest> {
        let (v, digests) = self.entries.get(object)?;
        if v != version {
            return None;
        }
        digests.iter().find(|(r, _)| r == reads).map(|(_, d)| *d)
    }

    pub fn insert(
        &mut self,
        object: ObjectKey,
        version: Version,
        reads: Reads,
        digest: ObjectDigest,
    ) {
        let entry = self
            .entries
            .entry(object)
            .or_insert_with(|| (version.clone(), Vec::with_capacity(1)));
        if entry.0 != version {
            // One entry is the rule (one way of reading per object); a first push would reserve 4.
            *entry = (version, Vec::with_capacity(1));
        }
        if !entry.1.iter().any(|(r, _)| *r == reads) {
            entry.1.push((reads, digest));
        }
    }

    pub fn remove(&mut self, object: &ObjectKey) {
        self.entries.remove(object);
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// What the loop knows of one reference when it hands a workload over.
#[derive(Clone, Debug)]
pub enum Lookup {
    Absent,
    Digest(ObjectDigest),
    /// Present in a version whose digest is not known: read it.
    Read,
}

/// A workload to decide (and maybe restamp) off the loop.
pub struct Job {
    pub ticket: Ticket,
    /// Where the workload's kind is served.
    pub resource: ApiResource,
    pub uid: String,
    pub refs: Vec<PodRef>,
    pub lookups: Vec<Lookup>,
    pub stamp: Option<String>,
    pub copies: Vec<(ResourceRef, String)>,
    pub key: Arc<HashKey>,
    pub key_generation: u64,
}

/// A digest read for the cache.
pub struct Read {
    pub object: ObjectKey,
    pub version: Version,
    pub reads: Reads,
    pub digest: ObjectDigest,
}

/// How a job ended.
pub struct Finished {
    pub key: WorkloadKey,
    pub reason: Reason,
    pub outcome: Outcome,
    pub key_generation: u64,
    pub reads: Vec<Read>,
    /// Reads that failed.
    pub read_errors: usize,
    /// Events that could not be published.
    pub event_errors: usize,
    /// For the report: the stamp before, the one expected, the one written; the error.
    pub detail: Detail,
    pub lag: std::time::Duration,
}

#[derive(Debug, Default)]
pub struct Detail {
    pub from: Option<String>,
    pub expected: Option<String>,
    pub to: Option<String>,
    pub error: Option<String>,
    pub dry_run: bool,
    /// Required references absent: not restamped until they exist.
    pub missing: Vec<ResourceRef>,
}

/// What every job shares.
pub struct Shared {
    pub client: Client,
    pub dry_run: bool,
    pub reporter: Reporter,
}

/// Decides the workload of `job` from the digests it has plus those it reads, and restamps it when
/// due.
pub async fn run(shared: Arc<Shared>, job: Job) -> Finished {
    let Job {
        ticket,
        resource,
        uid,
        refs,
        lookups,
        stamp,
        copies,
        key,
        key_generation,
    } = job;
    let namespace = ticket.key.namespace.clone();
    let mut finished = Finished {
        key: ticket.key.clone(),
        reason: ticket.reason.clone(),
        outcome: Outcome::Settled,
        key_generation,
        reads: Vec::new(),
        read_errors: 0,
        event_errors: 0,
        detail: Detail {
            from: stamp.clone(),
            dry_run: shared.dry_run,
            ..Detail::default()
        },
        lag: std::time::Duration::ZERO,
    };
    let mut observed = Vec::with_capacity(refs.len());
    for (r, lookup) in refs.iter().zip(lookups) {
        let seen = match lookup {
            Lookup::Absent => None,
            Lookup::Digest(d) => Some(d),
            Lookup::Read => {
                let object = ObjectKey {
                    namespace: namespace.clone(),
                    resource: r.resource.clone(),
                };
                match read_digest(&shared.client, &object, &key, &r.reads).await {
                    Ok(Some(read)) => {
                        let digest = read.digest;
                        finished.reads.push(read);
                        Some(digest)
                    }
                    Ok(None) => None,
                    Err(e) => {
                        finished.read_errors += 1;
                        finished.outcome = Outcome::Failed;
                        finished.detail.error =
                            Some(format!("reading {object}: {}", api_error::describe(&e)));
                        return finished;
                    }
                }
            }
        };
        observed.push(seen);
    }
    let digests: HashMap<&ResourceRef, Option<ObjectDigest>> =
        refs.iter().map(|r| &r.resource).zip(observed).collect();
    let decision = decide(&key, &namespace, &refs, stamp.as_deref(), |r| match digests
        .get(&r.resource)
        .copied()
        .flatten()
    {
        Some(d) => Observed::Digest(d),
        None => Observed::Absent,
    });
    let expected = match decision {
        Decision::Current => return finished,
        Decision::NotStamped(why) => {
            tracing::debug!(workload = %ticket.key, why, "not stamped by the webhook: left alone");
            return finished;
        }
        Decision::Missing(missing) => {
            finished.detail.missing = missing;
            return finished;
        }
        Decision::Due { expected, .. } => expected,
    };
    finished.detail.expected = Some(expected.clone());
    if shared.dry_run {
        return finished;
    }
    crate::test_pause::pause("rollout-before-restamp", &ticket.key.to_string()).await;
    let value = restamp_record(&copies, Timestamp::now());
    let result = restamp(&shared.client, &resource, &ticket.key, &value).await;
    finished.lag = Instant::now().saturating_duration_since(ticket.since);
    match result {
        Ok(after) => {
            finished.detail.to = after.clone();
            // A stamp that moved, even to another than expected (the content moved again after
            // it was read: the webhook reads it live), is a restamp that rolled; whether it is
            // current now is decided again when the workload's own change comes back.
            let moved = after.is_some() && after != stamp;
            if after.as_deref() == Some(expected.as_str()) || moved {
                finished.outcome = Outcome::Restamped;
                let note = format!("Restamped: {}", ticket.reason);
                let about = Regarding {
                    resource: &resource,
                    key: &ticket.key,
                    uid: &uid,
                };
                if !publish(&shared, &about, EventType::Normal, "Restamped", &note).await {
                    finished.event_errors += 1;
                }
            } else {
                finished.outcome = Outcome::Ineffective;
            }
        }
        Err(e) if api_error::is_not_found(&e) => finished.outcome = Outcome::Gone,
        Err(e) => {
            let error = api_error::describe(&e);
            finished.outcome = Outcome::Failed;
            let note = format!("restamp refused ({}): {error}", ticket.reason);
            let about = Regarding {
                resource: &resource,
                key: &ticket.key,
                uid: &uid,
            };
            if !publish(&shared, &about, EventType::Warning, "RestampRefused", &note).await {
                finished.event_errors += 1;
            }
            finished.detail.error = Some(error);
        }
    }
    finished
}

/// The `helmop.dev/restamp` value: the copies read, as `propagate` records them, then the time.
pub fn restamp_record(copies: &[(ResourceRef, String)], now: Timestamp) -> String {
    let listed: std::collections::BTreeMap<String, String> = copies
        .iter()
        .map(|(r, h)| (r.to_string(), h.clone()))
        .collect();
    let mut value = restamp_value(&listed);
    if !value.is_empty() {
        value.push(',');
    }
    value.push_str(&format!("watch:{now}"));
    value
}

/// Reads `object` and digests what `reads` reads of it; `None` when it is gone.
async fn read_digest(
    client: &Client,
    object: &ObjectKey,
    key: &HashKey,
    reads: &Reads,
) -> Result<Option<Read>, kube::Error> {
    let read = crate::run::live_stamp::read_digest(
        client,
        &object.namespace,
        &object.resource,
        key,
        reads,
    )
    .await?;
    Ok(read.map(|(version, digest)| Read {
        object: object.clone(),
        version,
        reads: reads.clone(),
        digest,
    }))
}

/// Writes the restamp value and returns the pod template's stamp as the API server (after its
/// webhooks) stored it.
async fn restamp(
    client: &Client,
    resource: &ApiResource,
    key: &WorkloadKey,
    value: &str,
) -> Result<Option<String>, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &key.namespace, resource);
    let patch = json!({"metadata": {"annotations": {names::ANN_RESTAMP: value}}});
    let params = PatchParams {
        field_manager: Some(names::MANAGER.into()),
        ..PatchParams::default()
    };
    let obj = api.patch(&key.name, &params, &Patch::Merge(&patch)).await?;
    Ok(pod_template(key.kind, &obj.data)
        .and_then(|t| t.annotation(names::ANN_CONFIG_HASH))
        .map(str::to_owned))
}

/// The workload an Event is about.
pub struct Regarding<'a> {
    pub resource: &'a ApiResource,
    pub key: &'a WorkloadKey,
    pub uid: &'a str,
}

/// Publishes an Event on the workload; false when it could not (logged, never fatal: the stdout
/// event and the metrics say the same).
pub async fn publish(
    shared: &Shared,
    about: &Regarding<'_>,
    type_: EventType,
    reason: &str,
    note: &str,
) -> bool {
    let key = about.key;
    let regarding = ObjectReference {
        api_version: Some(about.resource.api_version.clone()),
        kind: Some(about.resource.kind.clone()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.name.clone()),
        uid: (!about.uid.is_empty()).then(|| about.uid.to_owned()),
        ..ObjectReference::default()
    };
    let event = notices::event(type_, reason, "Restamp", note);
    match notices::publish(&shared.client, &shared.reporter, &event, &regarding).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(workload = %key, reason, error = %api_error::describe(&e), "cannot publish an event");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use helmop_core::hash::{ObjectData, reads_digest};

    use super::*;

    #[test]
    fn the_record_lists_copies_as_propagate_reads_them_and_is_always_new() {
        let t: Timestamp = "2026-12-02T08:00:00Z".parse().unwrap();
        let copies = vec![
            (ResourceRef::secret("db"), "v1:aa".to_string()),
            (ResourceRef::config_map("app"), "v1:bb".to_string()),
        ];
        let value = restamp_record(&copies, t);
        assert_eq!(
            value,
            "configmap/app=v1:bb,secret/db=v1:aa,watch:2026-12-02T08:00:00Z"
        );
        let parsed = crate::run::workloads::parse_restamp(&value);
        assert_eq!(parsed.len(), 2, "propagate sees the copies, not the time");
        assert_eq!(restamp_record(&[], t), "watch:2026-12-02T08:00:00Z");
    }

    #[test]
    fn digests_are_kept_per_version_and_read() {
        let mut cache = DigestCache::default();
        let object = ObjectKey {
            namespace: "apps".into(),
            resource: ResourceRef::secret("db"),
        };
        let v1 = Version {
            uid: "u".into(),
            resource_version: "1".into(),
        };
        let v2 = Version {
            resource_version: "2".into(),
            ..v1.clone()
        };
        let key = HashKey::new(&[1; 32]).unwrap();
        let whole = Reads::volume(&helmop_core::podrefs::Keys::All, true);
        let digest = reads_digest(&key, &ObjectData::default(), &whole);
        cache.insert(object.clone(), v1.clone(), whole.clone(), digest);
        assert_eq!(cache.get(&object, &v1, &whole), Some(digest));
        assert_eq!(cache.get(&object, &v2, &whole), None, "another version");
        assert_eq!(
            cache.get(&object, &v1, &Reads::default()),
            None,
            "read otherwise"
        );
        cache.insert(object.clone(), v2.clone(), whole.clone(), digest);
        assert_eq!(cache.get(&object, &v1, &whole), None, "replaced, not added");
        assert_eq!(cache.len(), 1);
    }
}
