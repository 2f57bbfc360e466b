//! Which clusters a run must cover. A watcher's run after nothing but edits of sources covers only
//! the clusters holding (or wanting) copies of those sources; every other trigger, and any changed
//! object whose role is not plainly "a source of these copies", covers the whole fleet.
//!
//! Why: at 1,000 clusters, an edit of one HelmOp's Secret ran over every cluster of every HelmOp
//! (docs/performance.md, "Watching a fleet"). A focused run does for the clusters it covers exactly
//! what a full run does there (all of their copies are planned, not only the edited source's), so
//! the only thing it leaves out is clusters the edit cannot concern; drift there is the periodic
//! resync's, as before.
//!
//! What counts as a plain source edit ([`covered`]): a change (not a deletion: a deleted Secret may
//! have had any role) of a Secret or ConfigMap that a HelmOp of the run names in its
//! `downstreamResources`, and that is neither a Cluster's kubeconfig Secret nor a HelmOp's
//! `helmSecretName`. Anything else - a Secret no HelmOp names, the hash key, a HelmOp or Cluster
//! change, the resync, a retry - is a full run.

use std::collections::BTreeSet;

use helmop_core::resource::ResourceRef;

use crate::run::inventory::Inventory;

/// A source upstream: its namespace and `Kind/name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceKey {
    pub namespace: String,
    pub resource: ResourceRef,
}

impl std::fmt::Display for SourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{}",
            self.resource.kind, self.namespace, self.resource.name
        )
    }
}

/// What a run covers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Focus {
    /// Every cluster of the scope.
    #[default]
    Everything,
    /// The clusters copying these sources ([`covered`]).
    Sources(BTreeSet<SourceKey>),
}

/// A focused run names at most this many sources; more changes at once make a full run, which
/// then costs no more than the focused one would.
pub const MAX_FOCUSED_SOURCES: usize = 64;

impl Focus {
    /// The sources, in words, for the run's report; `None` for a full run.
    pub fn describe(&self) -> Option<Vec<String>> {
        match self {
            Focus::Everything => None,
            Focus::Sources(s) => Some(s.iter().map(ToString::to_string).collect()),
        }
    }
}

/// The plan keys of the clusters a run with `focus` covers; `None`: every cluster of `inv`.
pub fn covered(inv: &Inventory, focus: &Focus) -> Option<BTreeSet<String>> {
    let Focus::Sources(sources) = focus else {
        return None;
    };
    let mut clusters = BTreeSet::new();
    for source in sources {
        if !plain_source(inv, source) {
            return None;
        }
        clusters.extend(
            inv.desired
                .iter()
                .filter(|d| d.helmop.namespace == source.namespace && d.resource == source.resource)
                .map(|d| d.cluster.clone()),
        );
    }
    Some(clusters)
}

/// Whether `source` is named by a HelmOp of the run and plays no other role it can see.
fn plain_source(inv: &Inventory, source: &SourceKey) -> bool {
    let in_namespace = || {
        inv.helmops
            .iter()
            .filter(|h| h.metadata.namespace.as_deref() == Some(source.namespace.as_str()))
    };
    let named = in_namespace().any(|h| h.named_sources().contains(&source.resource));
    let secret = source.resource.kind == helmop_core::resource::ResourceKind::Secret;
    let helm_secret = secret
        && in_namespace().any(|h| h.spec.helm_secret_name() == Some(source.resource.name.as_str()));
    let kubeconfig = secret
        && inv
            .kubeconfig_secrets
            .contains(&(source.namespace.clone(), source.resource.name.clone()));
    named && !helm_secret && !kubeconfig
}

#[cfg(test)]
mod tests {
    use helmop_core::model::{DownstreamResource, HelmOp, HelmOpSpec};

    use super::*;
    use crate::run::inventory::Selection;

    fn inventory() -> Inventory {
        let spec = |resources: &[&str], helm_secret: Option<&str>| HelmOpSpec {
            downstream_resources: Some(
                resources
                    .iter()
                    .map(|r| DownstreamResource::new("Secret", r))
                    .collect(),
            ),
            helm_secret_name: helm_secret.map(str::to_owned),
            ..HelmOpSpec::default()
        };
        let want = crate::run::inventory::wanted_secret;
        Inventory {
            helmops: vec![
                HelmOp::new("team", "a", spec(&["db", "shared"], None)),
                HelmOp::new(
                    "team",
                    "b",
                    spec(&["api", "shared", "creds"], Some("creds")),
                ),
            ],
            desired: vec![
                want("c1", "a", "db"),
                want("c1", "a", "shared"),
                want("c2", "b", "api"),
                want("c2", "b", "shared"),
                want("c3", "b", "api"),
            ],
            kubeconfig_secrets: BTreeSet::from([("team".to_owned(), "c1-kubeconfig".to_owned())]),
            ..Inventory::empty(Selection::All)
        }
    }

    fn focus(names: &[(&str, &str)]) -> Focus {
        Focus::Sources(
            names
                .iter()
                .map(|(ns, name)| SourceKey {
                    namespace: (*ns).into(),
                    resource: ResourceRef::secret(*name),
                })
                .collect(),
        )
    }

    fn keys(k: &[&str]) -> Option<BTreeSet<String>> {
        Some(k.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn a_source_edit_covers_the_clusters_copying_it() {
        let inv = inventory();
        assert_eq!(covered(&inv, &focus(&[("team", "db")])), keys(&["c1"]));
        assert_eq!(
            covered(&inv, &focus(&[("team", "api")])),
            keys(&["c2", "c3"])
        );
        assert_eq!(
            covered(&inv, &focus(&[("team", "db"), ("team", "shared")])),
            keys(&["c1", "c2"])
        );
        assert_eq!(covered(&inv, &Focus::Everything), None);
    }

    #[test]
    fn anything_that_is_not_plainly_a_source_covers_everything() {
        let inv = inventory();
        // No HelmOp names it; a kubeconfig; a helmSecretName that is also a source; the right
        // name in another namespace.
        for odd in ["unnamed", "c1-kubeconfig", "creds"] {
            assert_eq!(covered(&inv, &focus(&[("team", odd)])), None, "{odd}");
            assert_eq!(
                covered(&inv, &focus(&[("team", "db"), ("team", odd)])),
                None
            );
        }
        assert_eq!(covered(&inv, &focus(&[("other", "db")])), None);
        // A ConfigMap of a Secret's name is another object.
        let config_map = Focus::Sources(BTreeSet::from([SourceKey {
            namespace: "team".into(),
            resource: ResourceRef::config_map("db"),
        }]));
        assert_eq!(covered(&inv, &config_map), None);
    }

    #[test]
    fn focus_reads_as_the_sources() {
        assert_eq!(Focus::Everything.describe(), None);
        assert_eq!(
            focus(&[("team", "db")]).describe(),
            Some(vec!["Secret team/db".to_owned()])
        );
    }
}
