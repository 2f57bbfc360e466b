//! What the rollout watcher knows, kept small: per workload only what decides its stamp (the
//! references its pod template reads, its stamp, its opt-in label), per Secret and ConfigMap only
//! its version (uid and resourceVersion, never its data), per Namespace its opt-in label, and an
//! index from every object to the workloads that read it. A change costs its readers, not a scan
//! of every workload.
//!
//! Every update says which workloads it may have made due, with the reason; deciding whether
//! they are is [`helmop_core::rollout::decide`]'s job.

use std::collections::{BTreeSet, HashMap, HashSet};

/// The readers of one object: almost always one or two, so a `Vec` (a `HashSet` per object cost
/// ~200 bytes more each at 10,000 objects read).
type Readers = Vec<WorkloadKey>;

use helmop_core::podrefs::PodRef;
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::rollout::opt_in;
use helmop_core::workload::WorkloadKind;

/// A workload the watcher tracks.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for WorkloadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.kind, self.name)
    }
}

/// A Secret or ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub resource: ResourceRef,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{}",
            self.resource.kind, self.namespace, self.resource.name
        )
    }
}

/// What decides a workload's stamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadFacts {
    pub uid: String,
    /// Its own `helmop.dev/rollout-on-change` label.
    pub label: Option<String>,
    /// What its pod template reads, one entry per object (`pod_refs` order), or why the template
    /// could not be read (such a workload is never restamped: the webhook could not stamp it either).
    pub refs: Result<Vec<PodRef>, String>,
    /// Its pod template's `helmop.dev/config-hash`.
    pub stamp: Option<String>,
    /// What its `helmop.dev/restamp` says a watcher did: when it last restamped it, and how many
    /// restamps in a row for which expected stamp the webhook left without effect.
    pub restamp: WatcherRecord,
    /// Where its rollout stands (not part of what decides its stamp: a status write changes it).
    pub progress: Progress,
    /// Whether `refs` holds what it reads: only for a workload opted in when it was read (one that
    /// is not costs its key and these few fields, whatever its pod template holds).
    pub indexed: bool,
}

impl WorkloadFacts {
    /// Whether `other` decides the stamp as `self` does (everything but the progress is equal).
    fn decides_like(&self, other: &WorkloadFacts) -> bool {
        self.uid == other.uid
            && self.label == other.label
            && self.refs == other.refs
            && self.stamp == other.stamp
            && self.restamp == other.restamp
            && self.indexed == other.indexed
    }
}

/// What the watcher writes into `helmop.dev/restamp` about itself (see [`super::act`]): state on
/// the workload, so a restarted watcher or a new leader knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatcherRecord {
    /// `watch:<time>`: the last restamp a watcher wrote.
    pub at: Option<k8s_openapi::jiff::Timestamp>,
    /// `tries:<n>@<expected>`: `n` restamps in a row that were to stamp `expected` (the first 16
    /// digits of its hash) and did not.
    pub tries: Option<(u32, String)>,
    /// `seen:<fingerprint>`: the versions that restamp was decided from
    /// ([`super::act::versions_fingerprint`]).
    pub seen: Option<String>,
}

/// Where a workload's rollout stands: its generation and what its status says of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub generation: i64,
    pub state: helmop_core::progress::RollState,
}

pub use crate::run::live_stamp::Version;

/// What the watcher keeps of a Secret or ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectFacts {
    pub version: Version,
    /// `helmop.dev/content-hash` of one of helmop's copies: recorded in the restamp value, so
    /// `propagate` knows the workload was restamped for that content and does not restamp again.
    pub content_hash: Option<String>,
    /// `helmop.dev/rollout-resume`: a new value releases the source's flap breaker.
    pub resume: Option<String>,
}

/// What made a workload worth deciding again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// An object it reads was created, changed or deleted.
    Object {
        object: ObjectKey,
        what: &'static str,
    },
    /// Its own template, stamp or label changed (or it is new).
    Workload,
    /// Its namespace's opt-in label changed.
    Namespace,
    /// Everything is decided again: start-up, a new leader, the hash key, a resync.
    All(&'static str),
    /// `--images` found a new registry digest for a mutable tag it runs (which, per container).
    Images(String),
}

impl Reason {
    /// The metric label of the reason.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Object { what, .. } => match *what {
                "created" => "object-created",
                "deleted" => "object-deleted",
                _ => "object-changed",
            },
            Reason::Workload => "workload",
            Reason::Namespace => "namespace",
            Reason::All(why) => why,
            Reason::Images(_) => "images",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Object { object, what } => write!(f, "{object} {what}"),
            Reason::Workload => f.write_str("its pod template or labels changed"),
            Reason::Namespace => f.write_str("its namespace's opt-in label changed"),
            Reason::All(why) => f.write_str(why),
            Reason::Images(moved) => write!(f, "its image tags moved ({moved})"),
        }
    }
}

/// The watcher's picture of the cluster.
#[derive(Default)]
pub struct Index {
    workloads: HashMap<WorkloadKey, WorkloadFacts>,
    objects: HashMap<ObjectKey, ObjectFacts>,
    readers: HashMap<ObjectKey, Readers>,
    /// Namespace -> its `helmop.dev/rollout-on-change` label (`None`: present without it).
    namespaces: HashMap<String, Option<String>>,
    by_namespace: HashMap<String, HashSet<WorkloadKey>>,
}

impl Index {
    pub fn workload(&self, key: &WorkloadKey) -> Option<&WorkloadFacts> {
        self.workloads.get(key)
    }

    pub fn object(&self, key: &ObjectKey) -> Option<&ObjectFacts> {
        self.objects.get(key)
    }

    /// The opt-in label of `namespace`, when known.
    pub fn namespace_label(&self, namespace: &str) -> Option<&str> {
        self.namespaces.get(namespace)?.as_deref()
    }

    pub fn workload_count(&self) -> usize {
        self.workloads.len()
    }

    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    pub fn workload_keys(&self) -> impl Iterator<Item = &WorkloadKey> {
        self.workloads.keys()
    }

    /// Workloads of one kind (for a re-list: which ones the new listing no longer has).
    pub fn workloads_of(&self, kind: WorkloadKind) -> Vec<WorkloadKey> {
        self.workloads
            .keys()
            .filter(|k| k.kind == kind)
            .cloned()
            .collect()
    }

    /// Objects of one kind.
    pub fn objects_of(&self, kind: ResourceKind) -> Vec<ObjectKey> {
        self.objects
            .keys()
            .filter(|k| k.resource.kind == kind)
            .cloned()
            .collect()
    }

    pub fn namespace_names(&self) -> Vec<String> {
        self.namespaces.keys().cloned().collect()
    }

    /// A workload was added or modified. Due: itself, unless nothing that decides its stamp changed
    /// (a status write, a scale).
    pub fn put_workload(&mut self, key: WorkloadKey, facts: WorkloadFacts) -> Vec<WorkloadKey> {
        if let Some(old) = self.workloads.get_mut(&key)
            && old.decides_like(&facts)
        {
            old.progress = facts.progress;
            return Vec::new();
        }
        self.unlink(&key);
        for object in read_objects(&key.namespace, &facts) {
            let readers = self.readers.entry(object).or_default();
            if !readers.contains(&key) {
                readers.push(key.clone());
            }
        }
        self.by_namespace
            .entry(key.namespace.clone())
            .or_default()
            .insert(key.clone());
        self.workloads.insert(key.clone(), facts);
        vec![key]
    }

    /// A workload is gone.
    pub fn delete_workload(&mut self, key: &WorkloadKey) {
        self.unlink(key);
        self.workloads.remove(key);
    }

    fn unlink(&mut self, key: &WorkloadKey) {
        self.unlink_reads(key);
        if let Some(set) = self.by_namespace.get_mut(&key.namespace) {
            set.remove(key);
            if set.is_empty() {
                self.by_namespace.remove(&key.namespace);
            }
        }
    }

    /// Removes `key` from the readers of what it reads.
    fn unlink_reads(&mut self, key: &WorkloadKey) {
        let Some(old) = self.workloads.get(key) else {
            return;
        };
        for object in read_objects(&key.namespace, old) {
            if let Some(readers) = self.readers.get_mut(&object) {
                readers.retain(|r| r != key);
                if readers.is_empty() {
                    self.readers.remove(&object);
                }
            }
        }
    }

    /// A Secret or ConfigMap was added or modified. Due: its readers, when its content may have
    /// changed (a new version; labels and annotations alone bump the version too, and are then
    /// decided Current at the cost of one read).
    pub fn put_object(&mut self, key: ObjectKey, facts: ObjectFacts) -> Vec<(WorkloadKey, Reason)> {
        let what = match self.objects.get(&key) {
            Some(old) if old.version == facts.version => {
                self.objects.insert(key, facts);
                return Vec::new();
            }
            Some(old) if old.version.uid == facts.version.uid => "changed",
            // A new uid under the same name: deleted and created again (a rotation).
            Some(_) => "replaced",
            None => "created",
        };
        let due = self.readers_of(&key, what);
        self.objects.insert(key, facts);
        due
    }

    /// A Secret or ConfigMap is gone. Due: its readers.
    pub fn delete_object(&mut self, key: &ObjectKey) -> Vec<(WorkloadKey, Reason)> {
        if self.objects.remove(key).is_none() {
            return Vec::new();
        }
        self.readers_of(key, "deleted")
    }

    fn readers_of(&self, key: &ObjectKey, what: &'static str) -> Vec<(WorkloadKey, Reason)> {
        let mut due: Vec<WorkloadKey> = self
            .readers
            .get(key)
            .map(|r| r.to_vec())
            .unwrap_or_default();
        due.sort();
        due.into_iter()
            .map(|w| {
                (
                    w,
                    Reason::Object {
                        object: key.clone(),
                        what,
                    },
                )
            })
            .collect()
    }

    /// The workloads that read `key`.
    pub fn readers(&self, key: &ObjectKey) -> &[WorkloadKey] {
        self.readers.get(key).map_or(&[], Vec::as_slice)
    }

    /// A Namespace was added or modified. Due: its workloads, when its opt-in label changed. Those
    /// no longer opted in forget what they read (read again if it opts in once more).
    pub fn put_namespace(&mut self, name: String, label: Option<String>) -> Vec<WorkloadKey> {
        let changed = self.namespaces.get(&name) != Some(&label);
        self.namespaces.insert(name.clone(), label);
        if !changed {
            return Vec::new();
        }
        let due = self.workloads_in(&name);
        for key in &due {
            let stamps = self
                .workloads
                .get(key)
                .is_some_and(|w| opt_in(w.label.as_deref(), self.namespace_label(&name)).stamps());
            if stamps {
                continue;
            }
            self.unlink_reads(key);
            if let Some(w) = self.workloads.get_mut(key) {
                w.refs = Ok(Vec::new());
                w.indexed = false;
            }
        }
        due
    }

    pub fn delete_namespace(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    fn workloads_in(&self, namespace: &str) -> Vec<WorkloadKey> {
        let mut out: Vec<WorkloadKey> = self
            .by_namespace
            .get(namespace)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        out.sort();
        out
    }

    /// The copies (helmop's, with a content hash) `key` reads, for its restamp value.
    pub fn copies_read(&self, key: &WorkloadKey) -> Vec<(ResourceRef, String)> {
        let Some(Ok(refs)) = self.workloads.get(key).map(|w| w.refs.as_ref()) else {
            return Vec::new();
        };
        refs.iter()
            .filter_map(|r| {
                let object = ObjectKey {
                    namespace: key.namespace.clone(),
                    resource: r.resource.clone(),
                };
                let hash = self.objects.get(&object)?.content_hash.clone()?;
                Some((r.resource.clone(), hash))
            })
            .collect()
    }
}

fn read_objects(namespace: &str, facts: &WorkloadFacts) -> BTreeSet<ObjectKey> {
    facts
        .refs
        .iter()
        .flatten()
        .map(|r| ObjectKey {
            namespace: namespace.to_owned(),
            resource: r.resource.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use helmop_core::podrefs::Keys;

    use super::*;

    fn wkey(name: &str) -> WorkloadKey {
        WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "apps".into(),
            name: name.into(),
        }
    }

    fn okey(resource: ResourceRef) -> ObjectKey {
        ObjectKey {
            namespace: "apps".into(),
            resource,
        }
    }

    fn reading(resources: &[ResourceRef], stamp: &str) -> WorkloadFacts {
        WorkloadFacts {
            uid: "u".into(),
            label: None,
            refs: Ok(resources
                .iter()
                .map(|r| PodRef::new(r.clone(), Keys::All, false))
                .collect()),
            stamp: Some(stamp.into()),
            restamp: WatcherRecord::default(),
            progress: Progress {
                generation: 1,
                state: helmop_core::progress::RollState::Complete,
            },
            indexed: true,
        }
    }

    fn version(uid: &str, rv: &str) -> ObjectFacts {
        ObjectFacts {
            version: Version {
                uid: uid.into(),
                resource_version: rv.into(),
            },
            content_hash: None,
            resume: None,
        }
    }

    #[test]
    fn a_change_costs_its_readers_only() {
        let mut index = Index::default();
        let (app, db) = (ResourceRef::config_map("app"), ResourceRef::secret("db"));
        assert_eq!(
            index.put_workload(wkey("web"), reading(std::slice::from_ref(&app), "v2:a")),
            vec![wkey("web")]
        );
        index.put_workload(wkey("api"), reading(&[app.clone(), db.clone()], "v2:b"));
        // Created, then changed, then replaced (a rotation), then deleted: each time both readers.
        let due = index.put_object(okey(app.clone()), version("1", "10"));
        assert_eq!(
            due.iter().map(|(w, _)| w.clone()).collect::<Vec<_>>(),
            vec![wkey("api"), wkey("web")]
        );
        assert_eq!(due[0].1.label(), "object-created");
        assert!(
            index
                .put_object(okey(app.clone()), version("1", "10"))
                .is_empty(),
            "the same version again is no change"
        );
        let due = index.put_object(okey(app.clone()), version("1", "11"));
        assert_eq!(due[0].1.label(), "object-changed");
        let due = index.put_object(okey(app.clone()), version("2", "12"));
        assert_eq!(due[0].1.to_string(), "ConfigMap apps/app replaced");
        let due = index.delete_object(&okey(app.clone()));
        assert_eq!(due.len(), 2);
        assert_eq!(due[0].1.label(), "object-deleted");
        // Only api reads db.
        let due = index.put_object(okey(db.clone()), version("3", "1"));
        assert_eq!(
            due.into_iter().map(|(w, _)| w).collect::<Vec<_>>(),
            vec![wkey("api")]
        );
        // An object nobody reads costs nothing.
        assert!(
            index
                .put_object(okey(ResourceRef::secret("other")), version("4", "1"))
                .is_empty()
        );
    }

    #[test]
    fn a_workload_that_stops_reading_an_object_is_no_longer_its_reader() {
        let mut index = Index::default();
        let app = ResourceRef::config_map("app");
        index.put_workload(wkey("web"), reading(std::slice::from_ref(&app), "v2:a"));
        index.put_object(okey(app.clone()), version("1", "1"));
        index.put_workload(wkey("web"), reading(&[], "v2:a"));
        assert!(
            index
                .put_object(okey(app.clone()), version("1", "2"))
                .is_empty()
        );
        index.put_workload(wkey("web"), reading(std::slice::from_ref(&app), "v2:a"));
        index.delete_workload(&wkey("web"));
        assert!(
            index
                .put_object(okey(app.clone()), version("1", "3"))
                .is_empty()
        );
        assert_eq!(index.workload_count(), 0);
        assert!(index.readers.is_empty() && index.by_namespace.is_empty());
    }

    #[test]
    fn status_writes_are_no_change_and_namespace_labels_reach_their_workloads() {
        let mut index = Index::default();
        let facts = reading(&[ResourceRef::config_map("app")], "v2:a");
        index.put_workload(wkey("web"), facts.clone());
        assert!(index.put_workload(wkey("web"), facts).is_empty());
        assert_eq!(
            index.put_namespace("apps".into(), Some("enabled".into())),
            vec![wkey("web")]
        );
        assert!(
            index
                .put_namespace("apps".into(), Some("enabled".into()))
                .is_empty()
        );
        assert_eq!(index.namespace_label("apps"), Some("enabled"));
        assert!(index.put_namespace("other".into(), None).is_empty());
    }

    #[test]
    fn copies_read_lists_helmops_copies_with_their_content_hash() {
        let mut index = Index::default();
        let (app, db) = (ResourceRef::config_map("app"), ResourceRef::secret("db"));
        index.put_workload(wkey("web"), reading(&[app.clone(), db.clone()], "v2:a"));
        index.put_object(
            okey(app.clone()),
            ObjectFacts {
                content_hash: Some("v1:cc".into()),
                ..version("1", "1")
            },
        );
        index.put_object(okey(db), version("2", "1"));
        assert_eq!(index.copies_read(&wkey("web")), vec![(app, "v1:cc".into())]);
    }
}
