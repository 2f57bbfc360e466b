//! The wants of an [`Inventory`](super::inventory::Inventory) by cluster, so planning one
//! cluster reads its own wants (and those of the registrations that may reach the same cluster)
//! instead of scanning every want of the fleet.
//!
//! Why: a run plans each of its N clusters against the whole list of wants, and every one of
//! those scans compared cluster names. At 1,000 clusters with 4 sources each that was 4,000
//! comparisons several times per cluster, N^2 in all, and the largest CPU cost of a watcher's
//! run (docs/performance.md, "Watching a fleet"). The index is built once per enumeration, in
//! O(N).

use std::collections::{BTreeSet, HashMap};

use helmop_core::plan::DesiredCopy;

/// Positions in `desired` and `unserved` by plan key, and the plan keys by claimed identity.
#[derive(Debug, Default)]
pub struct ByCluster {
    desired: HashMap<String, Vec<usize>>,
    unserved: HashMap<String, Vec<usize>>,
    /// Plan keys of the wants, by the identity they claim.
    by_identity: HashMap<String, Vec<String>>,
    /// Plan keys of the wants whose identity is unknown: they may reach any cluster.
    unknown: Vec<String>,
}

impl ByCluster {
    /// Indexes `desired` and `unserved`; `identity_of` is the identity a plan key claims.
    pub fn new<'a>(
        desired: &[DesiredCopy],
        unserved: &[DesiredCopy],
        identity_of: impl Fn(&str) -> Option<&'a str>,
    ) -> ByCluster {
        let mut index = ByCluster::default();
        for (i, d) in desired.iter().enumerate() {
            index.desired.entry(d.cluster.clone()).or_default().push(i);
        }
        for (i, d) in unserved.iter().enumerate() {
            index.unserved.entry(d.cluster.clone()).or_default().push(i);
        }
        let keys: BTreeSet<&String> = index.desired.keys().chain(index.unserved.keys()).collect();
        for key in keys {
            match identity_of(key) {
                Some(id) => index
                    .by_identity
                    .entry(id.to_owned())
                    .or_default()
                    .push(key.clone()),
                None => index.unknown.push(key.clone()),
            }
        }
        index
    }

    /// Positions in `desired` of the wants on `cluster`, in order.
    pub fn desired(&self, cluster: &str) -> &[usize] {
        self.desired.get(cluster).map_or(&[], Vec::as_slice)
    }

    /// The plan keys other than `key` that may reach the cluster `key` reaches (same claimed
    /// identity, or either one unknown: `clusters::may_be_same`); `None`: every one of them may.
    pub fn may_reach(&self, key: &str, identity: Option<&str>) -> Option<BTreeSet<&str>> {
        let id = identity?;
        Some(
            self.by_identity
                .get(id)
                .into_iter()
                .flatten()
                .chain(&self.unknown)
                .map(String::as_str)
                .filter(|k| *k != key)
                .collect(),
        )
    }

    /// Positions in `desired` and in `unserved`, each in order, of the wants of `keys`.
    pub fn positions(&self, keys: &BTreeSet<&str>) -> (Vec<usize>, Vec<usize>) {
        let collect = |map: &HashMap<String, Vec<usize>>| {
            let mut at: Vec<usize> = keys
                .iter()
                .filter_map(|k| map.get(*k))
                .flatten()
                .copied()
                .collect();
            at.sort_unstable();
            at
        };
        (collect(&self.desired), collect(&self.unserved))
    }
}

#[cfg(test)]
mod tests {
    use helmop_core::plan::HelmOpKey;
    use helmop_core::resource::ResourceRef;

    use super::*;

    fn want(cluster: &str, name: &str) -> DesiredCopy {
        DesiredCopy {
            cluster: cluster.into(),
            namespace: "apps".into(),
            helmop: HelmOpKey::new("team", "app"),
            resource: ResourceRef::secret(name),
            keep: false,
        }
    }

    #[test]
    fn wants_by_cluster_and_who_may_reach_the_same_cluster() {
        let desired = [
            want("a", "x"),
            want("b", "x"),
            want("a", "y"),
            want("c", "x"),
        ];
        let unserved = [want("ctx", "z"), want("a", "u")];
        let identity = |k: &str| match k {
            "a" | "b" => Some("one"),
            "c" => Some("two"),
            _ => None,
        };
        let index = ByCluster::new(&desired, &unserved, identity);
        assert_eq!(index.desired("a"), [0, 2]);
        assert_eq!(index.desired("nowhere"), [] as [usize; 0]);
        // `a` shares its identity with `b`, and `ctx`'s is unknown: both may reach it, `c` not.
        let near = index.may_reach("a", Some("one")).expect("a known identity");
        assert_eq!(near, BTreeSet::from(["b", "ctx"]));
        assert_eq!(index.positions(&near), (vec![1], vec![0]));
        // An unknown identity may be any cluster.
        assert_eq!(index.may_reach("ctx", None), None);
        // A key under another name of the same identity never lists itself.
        let near = index.may_reach("c", Some("two")).expect("a known identity");
        assert_eq!(near, BTreeSet::from(["ctx"]));
    }
}
