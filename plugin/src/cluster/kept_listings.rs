//! What a watcher's (`propagate --watch`) last listing of a cluster's copies found, per kind, as
//! its own writes since left it: a run after source edits alone plans from it instead of listing
//! again when every write it then makes is an update of an existing copy.
//!
//! Why: after the edited kind's list ([`crate::run::focus::Focus::kinds`]) that list was half of
//! the requests before a cluster's copy was written (LIST, then APPLY), at 1,000 and 10,000
//! clusters alike (docs/performance.md, "Updates from the last listing").
//!
//! Nothing stale moves data: an update carries the `uid` and `resourceVersion` the listing gave
//! (or the write that followed it), so the API server refuses it if the copy changed or went away
//! since, and a run that planned from a kept listing plans that cluster again from a fresh one
//! when any write fails ([`crate::run::propagate`]). What a kept listing can hide is what no write
//! of the run touches (a copy of another source deleted or edited by hand), which the next fresh
//! listing finds: a run over every kind, a HelmOp edit, at the latest the resync.
//!
//! Bounded by the fleet: one listing per cluster and kind, each the labelled objects the run kept
//! (this upstream's copies, and what stands at its wanted places), metadata only without field
//! ownership; replaced by the next listing, dropped with the watcher's other kept reads (resync,
//! new leadership, a failed run: [`crate::cluster::read_cache::ReadCache::clear`]).

use std::collections::HashMap;
use std::sync::Mutex;

use helmop_core::resource::ResourceKind;
use kube::api::ObjectMeta;

/// One kind's listing of one cluster, for the places it was looking for.
#[derive(Debug)]
struct Listing {
    /// Tells the places (and upstream ids) the listing was filtered for apart: a run looking for
    /// other places lists again.
    looking: u64,
    objects: Vec<ObjectMeta>,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct KeptListings {
    clusters: Mutex<HashMap<(String, ResourceKind), Listing>>,
}

impl KeptListings {
    /// The objects of `kind` on `cluster` as last listed for `looking` (and written since).
    pub fn get(&self, cluster: &str, kind: ResourceKind, looking: u64) -> Option<Vec<ObjectMeta>> {
        let clusters = self.clusters.lock().ok()?;
        let listing = clusters.get(&(cluster.to_owned(), kind))?;
        (listing.looking == looking).then(|| listing.objects.clone())
    }

    /// What a listing of `kind` on `cluster` for `looking` kept: replaces the last one.
    pub fn keep(&self, cluster: &str, kind: ResourceKind, looking: u64, objects: Vec<ObjectMeta>) {
        if let Ok(mut clusters) = self.clusters.lock() {
            clusters.insert((cluster.to_owned(), kind), Listing { looking, objects });
        }
    }

    /// What a write on `cluster` left (the server's answer): replaces the object of that
    /// namespace and name in the kept listing of `kind`, or adds it. Without a kept listing,
    /// nothing is kept (nor copied): the next run lists.
    pub fn record(&self, cluster: &str, kind: ResourceKind, written: &ObjectMeta) {
        let Ok(mut clusters) = self.clusters.lock() else {
            return;
        };
        let Some(listing) = clusters.get_mut(&(cluster.to_owned(), kind)) else {
            return;
        };
        let written = ObjectMeta {
            managed_fields: None,
            ..written.clone()
        };
        let same = |m: &ObjectMeta| m.namespace == written.namespace && m.name == written.name;
        match listing.objects.iter_mut().find(|m| same(m)) {
            Some(kept) => *kept = written,
            None => listing.objects.push(written),
        }
    }

    /// Drops what was kept for `cluster`: its next run lists.
    pub fn forget(&self, cluster: &str) {
        if let Ok(mut clusters) = self.clusters.lock() {
            clusters.retain(|(c, _), _| c != cluster);
        }
    }

    pub fn clear(&self) {
        if let Ok(mut clusters) = self.clusters.lock() {
            clusters.clear();
        }
    }

    /// Objects kept, over every cluster and kind.
    pub fn len(&self) -> usize {
        self.clusters
            .lock()
            .map_or(0, |c| c.values().map(|l| l.objects.len()).sum())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, version: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("apps".into()),
            name: Some(name.into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        }
    }

    fn versions(kept: &KeptListings, kind: ResourceKind, looking: u64) -> Option<Vec<String>> {
        kept.get("c1", kind, looking).map(|objects| {
            objects
                .into_iter()
                .filter_map(|m| Some(format!("{}@{}", m.name?, m.resource_version?)))
                .collect()
        })
    }

    #[test]
    fn a_listing_is_used_only_for_what_it_looked_for_and_follows_the_writes() {
        let kept = KeptListings::default();
        let cm = ResourceKind::ConfigMap;
        // Nothing listed yet: a write keeps nothing.
        kept.record("c1", cm, &meta("app", "3"));
        assert!(kept.is_empty());
        kept.keep("c1", cm, 7, vec![meta("app", "3"), meta("other", "4")]);
        assert_eq!(
            versions(&kept, cm, 7),
            Some(vec!["app@3".into(), "other@4".into()])
        );
        // Other places looked for, another kind, another cluster: list again.
        assert_eq!(versions(&kept, cm, 8), None);
        assert_eq!(versions(&kept, ResourceKind::Secret, 7), None);
        assert_eq!(kept.get("c2", cm, 7), None);
        // A write replaces its object (field ownership dropped) or adds it.
        let mut written = meta("app", "9");
        written.managed_fields = Some(Vec::new());
        kept.record("c1", cm, &written);
        kept.record("c1", cm, &meta("new", "10"));
        assert_eq!(
            versions(&kept, cm, 7),
            Some(vec!["app@9".into(), "other@4".into(), "new@10".into()])
        );
        assert!(
            kept.get("c1", cm, 7)
                .into_iter()
                .flatten()
                .all(|m| m.managed_fields.is_none())
        );
        // A new listing replaces the old; forgetting a cluster drops all its kinds.
        kept.keep("c1", cm, 7, vec![meta("app", "11")]);
        assert_eq!(versions(&kept, cm, 7), Some(vec!["app@11".into()]));
        kept.keep("c1", ResourceKind::Secret, 7, vec![meta("db", "1")]);
        kept.keep("c2", cm, 7, vec![meta("app", "1")]);
        kept.forget("c1");
        assert_eq!(kept.len(), 1);
        kept.clear();
        assert!(kept.is_empty());
    }
}
