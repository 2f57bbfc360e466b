use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use proptest::prelude::*;

use super::*;
use crate::model::HelmOpSpec;
use crate::test_support::labels;

fn sel(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(labels(pairs)),
        ..LabelSelector::default()
    })
}

fn everything() -> Option<LabelSelector> {
    Some(LabelSelector::default())
}

fn namespace(name: &str, pairs: &[(&str, &str)]) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels(pairs)),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

fn helmop(ns: &str, name: &str, spec_labels: &[(&str, &str)]) -> HelmOp {
    let spec = HelmOpSpec {
        labels: (!spec_labels.is_empty()).then(|| labels(spec_labels)),
        ..HelmOpSpec::default()
    };
    HelmOp::new(ns, name, spec)
}

fn namespaces() -> Vec<Namespace> {
    vec![
        namespace("team-a", &[]),
        namespace("edge-1", &[("fleet", "edge")]),
        namespace("edge-2", &[("fleet", "edge"), ("region", "eu")]),
        namespace("core", &[("fleet", "core")]),
    ]
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn own_namespace_only_without_mappings() {
    let op = helmop("team-a", "app", &[]);
    assert_eq!(
        candidate_namespaces(&op, &[], &namespaces()),
        set(&["team-a"])
    );
}

#[test]
fn both_selectors_are_required() {
    let op = helmop("team-a", "app", &[("tier", "web")]);
    for (bundles, namespaces_) in [
        (None, sel(&[("fleet", "edge")])),
        (sel(&[("tier", "web")]), None),
        (None, None),
        (None, everything()),
        (everything(), None),
    ] {
        let m = BundleNamespaceMapping::new("team-a", "m", bundles, namespaces_);
        assert_eq!(
            candidate_namespaces(&op, &[m], &namespaces()),
            set(&["team-a"])
        );
    }
    let m = BundleNamespaceMapping::new(
        "team-a",
        "m",
        sel(&[("tier", "web")]),
        sel(&[("fleet", "edge")]),
    );
    assert_eq!(
        candidate_namespaces(&op, &[m], &namespaces()),
        set(&["team-a", "edge-1", "edge-2"])
    );
}

#[test]
fn bundle_selector_sees_spec_labels_and_the_helmop_name_label_only() {
    let mut op = helmop("team-a", "app", &[("tier", "web")]);
    op.metadata.labels = Some(labels(&[("meta", "x")]));
    let mapped = |bundles| {
        let m = BundleNamespaceMapping::new("team-a", "m", bundles, sel(&[("fleet", "core")]));
        candidate_namespaces(&op, &[m], &namespaces()).contains("core")
    };
    assert!(mapped(sel(&[("tier", "web")])));
    assert!(mapped(sel(&[(FLEET_HELMOP_LABEL, "app")])));
    assert!(mapped(everything()));
    assert!(
        !mapped(sel(&[("meta", "x")])),
        "metadata.labels stay on the HelmOp"
    );
    assert!(!mapped(sel(&[("tier", "db")])));
}

#[test]
fn the_helmop_name_label_wins_over_spec_labels() {
    let op = helmop("team-a", "app", &[(FLEET_HELMOP_LABEL, "other")]);
    assert_eq!(
        bundle_labels(&op)
            .get(FLEET_HELMOP_LABEL)
            .map(String::as_str),
        Some("app")
    );
}

#[test]
fn only_mappings_of_the_helmops_namespace_count() {
    let op = helmop("team-a", "app", &[]);
    let m = BundleNamespaceMapping::new("team-b", "m", everything(), everything());
    assert_eq!(
        candidate_namespaces(&op, &[m], &namespaces()),
        set(&["team-a"])
    );
}

#[test]
fn namespace_selector_semantics_and_union_of_mappings() {
    let op = helmop("team-a", "app", &[]);
    let not_eu = Some(LabelSelector {
        match_labels: Some(labels(&[("fleet", "edge")])),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "region".into(),
            operator: "NotIn".into(),
            values: Some(vec!["eu".into()]),
        }]),
    });
    let edge_not_eu = BundleNamespaceMapping::new("team-a", "a", everything(), not_eu);
    assert_eq!(
        candidate_namespaces(&op, std::slice::from_ref(&edge_not_eu), &namespaces()),
        set(&["team-a", "edge-1"])
    );
    let core = BundleNamespaceMapping::new("team-a", "b", everything(), sel(&[("fleet", "core")]));
    assert_eq!(
        candidate_namespaces(&op, &[edge_not_eu, core], &namespaces()),
        set(&["team-a", "edge-1", "core"])
    );
    let all = BundleNamespaceMapping::new("team-a", "c", everything(), everything());
    assert_eq!(
        candidate_namespaces(&op, &[all], &namespaces()),
        set(&["team-a", "edge-1", "edge-2", "core"])
    );
}

#[test]
fn own_namespace_stays_when_the_selector_excludes_it() {
    let op = helmop("team-a", "app", &[]);
    let m = BundleNamespaceMapping::new("team-a", "m", everything(), sel(&[("fleet", "core")]));
    assert_eq!(
        candidate_namespaces(&op, &[m], &[namespace("core", &[("fleet", "core")])]),
        set(&["team-a", "core"])
    );
}

#[test]
fn reachable_namespaces_ignore_the_bundle_selector() {
    let op = helmop("team-a", "app", &[("tier", "web")]);
    let mappings = Mappings::new(&[
        BundleNamespaceMapping::new(
            "team-a",
            "m",
            sel(&[("tier", "db")]),
            sel(&[("fleet", "edge")]),
        ),
        BundleNamespaceMapping::new("team-a", "half", everything(), None),
        BundleNamespaceMapping::new("team-b", "other", everything(), sel(&[("fleet", "core")])),
    ]);
    assert!(!mappings.maps(&op));
    assert!(mappings.any_in("team-a"));
    assert!(!mappings.any_in("core"));
    assert_eq!(
        mappings.reachable_from("team-a", &namespaces()),
        set(&["edge-1", "edge-2"])
    );
    assert_eq!(
        mappings.reachable_from("team-b", &namespaces()),
        set(&["core"])
    );
}

#[test]
fn an_invalid_mapping_is_skipped_and_the_others_apply() {
    let op = helmop("team-a", "app", &[]);
    let bad = BundleNamespaceMapping::new(
        "team-a",
        "bad",
        sel(&[("in valid", "x")]),
        sel(&[("fleet", "edge")]),
    );
    let good =
        BundleNamespaceMapping::new("team-a", "good", everything(), sel(&[("fleet", "core")]));
    let mappings = Mappings::new(&[bad, good]);
    assert_eq!(mappings.skipped().len(), 1);
    assert_eq!(mappings.skipped()[0].mapping, "team-a/bad");
    assert!(
        mappings.skipped()[0]
            .reason
            .starts_with("bundleSelector.matchLabels.in valid"),
        "{:?}",
        mappings.skipped()
    );
    assert!(mappings.maps(&op));
    assert_eq!(
        mappings.candidate_namespaces(&op, &namespaces()),
        set(&["team-a", "core"])
    );
}

#[test]
fn a_mapping_deserializes_from_its_top_level_selectors() {
    let m: BundleNamespaceMapping = serde_json::from_value(serde_json::json!({
        "apiVersion": "fleet.cattle.io/v1alpha1",
        "kind": "BundleNamespaceMapping",
        "metadata": {"name": "m", "namespace": "team-a"},
        "bundleSelector": {"matchLabels": {"tier": "web"}},
        "namespaceSelector": null,
    }))
    .unwrap_or_default();
    assert_eq!(m.bundle_selector, sel(&[("tier", "web")]));
    assert_eq!(m.namespace_selector, None);
}

fn arb_labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map("[ab]", "[xy]", 0..3)
}

fn arb_selector() -> impl Strategy<Value = Option<LabelSelector>> {
    proptest::option::of(arb_labels().prop_map(|l| LabelSelector {
        match_labels: Some(l),
        ..LabelSelector::default()
    }))
}

fn arb_mapping() -> impl Strategy<Value = BundleNamespaceMapping> {
    ("ns[0-2]", arb_selector(), arb_selector())
        .prop_map(|(ns, b, n)| BundleNamespaceMapping::new(&ns, "m", b, n))
}

fn arb_namespaces() -> impl Strategy<Value = Vec<Namespace>> {
    proptest::collection::vec(("ns[0-5]", arb_labels()), 0..6).prop_map(|v| {
        v.into_iter()
            .map(|(name, l)| Namespace {
                metadata: ObjectMeta {
                    name: Some(name),
                    labels: Some(l),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            })
            .collect()
    })
}

proptest! {
    /// The own namespace is always in; everything else is a listed Namespace; adding a mapping
    /// never takes a namespace away.
    #[test]
    fn candidates_contain_own_are_listed_and_grow_with_mappings(
        mappings in proptest::collection::vec(arb_mapping(), 0..4),
        extra in arb_mapping(),
        nss in arb_namespaces(),
        spec_labels in arb_labels(),
    ) {
        let mut op = HelmOp::new("ns0", "app", HelmOpSpec::default());
        op.spec.labels = Some(spec_labels);
        let got = candidate_namespaces(&op, &mappings, &nss);
        prop_assert!(got.contains("ns0"));
        for n in &got {
            prop_assert!(n == "ns0" || nss.iter().any(|ns| ns.metadata.name.as_ref() == Some(n)));
        }
        let mut more = mappings.clone();
        more.push(extra);
        let grown = candidate_namespaces(&op, &more, &nss);
        prop_assert!(got.is_subset(&grown));
        // Whatever a mapping maps the HelmOp to, a namespace-scoped run visits.
        let mut reachable = Mappings::new(&mappings).reachable_from("ns0", &nss);
        reachable.insert("ns0".to_string());
        prop_assert!(got.is_subset(&reachable));
    }
}
