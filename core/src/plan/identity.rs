//! Identity rules applied to a cluster's plan input before planning (docs/cluster-identity.md):
//!
//! - [`migrate_upstream_ids`]: copies whose markers name an earlier id of this same upstream
//!   (an alias, e.g. the id older releases derived from the API server's CA or URL) are read as
//!   ours, and flagged so that the planner sees their markers differ and the next write records
//!   the current id, but only when their recorded source uid is a live source's of this run:
//!   such ids were derived from how the upstream was reached, so another management cluster
//!   behind the same proxy CA or URL carries the same one. Entries of any other id, and alias
//!   copies that cannot be proven this upstream's, are left exactly as they are.
//! - [`take_sources`]: on the upstream cluster itself, a place that holds a source is never a
//!   copy: it is refused (`Conflict`, [`ConflictReason::IsSource`]) whatever `--adopt` says, and
//!   never pruned.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Action, ActionKind, ConflictReason, HelmOpKey, ObservedCopy, OwnerRef, PlanInput, SourceObject,
    SourceRef, format_owners, parse_owners,
};
use crate::names;
use crate::resource::ResourceRef;

/// An annotation that only ever exists in memory, on an observed copy whose markers were
/// rewritten from an alias (its value): helmop never writes it, so the planner finds the copy's
/// `helmop.dev/` keys differ from what it would write and plans an update (`MarkersChanged`).
pub const MIGRATING: &str = "helmop.dev/migrating-from-upstream-id";

/// Rewrites, in `observed`, owners entries and source markers of the ids in `aliases` to
/// `upstream_id`, in the copies whose `helmop.dev/source` names one of `live` (this upstream's
/// sources, as read by the run) and whose `helmop.dev/source-uid` is that source's uid (see the
/// module documentation).
pub fn migrate_upstream_ids(
    observed: &mut [ObservedCopy],
    upstream_id: &str,
    aliases: &[String],
    live: &[SourceObject],
) {
    let is_alias = |id: &str| id != upstream_id && aliases.iter().any(|a| a == id);
    let proven = |o: &ObservedCopy| {
        let Some(source) = o
            .annotations
            .get(names::ANN_SOURCE)
            .and_then(|s| SourceRef::parse(s))
            .filter(|s| s.upstream_id == upstream_id || is_alias(&s.upstream_id))
        else {
            return false;
        };
        let recorded = o.annotations.get(names::ANN_SOURCE_UID);
        live.iter().any(|l| {
            l.namespace == source.namespace
                && l.resource == source.resource
                && recorded == Some(&l.uid)
        })
    };
    for o in observed {
        if !proven(o) {
            continue;
        }
        let mut from = None;
        if let Some(value) = o.annotations.get(names::ANN_OWNERS) {
            let mut changed = false;
            let entries: BTreeSet<String> = parse_owners(value)
                .into_iter()
                .map(|entry| match OwnerRef::parse(&entry) {
                    Some(owner) if is_alias(&owner.upstream_id) => {
                        changed = true;
                        from = Some(owner.upstream_id.clone());
                        OwnerRef::new(upstream_id, &owner.namespace, &owner.name).to_string()
                    }
                    _ => entry,
                })
                .collect();
            if changed {
                o.annotations
                    .insert(names::ANN_OWNERS.into(), format_owners(&entries));
            }
        }
        if let Some(source) = o
            .annotations
            .get(names::ANN_SOURCE)
            .and_then(|s| SourceRef::parse(s))
            .filter(|s| is_alias(&s.upstream_id))
        {
            let current = SourceRef::new(upstream_id, &source.namespace, source.resource.clone());
            o.annotations
                .insert(names::ANN_SOURCE.into(), current.to_string());
            from = Some(source.upstream_id);
        }
        if let Some(from) = from {
            o.annotations.insert(MIGRATING.into(), from);
        }
    }
}

/// `(namespace, lower-case kind, name)` of a place on one cluster.
type Place = (String, &'static str, String);

fn place(namespace: &str, resource: &ResourceRef) -> Place {
    (
        namespace.to_string(),
        resource.kind.lower(),
        resource.name.clone(),
    )
}

/// For the plan input of the upstream cluster itself: removes every desired copy and observed
/// object at a place that holds a source, and returns one `Conflict(IsSource)` action per such
/// place that a HelmOp wants or that carries helmop's markers of this upstream.
///
/// A place holds a source when it is the source namespace and resource of a desired copy or of
/// a live source, when it is in `named` (what every HelmOp names, `(namespace, resource)`,
/// whatever the run's scope and the HelmOps' targets), or when the object there names itself as
/// its own source (an older release may have adopted a source that way).
pub fn take_sources(input: &mut PlanInput, named: &[(String, ResourceRef)]) -> Vec<Action> {
    let upstream_id = input.upstream_id.clone();
    let self_marked = |o: &ObservedCopy| {
        o.annotations
            .get(names::ANN_SOURCE)
            .and_then(|s| SourceRef::parse(s))
            .is_some_and(|s| {
                s.upstream_id == upstream_id
                    && s.namespace == o.namespace
                    && s.resource == o.resource
            })
    };
    let mut sources: BTreeSet<Place> = input
        .desired
        .iter()
        .map(|d| place(&d.helmop.namespace, &d.resource))
        .chain(
            input
                .sources
                .iter()
                .map(|s| place(&s.namespace, &s.resource)),
        )
        .chain(named.iter().map(|(ns, r)| place(ns, r)))
        .collect();
    sources.extend(
        input
            .observed
            .iter()
            .filter(|o| self_marked(o))
            .map(|o| place(&o.namespace, &o.resource)),
    );

    let mut refused: BTreeMap<Place, Action> = BTreeMap::new();
    input.desired.retain(|d| {
        let at = place(&d.namespace, &d.resource);
        if !sources.contains(&at) {
            return true;
        }
        let action = refused.entry(at).or_insert_with(|| Action {
            cluster: d.cluster.clone(),
            namespace: d.namespace.clone(),
            resource: d.resource.clone(),
            helmops: Vec::new(),
            kind: ActionKind::Conflict(ConflictReason::IsSource),
        });
        if !action.helmops.contains(&d.helmop) {
            action.helmops.push(d.helmop.clone());
            action.helmops.sort();
        }
        false
    });
    input.observed.retain(|o| {
        let at = place(&o.namespace, &o.resource);
        if !sources.contains(&at) {
            return true;
        }
        let ours = o
            .annotations
            .get(names::ANN_SOURCE)
            .and_then(|s| SourceRef::parse(s))
            .is_some_and(|s| s.upstream_id == upstream_id);
        if ours && !refused.contains_key(&at) {
            let helmops: BTreeSet<HelmOpKey> = o
                .annotations
                .get(names::ANN_OWNERS)
                .map(|v| parse_owners(v))
                .unwrap_or_default()
                .iter()
                .filter_map(|e| OwnerRef::parse(e))
                .filter(|owner| owner.upstream_id == upstream_id)
                .map(|owner| HelmOpKey::new(&owner.namespace, &owner.name))
                .collect();
            refused.insert(
                at,
                Action {
                    cluster: o.cluster.clone(),
                    namespace: o.namespace.clone(),
                    resource: o.resource.clone(),
                    helmops: helmops.into_iter().collect(),
                    kind: ActionKind::Conflict(ConflictReason::IsSource),
                },
            );
        }
        false
    });
    refused.into_values().collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::{DesiredCopy, Scope, SourceObject, plan};
    use super::*;

    const UP: &str = "up-new";
    const OLD: &str = "up-old";

    fn observed(ns: &str, name: &str, annotations: &[(&str, &str)]) -> ObservedCopy {
        ObservedCopy {
            cluster: "self".into(),
            namespace: ns.into(),
            resource: ResourceRef::secret(name),
            uid: format!("uid-{ns}-{name}"),
            labels: BTreeMap::from([(names::LABEL_MANAGED_BY.into(), names::MANAGER.into())]),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            data_hash: None,
        }
    }

    fn want(dest: &str, helmop_ns: &str, helmop: &str, name: &str) -> DesiredCopy {
        DesiredCopy {
            cluster: "self".into(),
            namespace: dest.into(),
            helmop: HelmOpKey::new(helmop_ns, helmop),
            resource: ResourceRef::secret(name),
            keep: false,
        }
    }

    fn source(ns: &str, name: &str) -> SourceObject {
        SourceObject {
            namespace: ns.into(),
            resource: ResourceRef::secret(name),
            uid: format!("uid-{ns}-{name}"),
            content_hash: "v1:aa".into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }

    fn input(desired: Vec<DesiredCopy>, observed: Vec<ObservedCopy>, adopt: bool) -> PlanInput {
        PlanInput {
            upstream_id: UP.into(),
            sources: vec![source("team", "db")],
            desired,
            observed,
            scope: Scope::All,
            complete: true,
            adopt,
            holds: Default::default(),
            protected: Vec::new(),
            mode: super::super::Mode::Fleet,
        }
    }

    #[test]
    fn alias_markers_are_rewritten_and_flagged_others_untouched() {
        let mut copies = vec![
            observed(
                "apps",
                "db",
                &[
                    (
                        names::ANN_OWNERS,
                        "up-old/team/a,elsewhere/team/a,up-new/team/b",
                    ),
                    (names::ANN_SOURCE, "up-old/team/secret/db"),
                    (names::ANN_SOURCE_UID, "uid-team-db"),
                ],
            ),
            observed(
                "apps",
                "cfg",
                &[
                    (names::ANN_OWNERS, "elsewhere/team/a"),
                    (names::ANN_SOURCE, "elsewhere/team/Secret/cfg"),
                ],
            ),
        ];
        let foreign = copies[1].clone();
        migrate_upstream_ids(&mut copies, UP, &[OLD.to_string()], &[source("team", "db")]);
        let a = &copies[0].annotations;
        assert_eq!(
            a[names::ANN_OWNERS],
            "elsewhere/team/a,up-new/team/a,up-new/team/b"
        );
        assert_eq!(a[names::ANN_SOURCE], "up-new/team/Secret/db");
        assert_eq!(a[MIGRATING], OLD);
        assert_eq!(copies[1], foreign, "another upstream's copy is not ours");
    }

    #[test]
    fn an_alias_copy_of_another_source_or_uid_is_not_migrated() {
        // Another management cluster reached through the same proxy CA has the same legacy id:
        // its copy of "team/db" records its own source's uid, or names a source this run does
        // not read.
        let other_uid = observed(
            "apps",
            "db",
            &[
                (names::ANN_OWNERS, "up-old/team/a"),
                (names::ANN_SOURCE, "up-old/team/Secret/db"),
                (names::ANN_SOURCE_UID, "uid-of-another-cluster"),
            ],
        );
        let unknown_source = observed(
            "apps",
            "cfg",
            &[
                (names::ANN_OWNERS, "up-old/team/a"),
                (names::ANN_SOURCE, "up-old/team/Secret/cfg"),
                (names::ANN_SOURCE_UID, "uid-team-cfg"),
            ],
        );
        let no_source = observed("apps", "x", &[(names::ANN_OWNERS, "up-old/team/a")]);
        let mut copies = vec![other_uid, unknown_source, no_source];
        let before = copies.clone();
        migrate_upstream_ids(&mut copies, UP, &[OLD.to_string()], &[source("team", "db")]);
        assert_eq!(copies, before, "none is proven this upstream's");
    }

    #[test]
    fn a_migrated_copy_is_updated_to_the_current_id_in_place() {
        let src = source("team", "db");
        let meta =
            super::super::copy_meta(OLD, &src, &BTreeSet::from([format!("{OLD}/team/a")]), false);
        let mut copy = observed("apps", "db", &[]);
        copy.annotations = meta.annotations;
        let mut copies = vec![copy];
        migrate_upstream_ids(
            &mut copies,
            UP,
            &[OLD.to_string()],
            std::slice::from_ref(&src),
        );
        let plan_input = input(vec![want("apps", "team", "a", "db")], copies, false);
        let actions = plan(&plan_input);
        assert_eq!(actions.len(), 1);
        let ActionKind::Update { meta, .. } = &actions[0].kind else {
            panic!("{actions:?}");
        };
        assert_eq!(meta.annotations[names::ANN_OWNERS], "up-new/team/a");
        assert_eq!(meta.annotations[names::ANN_SOURCE], "up-new/team/Secret/db");
        assert!(!meta.annotations.contains_key(MIGRATING));
    }

    #[test]
    fn without_aliases_nothing_changes() {
        let mut copies = vec![observed(
            "apps",
            "db",
            &[(names::ANN_OWNERS, "up-old/team/a")],
        )];
        let before = copies.clone();
        let live = [source("team", "db")];
        migrate_upstream_ids(&mut copies, UP, &[], &live);
        migrate_upstream_ids(&mut copies, UP, &[UP.to_string()], &live);
        assert_eq!(copies, before);
    }

    #[test]
    fn a_source_is_refused_even_with_adopt_and_never_pruned() {
        // The HelmOp's own namespace as destination on the upstream cluster: the source itself.
        let mut i = input(
            vec![
                want("team", "team", "app", "db"),
                want("apps", "team", "app", "db"),
            ],
            vec![observed("team", "db", &[])],
            true,
        );
        let refused = take_sources(&mut i, &[]);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].namespace, "team");
        assert_eq!(refused[0].helmops, [HelmOpKey::new("team", "app")]);
        assert_eq!(
            refused[0].kind,
            ActionKind::Conflict(ConflictReason::IsSource)
        );
        assert_eq!(i.desired, [want("apps", "team", "app", "db")]);
        assert!(i.observed.is_empty());
        assert!(refused[0].reason().contains("source itself"));

        // A source an older release marked as its own copy, wanted by nobody: reported, not
        // planned (so never pruned).
        let marked = observed(
            "other",
            "cfg",
            &[
                (names::ANN_OWNERS, "up-new/other/gone"),
                (names::ANN_SOURCE, "up-new/other/Secret/cfg"),
                (names::ANN_SOURCE_UID, "uid-other-cfg"),
            ],
        );
        let mut i = input(Vec::new(), vec![marked], false);
        let refused = take_sources(&mut i, &[]);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].helmops, [HelmOpKey::new("other", "gone")]);
        assert!(plan(&i).is_empty());
    }

    #[test]
    fn a_source_another_helmop_names_is_never_adopted() {
        // `app` (namespace team) copies db into namespace ops on the management cluster; ops
        // holds the source db of HelmOp ops/other, which this run does not select (or which
        // targets no cluster now), so nothing in the plan input says so but `named`.
        let unowned = observed("ops", "db", &[]);
        let mut i = input(vec![want("ops", "team", "app", "db")], vec![unowned], true);
        let named = [("ops".to_string(), ResourceRef::secret("db"))];
        let refused = take_sources(&mut i, &named);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(
            refused[0].kind,
            ActionKind::Conflict(ConflictReason::IsSource)
        );
        assert!(i.desired.is_empty() && i.observed.is_empty());
        assert!(plan(&i).is_empty(), "not adopted, not written");
    }

    #[test]
    fn copies_elsewhere_on_the_upstream_cluster_are_planned_as_usual() {
        let copy = observed(
            "apps",
            "old",
            &[
                (names::ANN_OWNERS, "up-new/team/gone"),
                (names::ANN_SOURCE, "up-new/team/Secret/old"),
            ],
        );
        let mut i = input(vec![want("apps", "team", "app", "db")], vec![copy], false);
        assert!(take_sources(&mut i, &[]).is_empty());
        assert_eq!(i.desired.len(), 1);
        assert_eq!(i.observed.len(), 1);
        let kinds: Vec<&str> = plan(&i).iter().map(|a| a.kind.name()).collect();
        assert_eq!(kinds, ["Create", "Prune"]);
    }

    proptest! {
        /// Migration maps exactly the alias entries to the current id, keeps every other entry
        /// verbatim, and is idempotent.
        #[test]
        fn migration_touches_only_aliases(
            entries in proptest::collection::vec((0usize..4, "[a-c]", "[a-c]"), 0..6)
        ) {
            let ids = [UP, OLD, "elsewhere", "up-other"];
            let value: Vec<String> = entries
                .iter()
                .map(|(i, ns, n)| format!("{}/{ns}/{n}", ids[*i]))
                .collect();
            let mut copies = vec![observed("apps", "db", &[
                (names::ANN_OWNERS, &value.join(",")),
                (names::ANN_SOURCE, &format!("{OLD}/team/Secret/db")),
                (names::ANN_SOURCE_UID, "uid-team-db"),
            ])];
            let live = [source("team", "db")];
            migrate_upstream_ids(&mut copies, UP, &[OLD.to_string()], &live);
            let once = copies.clone();
            migrate_upstream_ids(&mut copies, UP, &[OLD.to_string()], &live);
            prop_assert_eq!(&copies, &once);
            let got = parse_owners(copies[0].annotations.get(names::ANN_OWNERS).map(String::as_str).unwrap_or(""));
            let want: BTreeSet<String> = value
                .iter()
                .map(|e| e.replacen(&format!("{OLD}/"), &format!("{UP}/"), 1))
                .collect();
            prop_assert_eq!(got, want);
            prop_assert!(!copies[0].annotations.get(names::ANN_OWNERS).is_some_and(|v| v.contains(OLD)));
        }
    }
}
