//! Which clusters a run must cover. A watcher's run after nothing but edits of sources and
//! HelmOps covers only the clusters those edits concern; every other trigger, and any changed
//! object whose role is not plainly "a source of these copies" or "this shard's HelmOp", covers the
//! whole fleet.
//!
//! Why: at 1,000 clusters, an edit of one HelmOp or of its Secret ran over every cluster of every
//! HelmOp (docs/performance.md, "Watching a fleet"). A focused run does for the clusters it
//! covers exactly what a full run does there (all of their copies are planned, not only the
//! edited ones), so the only thing it leaves out is clusters the edit cannot concern; drift there
//! is the periodic resync's, as before.
//!
//! What counts as a plain source edit ([`covered`]): a change (not a deletion: a deleted Secret may
//! have had any role) of a Secret or ConfigMap that a HelmOp of the run names in its
//! `downstreamResources`, and that is neither a Cluster's kubeconfig Secret nor a HelmOp's
//! `helmSecretName`. It covers the clusters wanting copies of it.
//!
//! A HelmOp edit (or a new HelmOp) of this run's own HelmOps covers the clusters where it wants
//! copies now and those where the watcher's standing report ([`crate::watch::standing`], the
//! whole fleet as the last full run and the focused runs since left it) shows it: wherever it can
//! have a copy to write, move, release or report. A HelmOp's copies are found only where a run has
//! seen them, and the start-up run is a full one, so that is every place it has copies as far as
//! the watcher knows; one made meanwhile by someone else is the resync's, like any drift. Because
//! plans protect what other registrations of the same cluster want, the run also covers every
//! registration that may reach one of those clusters (the same identity, or an unknown one).
//! A deleted HelmOp, one another shard handles, or one the inventory no longer lists is a full run.
//!
//! A run after source edits alone works on the kinds of those sources only ([`Focus::kinds`]): an
//! edit of a ConfigMap lists, plans and writes the ConfigMap copies of the clusters copying it, and
//! leaves their Secret copies as they stand. At 1,000 clusters that is one list request fewer per
//! cluster before the edited copies are written (docs/performance.md).

use std::collections::BTreeSet;

use helmop_core::plan::HelmOpKey;
use helmop_core::resource::{ResourceKind, ResourceRef};

use crate::output::report::Row;
use crate::run::inventory::{Inventory, key_of};

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
    /// The clusters these changes concern ([`covered`]).
    Changes(Changes),
}

/// Edits of sources and HelmOps, and where the edited HelmOps stood.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub sources: BTreeSet<SourceKey>,
    pub helmops: BTreeSet<HelmOpKey>,
    /// The clusters (as reports name them) where the standing report shows one of `helmops`
    /// ([`Focus::placed`]).
    pub stood: BTreeSet<String>,
}

impl Changes {
    /// Sources and HelmOps named.
    pub fn len(&self) -> usize {
        self.sources.len() + self.helmops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A focused run names at most this many sources and HelmOps; more changes at once make a full
/// run, which then costs no more than the focused one would.
pub const MAX_FOCUSED_CHANGES: usize = 64;

impl Focus {
    /// The changes, in words, for the run's report; `None` for a full run.
    pub fn describe(&self) -> Option<Vec<String>> {
        match self {
            Focus::Everything => None,
            Focus::Changes(c) => Some(
                c.sources
                    .iter()
                    .map(ToString::to_string)
                    .chain(c.helmops.iter().map(|h| format!("HelmOp {h}")))
                    .collect(),
            ),
        }
    }

    /// The kinds of copies a run with this focus works on where it covers only some clusters
    /// ([`covered`]): after edits of sources alone, the kinds of those sources, since an edit of a
    /// Secret changes no ConfigMap copy (and the other way round); every kind otherwise. Its
    /// clusters' copies of the other kinds are left as they stand, like the clusters it does not
    /// cover, until the next run over them (docs/decisions.md).
    pub fn kinds(&self) -> Vec<ResourceKind> {
        match self {
            Focus::Changes(c) if self.source_edits_only() => ResourceKind::ALL
                .into_iter()
                .filter(|k| c.sources.iter().any(|s| s.resource.kind == *k))
                .collect(),
            _ => ResourceKind::ALL.to_vec(),
        }
    }

    /// Whether the changes are edits of sources and nothing else: such a run changes the
    /// content of existing copies, and where that is all its plan writes, a watcher plans it
    /// from its kept listings (docs/decisions.md).
    pub fn source_edits_only(&self) -> bool {
        matches!(self, Focus::Changes(c) if c.helmops.is_empty() && !c.sources.is_empty())
    }

    /// This focus with where its HelmOps stand in `standing` (the rows of the watcher's picture
    /// of the whole fleet). Without one, a HelmOp edit cannot be placed: everything.
    pub fn placed(self, standing: Option<&[Row]>) -> Focus {
        let Focus::Changes(mut changes) = self else {
            return self;
        };
        if changes.helmops.is_empty() {
            return Focus::Changes(changes);
        }
        let Some(standing) = standing else {
            return Focus::Everything;
        };
        let names: BTreeSet<String> = changes.helmops.iter().map(ToString::to_string).collect();
        changes.stood = standing
            .iter()
            .filter(|r| !r.cluster.is_empty() && r.helmops.iter().any(|h| names.contains(h)))
            .map(|r| r.cluster.clone())
            .collect();
        Focus::Changes(changes)
    }
}

/// The plan keys of the clusters a run with `focus` covers; `None`: every cluster of `inv`.
pub fn covered(inv: &Inventory, focus: &Focus) -> Option<BTreeSet<String>> {
    let Focus::Changes(changes) = focus else {
        return None;
    };
    let mut clusters = BTreeSet::new();
    for source in &changes.sources {
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
    if !changes.helmops.is_empty() {
        clusters.extend(helmop_clusters(inv, changes)?);
    }
    Some(clusters)
}

/// The clusters the HelmOp edits of `changes` concern (see the module documentation); `None`
/// when one of them is not plainly this run's.
fn helmop_clusters(inv: &Inventory, changes: &Changes) -> Option<BTreeSet<String>> {
    let listed: BTreeSet<HelmOpKey> = inv.helmops.iter().filter_map(key_of).collect();
    if changes
        .helmops
        .iter()
        .any(|h| !listed.contains(h) || inv.elsewhere.contains(h))
    {
        return None;
    }
    let mut near: BTreeSet<String> = inv
        .desired
        .iter()
        .filter(|d| changes.helmops.contains(&d.helmop))
        .map(|d| d.cluster.clone())
        .collect();
    near.extend(
        inv.downstreams
            .iter()
            .filter(|d| changes.stood.contains(&d.display()))
            .map(|d| d.key.clone()),
    );
    // Every registration that may reach one of these clusters: its plan protects their wants.
    let identities: Option<BTreeSet<&str>> = near.iter().map(|k| inv.identity_of(k)).collect();
    let Some(identities) = identities else {
        // One of them may be any cluster.
        return Some(inv.downstreams.iter().map(|d| d.key.clone()).collect());
    };
    near.extend(
        inv.downstreams
            .iter()
            .filter(|d| {
                inv.identity_of(&d.key)
                    .is_none_or(|id| identities.contains(id))
            })
            .map(|d| d.key.clone()),
    );
    Some(near)
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
    use helmop_core::plan::HelmOpKey;

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
        Focus::Changes(Changes {
            sources: names
                .iter()
                .map(|(ns, name)| SourceKey {
                    namespace: (*ns).into(),
                    resource: ResourceRef::secret(*name),
                })
                .collect(),
            ..Changes::default()
        })
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
        let config_map = Focus::Changes(Changes {
            sources: BTreeSet::from([SourceKey {
                namespace: "team".into(),
                resource: ResourceRef::config_map("db"),
            }]),
            ..Changes::default()
        });
        assert_eq!(covered(&inv, &config_map), None);
    }

    #[test]
    fn a_run_after_source_edits_works_on_their_kinds() {
        let config_map = |name: &str| SourceKey {
            namespace: "team".into(),
            resource: ResourceRef::config_map(name),
        };
        let secrets = focus(&[("team", "db"), ("team", "shared")]);
        assert_eq!(secrets.kinds(), [ResourceKind::Secret]);
        let configs = Focus::Changes(Changes {
            sources: BTreeSet::from([config_map("app")]),
            ..Changes::default()
        });
        assert_eq!(configs.kinds(), [ResourceKind::ConfigMap]);
        let mut both = secrets.clone();
        if let Focus::Changes(c) = &mut both {
            c.sources.insert(config_map("app"));
        }
        assert_eq!(both.kinds(), ResourceKind::ALL);
        // A HelmOp edit may add, move or drop copies of any kind: its run works on every kind.
        let mut with_helmop = secrets.clone();
        if let Focus::Changes(c) = &mut with_helmop {
            c.helmops.insert(HelmOpKey::new("team", "a"));
        }
        assert_eq!(with_helmop.kinds(), ResourceKind::ALL);
        assert_eq!(helmop_edit(&["a"], &[]).kinds(), ResourceKind::ALL);
        assert_eq!(Focus::Everything.kinds(), ResourceKind::ALL);
    }

    #[test]
    fn focus_reads_as_the_sources() {
        assert_eq!(Focus::Everything.describe(), None);
        assert_eq!(
            focus(&[("team", "db")]).describe(),
            Some(vec!["Secret team/db".to_owned()])
        );
    }

    /// `inventory()` with a Downstream per cluster: c1 and c4 claim one identity, c2 and c3
    /// their own; `c4` is named `team/c4` in reports.
    fn reachable() -> Inventory {
        use crate::cluster::clusters::Downstream;
        use crate::error::PluginError;
        let ds = |key: &str, identity: Option<&str>| Downstream {
            key: key.into(),
            name: format!("team/{key}"),
            identity: identity.map(str::to_owned),
            client: Err(PluginError::NoKubeconfigSecret),
        };
        let downstreams = vec![
            ds("c1", Some("one")),
            ds("c2", Some("two")),
            ds("c3", Some("three")),
            ds("c4", Some("one")),
        ];
        Inventory {
            identities: downstreams
                .iter()
                .map(|d| (d.key.clone(), d.identity.clone()))
                .collect(),
            downstreams,
            ..inventory()
        }
    }

    fn helmop_edit(names: &[&str], stood: &[&str]) -> Focus {
        Focus::Changes(Changes {
            helmops: names.iter().map(|n| HelmOpKey::new("team", n)).collect(),
            stood: stood.iter().map(|s| (*s).to_owned()).collect(),
            ..Changes::default()
        })
    }

    #[test]
    fn a_helmop_edit_covers_where_it_wants_copies_where_it_stood_and_the_same_clusters() {
        let inv = reachable();
        // b wants copies on c2 and c3.
        assert_eq!(
            covered(&inv, &helmop_edit(&["b"], &[])),
            keys(&["c2", "c3"])
        );
        // a wants copies on c1, which c4 claims to be too.
        assert_eq!(
            covered(&inv, &helmop_edit(&["a"], &[])),
            keys(&["c1", "c4"])
        );
        // b stood on c4 (it had a copy there, say, that it no longer wants): c4, and c1.
        assert_eq!(
            covered(&inv, &helmop_edit(&["b"], &["team/c4"])),
            keys(&["c1", "c2", "c3", "c4"])
        );
        // A HelmOp edit and a source edit together: both sets (a source edit changes content
        // only, so it covers no other registration of its clusters).
        let mut both = helmop_edit(&["b"], &[]);
        if let Focus::Changes(c) = &mut both {
            c.sources.insert(SourceKey {
                namespace: "team".into(),
                resource: ResourceRef::secret("db"),
            });
        }
        assert_eq!(covered(&inv, &both), keys(&["c1", "c2", "c3"]));
        // An unknown identity may be any cluster.
        let mut unknown = reachable();
        unknown.identities.insert("c3".into(), None);
        assert_eq!(
            covered(&unknown, &helmop_edit(&["b"], &[])),
            keys(&["c1", "c2", "c3", "c4"])
        );
    }

    #[test]
    fn a_helmop_the_run_does_not_plainly_handle_covers_everything() {
        let mut inv = reachable();
        // Not listed (deleted meanwhile, or another selection's).
        assert_eq!(covered(&inv, &helmop_edit(&["gone"], &[])), None);
        assert_eq!(covered(&inv, &helmop_edit(&["a", "gone"], &[])), None);
        // Another shard's.
        inv.elsewhere.insert(HelmOpKey::new("team", "b"));
        assert_eq!(covered(&inv, &helmop_edit(&["b"], &[])), None);
    }

    #[test]
    fn a_helmop_edit_is_placed_by_the_standing_report() {
        use crate::watch::fixtures::{report, row};
        use helmop_core::state::RowState;
        let mut elsewhere = row("team/d2", RowState::Unchanged);
        elsewhere.helmops = vec!["team/other".into()];
        let standing = report(
            vec![
                row("team/d1", RowState::Unchanged),
                elsewhere,
                row("", RowState::Invalid),
            ],
            0,
        );
        let edit = helmop_edit(&["app"], &[]);
        assert_eq!(
            edit.clone().placed(Some(&standing.rows)),
            helmop_edit(&["app"], &["team/d1"])
        );
        // No standing report yet: everything. Sources alone need none.
        assert_eq!(edit.placed(None), Focus::Everything);
        assert_eq!(
            focus(&[("team", "db")]).placed(None),
            focus(&[("team", "db")])
        );
        assert_eq!(
            helmop_edit(&["app"], &[]).describe(),
            Some(vec!["HelmOp team/app".to_owned()])
        );
    }
}
