//! Objects per namespace in a watch cache, kept up to date from the watch events: the reflector's store has no
//! namespace index, and counting by scanning it would cost a pass over every Secret of the cluster per admission.
//! Only [`super::cache::read_plan`] reads these counts, to choose between one LIST and one GET per object; no
//! answer rests on them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use kube::Resource;
use kube::runtime::watcher::Event;

/// Objects per namespace. Cheap to clone.
#[derive(Clone, Default)]
pub struct NamespaceCounts {
    inner: Arc<Mutex<Counts>>,
}

#[derive(Default)]
struct Counts {
    live: HashMap<String, usize>,
    /// The counts of a re-list in progress, which replace `live` when it is complete (as the store does).
    relist: Option<HashMap<String, usize>>,
}

impl NamespaceCounts {
    /// Objects in `namespace` as of the last event.
    pub fn get(&self, namespace: &str) -> usize {
        lock(&self.inner).live.get(namespace).copied().unwrap_or(0)
    }

    /// Counts `event`, seen before the store applies it: `known` says whether the store holds the object already
    /// (an `Apply` of a known object is an update, a `Delete` of an unknown one a repeat).
    pub fn record<K: Resource>(&self, event: &Event<K>, known: impl Fn(&K) -> bool) {
        let mut counts = lock(&self.inner);
        match event {
            Event::Apply(obj) if !known(obj) => add(&mut counts.live, obj, 1),
            Event::Delete(obj) if known(obj) => add(&mut counts.live, obj, -1),
            Event::Apply(_) | Event::Delete(_) => {}
            Event::Init => counts.relist = Some(HashMap::new()),
            Event::InitApply(obj) => {
                if let Some(relist) = counts.relist.as_mut() {
                    add(relist, obj, 1);
                }
            }
            Event::InitDone => {
                if let Some(relist) = counts.relist.take() {
                    counts.live = relist;
                }
            }
        }
    }
}

fn add<K: Resource>(counts: &mut HashMap<String, usize>, obj: &K, delta: isize) {
    let namespace = obj.meta().namespace.as_deref().unwrap_or_default();
    if delta > 0 {
        *counts.entry(namespace.to_owned()).or_default() += 1;
    } else if let Some(n) = counts.get_mut(namespace) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(namespace);
        }
    }
}

fn lock(m: &Mutex<Counts>) -> MutexGuard<'_, Counts> {
    // Counts are plain numbers: a panic elsewhere cannot leave them half-written.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;
    use kube::core::PartialObjectMeta;

    use super::*;

    fn secret(namespace: &str, name: &str) -> PartialObjectMeta<Secret> {
        let mut s = PartialObjectMeta::<Secret>::default();
        s.metadata.namespace = Some(namespace.into());
        s.metadata.name = Some(name.into());
        s
    }

    #[test]
    fn counts_follow_creates_updates_deletes_and_relists() {
        let counts = NamespaceCounts::default();
        let (a, b, c) = (
            secret("team", "a"),
            secret("team", "b"),
            secret("other", "c"),
        );
        counts.record(&Event::<PartialObjectMeta<Secret>>::Init, |_| false);
        counts.record(&Event::InitApply(a.clone()), |_| false);
        counts.record(&Event::InitApply(c.clone()), |_| false);
        assert_eq!(
            counts.get("team"),
            0,
            "a list in progress is not counted yet"
        );
        counts.record(&Event::<PartialObjectMeta<Secret>>::InitDone, |_| false);
        assert_eq!((counts.get("team"), counts.get("other")), (1, 1));
        counts.record(&Event::Apply(b.clone()), |_| false);
        // An update of a known object, and a delete of an unknown one, change nothing.
        counts.record(&Event::Apply(b.clone()), |_| true);
        counts.record(&Event::Delete(secret("team", "gone")), |_| false);
        assert_eq!(counts.get("team"), 2);
        counts.record(&Event::Delete(a), |_| true);
        assert_eq!(counts.get("team"), 1);
        // A re-list replaces everything, including namespaces that emptied meanwhile.
        counts.record(&Event::<PartialObjectMeta<Secret>>::Init, |_| false);
        counts.record(&Event::InitApply(b), |_| false);
        counts.record(&Event::<PartialObjectMeta<Secret>>::InitDone, |_| false);
        assert_eq!((counts.get("team"), counts.get("other")), (1, 0));
        assert_eq!(counts.get("nowhere"), 0);
    }
}
