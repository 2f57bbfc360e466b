//! The watcher's work off its loop, besides its watches: reading the digests a decision needs,
//! and the restamps the loop decided. The data of a Secret or ConfigMap is read only here, only
//! for an object an opted-in workload reads whose digest for this version is not known yet, and
//! dropped as soon as it is digested (only the keyed digest is kept, see [`DigestCache`]).
//!
//! The restamp is the one `rollout` and `propagate` write: a new `helmop.dev/restamp` value, an
//! UPDATE on which the webhook recomputes the stamp from what the pods read right now. The value
//! lists helmop's copies the workload reads with their content hashes (so `propagate` knows the
//! workload was restamped for that content), then `watch:<time>` (always new, and it says when a
//! watcher restamped it) and `tries:<n>@<expected>` (the `n`th restamp in a row meant to write that
//! stamp, so "tried 3 times, then left until a change" holds across restarts and leaders).

use std::collections::HashMap;
use std::sync::Arc;

use helmop_core::hash::{HashKey, ObjectDigest};
use helmop_core::names;
use helmop_core::podrefs::{PodRef, Reads};
use helmop_core::resource::ResourceRef;
use helmop_core::workload::pod_template;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Api, Client};
use serde_json::json;
use tokio::time::Instant;

use super::index::{ObjectKey, Reason, Version, WorkloadFacts, WorkloadKey};
use super::queue::{Outcome, Ticket};
use crate::cluster::api_error;
use crate::run::live_stamp::Digested;
use crate::run::workloads::restamp_value;
use crate::watch::notices;

/// `reportingController` of the watcher's Events.
pub const CONTROLLER: &str = helmop_core::names::ROLLOUT_WATCHER_COMPONENT;

/// What is known of one way of reading one object version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Known {
    pub digest: ObjectDigest,
    /// Required keys the object lacks (see [`helmop_core::hash::missing_keys`]).
    pub missing_keys: Vec<String>,
}

/// The digests of what workloads read, per object and version: a new version replaces the old
/// one, so this holds one entry per object some opted-in workload reads (times the distinct ways
/// it is read), whatever the cluster's other Secrets and ConfigMaps.
#[derive(Default)]
pub struct DigestCache {
    entries: HashMap<ObjectKey, (Version, Vec<(Reads, Known)>)>,
}

impl DigestCache {
    pub fn get(&self, object: &ObjectKey, version: &Version, reads: &Reads) -> Option<&Known> {
        let (v, digests) = self.entries.get(object)?;
        if v != version {
            return None;
        }
        digests.iter().find(|(r, _)| r == reads).map(|(_, d)| d)
    }

    pub fn insert(&mut self, object: ObjectKey, version: Version, reads: Reads, known: Known) {
        let entry = self
            .entries
            .entry(object)
            .or_insert_with(|| (version.clone(), Vec::with_capacity(1)));
        if entry.0 != version {
            // One entry is the rule (one way of reading per object); a first push would reserve 4.
            *entry = (version, Vec::with_capacity(1));
        }
        if !entry.1.iter().any(|(r, _)| *r == reads) {
            entry.1.push((reads, known));
        }
    }

    pub fn remove(&mut self, object: &ObjectKey) {
        self.entries.remove(object);
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// What the loop knows of one reference when it hands a workload over.
#[derive(Clone, Debug)]
pub enum Lookup {
    Absent,
    Known(Known),
    /// Present in a version whose digest is not known: read it.
    Read,
}

/// What a job does.
#[derive(Debug)]
pub enum Work {
    /// Read the digests the loop lacks (each [`Lookup::Read`]), then hand the workload back to be
    /// decided with them.
    Read,
    /// Read the workload whole: it was not opted in when it was last seen, so what it reads was not
    /// indexed (see [`super::watches::workload_facts`]).
    Fetch,
    /// Restamp: the loop decided it is due, to `expected`; this is the `tries`th restamp meant to
    /// write it, decided from the object versions `seen` ([`versions_fingerprint`]). `repin`: the
    /// restamp is (also) for `--images`, and the webhook must resolve image tags again.
    Restamp {
        expected: String,
        tries: u32,
        seen: String,
        repin: bool,
    },
}

/// A workload to read for or restamp, off the loop.
pub struct Job {
    pub ticket: Ticket,
    pub work: Work,
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
    pub known: Known,
}

/// How a job ended.
pub struct Finished {
    pub key: WorkloadKey,
    pub reason: Reason,
    pub since: Instant,
    pub outcome: Outcome,
    pub key_generation: u64,
    pub reads: Vec<Read>,
    /// Reads that failed.
    pub read_errors: usize,
    /// Events that could not be published.
    pub event_errors: usize,
    /// For the report: the stamp before, the one expected, the one written; the error.
    pub detail: Detail,
    /// The workload's generation after a restamp that changed its stamp (its rollout to wait for).
    pub generation: Option<i64>,
    /// What a [`Work::Fetch`] read of the workload.
    pub fetched: Option<Box<WorkloadFacts>>,
    pub lag: std::time::Duration,
    /// A restamp that re-pinned image tags for `--images` landed.
    pub repinned: bool,
}

#[derive(Debug, Default)]
pub struct Detail {
    pub from: Option<String>,
    pub expected: Option<String>,
    pub to: Option<String>,
    pub error: Option<String>,
    pub dry_run: bool,
}

/// What every job shares.
pub struct Shared {
    pub client: Client,
    pub dry_run: bool,
    /// One recorder for every Event of the watcher: its cache folds another Event of the same
    /// reason on the same workload (within kube's few minutes) into the first one's series (a
    /// count and a last time, the first note kept), so a workload restamped ten times carries one
    /// `Restamped` Event with a count of 10, not ten Events.
    pub recorder: Recorder,
}

/// Does `job`'s work.
pub async fn run(shared: Arc<Shared>, job: Job) -> Finished {
    let Job {
        ticket,
        work,
        resource,
        uid,
        refs,
        lookups,
        stamp,
        copies,
        key,
        key_generation,
    } = job;
    let mut finished = Finished {
        key: ticket.key.clone(),
        reason: ticket.reason.clone(),
        since: ticket.since,
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
        generation: None,
        fetched: None,
        lag: std::time::Duration::ZERO,
        repinned: false,
    };
    let (expected, tries, seen, repin) = match work {
        Work::Read => {
            read_missing(
                &shared,
                &ticket.key.namespace,
                &refs,
                lookups,
                &key,
                &mut finished,
            )
            .await;
            return finished;
        }
        Work::Fetch => {
            let api: Api<DynamicObject> =
                Api::namespaced_with(shared.client.clone(), &ticket.key.namespace, &resource);
            match api.get_opt(&ticket.key.name).await {
                Ok(Some(obj)) => {
                    // The loop fetches only what it finds opted in: index unless the workload's
                    // own label opts it out.
                    let facts =
                        super::watches::workload_facts(ticket.key.kind, obj, Some("enabled"));
                    match facts {
                        Some((_, facts)) => {
                            finished.outcome = Outcome::Read;
                            finished.fetched = Some(Box::new(facts));
                        }
                        None => finished.outcome = Outcome::Gone,
                    }
                }
                Ok(None) => finished.outcome = Outcome::Gone,
                Err(e) => {
                    finished.read_errors += 1;
                    finished.outcome = Outcome::Failed;
                    finished.detail.error = Some(format!(
                        "reading {}: {}",
                        ticket.key,
                        api_error::describe(&e)
                    ));
                }
            }
            return finished;
        }
        Work::Restamp {
            expected,
            tries,
            seen,
            repin,
        } => (expected, tries, seen, repin),
    };
    finished.detail.expected = Some(expected.clone());
    if shared.dry_run {
        return finished;
    }
    crate::test_pause::pause("rollout-before-restamp", &ticket.key.to_string()).await;
    // A re-pin of a workload the webhook stamps nothing on has no expected stamp to count tries of.
    let record = (!expected.is_empty()).then_some((tries, expected.as_str(), seen.as_str()));
    let mut value = restamp_record(&copies, record, Timestamp::now());
    if repin {
        // Not one of the config-only entries (`helmop_core::rollout::restamp_repins`): the
        // webhook resolves the image tags again on this UPDATE.
        value.push_str(&format!(",{}{}", names::RESTAMP_REPIN, Timestamp::now()));
    }
    let result = restamp(&shared.client, &resource, &ticket.key, &value).await;
    finished.lag = Instant::now().saturating_duration_since(ticket.since);
    let about = workload_ref(&resource, &ticket.key, &uid);
    match result {
        Ok((after, generation)) => {
            finished.detail.to = after.clone();
            // A stamp that moved, even to another than expected (the content moved again after
            // it was read: the webhook reads it live), is a restamp that rolled; whether it is
            // current now is decided again when the workload's own change comes back.
            let moved = after.is_some() && after != stamp;
            // A re-pin is checked by the next registry poll (the pins), not by the stamp.
            if after.as_deref() == Some(expected.as_str()) || moved || repin {
                finished.outcome = Outcome::Restamped;
                finished.repinned = repin;
                finished.generation = generation;
                let note = format!("Restamped: {}", ticket.reason);
                if !publish(&shared, &about, EventType::Normal, "Restamped", &note).await {
                    finished.event_errors += 1;
                }
            } else {
                finished.outcome = Outcome::Ineffective(tries);
            }
        }
        Err(e) if api_error::is_not_found(&e) => finished.outcome = Outcome::Gone,
        Err(e) => {
            let error = api_error::describe(&e);
            finished.outcome = Outcome::Failed;
            let note = format!("restamp refused ({}): {error}", ticket.reason);
            if !publish(&shared, &about, EventType::Warning, "RestampRefused", &note).await {
                finished.event_errors += 1;
            }
            finished.detail.error = Some(error);
        }
    }
    finished
}

/// Reads every reference the loop had no digest for; the first failure ends the job `Failed`.
async fn read_missing(
    shared: &Shared,
    namespace: &str,
    refs: &[PodRef],
    lookups: Vec<Lookup>,
    key: &HashKey,
    finished: &mut Finished,
) {
    finished.outcome = Outcome::Read;
    for (r, lookup) in refs.iter().zip(lookups) {
        if !matches!(lookup, Lookup::Read) {
            continue;
        }
        let object = ObjectKey {
            namespace: namespace.to_owned(),
            resource: r.resource.clone(),
        };
        match crate::run::live_stamp::read_digest(
            &shared.client,
            namespace,
            &r.resource,
            key,
            &r.reads,
        )
        .await
        {
            Ok(Some(Digested {
                version,
                digest,
                missing_keys,
            })) => finished.reads.push(Read {
                object,
                version,
                reads: r.reads.clone(),
                known: Known {
                    digest,
                    missing_keys,
                },
            }),
            // Gone since: its deletion reaches the loop through the watch.
            Ok(None) => {}
            Err(e) => {
                finished.read_errors += 1;
                finished.outcome = Outcome::Failed;
                finished.detail.error =
                    Some(format!("reading {object}: {}", api_error::describe(&e)));
                return;
            }
        }
    }
}

/// A short digest of the versions of what a workload reads and how it reads them (`None`: absent),
/// for `seen:` in the restamp value: a watcher that finds the same versions and a stamp the restamp
/// wrote knows the stamp is current without reading anything (after a restart or a handover).
pub fn versions_fingerprint<'a>(
    reads: impl Iterator<Item = (&'a PodRef, Option<&'a Version>)>,
) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for (r, version) in reads {
        h.update(format!("{}|{:?}|", r.resource, r.reads).as_bytes());
        match version {
            Some(v) => h.update(format!("{}:{};", v.uid, v.resource_version).as_bytes()),
            None => h.update(b"-;"),
        }
    }
    hex::encode(&h.finalize()[..8])
}

/// How many hex digits of the expected stamp `tries:` records.
const TRIES_DIGITS: usize = 16;

/// The part of an expected stamp `tries:` records.
pub fn tries_tag(expected: &str) -> &str {
    let hash = expected.split_once(':').map_or(expected, |(_, h)| h);
    hash.get(..TRIES_DIGITS).unwrap_or(hash)
}

/// The `helmop.dev/restamp` value: the copies read, as `propagate` records them, the time, then the
/// tries for the expected stamp.
pub fn restamp_record(
    copies: &[(ResourceRef, String)],
    tries: Option<(u32, &str, &str)>,
    now: Timestamp,
) -> String {
    let listed: std::collections::BTreeMap<String, String> = copies
        .iter()
        .map(|(r, h)| (r.to_string(), h.clone()))
        .collect();
    let mut value = restamp_value(&listed);
    if !value.is_empty() {
        value.push(',');
    }
    value.push_str(&format!("watch:{now}"));
    if let Some((n, expected, seen)) = tries {
        value.push_str(&format!(",tries:{n}@{},seen:{seen}", tries_tag(expected)));
    }
    value
}

/// Writes the restamp value and returns the pod template's stamp as the API server (after its
/// webhooks) stored it, and the workload's generation then.
async fn restamp(
    client: &Client,
    resource: &ApiResource,
    key: &WorkloadKey,
    value: &str,
) -> Result<(Option<String>, Option<i64>), kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &key.namespace, resource);
    let patch = json!({"metadata": {"annotations": {names::ANN_RESTAMP: value}}});
    let params = PatchParams {
        field_manager: Some(names::MANAGER.into()),
        ..PatchParams::default()
    };
    let obj = api.patch(&key.name, &params, &Patch::Merge(&patch)).await?;
    let stamp = pod_template(key.kind, &obj.data)
        .and_then(|t| t.annotation(names::ANN_CONFIG_HASH))
        .map(str::to_owned);
    Ok((stamp, obj.metadata.generation))
}

/// The workload an Event is about.
pub fn workload_ref(resource: &ApiResource, key: &WorkloadKey, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(resource.api_version.clone()),
        kind: Some(resource.kind.clone()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.name.clone()),
        uid: (!uid.is_empty()).then(|| uid.to_owned()),
        ..ObjectReference::default()
    }
}

/// The Secret or ConfigMap an Event is about.
pub fn object_ref(key: &ObjectKey, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some(key.resource.kind.to_string()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.resource.name.clone()),
        uid: (!uid.is_empty()).then(|| uid.to_owned()),
        ..ObjectReference::default()
    }
}

/// Publishes an Event on `regarding`; false when it could not (logged, never fatal: the stdout
/// event and the metrics say the same).
pub async fn publish(
    shared: &Shared,
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: &str,
) -> bool {
    let event = notices::event(type_, reason, "Restamp", note);
    match shared.recorder.publish(&event, regarding).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                namespace = regarding.namespace.as_deref().unwrap_or(""),
                name = regarding.name.as_deref().unwrap_or(""),
                reason,
                error = %api_error::describe(&e),
                "cannot publish an event"
            );
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
        let expected = format!("v2:{}", "ab".repeat(32));
        let value = restamp_record(&copies, Some((2, &expected, "0011223344556677")), t);
        assert_eq!(
            value,
            "configmap/app=v1:bb,secret/db=v1:aa,watch:2026-12-02T08:00:00Z,tries:2@abababababababab,seen:0011223344556677"
        );
        assert!(
            !helmop_core::rollout::restamp_repins(&value),
            "a config restamp keeps pins"
        );
        let parsed = crate::run::workloads::parse_restamp(&value);
        assert_eq!(parsed.len(), 2, "propagate sees the copies, not the time");
        let record = super::super::watches::watcher_record(&value);
        assert_eq!(record.tries, Some((2, tries_tag(&expected).to_owned())));
        assert_eq!(record.seen.as_deref(), Some("0011223344556677"));
        assert_eq!(restamp_record(&[], None, t), "watch:2026-12-02T08:00:00Z");
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
        let known = Known {
            digest,
            missing_keys: Vec::new(),
        };
        cache.insert(object.clone(), v1.clone(), whole.clone(), known.clone());
        assert_eq!(cache.get(&object, &v1, &whole), Some(&known));
        assert_eq!(cache.get(&object, &v2, &whole), None, "another version");
        assert_eq!(
            cache.get(&object, &v1, &Reads::default()),
            None,
            "read otherwise"
        );
        cache.insert(object.clone(), v2.clone(), whole.clone(), known);
        assert_eq!(cache.get(&object, &v1, &whole), None, "replaced, not added");
        assert_eq!(cache.len(), 1);
    }
}
