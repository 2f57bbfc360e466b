use proptest::prelude::*;

use super::*;

const UP: &str = "up1";

fn source(ns: &str, resource: ResourceRef, uid: &str, hash: &str) -> SourceObject {
    SourceObject {
        namespace: ns.into(),
        resource,
        uid: uid.into(),
        content_hash: hash.into(),
        labels: BTreeMap::from([("app".into(), "web".into())]),
        annotations: BTreeMap::new(),
    }
}

fn want(helmop_ns: &str, helmop: &str, resource: ResourceRef, keep: bool) -> DesiredCopy {
    DesiredCopy {
        cluster: "c1".into(),
        namespace: "dest".into(),
        helmop: HelmOpKey::new(helmop_ns, helmop),
        resource,
        keep,
    }
}

fn db() -> ResourceRef {
    ResourceRef::secret("db")
}

fn db_source() -> SourceObject {
    source("team", db(), "uid-src", "v1:aa")
}

/// A copy exactly as helmop would have written it for `owners`.
fn copy(src: &SourceObject, owners: &[&str], keep: bool) -> ObservedCopy {
    let owners = owners.iter().map(|o| o.to_string()).collect();
    let meta = copy_meta(UP, src, &owners, keep);
    ObservedCopy {
        cluster: "c1".into(),
        namespace: "dest".into(),
        resource: src.resource.clone(),
        uid: "uid-copy".into(),
        labels: meta.labels,
        annotations: meta.annotations,
        data_hash: None,
    }
}

fn input(desired: Vec<DesiredCopy>, observed: Vec<ObservedCopy>) -> PlanInput {
    PlanInput {
        upstream_id: UP.into(),
        desired,
        sources: vec![db_source()],
        observed,
        scope: Scope::All,
        complete: true,
        adopt: false,
        holds: Default::default(),
        protected: Vec::new(),
        mode: Mode::Fleet,
    }
}

fn only(actions: Vec<Action>) -> Action {
    assert_eq!(actions.len(), 1, "{actions:#?}");
    actions.into_iter().next().unwrap()
}

fn update_reasons(a: &Action) -> &[UpdateReason] {
    match &a.kind {
        ActionKind::Update { reasons, .. } => reasons,
        other => panic!("expected Update, got {other:?}"),
    }
}

fn written_owners(a: &Action) -> Option<&str> {
    match &a.kind {
        ActionKind::Create { meta, .. } | ActionKind::Update { meta, .. } => {
            meta.annotations.get(names::ANN_OWNERS).map(String::as_str)
        }
        ActionKind::RemoveOwner { owners, .. } => Some(owners),
        _ => None,
    }
}

#[test]
fn create_when_absent() {
    let a = only(plan(&input(vec![want("team", "app", db(), false)], vec![])));
    let ActionKind::Create { source, meta } = &a.kind else {
        panic!("{a:?}")
    };
    assert_eq!(source.to_string(), "up1/team/Secret/db");
    assert_eq!(meta.annotations[names::ANN_OWNERS], "up1/team/app");
    assert_eq!(meta.annotations[names::ANN_SOURCE_UID], "uid-src");
    assert_eq!(meta.annotations[names::ANN_CONTENT_HASH], "v1:aa");
    assert_eq!(meta.labels[names::LABEL_MANAGED_BY], names::MANAGER);
    assert!(!meta.annotations.contains_key(names::ANN_KEEP));
    assert_eq!(a.helmops, vec![HelmOpKey::new("team", "app")]);
    assert!(a.kind.writes());
    assert_eq!(a.reason(), "no copy yet");
}

#[test]
fn keep_resources_is_recorded_at_write_time() {
    let a = only(plan(&input(vec![want("team", "app", db(), true)], vec![])));
    let ActionKind::Create { meta, .. } = &a.kind else {
        panic!("{a:?}")
    };
    assert_eq!(meta.annotations[names::ANN_KEEP], "true");
}

#[test]
fn unchanged_when_in_sync_writes_nothing() {
    let observed = copy(&db_source(), &["up1/team/app"], false);
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert_eq!(a.kind, ActionKind::Unchanged);
    assert!(!a.kind.writes());
    assert_eq!(a.reason(), "in sync");
}

#[test]
fn unrelated_annotations_on_the_copy_do_not_cause_writes_but_labels_do() {
    let mut observed = copy(&db_source(), &["up1/team/app"], false);
    observed
        .annotations
        .insert("other.io/note".into(), "x".into());
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed.clone()],
    )));
    assert_eq!(a.kind, ActionKind::Unchanged);
    // Labels follow the source exactly (docs/copy-lifecycle.md).
    observed
        .labels
        .insert("added-by-someone".into(), "x".into());
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert_eq!(update_reasons(&a), [UpdateReason::MarkersChanged]);
}

#[test]
fn update_on_content_change() {
    let mut old = db_source();
    old.content_hash = "v1:old".into();
    let observed = copy(&old, &["up1/team/app"], false);
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert_eq!(update_reasons(&a), [UpdateReason::ContentChanged]);
    let ActionKind::Update { uid, meta, .. } = &a.kind else {
        unreachable!()
    };
    assert_eq!(uid, "uid-copy");
    assert_eq!(meta.annotations[names::ANN_CONTENT_HASH], "v1:aa");
    assert_eq!(a.reason(), "source content changed");
}

#[test]
fn update_on_marker_change() {
    let mut old = db_source();
    old.labels.insert("app".into(), "old".into());
    let observed = copy(&old, &["up1/team/app"], false);
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert_eq!(update_reasons(&a), [UpdateReason::MarkersChanged]);

    // keepResources switched off: the stale keep marker goes.
    let observed = copy(&db_source(), &["up1/team/app"], true);
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert_eq!(update_reasons(&a), [UpdateReason::MarkersChanged]);
    let ActionKind::Update { meta, .. } = &a.kind else {
        unreachable!()
    };
    assert!(!meta.annotations.contains_key(names::ANN_KEEP));
}

#[test]
fn owners_are_added_sorted_and_deduplicated() {
    let observed = copy(&db_source(), &["up1/team/app"], false);
    let desired = vec![
        want("team", "web", db(), false),
        want("team", "app", db(), false),
        want("team", "web", db(), false),
    ];
    let a = only(plan(&input(desired, vec![observed])));
    assert_eq!(
        update_reasons(&a),
        [UpdateReason::OwnersAdded(vec![HelmOpKey::new(
            "team", "web"
        )])]
    );
    assert_eq!(written_owners(&a), Some("up1/team/app,up1/team/web"));
    assert_eq!(
        a.helmops,
        vec![HelmOpKey::new("team", "app"), HelmOpKey::new("team", "web")]
    );
}

#[test]
fn owners_are_released_only_after_complete_enumeration() {
    let observed = copy(&db_source(), &["up1/team/app", "up1/team/old"], false);
    let desired = vec![want("team", "app", db(), false)];
    let a = only(plan(&input(desired.clone(), vec![observed.clone()])));
    assert_eq!(
        update_reasons(&a),
        [UpdateReason::OwnersRemoved(vec![HelmOpKey::new(
            "team", "old"
        )])]
    );
    assert_eq!(written_owners(&a), Some("up1/team/app"));

    let mut partial = input(desired, vec![observed]);
    partial.complete = false;
    assert_eq!(only(plan(&partial)).kind, ActionKind::Unchanged);
}

#[test]
fn what_another_registration_of_the_cluster_wants_is_protected_never_written() {
    // c1 wants nothing of `old`; another registration reaching c1 (or maybe reaching it) does.
    let observed = copy(&db_source(), &["up1/team/app", "up1/team/old"], false);
    let mut i = input(
        vec![want("team", "app", db(), false)],
        vec![observed.clone()],
    );
    i.protected = vec![want("team", "old", db(), false)];
    assert_eq!(only(plan(&i)).kind, ActionKind::Unchanged);

    // Not wanted here at all: neither pruned nor reported, and nothing is created for it.
    let mut i = input(Vec::new(), vec![observed]);
    i.protected = vec![
        want("team", "app", db(), false),
        want("team", "old", db(), false),
    ];
    assert!(plan(&i).is_empty(), "{:#?}", plan(&i));
    let mut i = input(Vec::new(), Vec::new());
    i.protected = vec![want("team", "app", db(), false)];
    assert!(plan(&i).is_empty());

    // Protection is per place and HelmOp: an owner protected elsewhere is still released here.
    let observed = copy(&db_source(), &["up1/team/app", "up1/team/old"], false);
    let mut i = input(Vec::new(), vec![observed]);
    let mut elsewhere = want("team", "old", db(), false);
    elsewhere.namespace = "other".into();
    i.protected = vec![elsewhere];
    assert!(matches!(only(plan(&i)).kind, ActionKind::Prune { .. }));
}

#[test]
fn each_kind_of_run_marks_its_copies_and_never_prunes_the_others() {
    let made_by = |a: &Action| -> Option<String> {
        match &a.kind {
            ActionKind::Create { meta, .. } | ActionKind::Update { meta, .. } => {
                meta.annotations.get(names::ANN_MADE_BY).cloned()
            }
            other => panic!("not a write: {other:?}"),
        }
    };
    let context = |mut i: PlanInput| {
        i.mode = Mode::Context;
        i
    };
    // A Fleet-mode copy carries no marker; a context-mode one says so.
    let want = || vec![want("team", "app", db(), false)];
    assert_eq!(made_by(&only(plan(&input(want(), Vec::new())))), None);
    let a = only(plan(&context(input(want(), Vec::new()))));
    assert_eq!(made_by(&a).as_deref(), Some("target-context"));

    // A context run wanting a Fleet-made copy adds its kind (one marker write).
    let fleet_copy = copy(&db_source(), &["up1/team/app"], false);
    let a = only(plan(&context(input(want(), vec![fleet_copy.clone()]))));
    assert_eq!(update_reasons(&a), [UpdateReason::MarkersChanged]);
    assert_eq!(made_by(&a).as_deref(), Some("fleet,target-context"));

    let mark = |o: &ObservedCopy, v: &str| {
        let mut o = o.clone();
        o.annotations.insert(names::ANN_MADE_BY.into(), v.into());
        o
    };
    // Unwanted by a Fleet-mode run, made by context runs only: left to them.
    let ctx_copy = mark(&fleet_copy, "target-context");
    let a = only(plan(&input(Vec::new(), vec![ctx_copy.clone()])));
    assert_eq!(
        a.kind,
        ActionKind::Orphaned(OrphanReason::OtherMode(Mode::Context))
    );
    // ... and by the context run itself: pruned as usual.
    let a = only(plan(&context(input(Vec::new(), vec![ctx_copy]))));
    assert!(matches!(a.kind, ActionKind::Prune { .. }), "{a:?}");

    // Made by both: the run that no longer wants it only takes its mark off.
    let both = mark(&fleet_copy, "fleet,target-context");
    let a = only(plan(&input(Vec::new(), vec![both.clone()])));
    assert_eq!(
        a.kind,
        ActionKind::Handover {
            uid: "uid-copy".into(),
            made_by: Some("target-context".into())
        }
    );
    let a = only(plan(&context(input(Vec::new(), vec![both.clone()]))));
    assert_eq!(
        a.kind,
        ActionKind::Handover {
            uid: "uid-copy".into(),
            made_by: None
        }
    );
    // Wanted, with an owner this kind does not want: not released (the other kind may).
    let shared = mark(
        &copy(&db_source(), &["up1/team/app", "up1/team/old"], false),
        "fleet,target-context",
    );
    assert_eq!(
        only(plan(&input(want(), vec![shared]))).kind,
        ActionKind::Unchanged
    );
    // A kind this release does not know is never judged for it.
    let newer = mark(&fleet_copy, "fleet,some-new-kind");
    let a = only(plan(&input(Vec::new(), vec![newer])));
    assert_eq!(
        a.kind,
        ActionKind::Handover {
            uid: "uid-copy".into(),
            made_by: Some("some-new-kind".into())
        }
    );
}

#[test]
fn foreign_and_unreadable_owners_are_never_released() {
    let observed = copy(
        &db_source(),
        &["up1/team/app", "up2/team/app", "not an owner"],
        false,
    );
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert_eq!(a.kind, ActionKind::Unchanged);
}

#[test]
fn conflict_on_unmanaged_object_unless_adopt() {
    let observed = ObservedCopy {
        cluster: "c1".into(),
        namespace: "dest".into(),
        resource: db(),
        uid: "uid-theirs".into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::from([(names::ANN_OWNERS.into(), "up1/other/x".into())]),
        data_hash: None,
    };
    let mut inp = input(
        vec![want("team", "app", db(), false)],
        vec![observed.clone()],
    );
    let a = only(plan(&inp));
    assert_eq!(a.kind, ActionKind::Conflict(ConflictReason::NotManaged));
    assert!(a.reason().contains("--adopt"));

    // The managed-by label alone is not enough.
    let mut labelled = observed.clone();
    labelled
        .labels
        .insert(names::LABEL_MANAGED_BY.into(), names::MANAGER.into());
    inp.observed = vec![labelled];
    assert_eq!(
        only(plan(&inp)).kind,
        ActionKind::Conflict(ConflictReason::NotManaged)
    );

    inp.observed = vec![observed];
    inp.adopt = true;
    let a = only(plan(&inp));
    assert_eq!(update_reasons(&a)[0], UpdateReason::Adopted);
    // Whatever owners the object claimed do not carry over.
    assert_eq!(written_owners(&a), Some("up1/team/app"));
    let ActionKind::Update { uid, .. } = &a.kind else {
        unreachable!()
    };
    assert_eq!(uid, "uid-theirs");
}

#[test]
fn conflict_on_another_source_unless_adopt() {
    for other in [
        source("elsewhere", db(), "uid-src", "v1:aa"),
        source("team", ResourceRef::config_map("db"), "uid-src", "v1:aa"),
    ] {
        let mut observed = copy(&other, &["up1/elsewhere/app"], false);
        observed.resource = db();
        let mut inp = input(vec![want("team", "app", db(), false)], vec![observed]);
        let a = only(plan(&inp));
        let ActionKind::Conflict(ConflictReason::SourceMismatch { found }) = &a.kind else {
            panic!("{a:?}")
        };
        assert_eq!(
            found,
            &SourceRef::new(UP, &other.namespace, other.resource.clone()).to_string()
        );
        inp.adopt = true;
        let a = only(plan(&inp));
        assert_eq!(written_owners(&a), Some("up1/team/app"));
    }
    // Another upstream cluster's copy of a same-named source.
    let mut observed = copy(&db_source(), &["up2/team/app"], false);
    observed
        .annotations
        .insert(names::ANN_SOURCE.into(), "up2/team/Secret/db".into());
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert!(matches!(
        a.kind,
        ActionKind::Conflict(ConflictReason::SourceMismatch { .. })
    ));
}

#[test]
fn a_recreated_source_is_followed_by_the_copies_of_its_owners() {
    let mut old = db_source();
    old.uid = "uid-before".into();
    let observed = copy(&old, &["up1/team/app", "up2/x/y"], false);
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert_eq!(update_reasons(&a), [UpdateReason::SourceRecreated]);
    // Same source, so its other owners stay owners.
    assert_eq!(written_owners(&a), Some("up1/team/app,up2/x/y"));
    let ActionKind::Update { meta, .. } = &a.kind else {
        unreachable!()
    };
    assert_eq!(meta.annotations[names::ANN_SOURCE_UID], "uid-src");
}

#[test]
fn a_copy_of_an_earlier_source_not_owned_by_these_helmops_is_a_conflict_unless_adopt() {
    let mut old = db_source();
    old.uid = "uid-before".into();
    // An impostor (or another HelmOp's copy): right source name, none of the wanting owners.
    let observed = copy(&old, &["up1/team/other", "up2/x/y"], false);
    let mut inp = input(vec![want("team", "app", db(), false)], vec![observed]);
    let a = only(plan(&inp));
    assert_eq!(
        a.kind,
        ActionKind::Conflict(ConflictReason::SourceUidMismatch {
            found: Some("uid-before".into())
        })
    );
    inp.adopt = true;
    let a = only(plan(&inp));
    assert_eq!(update_reasons(&a)[0], UpdateReason::Adopted);
    // The unwanted owner of our upstream is released (enumeration is complete).
    assert_eq!(written_owners(&a), Some("up1/team/app,up2/x/y"));
}

#[test]
fn labels_follow_the_source_exactly() {
    let mut old = db_source();
    old.labels.insert("tier".into(), "gone".into());
    let mut observed = copy(&old, &["up1/team/app"], false);
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed.clone()],
    )));
    assert_eq!(update_reasons(&a), [UpdateReason::MarkersChanged]);
    let ActionKind::Update { meta, .. } = &a.kind else {
        unreachable!()
    };
    assert!(!meta.labels.contains_key("tier"));
    assert_eq!(
        extra_labels(&observed.labels, &meta.labels),
        ["tier".to_string()]
    );
    // Labels under reserved prefixes belong to their writers and are no difference.
    observed.labels.remove("tier");
    observed
        .labels
        .insert("kubectl.kubernetes.io/x".into(), "y".into());
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert_eq!(a.kind, ActionKind::Unchanged);
}

#[test]
fn data_edited_downstream_is_drift() {
    let mut observed = copy(&db_source(), &["up1/team/app"], false);
    observed.data_hash = Some("v1:aa".into());
    let inp = input(
        vec![want("team", "app", db(), false)],
        vec![observed.clone()],
    );
    assert_eq!(only(plan(&inp)).kind, ActionKind::Unchanged);
    observed.data_hash = Some("v1:edited".into());
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert_eq!(update_reasons(&a), [UpdateReason::Drifted]);
    assert_eq!(a.reason(), "the copy's data was edited downstream");
}

#[test]
fn live_content_tells_a_source_change_from_a_replaced_key() {
    let mut old = db_source();
    old.content_hash = "v1:old".into();
    // Source changed; the copy is as helmop wrote it.
    let mut observed = copy(&old, &["up1/team/app"], false);
    observed.data_hash = Some("v1:old".into());
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed.clone()],
    )));
    assert_eq!(update_reasons(&a), [UpdateReason::ContentChanged]);
    // The hash key was replaced: the live content, hashed with the current key, equals the
    // source's; only the annotation is outdated (and this is no drift).
    observed.data_hash = Some("v1:aa".into());
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed.clone()],
    )));
    assert_eq!(update_reasons(&a), [UpdateReason::HashOutdated]);
    assert!(a.reason().contains("another hash key"), "{}", a.reason());
    // Source changed and the copy was edited too.
    observed.data_hash = Some("v1:edited".into());
    let a = only(plan(&input(
        vec![want("team", "app", db(), false)],
        vec![observed],
    )));
    assert_eq!(
        update_reasons(&a),
        [UpdateReason::ContentChanged, UpdateReason::Drifted]
    );
}

#[test]
fn fleet_managed_objects_are_never_touched() {
    let mut observed = copy(&db_source(), &["up1/team/app"], false);
    observed
        .labels
        .insert(names::FLEET_BUNDLEDEPLOYMENT_LABEL.into(), "app".into());
    let mut inp = input(
        vec![want("team", "app", db(), false)],
        vec![observed.clone()],
    );
    inp.adopt = true;
    let a = only(plan(&inp));
    assert_eq!(a.kind, ActionKind::SkipFleetManaged);
    assert_eq!(a.kind.name(), "FleetManaged");
    // Not wanted any more: still not pruned, but reported since it lists us.
    inp.desired.clear();
    let a = only(plan(&inp));
    assert_eq!(a.kind, ActionKind::SkipFleetManaged);
    // Fleet's own copy (no helmop markers) that nobody asked helmop for: not our business.
    let fleet_own = ObservedCopy {
        labels: BTreeMap::from([(names::FLEET_BUNDLEDEPLOYMENT_LABEL.into(), "x".into())]),
        annotations: BTreeMap::new(),
        ..observed
    };
    inp.observed = vec![fleet_own];
    assert!(plan(&inp).is_empty());
}

#[test]
fn source_missing_is_reported_and_nothing_written() {
    let mut inp = input(
        vec![want("team", "app", ResourceRef::secret("nope"), false)],
        vec![],
    );
    let a = only(plan(&inp));
    assert_eq!(a.kind, ActionKind::SourceMissing);
    assert_eq!(
        a.reason(),
        "source secret/nope not found in the HelmOp's namespace upstream"
    );
    // An existing copy whose source vanished is reported, not pruned.
    inp.desired = vec![want("team", "app", db(), false)];
    inp.sources.clear();
    inp.observed = vec![copy(&db_source(), &["up1/team/app"], false)];
    assert_eq!(only(plan(&inp)).kind, ActionKind::SourceMissing);
}

#[test]
fn prune_when_last_owner_lets_go() {
    let observed = copy(&db_source(), &["up1/team/app"], false);
    let a = only(plan(&input(vec![], vec![observed.clone()])));
    assert_eq!(
        a.kind,
        ActionKind::Prune {
            uid: "uid-copy".into()
        }
    );
    assert_eq!(a.helmops, vec![HelmOpKey::new("team", "app")]);

    let mut partial = input(vec![], vec![observed]);
    partial.complete = false;
    let a = only(plan(&partial));
    assert_eq!(
        a.kind,
        ActionKind::Orphaned(OrphanReason::EnumerationIncomplete)
    );
    assert!(!a.kind.writes());
}

#[test]
fn remove_owner_when_others_remain() {
    let observed = copy(&db_source(), &["up1/team/app", "up2/x/y"], false);
    let a = only(plan(&input(vec![], vec![observed])));
    assert_eq!(
        a.kind,
        ActionKind::RemoveOwner {
            uid: "uid-copy".into(),
            owners: "up2/x/y".into()
        }
    );
    assert_eq!(a.helmops, vec![HelmOpKey::new("team", "app")]);
    assert!(a.reason().contains("team/app"));
}

#[test]
fn keep_instead_of_prune() {
    let observed = copy(&db_source(), &["up1/team/app"], true);
    let a = only(plan(&input(vec![], vec![observed])));
    assert_eq!(
        a.kind,
        ActionKind::Keep {
            uid: "uid-copy".into(),
            rewrite: true
        }
    );
    assert_eq!(a.kind.name(), "Kept");

    // Already released: reported Kept, nothing to write.
    let kept = copy(&db_source(), &[], true);
    let a = only(plan(&input(vec![], vec![kept.clone()])));
    assert_eq!(
        a.kind,
        ActionKind::Keep {
            uid: "uid-copy".into(),
            rewrite: false
        }
    );
    assert!(!a.kind.writes());

    // A run scoped to some HelmOps does not report ownerless copies.
    let mut scoped = input(vec![], vec![kept]);
    scoped.scope = Scope::HelmOps(BTreeSet::from([HelmOpKey::new("team", "app")]));
    assert!(plan(&scoped).is_empty());
}

#[test]
fn ownerless_copy_without_keep_is_orphaned_not_pruned() {
    let observed = copy(&db_source(), &[], false);
    let a = only(plan(&input(vec![], vec![observed])));
    assert_eq!(a.kind, ActionKind::Orphaned(OrphanReason::NoOwners));
}

#[test]
fn kept_copy_is_readopted_by_a_later_helmop() {
    let kept = copy(&db_source(), &[], true);
    let a = only(plan(&input(
        vec![want("team", "new", db(), false)],
        vec![kept],
    )));
    assert_eq!(
        update_reasons(&a),
        [UpdateReason::OwnersAdded(vec![HelmOpKey::new(
            "team", "new"
        )])]
    );
    assert_eq!(written_owners(&a), Some("up1/team/new"));
    // The new owner's keepResources now decides.
    let ActionKind::Update { meta, .. } = &a.kind else {
        unreachable!()
    };
    assert!(!meta.annotations.contains_key(names::ANN_KEEP));
}

#[test]
fn keep_marker_survives_while_an_unknown_owner_remains() {
    let observed = copy(&db_source(), &["up1/team/app", "up1/team/keeper"], true);
    let mut inp = input(vec![want("team", "app", db(), false)], vec![observed]);
    inp.scope = Scope::HelmOps(BTreeSet::from([HelmOpKey::new("team", "app")]));
    // team/keeper is out of scope: its keepResources is unknown, so the marker stays.
    assert_eq!(only(plan(&inp)).kind, ActionKind::Unchanged);
}

#[test]
fn scope_limits_whose_ownership_is_released() {
    let scope = Scope::HelmOps(BTreeSet::from([HelmOpKey::new("team", "app")]));
    let shared = copy(&db_source(), &["up1/team/app", "up1/team/web"], false);
    let mut inp = input(vec![], vec![shared]);
    inp.scope = scope.clone();
    let a = only(plan(&inp));
    assert_eq!(
        a.kind,
        ActionKind::RemoveOwner {
            uid: "uid-copy".into(),
            owners: "up1/team/web".into()
        }
    );
    inp.observed = vec![copy(&db_source(), &["up1/team/web"], false)];
    assert!(plan(&inp).is_empty());
}

#[test]
fn unmanaged_objects_that_nobody_wants_are_ignored() {
    let stranger = ObservedCopy {
        cluster: "c1".into(),
        namespace: "dest".into(),
        resource: db(),
        uid: "u".into(),
        labels: BTreeMap::from([(names::LABEL_MANAGED_BY.into(), names::MANAGER.into())]),
        annotations: BTreeMap::from([(names::ANN_OWNERS.into(), "up1/team/app".into())]),
        data_hash: None,
    };
    assert!(plan(&input(vec![], vec![stranger])).is_empty());
    // Copies from another upstream, not listing us.
    let mut foreign = copy(&db_source(), &["up2/team/app"], false);
    foreign
        .annotations
        .insert(names::ANN_SOURCE.into(), "up2/team/Secret/db".into());
    assert!(plan(&input(vec![], vec![foreign])).is_empty());
}

#[test]
fn competing_sources_conflict_unless_one_already_owns_the_copy() {
    let other_src = source("other", db(), "uid-other", "v1:bb");
    let desired = vec![
        want("team", "app", db(), false),
        want("other", "app", db(), false),
    ];
    let mut inp = input(desired, vec![]);
    inp.sources.push(other_src);
    let actions = plan(&inp);
    assert_eq!(actions.len(), 2, "{actions:#?}");
    for a in &actions {
        let ActionKind::Conflict(ConflictReason::CompetingSources { sources }) = &a.kind else {
            panic!("{a:?}")
        };
        assert_eq!(
            sources,
            &vec![
                "up1/other/Secret/db".to_string(),
                "up1/team/Secret/db".to_string()
            ]
        );
    }

    inp.observed = vec![copy(&db_source(), &["up1/team/app"], false)];
    let actions = plan(&inp);
    let kinds: Vec<(&str, &str)> = actions
        .iter()
        .map(|a| (a.helmops[0].namespace.as_str(), a.kind.name()))
        .collect();
    assert_eq!(kinds, vec![("other", "Conflict"), ("team", "Unchanged")]);
}

#[test]
fn output_order_is_deterministic() {
    let mut a = input(vec![], vec![]);
    for (cluster, ns, name) in [
        ("c2", "b", "x"),
        ("c1", "b", "y"),
        ("c1", "a", "z"),
        ("c1", "a", "a"),
    ] {
        let mut d = want("team", "app", ResourceRef::secret(name), false);
        d.cluster = cluster.into();
        d.namespace = ns.into();
        a.desired.push(d);
    }
    let mut cm = want("team", "app", ResourceRef::config_map("z"), false);
    cm.namespace = "a".into();
    a.desired.push(cm);
    let got: Vec<String> = plan(&a)
        .iter()
        .map(|x| format!("{}/{}/{}", x.cluster, x.namespace, x.resource))
        .collect();
    assert_eq!(
        got,
        [
            "c1/a/configmap/z",
            "c1/a/secret/a",
            "c1/a/secret/z",
            "c1/b/secret/y",
            "c2/b/secret/x"
        ]
    );
    let mut reversed = a.clone();
    reversed.desired.reverse();
    assert_eq!(plan(&a), plan(&reversed));
}

// ---- property tests ----

const OWNER_POOL: &[&str] = &[
    "up1/team/app",
    "up1/team/web",
    "up1/other/app",
    "up2/team/app",
    "garbage",
];

fn arb_observed() -> impl Strategy<Value = ObservedCopy> {
    (
        0usize..4,                                                  // name
        proptest::bool::weighted(0.85),                             // managed-by label
        0usize..6,                                                  // source annotation variant
        proptest::collection::btree_set(0..OWNER_POOL.len(), 0..4), // owners
        any::<bool>(),                                              // keep
        proptest::bool::weighted(0.15),                             // fleet label
        0usize..3,                                                  // source-uid variant
        any::<bool>(),                                              // content hash current
    )
        .prop_map(|(name, label, src, owners, keep, fleet, uid, fresh)| {
            let resource = ResourceRef::secret(["db", "api", "cfg", "tls"][name]);
            let mut labels = BTreeMap::new();
            let mut annotations = BTreeMap::new();
            if label {
                labels.insert(
                    names::LABEL_MANAGED_BY.to_string(),
                    names::MANAGER.to_string(),
                );
            }
            if fleet {
                labels.insert(
                    names::FLEET_BUNDLEDEPLOYMENT_LABEL.to_string(),
                    "x".to_string(),
                );
            }
            let source = match src {
                0 => None,
                1..=3 => Some(format!("up1/team/Secret/{}", resource.name)),
                4 => Some(format!("up2/team/Secret/{}", resource.name)),
                _ => Some(format!("up1/other/Secret/{}", resource.name)),
            };
            if let Some(s) = source {
                annotations.insert(names::ANN_SOURCE.to_string(), s);
            }
            if !owners.is_empty() {
                let set: BTreeSet<String> =
                    owners.iter().map(|i| OWNER_POOL[*i].to_string()).collect();
                annotations.insert(names::ANN_OWNERS.to_string(), format_owners(&set));
            }
            if keep {
                annotations.insert(names::ANN_KEEP.to_string(), "true".to_string());
            }
            match uid {
                0 => {}
                1 => {
                    annotations.insert(names::ANN_SOURCE_UID.to_string(), "uid-src".to_string());
                }
                _ => {
                    annotations.insert(names::ANN_SOURCE_UID.to_string(), "uid-old".to_string());
                }
            }
            let hash = if fresh { "v1:aa" } else { "v1:old" };
            annotations.insert(names::ANN_CONTENT_HASH.to_string(), hash.to_string());
            ObservedCopy {
                cluster: "c1".into(),
                namespace: "dest".into(),
                resource,
                uid: format!("uid-{name}"),
                labels,
                annotations,
                data_hash: None,
            }
        })
}

fn arb_input() -> impl Strategy<Value = PlanInput> {
    (
        proptest::collection::vec(arb_observed(), 0..3),
        proptest::collection::vec((0usize..2, 0usize..3, any::<bool>()), 0..4),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        proptest::bool::weighted(0.8),
    )
        .prop_map(|(observed, wants, complete, adopt, all, with_sources)| {
            let helmops = [("team", "app"), ("team", "web"), ("other", "app")];
            let desired = wants
                .into_iter()
                .map(|(name, h, keep)| {
                    let (ns, n) = helmops[h];
                    want(ns, n, ResourceRef::secret(["db", "api"][name]), keep)
                })
                .collect();
            let mut sources = Vec::new();
            if with_sources {
                for ns in ["team", "other"] {
                    for name in ["db", "api", "cfg", "tls"] {
                        sources.push(source(ns, ResourceRef::secret(name), "uid-src", "v1:aa"));
                    }
                }
            }
            PlanInput {
                upstream_id: UP.into(),
                desired,
                sources,
                observed,
                scope: if all {
                    Scope::All
                } else {
                    Scope::HelmOps(BTreeSet::from([HelmOpKey::new("team", "app")]))
                },
                complete,
                adopt,
                holds: Default::default(),
                protected: Vec::new(),
                mode: Mode::Fleet,
            }
        })
}

fn observed_for<'a>(inp: &'a PlanInput, a: &Action) -> Option<&'a ObservedCopy> {
    inp.observed
        .iter()
        .find(|o| o.cluster == a.cluster && o.namespace == a.namespace && o.resource == a.resource)
}

fn has_markers(o: &ObservedCopy) -> bool {
    o.labels.get(names::LABEL_MANAGED_BY).map(String::as_str) == Some(names::MANAGER)
        && o.annotations.contains_key(names::ANN_SOURCE)
}

proptest! {
    // The planner is cheap; more cases reach the rarer branches (prune, keep) more often.
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn nothing_is_pruned_or_released_without_complete_enumeration(mut inp in arb_input()) {
        inp.complete = false;
        for a in plan(&inp) {
            prop_assert!(!matches!(a.kind, ActionKind::Prune { .. } | ActionKind::RemoveOwner { .. }), "{:?}", a);
            prop_assert!(!matches!(a.kind, ActionKind::Keep { rewrite: true, .. }), "{:?}", a);
            if let ActionKind::Update { reasons, .. } = &a.kind {
                prop_assert!(!reasons.iter().any(|r| matches!(r, UpdateReason::OwnersRemoved(_))));
                // Unless adopting another source's object, every owner stays.
                let o = observed_for(&inp, &a).unwrap();
                if !reasons.contains(&UpdateReason::Adopted) {
                    let before = owners_of(o);
                    let after = parse_owners(written_owners(&a).unwrap_or(""));
                    prop_assert!(before.is_subset(&after), "{:?} -> {:?}", before, after);
                }
            }
        }
    }

    #[test]
    fn copies_without_markers_are_never_pruned_or_rewritten(inp in arb_input()) {
        for a in plan(&inp) {
            let Some(o) = observed_for(&inp, &a) else { continue };
            if !has_markers(o) {
                prop_assert!(!matches!(
                    a.kind,
                    ActionKind::Prune { .. } | ActionKind::RemoveOwner { .. } | ActionKind::Keep { .. }
                ), "{:?}", a);
                if matches!(a.kind, ActionKind::Update { .. }) {
                    prop_assert!(inp.adopt);
                }
            }
        }
    }

    #[test]
    fn fleet_managed_copies_are_never_written(inp in arb_input()) {
        for a in plan(&inp) {
            let Some(o) = observed_for(&inp, &a) else { continue };
            if o.labels.contains_key(names::FLEET_BUNDLEDEPLOYMENT_LABEL) {
                prop_assert!(!a.kind.writes(), "{:?}", a);
            }
        }
    }

    #[test]
    fn prune_needs_every_condition(inp in arb_input()) {
        for a in plan(&inp) {
            if let ActionKind::Prune { uid } = &a.kind {
                let o = observed_for(&inp, &a).unwrap();
                prop_assert_eq!(uid, &o.uid);
                prop_assert!(inp.complete);
                prop_assert!(has_markers(o));
                let owners = owners_of(o);
                prop_assert!(!owners.is_empty());
                // Every owner is one of ours that this run may release.
                for e in &owners {
                    let owner = OwnerRef::parse(e);
                    prop_assert!(owner.as_ref().is_some_and(|x| x.upstream_id == UP), "{}", e);
                    if let Scope::HelmOps(set) = &inp.scope {
                        let owner = owner.unwrap();
                        prop_assert!(set.contains(&HelmOpKey::new(&owner.namespace, &owner.name)));
                    }
                }
                prop_assert!(!inp.desired.iter().any(|d| d.resource == a.resource));
            }
        }
    }

    #[test]
    fn other_upstreams_owners_survive_every_rewrite(inp in arb_input()) {
        for a in plan(&inp) {
            let Some(o) = observed_for(&inp, &a) else { continue };
            let adopted = matches!(&a.kind, ActionKind::Update { reasons, .. } if reasons.contains(&UpdateReason::Adopted));
            if adopted || !a.kind.writes() || matches!(a.kind, ActionKind::Prune { .. }) {
                continue;
            }
            let foreign: BTreeSet<String> = owners_of(o)
                .into_iter()
                .filter(|e| OwnerRef::parse(e).is_none_or(|x| x.upstream_id != UP))
                .collect();
            if matches!(a.kind, ActionKind::Keep { .. }) {
                prop_assert!(foreign.is_empty());
                continue;
            }
            let after = parse_owners(written_owners(&a).unwrap_or(""));
            prop_assert!(foreign.is_subset(&after), "{:?} lost from {:?}", foreign, after);
        }
    }

    #[test]
    fn input_order_does_not_matter(inp in arb_input()) {
        let mut reversed = inp.clone();
        reversed.observed.reverse();
        reversed.desired.reverse();
        reversed.sources.reverse();
        // Reordering duplicates of one observed name would change which one is seen first.
        let names: BTreeSet<_> = inp.observed.iter().map(|o| &o.resource).collect();
        prop_assume!(names.len() == inp.observed.len());
        prop_assert_eq!(plan(&inp), plan(&reversed));
    }
}

fn paused_cluster(mut i: PlanInput) -> PlanInput {
    i.holds.pause_cluster("c1", "team");
    i
}

fn held_helmop(mut i: PlanInput, name: &str, why: HoldReason) -> PlanInput {
    i.holds.helmops.insert(HelmOpKey::new("team", name), why);
    i
}

fn held(a: &Action) -> (&HoldReason, HeldCopy) {
    match &a.kind {
        ActionKind::Held { why, copy } => (why, *copy),
        other => panic!("expected Held, got {other:?}"),
    }
}

#[test]
fn paused_cluster_creates_nothing() {
    let a = only(plan(&paused_cluster(input(
        vec![want("team", "app", db(), false)],
        vec![],
    ))));
    assert_eq!(held(&a), (&HoldReason::ClusterPaused, HeldCopy::Absent));
    assert!(!a.kind.writes());
    assert_eq!(a.kind.name(), "Paused");
    assert_eq!(
        a.reason(),
        "the Cluster is paused; no copy yet; none is created until it is unpaused"
    );
}

#[test]
fn paused_helmop_does_not_update_and_says_whether_the_copy_is_current() {
    let current = copy(&db_source(), &["up1/team/app"], false);
    let i = held_helmop(
        input(
            vec![want("team", "app", db(), false)],
            vec![current.clone()],
        ),
        "app",
        HoldReason::HelmOpPaused,
    );
    assert_eq!(
        held(&only(plan(&i))),
        (&HoldReason::HelmOpPaused, HeldCopy::Current)
    );
    let old = copy(
        &source("team", db(), "uid-src", "v1:old"),
        &["up1/team/app"],
        false,
    );
    let i = held_helmop(
        input(vec![want("team", "app", db(), false)], vec![old]),
        "app",
        HoldReason::HelmOpPaused,
    );
    let a = only(plan(&i));
    assert_eq!(held(&a), (&HoldReason::HelmOpPaused, HeldCopy::Outdated));
    assert!(!a.kind.writes());
}

#[test]
fn held_owners_are_never_released() {
    // Unwanted copy of a paused HelmOp: not pruned.
    let observed = copy(&db_source(), &["up1/team/app"], false);
    let i = held_helmop(
        input(vec![], vec![observed.clone()]),
        "app",
        HoldReason::HelmOpPaused,
    );
    let a = only(plan(&i));
    assert_eq!(held(&a), (&HoldReason::HelmOpPaused, HeldCopy::Unwanted));
    // On a paused cluster, nothing is pruned either.
    let a = only(plan(&paused_cluster(input(vec![], vec![observed.clone()]))));
    assert_eq!(held(&a), (&HoldReason::ClusterPaused, HeldCopy::Unwanted));
    // Another HelmOp releasing a shared copy keeps the held owner.
    let shared = copy(&db_source(), &["up1/team/app", "up1/team/other"], false);
    let i = held_helmop(
        input(vec![], vec![shared.clone()]),
        "app",
        HoldReason::HelmOpPaused,
    );
    let a = only(plan(&i));
    assert!(matches!(a.kind, ActionKind::RemoveOwner { .. }), "{a:?}");
    assert_eq!(written_owners(&a), Some("up1/team/app"));
    // An active HelmOp updating a shared copy keeps the held owner listed.
    let i = held_helmop(
        input(vec![want("team", "other", db(), false)], vec![shared]),
        "app",
        HoldReason::Invalid("bad".into()),
    );
    let a = only(plan(&i));
    assert_eq!(a.kind, ActionKind::Unchanged, "{a:?}");
}

#[test]
fn invalid_helmop_beside_an_active_one_reports_both() {
    let i = held_helmop(
        input(
            vec![
                want("team", "app", db(), false),
                want("team", "other", db(), false),
            ],
            vec![],
        ),
        "app",
        HoldReason::Invalid("spec.helm: helm options are empty".into()),
    );
    let actions = plan(&i);
    assert_eq!(actions.len(), 2, "{actions:#?}");
    assert_eq!(actions[0].kind.name(), "Invalid");
    assert_eq!(actions[0].helmops, [HelmOpKey::new("team", "app")]);
    assert_eq!(
        actions[0].reason(),
        "Fleet rejects the HelmOp: spec.helm: helm options are empty; no copy yet; none is created until the HelmOp is accepted again"
    );
    assert!(matches!(actions[1].kind, ActionKind::Create { .. }));
    assert_eq!(written_owners(&actions[1]), Some("up1/team/other"));
}

#[test]
fn a_helmop_hold_wins_over_its_cluster_pause() {
    let i = held_helmop(
        paused_cluster(input(vec![want("team", "app", db(), false)], vec![])),
        "app",
        HoldReason::Invalid("x".into()),
    );
    assert_eq!(held(&only(plan(&i))).0, &HoldReason::Invalid("x".into()));
}

#[test]
fn a_paused_cluster_freezes_only_the_helmops_of_its_namespace() {
    let mut i = input(
        vec![
            want("team", "app", db(), false),
            want("other", "app", db(), false),
        ],
        vec![],
    );
    i.sources.push(source("other", db(), "uid-other", "v1:bb"));
    i.holds.pause_cluster("c1", "other");
    let actions = plan(&i);
    let kinds: Vec<(&str, String)> = actions
        .iter()
        .map(|a| (a.kind.name(), a.helmops[0].to_string()))
        .collect();
    // Competing sources aside, team/app is planned and other/app is held.
    assert!(
        kinds.contains(&("Paused", "other/app".to_string())),
        "{kinds:?}"
    );
    assert!(
        !kinds.iter().any(|(k, h)| *k == "Paused" && h == "team/app"),
        "{kinds:?}"
    );
}

fn off_schedule_cluster(mut i: PlanInput) -> PlanInput {
    i.holds
        .hold_cluster("c1", "team", HoldReason::ClusterOffSchedule);
    i
}

#[test]
fn a_cluster_off_its_schedule_gets_nothing_new_and_loses_nothing() {
    let a = only(plan(&off_schedule_cluster(input(
        vec![want("team", "app", db(), false)],
        vec![],
    ))));
    assert_eq!(
        held(&a),
        (&HoldReason::ClusterOffSchedule, HeldCopy::Absent)
    );
    assert!(!a.kind.writes());
    assert_eq!(a.kind.name(), "OffSchedule");
    assert_eq!(
        a.reason(),
        "the Cluster is off its schedule (status.scheduled without status.activeSchedule); no copy yet; none is created until its schedule is active again"
    );
    // An outdated copy is not updated.
    let old = copy(
        &source("team", db(), "uid-src", "v1:old"),
        &["up1/team/app"],
        false,
    );
    let a = only(plan(&off_schedule_cluster(input(
        vec![want("team", "app", db(), false)],
        vec![old],
    ))));
    assert_eq!(
        held(&a),
        (&HoldReason::ClusterOffSchedule, HeldCopy::Outdated)
    );
    assert!(!a.kind.writes());
    // A copy no longer wanted is not pruned (Fleet never deletes an off-schedule
    // BundleDeployment as an orphan).
    let observed = copy(&db_source(), &["up1/team/app"], false);
    let a = only(plan(&off_schedule_cluster(input(vec![], vec![observed]))));
    assert_eq!(
        held(&a),
        (&HoldReason::ClusterOffSchedule, HeldCopy::Unwanted)
    );
    assert!(
        a.reason()
            .contains("not pruned until its schedule is active again")
    );
}

#[test]
fn a_pause_wins_over_a_schedule() {
    let mut c = crate::model::Cluster::new("team", "c1", &[]);
    assert_eq!(HoldReason::of_cluster(&c), None);
    c.status = Some(crate::model::ClusterStatus {
        scheduled: Some(true),
        ..Default::default()
    });
    assert_eq!(
        HoldReason::of_cluster(&c),
        Some(HoldReason::ClusterOffSchedule)
    );
    c.spec.paused = Some(true);
    assert_eq!(HoldReason::of_cluster(&c), Some(HoldReason::ClusterPaused));

    // Two Clusters holding the same namespace on one physical cluster: paused either way round.
    for order in [
        [HoldReason::ClusterOffSchedule, HoldReason::ClusterPaused],
        [HoldReason::ClusterPaused, HoldReason::ClusterOffSchedule],
    ] {
        let mut holds = Holds::default();
        for why in order {
            holds.hold_cluster("c1", "team", why);
        }
        assert_eq!(
            holds.reason("c1", &HelmOpKey::new("team", "app")),
            Some(HoldReason::ClusterPaused)
        );
    }
}

#[test]
fn held_copies_outside_the_scope_are_not_reported() {
    let observed = copy(&db_source(), &["up1/team/app"], false);
    let mut i = paused_cluster(input(vec![], vec![observed]));
    i.scope = Scope::HelmOps(BTreeSet::from([HelmOpKey::new("team", "else")]));
    assert!(plan(&i).is_empty());
}
