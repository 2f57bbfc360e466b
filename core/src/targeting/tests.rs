use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::model::HelmOpSpec;

const NS: &str = "fleet-default";

fn op(targets: serde_json::Value) -> HelmOp {
    let spec: HelmOpSpec = serde_json::from_value(json!({
        "helm": {"repo": "https://charts.example.com", "chart": "app"},
        "targets": targets,
    }))
    .unwrap();
    HelmOp::new(NS, "app", spec)
}

fn op_from(spec: serde_json::Value) -> HelmOp {
    HelmOp::new(NS, "app", serde_json::from_value(spec).unwrap())
}

fn cluster(name: &str, labels: &[(&str, &str)]) -> Cluster {
    Cluster::new(NS, name, labels)
}

fn sel(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        match_expressions: None,
    })
}

fn group(name: &str, labels: &[(&str, &str)], selector: Option<LabelSelector>) -> ClusterGroup {
    ClusterGroup::new(NS, name, labels, selector)
}

fn m(i: usize) -> TargetMatch {
    TargetMatch::selected(Some(i))
}

/// One row: what the HelmOp's targets are, which cluster/groups, and the expected outcome.
struct Case {
    name: &'static str,
    targets: serde_json::Value,
    cluster: Cluster,
    groups: Vec<ClusterGroup>,
    want: TargetMatch,
}

#[test]
fn matching_table() {
    let prod = cluster("c1", &[("env", "prod"), ("region", "eu")]);
    let dev = cluster("c2", &[("env", "dev")]);
    let rancher = cluster("c-m-12345", &[(FLEET_DISPLAY_NAME_LABEL, "shop-eu")]);
    let all = || group("all", &[("tier", "gold")], Some(LabelSelector::default()));
    let prods = || group("prods", &[("kind", "prod")], sel(&[("env", "prod")]));
    let cases = vec![
        Case {
            name: "no targets: default group member",
            targets: json!([]),
            cluster: prod.clone(),
            groups: vec![group("default", &[], Some(LabelSelector::default()))],
            want: TargetMatch::selected(None),
        },
        Case {
            name: "no targets: not in default group",
            targets: json!([]),
            cluster: prod.clone(),
            groups: vec![all()],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "no targets: no groups at all",
            targets: json!(null),
            cluster: prod.clone(),
            groups: vec![],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "first match wins",
            targets: json!([{"clusterSelector": {}}, {"clusterName": "c1"}]),
            cluster: prod.clone(),
            groups: vec![],
            want: m(0),
        },
        Case {
            name: "later target when earlier misses",
            targets: json!([{"clusterName": "other"}, {"clusterName": "c1"}]),
            cluster: prod.clone(),
            groups: vec![],
            want: m(1),
        },
        Case {
            name: "nothing matches",
            targets: json!([{"clusterName": "other"}, {"clusterSelector": {"matchLabels": {"env": "test"}}}]),
            cluster: prod.clone(),
            groups: vec![],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "doNotDeploy on first match skips even if a later target matches",
            targets: json!([{"clusterName": "c1", "doNotDeploy": true}, {"clusterSelector": {}}]),
            cluster: prod.clone(),
            groups: vec![],
            want: TargetMatch::DoNotDeploy { target_index: 0 },
        },
        Case {
            name: "doNotDeploy on a non-matching target is irrelevant",
            targets: json!([{"clusterName": "other", "doNotDeploy": true}, {"clusterSelector": {}}]),
            cluster: prod.clone(),
            groups: vec![],
            want: m(1),
        },
        Case {
            name: "doNotDeploy false deploys",
            targets: json!([{"clusterName": "c1", "doNotDeploy": false}]),
            cluster: prod.clone(),
            groups: vec![],
            want: m(0),
        },
        Case {
            name: "clusterName by object name",
            targets: json!([{"clusterName": "c-m-12345"}]),
            cluster: rancher.clone(),
            groups: vec![],
            want: m(0),
        },
        Case {
            name: "clusterName by display-name label",
            targets: json!([{"clusterName": "shop-eu"}]),
            cluster: rancher.clone(),
            groups: vec![],
            want: m(0),
        },
        Case {
            name: "clusterName matches neither",
            targets: json!([{"clusterName": "shop-us"}]),
            cluster: rancher.clone(),
            groups: vec![],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "clusterSelector hit",
            targets: json!([{"clusterSelector": {"matchLabels": {"env": "prod"}}}]),
            cluster: prod.clone(),
            groups: vec![],
            want: m(0),
        },
        Case {
            name: "clusterSelector miss",
            targets: json!([{"clusterSelector": {"matchLabels": {"env": "prod"}}}]),
            cluster: dev.clone(),
            groups: vec![],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "clusterSelector {} matches everything",
            targets: json!([{"clusterSelector": {}}]),
            cluster: dev.clone(),
            groups: vec![],
            want: m(0),
        },
        Case {
            name: "clusterSelector null is no criterion (target matches nothing)",
            targets: json!([{"clusterSelector": null}]),
            cluster: dev.clone(),
            groups: vec![],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "clusterSelector matchExpressions",
            targets: json!([{"clusterSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["dev", "test"]}]}}]),
            cluster: dev.clone(),
            groups: vec![],
            want: m(0),
        },
        Case {
            name: "target without criteria matches nothing",
            targets: json!([{"name": "empty"}, {"clusterName": "c1"}]),
            cluster: prod.clone(),
            groups: vec![],
            want: m(1),
        },
        Case {
            name: "empty strings are no criteria",
            targets: json!([{"clusterName": "", "clusterGroup": ""}]),
            cluster: prod.clone(),
            groups: vec![all()],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "criteria are ANDed (name ok, selector not)",
            targets: json!([{"clusterName": "c1", "clusterSelector": {"matchLabels": {"env": "dev"}}}]),
            cluster: prod.clone(),
            groups: vec![],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "criteria are ANDed (both ok)",
            targets: json!([{"clusterName": "c1", "clusterSelector": {"matchLabels": {"env": "prod"}}}]),
            cluster: prod.clone(),
            groups: vec![],
            want: m(0),
        },
        Case {
            name: "clusterGroup member",
            targets: json!([{"clusterGroup": "prods"}]),
            cluster: prod.clone(),
            groups: vec![prods()],
            want: m(0),
        },
        Case {
            name: "clusterGroup non-member",
            targets: json!([{"clusterGroup": "prods"}]),
            cluster: dev.clone(),
            groups: vec![prods()],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "clusterGroup in another namespace does not count",
            targets: json!([{"clusterGroup": "prods"}]),
            cluster: prod.clone(),
            groups: vec![ClusterGroup::new(
                "elsewhere",
                "prods",
                &[],
                Some(LabelSelector::default()),
            )],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "group without selector contains nothing",
            targets: json!([{"clusterGroup": "g"}]),
            cluster: prod.clone(),
            groups: vec![group("g", &[], None)],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "group with invalid selector contains nothing",
            targets: json!([{"clusterGroup": "g"}]),
            cluster: prod.clone(),
            groups: vec![group(
                "g",
                &[],
                Some(LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: "env".into(),
                        operator: "Bogus".into(),
                        values: None,
                    }]),
                }),
            )],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "clusterGroupSelector on the group's labels",
            targets: json!([{"clusterGroupSelector": {"matchLabels": {"tier": "gold"}}}]),
            cluster: dev.clone(),
            groups: vec![all()],
            want: m(0),
        },
        Case {
            name: "clusterGroupSelector miss",
            targets: json!([{"clusterGroupSelector": {"matchLabels": {"tier": "silver"}}}]),
            cluster: dev.clone(),
            groups: vec![all()],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "clusterGroupSelector does not look at cluster labels",
            targets: json!([{"clusterGroupSelector": {"matchLabels": {"env": "prod"}}}]),
            cluster: prod.clone(),
            groups: vec![all()],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "clusterGroupSelector {} matches a cluster in no group (Fleet quirk)",
            targets: json!([{"clusterGroupSelector": {}}]),
            cluster: dev.clone(),
            groups: vec![],
            want: m(0),
        },
        Case {
            name: "clusterGroupSelector DoesNotExist matches a cluster in no group",
            targets: json!([{"clusterGroupSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}}]),
            cluster: dev.clone(),
            groups: vec![],
            want: m(0),
        },
        Case {
            name: "any group may satisfy",
            targets: json!([{"clusterGroupSelector": {"matchLabels": {"kind": "prod"}}}]),
            cluster: prod.clone(),
            groups: vec![all(), prods()],
            want: m(0),
        },
        Case {
            name: "clusterGroup and clusterGroupSelector must hold for the same group",
            targets: json!([{"clusterGroup": "all", "clusterGroupSelector": {"matchLabels": {"kind": "prod"}}}]),
            cluster: prod.clone(),
            groups: vec![all(), prods()],
            want: TargetMatch::NoMatch,
        },
        Case {
            name: "clusterGroup and clusterGroupSelector on one group",
            targets: json!([{"clusterGroup": "prods", "clusterGroupSelector": {"matchLabels": {"kind": "prod"}}}]),
            cluster: prod.clone(),
            groups: vec![all(), prods()],
            want: m(0),
        },
        Case {
            name: "clusterSelector refines clusterGroup",
            targets: json!([{"clusterGroup": "all", "clusterSelector": {"matchLabels": {"region": "us"}}}, {"clusterGroup": "all"}]),
            cluster: prod.clone(),
            groups: vec![all()],
            want: m(1),
        },
    ];
    for c in cases {
        let op = op(c.targets.clone());
        let got = match_cluster(&op, &c.cluster, &c.groups).unwrap();
        assert_eq!(got, c.want, "{}", c.name);
    }
}

fn customized(target: Option<usize>, customizations: &[usize]) -> TargetMatch {
    TargetMatch::Matched {
        target_index: target,
        customizations: customizations.to_vec(),
    }
}

#[test]
fn restrictions_are_an_allow_list() {
    let prod = cluster("c1", &[("env", "prod")]);
    let dev = cluster("c2", &[("env", "dev")]);
    let op = op_from(json!({
        "helm": {"repo": "https://x", "chart": "y"},
        "targets": [{"clusterSelector": {}}],
        "targetRestrictions": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
    }));
    assert_eq!(match_cluster(&op, &prod, &[]).unwrap(), m(0));
    assert_eq!(match_cluster(&op, &dev, &[]).unwrap(), TargetMatch::NoMatch);
}

#[test]
fn invalid_selector_fails_the_whole_helmop() {
    let op = op(json!([
        {"clusterName": "c1"},
        {"clusterSelector": {"matchExpressions": [{"key": "env", "operator": "in", "values": ["x"]}]}},
    ]));
    // Even though target 0 would match, Fleet compiles every matcher first and fails.
    let err = match_cluster(&op, &cluster("c1", &[]), &[]).unwrap_err();
    assert_eq!(err.path, "spec.targets[1].clusterSelector");
    assert_eq!(err.source.path, "matchExpressions[0].operator");
    assert!(
        err.to_string()
            .starts_with("spec.targets[1].clusterSelector.matchExpressions[0].operator: ")
    );

    let op = op_from(json!({
        "helm": {},
        "targetRestrictions": [{"clusterGroupSelector": {"matchLabels": {"bad key": "x"}}}],
    }));
    let err = match_cluster(&op, &cluster("c1", &[]), &[]).unwrap_err();
    assert_eq!(err.path, "spec.targetRestrictions[0].clusterGroupSelector");
}

#[test]
fn cluster_groups_for_filters_namespace_and_selector() {
    let c = cluster("c1", &[("env", "prod")]);
    let groups = vec![
        group("all", &[], Some(LabelSelector::default())),
        group("prods", &[], sel(&[("env", "prod")])),
        group("devs", &[], sel(&[("env", "dev")])),
        group("none", &[], None),
        ClusterGroup::new("other-ns", "all2", &[], Some(LabelSelector::default())),
    ];
    let names: Vec<_> = cluster_groups_for(&c, &groups)
        .iter()
        .map(|g| g.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["all", "prods"]);
}

#[test]
fn destination_namespace_precedence() {
    // (root namespace, root defaultNamespace, target namespace, target defaultNamespace) -> want
    let cases = [
        ((None, None, None, None), "default"),
        ((None, Some("rd"), None, None), "rd"),
        ((Some("rn"), Some("rd"), None, None), "rn"),
        ((None, Some("rd"), None, Some("td")), "td"),
        ((Some("rn"), None, None, Some("td")), "rn"),
        ((None, Some("rd"), Some("tn"), None), "tn"),
        ((Some("rn"), Some("rd"), Some("tn"), Some("td")), "tn"),
        ((Some(""), Some("rd"), Some(""), None), "rd"),
    ];
    for ((rn, rd, tn, td), want) in cases {
        let op = op_from(json!({
            "helm": {},
            "namespace": rn, "defaultNamespace": rd,
            "targets": [{"clusterSelector": {}, "namespace": tn, "defaultNamespace": td}],
        }));
        let opts = cluster_options(&op, &m(0)).unwrap();
        assert_eq!(opts.namespace, want, "{rn:?} {rd:?} {tn:?} {td:?}");
    }
    // The implicit default target only has the root options.
    let op = op_from(json!({"helm": {}, "defaultNamespace": "rd"}));
    let opts = cluster_options(&op, &TargetMatch::selected(None)).unwrap();
    assert_eq!(opts.namespace, "rd");
}

#[test]
fn resources_merge_and_dedup() {
    let op = op_from(json!({
        "helm": {},
        "downstreamResources": [
            {"kind": "Secret", "name": "db"},
            {"kind": "ConfigMap", "name": "app"},
            {"kind": "secret", "name": "db"},
            {"kind": "Deployment", "name": "nope"},
        ],
        "targets": [
            {"clusterSelector": {}, "downstreamResources": [
                {"kind": "SECRET", "name": "db"},
                {"kind": "Secret", "name": "tls"},
                {"kind": "ConfigMap", "name": "db"},
                {"kind": "configmap", "name": "tls"},
            ]},
            {"clusterName": "x"},
        ],
    }));
    let opts = cluster_options(&op, &m(0)).unwrap();
    assert_eq!(
        opts.resources,
        [
            ResourceRef::secret("db"),
            ResourceRef::config_map("app"),
            ResourceRef::secret("tls"),
            ResourceRef::config_map("db"),
            ResourceRef::config_map("tls"),
        ]
    );
    let opts = cluster_options(&op, &m(1)).unwrap();
    assert_eq!(
        opts.resources,
        [ResourceRef::secret("db"), ResourceRef::config_map("app")]
    );
}

#[test]
fn keep_resources_is_root_or_target() {
    for (root, target, want) in [
        (None, None, false),
        (Some(true), None, true),
        (None, Some(true), true),
        (Some(false), Some(true), true),
        (Some(true), Some(false), true),
        (Some(false), Some(false), false),
    ] {
        let op = op_from(json!({
            "helm": {}, "keepResources": root,
            "targets": [{"clusterSelector": {}, "keepResources": target}],
        }));
        assert_eq!(
            cluster_options(&op, &m(0)).unwrap().keep_resources,
            want,
            "{root:?} {target:?}"
        );
    }
}

#[test]
fn no_options_unless_matched() {
    let op = op(json!([{"clusterSelector": {}}]));
    assert_eq!(cluster_options(&op, &TargetMatch::NoMatch), None);
    assert_eq!(
        cluster_options(&op, &TargetMatch::DoNotDeploy { target_index: 0 }),
        None
    );
    assert!(m(0).is_deployed());
    assert!(!TargetMatch::NoMatch.is_deployed());
}

#[test]
fn end_to_end_match_then_options() {
    let op = op_from(json!({
        "helm": {"repo": "oci://ghcr.io/acme/charts/shop"},
        "namespace": "shop",
        "downstreamResources": [{"kind": "Secret", "name": "db"}],
        "targets": [
            {"name": "canary", "clusterName": "canary", "doNotDeploy": true},
            {"name": "eu", "clusterGroup": "eu", "namespace": "shop-eu",
             "downstreamResources": [{"kind": "ConfigMap", "name": "eu-settings"}], "keepResources": true},
            {"name": "rest", "clusterSelector": {}},
        ],
    }));
    let groups = [group("eu", &[], sel(&[("region", "eu")]))];
    let eu = cluster("eu-1", &[("region", "eu")]);
    let us = cluster("us-1", &[("region", "us")]);
    let canary = cluster("canary", &[("region", "eu")]);

    let m_eu = match_cluster(&op, &eu, &groups).unwrap();
    assert_eq!(
        cluster_options(&op, &m_eu).unwrap(),
        ClusterOptions {
            namespace: "shop-eu".into(),
            resources: vec![
                ResourceRef::secret("db"),
                ResourceRef::config_map("eu-settings")
            ],
            keep_resources: true,
        }
    );
    let m_us = match_cluster(&op, &us, &groups).unwrap();
    assert_eq!(
        cluster_options(&op, &m_us).unwrap(),
        ClusterOptions {
            namespace: "shop".into(),
            resources: vec![ResourceRef::secret("db")],
            keep_resources: false,
        }
    );
    assert_eq!(
        match_cluster(&op, &canary, &groups).unwrap(),
        TargetMatch::DoNotDeploy { target_index: 0 }
    );
}

#[test]
fn compiled_matcher_agrees_with_match_cluster() {
    let op = op(json!([
        {"clusterName": "canary", "doNotDeploy": true},
        {"clusterGroup": "eu"},
        {"clusterSelector": {"matchLabels": {"env": "prod"}}},
    ]));
    let groups = [group("eu", &[], sel(&[("region", "eu")]))];
    let matcher = Matcher::new(&op).unwrap();
    for c in [
        cluster("canary", &[("region", "eu")]),
        cluster("a", &[("region", "eu")]),
        cluster("b", &[("env", "prod")]),
        cluster("c", &[]),
    ] {
        assert_eq!(
            matcher.match_cluster(&c, &groups),
            match_cluster(&op, &c, &groups).unwrap()
        );
    }
    assert_eq!(
        matcher.match_cluster(&cluster("c", &[]), &groups),
        TargetMatch::NoMatch
    );
}

// --- targetRestrictions: Fleet's split (bundlematch.go, builder.go) ---

#[test]
fn leading_targets_are_customizations_that_never_select() {
    // 3 targets, 1 restriction: targets 0 and 1 are customizations.
    let op = op_from(json!({
        "helm": {},
        "targets": [
            {"clusterName": "c1"},
            {"clusterSelector": {"matchLabels": {"env": "dev"}}},
            {"clusterName": "c3"},
        ],
        "targetRestrictions": [{"clusterSelector": {}}],
    }));
    assert_eq!(customization_count(&op), 2);
    // c1 and c2 pass the restriction but only customizations match them.
    for c in [cluster("c1", &[]), cluster("c2", &[("env", "dev")])] {
        assert_eq!(match_cluster(&op, &c, &[]).unwrap(), TargetMatch::NoMatch);
    }
    assert_eq!(match_cluster(&op, &cluster("c3", &[]), &[]).unwrap(), m(2));
}

#[test]
fn a_regular_target_selects_only_clusters_a_restriction_allows() {
    let op = op_from(json!({
        "helm": {},
        "targets": [{"clusterName": "c1", "namespace": "custom"}, {"clusterSelector": {}}],
        "targetRestrictions": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
    }));
    let prod = cluster("c1", &[("env", "prod")]);
    let dev = cluster("c2", &[("env", "dev")]);
    assert_eq!(
        match_cluster(&op, &prod, &[]).unwrap(),
        customized(Some(1), &[0])
    );
    assert_eq!(match_cluster(&op, &dev, &[]).unwrap(), TargetMatch::NoMatch);
}

#[test]
fn restriction_and_target_must_hold_for_one_group() {
    let op = op_from(json!({
        "helm": {},
        "targets": [{"clusterGroup": "a"}],
        "targetRestrictions": [{"clusterGroup": "b"}],
    }));
    let c = cluster("c1", &[("x", "1")]);
    let groups = [
        group("a", &[], sel(&[("x", "1")])),
        group("b", &[], sel(&[("x", "1")])),
    ];
    assert_eq!(
        match_cluster(&op, &c, &groups).unwrap(),
        TargetMatch::NoMatch
    );
}

#[test]
fn customizations_ignore_restrictions() {
    // Selected through group a (allowed); the customization matches through group b, which
    // no restriction allows: Fleet still applies it.
    let op = op_from(json!({
        "helm": {},
        "targets": [{"clusterGroup": "b", "namespace": "from-b"}, {"clusterGroup": "a"}],
        "targetRestrictions": [{"clusterGroup": "a"}],
    }));
    let c = cluster("c1", &[("x", "1")]);
    let groups = [
        group("a", &[], sel(&[("x", "1")])),
        group("b", &[], sel(&[("x", "1")])),
    ];
    let got = match_cluster(&op, &c, &groups).unwrap();
    assert_eq!(got, customized(Some(1), &[0]));
    assert_eq!(cluster_options(&op, &got).unwrap().namespace, "from-b");
}

#[test]
fn no_targets_with_restrictions_is_the_default_target_restricted() {
    let op = op_from(json!({
        "helm": {},
        "targetRestrictions": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
    }));
    assert_eq!(customization_count(&op), 0);
    let groups = [group("default", &[], Some(LabelSelector::default()))];
    assert_eq!(
        match_cluster(&op, &cluster("c1", &[("env", "prod")]), &groups).unwrap(),
        TargetMatch::selected(None)
    );
    assert_eq!(
        match_cluster(&op, &cluster("c2", &[("env", "dev")]), &groups).unwrap(),
        TargetMatch::NoMatch
    );
}

#[test]
fn more_restrictions_than_targets_means_no_customizations() {
    let op = op_from(json!({
        "helm": {},
        "targets": [{"clusterName": "c1"}],
        "targetRestrictions": [{"clusterName": "c1"}, {"clusterName": "c2"}],
    }));
    assert_eq!(customization_count(&op), 0);
    assert_eq!(match_cluster(&op, &cluster("c1", &[]), &[]).unwrap(), m(0));
}

#[test]
fn first_match_customization_replaces_the_target_options() {
    let op = op_from(json!({
        "helm": {},
        "defaultNamespace": "root-default",
        "downstreamResources": [{"kind": "Secret", "name": "db"}],
        "targets": [
            {"clusterSelector": {"matchLabels": {"env": "prod"}}, "defaultNamespace": "cust",
             "downstreamResources": [{"kind": "ConfigMap", "name": "cust"}]},
            {"clusterSelector": {}, "namespace": "second", "keepResources": true,
             "downstreamResources": [{"kind": "ConfigMap", "name": "target"}]},
            {"clusterSelector": {}},
        ],
        "targetRestrictions": [{"clusterSelector": {}}],
    }));
    let prod = cluster("c1", &[("env", "prod")]);
    let got = match_cluster(&op, &prod, &[]).unwrap();
    assert_eq!(got, customized(Some(2), &[0]));
    assert_eq!(
        cluster_options(&op, &got).unwrap(),
        ClusterOptions {
            namespace: "cust".into(),
            resources: vec![ResourceRef::secret("db"), ResourceRef::config_map("cust")],
            keep_resources: false,
        }
    );
    // Only the first matching customization counts; the second applies where the first
    // does not match.
    let dev = cluster("c2", &[("env", "dev")]);
    let got = match_cluster(&op, &dev, &[]).unwrap();
    assert_eq!(got, customized(Some(2), &[1]));
    assert_eq!(
        cluster_options(&op, &got).unwrap(),
        ClusterOptions {
            namespace: "second".into(),
            resources: vec![ResourceRef::secret("db"), ResourceRef::config_map("target")],
            keep_resources: true,
        }
    );
}

#[test]
fn selecting_target_options_apply_without_customization() {
    let op = op_from(json!({
        "helm": {},
        "targets": [
            {"clusterName": "other", "namespace": "cust"},
            {"clusterSelector": {}, "namespace": "tgt", "keepResources": true,
             "downstreamResources": [{"kind": "ConfigMap", "name": "t"}]},
        ],
        "targetRestrictions": [{"clusterSelector": {}}],
    }));
    let got = match_cluster(&op, &cluster("c1", &[]), &[]).unwrap();
    assert_eq!(got, m(1));
    assert_eq!(
        cluster_options(&op, &got).unwrap(),
        ClusterOptions {
            namespace: "tgt".into(),
            resources: vec![ResourceRef::config_map("t")],
            keep_resources: true,
        }
    );
}

#[test]
fn first_match_only_the_first_customization_counts() {
    let op = op_from(json!({
        "helm": {},
        "targets": [
            {"clusterName": "c1", "namespace": "first"},
            {"clusterName": "c1", "doNotDeploy": true},
            {"clusterSelector": {}},
        ],
        "targetRestrictions": [{"clusterSelector": {}}],
    }));
    let got = match_cluster(&op, &cluster("c1", &[]), &[]).unwrap();
    assert_eq!(got, customized(Some(2), &[0]));
    assert_eq!(cluster_options(&op, &got).unwrap().namespace, "first");
}

#[test]
fn do_not_deploy_on_the_first_matching_customization_skips() {
    let op = op_from(json!({
        "helm": {},
        "targets": [
            {"clusterName": "c1", "doNotDeploy": true},
            {"clusterName": "c1", "namespace": "second"},
            {"clusterSelector": {}},
        ],
        "targetRestrictions": [{"clusterSelector": {}}],
    }));
    assert_eq!(
        match_cluster(&op, &cluster("c1", &[]), &[]).unwrap(),
        TargetMatch::DoNotDeploy { target_index: 0 }
    );
    // A customization's doNotDeploy only matters for a cluster that is selected.
    assert_eq!(match_cluster(&op, &cluster("c2", &[]), &[]).unwrap(), m(2));
}

#[test]
fn do_not_deploy_on_the_selecting_target_wins_over_customizations() {
    let op = op_from(json!({
        "helm": {},
        "targets": [
            {"clusterName": "c1", "namespace": "x"},
            {"clusterSelector": {}, "doNotDeploy": true},
        ],
        "targetRestrictions": [{"clusterSelector": {}}],
    }));
    assert_eq!(
        match_cluster(&op, &cluster("c1", &[]), &[]).unwrap(),
        TargetMatch::DoNotDeploy { target_index: 1 }
    );
}

#[test]
fn all_matches_merges_every_matching_customization_in_order() {
    let op = op_from(json!({
        "helm": {},
        "targetCustomizationMode": "AllMatches",
        "namespace": "root",
        "downstreamResources": [{"kind": "Secret", "name": "db"}],
        "targets": [
            {"clusterSelector": {"matchLabels": {"env": "prod"}}, "namespace": "one",
             "downstreamResources": [{"kind": "ConfigMap", "name": "one"}, {"kind": "secret", "name": "db"}]},
            {"clusterName": "nope", "namespace": "never"},
            {"clusterSelector": {"matchLabels": {"region": "eu"}}, "namespace": "two", "keepResources": true,
             "downstreamResources": [{"kind": "ConfigMap", "name": "two"}]},
            {"clusterSelector": {}, "defaultNamespace": "tgt",
             "downstreamResources": [{"kind": "ConfigMap", "name": "target"}]},
        ],
        "targetRestrictions": [{"clusterSelector": {}}],
    }));
    let c = cluster("c1", &[("env", "prod"), ("region", "eu")]);
    let got = match_cluster(&op, &c, &[]).unwrap();
    assert_eq!(got, customized(Some(3), &[0, 2]));
    assert_eq!(
        cluster_options(&op, &got).unwrap(),
        ClusterOptions {
            namespace: "two".into(),
            resources: vec![
                ResourceRef::secret("db"),
                ResourceRef::config_map("target"),
                ResourceRef::config_map("one"),
                ResourceRef::config_map("two"),
            ],
            keep_resources: true,
        }
    );
    let c = cluster("c2", &[("env", "prod")]);
    let got = match_cluster(&op, &c, &[]).unwrap();
    assert_eq!(got, customized(Some(3), &[0]));
    assert_eq!(cluster_options(&op, &got).unwrap().namespace, "one");
}

#[test]
fn all_matches_any_do_not_deploy_skips() {
    let op = op_from(json!({
        "helm": {},
        "targetCustomizationMode": "AllMatches",
        "targets": [
            {"clusterName": "c1", "namespace": "x"},
            {"clusterSelector": {}, "doNotDeploy": true},
            {"clusterSelector": {}},
        ],
        "targetRestrictions": [{"clusterSelector": {}}],
    }));
    assert_eq!(
        match_cluster(&op, &cluster("c1", &[]), &[]).unwrap(),
        TargetMatch::DoNotDeploy { target_index: 1 }
    );
}

#[test]
fn an_unknown_mode_is_first_match() {
    let op = op_from(json!({
        "helm": {},
        "targetCustomizationMode": "allmatches",
        "targets": [
            {"clusterName": "c1", "namespace": "x"},
            {"clusterName": "c1", "namespace": "y"},
            {"clusterSelector": {}},
        ],
        "targetRestrictions": [{"clusterSelector": {}}],
    }));
    assert_eq!(
        match_cluster(&op, &cluster("c1", &[]), &[]).unwrap(),
        customized(Some(2), &[0])
    );
}

#[test]
fn an_invalid_selector_in_a_customization_fails_the_whole_helmop() {
    let op = op_from(json!({
        "helm": {},
        "targets": [
            {"clusterSelector": {"matchExpressions": [{"key": "a", "operator": "Nope"}]}},
            {"clusterSelector": {}},
        ],
        "targetRestrictions": [{"clusterSelector": {}}],
    }));
    let err = match_cluster(&op, &cluster("c1", &[]), &[]).unwrap_err();
    assert_eq!(err.path, "spec.targets[0].clusterSelector");
}

#[test]
fn match_or_root_selects_every_cluster_but_honours_customizations() {
    let op = op_from(json!({
        "helm": {},
        "defaultNamespace": "root",
        "targets": [
            {"clusterName": "ctx-a", "namespace": "a"},
            {"clusterName": "ctx-b", "doNotDeploy": true},
            {"clusterName": "ctx-c", "namespace": "c"},
        ],
        "targetRestrictions": [{"clusterName": "ctx-c"}],
    }));
    let matcher = Matcher::new(&op).unwrap();
    let got = matcher.match_or_root(&cluster("ctx-a", &[]), &[]);
    assert_eq!(got, customized(None, &[0]));
    assert_eq!(cluster_options(&op, &got).unwrap().namespace, "a");
    assert_eq!(
        matcher.match_or_root(&cluster("ctx-b", &[]), &[]),
        TargetMatch::DoNotDeploy { target_index: 1 }
    );
    let got = matcher.match_or_root(&cluster("ctx-c", &[]), &[]);
    assert_eq!(got, m(2));
    assert_eq!(cluster_options(&op, &got).unwrap().namespace, "c");
    let got = matcher.match_or_root(&cluster("ctx-z", &[]), &[]);
    assert_eq!(got, TargetMatch::selected(None));
    assert_eq!(cluster_options(&op, &got).unwrap().namespace, "root");
}

// --- namespaceLabels / namespaceAnnotations (target.go BundleDeployment) ---

#[test]
fn namespace_metadata_merges_root_and_every_target() {
    let op = op_from(json!({
        "helm": {},
        "namespaceLabels": {"team": "shop", "a": "root"},
        "namespaceAnnotations": {"note": "root"},
        "targets": [
            {"clusterName": "c1", "namespaceLabels": {"a": "t0", "pod-security.kubernetes.io/enforce": "privileged"}},
            {"clusterName": "never-matches", "doNotDeploy": true,
             "namespaceLabels": {"b": "t1"}, "namespaceAnnotations": {"note": "t1", "x": "y"}},
        ],
    }));
    let got = namespace_metadata(&op);
    assert_eq!(
        got.labels,
        BTreeMap::from([
            ("a".to_string(), "t0".to_string()),
            ("b".to_string(), "t1".to_string()),
            ("team".to_string(), "shop".to_string()),
        ])
    );
    assert_eq!(
        got.annotations,
        BTreeMap::from([
            ("note".to_string(), "t1".to_string()),
            ("x".to_string(), "y".to_string()),
        ])
    );
    assert_eq!(
        namespace_metadata(&op_from(json!({"helm": {}}))),
        NamespaceMetadata::default()
    );
}

#[test]
fn combined_namespace_metadata_drops_disputed_keys() {
    let meta = |l: &[(&str, &str)], a: &[(&str, &str)]| NamespaceMetadata {
        labels: l
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        annotations: a
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let one = meta(&[("team", "a"), ("same", "s")], &[("n", "1")]);
    let two = meta(
        &[("team", "b"), ("same", "s"), ("own", "2")],
        &[("n", "2"), ("m", "x")],
    );
    let three = meta(&[("team", "a")], &[]);
    let (got, conflicts) = combine_namespace_metadata([&one, &two, &three]);
    assert_eq!(got, meta(&[("own", "2"), ("same", "s")], &[("m", "x")]));
    assert_eq!(conflicts, ["label team", "annotation n"]);
    let (got, conflicts) = combine_namespace_metadata([&one]);
    assert_eq!(got, one);
    assert!(conflicts.is_empty());
}

// --- laws ---

fn arb_selector() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(json!({})),
        ("[ab]", "[xy]").prop_map(|(k, v)| json!({"matchLabels": {k: v}})),
        "[ab]".prop_map(|k| json!({"matchExpressions": [{"key": k, "operator": "DoesNotExist"}]})),
    ]
}

fn arb_criteria() -> impl Strategy<Value = serde_json::Map<String, serde_json::Value>> {
    (
        proptest::option::of("c[123]"),
        proptest::option::of(arb_selector()),
        proptest::option::of("g[12]"),
        proptest::option::of(arb_selector()),
    )
        .prop_map(|(name, sel, group, group_sel)| {
            let mut m = serde_json::Map::new();
            if let Some(n) = name {
                m.insert("clusterName".into(), json!(n));
            }
            if let Some(s) = sel {
                m.insert("clusterSelector".into(), s);
            }
            if let Some(g) = group {
                m.insert("clusterGroup".into(), json!(g));
            }
            if let Some(s) = group_sel {
                m.insert("clusterGroupSelector".into(), s);
            }
            m
        })
}

fn arb_target() -> impl Strategy<Value = serde_json::Value> {
    (
        arb_criteria(),
        any::<bool>(),
        proptest::option::of("n[12]"),
        proptest::option::of("r[12]"),
        any::<bool>(),
    )
        .prop_map(|(mut m, dnd, ns, res, keep)| {
            m.insert("doNotDeploy".into(), json!(dnd));
            if let Some(ns) = ns {
                m.insert("namespace".into(), json!(ns));
            }
            if let Some(r) = res {
                m.insert(
                    "downstreamResources".into(),
                    json!([{"kind": "ConfigMap", "name": r}]),
                );
            }
            m.insert("keepResources".into(), json!(keep));
            serde_json::Value::Object(m)
        })
}

fn arb_spec() -> impl Strategy<Value = serde_json::Value> {
    (
        proptest::collection::vec(arb_target(), 0..5),
        proptest::collection::vec(arb_criteria().prop_map(serde_json::Value::Object), 0..3),
        any::<bool>(),
    )
        .prop_map(|(targets, restrictions, all)| {
            json!({
                "helm": {},
                "defaultNamespace": "root",
                "downstreamResources": [{"kind": "Secret", "name": "db"}],
                "targetCustomizationMode": if all { "AllMatches" } else { "FirstMatch" },
                "targets": targets,
                "targetRestrictions": restrictions,
            })
        })
}

fn arb_world() -> impl Strategy<Value = (Cluster, Vec<ClusterGroup>)> {
    (
        "c[1234]",
        proptest::collection::btree_map("[ab]", "[xy]", 0..3),
        // Rancher's display name, which a target's `clusterName` may name instead.
        proptest::option::of("c[1234]"),
        proptest::collection::vec(
            (
                "g[12]",
                proptest::collection::btree_map("[ab]", "[xy]", 0..2),
                arb_selector(),
            ),
            0..3,
        ),
    )
        .prop_map(|(name, labels, display, groups)| {
            let mut labels: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            if let Some(display) = &display {
                labels.push((FLEET_DISPLAY_NAME_LABEL, display));
            }
            let groups = groups
                .into_iter()
                .map(|(g, l, s)| {
                    let l: Vec<(&str, &str)> =
                        l.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    group(&g, &l, Some(serde_json::from_value(s).unwrap()))
                })
                .collect();
            (cluster(&name, &labels), groups)
        })
}

/// The spec with only target `i` (as a regular target, no restrictions).
fn only_target(spec: &serde_json::Value, i: usize) -> HelmOp {
    let mut s = spec.clone();
    s["targets"] = json!([spec["targets"][i].clone()]);
    s["targetRestrictions"] = json!([]);
    op_from(s)
}

/// The spec with restriction `i` as its only target (to ask whether the restriction matches).
fn restriction_as_target(spec: &serde_json::Value, i: usize) -> HelmOp {
    let mut s = spec.clone();
    s["targets"] = json!([spec["targetRestrictions"][i].clone()]);
    s["targetRestrictions"] = json!([]);
    op_from(s)
}

proptest! {
    /// The selecting target is a regular one that matches the cluster on its own, some
    /// restriction (if any) matches it too, and no earlier regular target would have.
    #[test]
    fn selection_follows_the_split((spec, (c, groups)) in (arb_spec(), arb_world())) {
        let op = op_from(spec.clone());
        let n_custom = customization_count(&op);
        let got = match_cluster(&op, &c, &groups).unwrap();
        let restrictions = op.spec.target_restrictions().len();
        let restricted_ok = restrictions == 0
            || (0..restrictions).any(|r| {
                match_cluster(&restriction_as_target(&spec, r), &c, &groups)
                    .unwrap()
                    .is_deployed()
            });
        if let TargetMatch::Matched { target_index: Some(i), customizations } = &got {
            prop_assert!(*i >= n_custom, "a customization selected: {got:?}");
            prop_assert!(restricted_ok);
            prop_assert!(match_cluster(&only_target(&spec, *i), &c, &groups).unwrap() == m(0));
            for &k in customizations {
                prop_assert!(k < n_custom);
                let alone = match_cluster(&only_target(&spec, k), &c, &groups).unwrap();
                prop_assert!(alone != TargetMatch::NoMatch, "customization {k} does not match");
            }
            if !op.spec.all_matches() {
                prop_assert!(customizations.len() <= 1);
            }
        }
        if op.spec.targets().is_empty() {
            let by_a_target = matches!(got, TargetMatch::Matched { target_index: Some(_), .. });
            prop_assert!(!by_a_target);
        }
    }

    /// Customization targets never decide whether a cluster is selected: replacing their
    /// criteria by ones that match nothing can only turn a skip into a deploy.
    #[test]
    fn customizations_never_select((spec, (c, groups)) in (arb_spec(), arb_world())) {
        let op = op_from(spec.clone());
        let n_custom = customization_count(&op);
        let mut neutral = spec.clone();
        for i in 0..n_custom {
            neutral["targets"][i] = json!({"name": "inert"});
        }
        let before = match_cluster(&op, &c, &groups).unwrap();
        let after = match_cluster(&op_from(neutral), &c, &groups).unwrap();
        match before {
            TargetMatch::NoMatch => prop_assert_eq!(after, TargetMatch::NoMatch),
            TargetMatch::Matched { target_index, .. } => {
                prop_assert_eq!(after, TargetMatch::selected(target_index))
            }
            TargetMatch::DoNotDeploy { .. } => prop_assert!(after != TargetMatch::NoMatch),
        }
    }

    /// Without restrictions nothing is a customization; restrictions that allow everything,
    /// one per target, give the same result.
    #[test]
    fn allow_all_restrictions_change_nothing((spec, (c, groups)) in (arb_spec(), arb_world())) {
        let mut free = spec.clone();
        free["targetRestrictions"] = json!([]);
        let free_op = op_from(free.clone());
        prop_assert_eq!(customization_count(&free_op), 0);
        let n = free_op.spec.targets().len().max(1);
        let mut open = free.clone();
        open["targetRestrictions"] = json!(vec![json!({"clusterSelector": {}}); n]);
        prop_assert_eq!(
            match_cluster(&free_op, &c, &groups).unwrap(),
            match_cluster(&op_from(open), &c, &groups).unwrap()
        );
    }

    /// Finding the targets by cluster name and display name decides exactly as trying every
    /// target in turn does.
    #[test]
    fn the_name_index_decides_as_a_full_scan((spec, (c, groups)) in (arb_spec(), arb_world())) {
        let op = op_from(spec);
        let (indexed, scanning) = (Matcher::new(&op).unwrap(), Matcher::new(&op).unwrap().scanning_all());
        prop_assert_eq!(indexed.match_cluster(&c, &groups), scanning.match_cluster(&c, &groups));
        prop_assert_eq!(indexed.match_or_root(&c, &groups), scanning.match_or_root(&c, &groups));
    }

    /// Fleet's Merge keeps the root entries first: a deployed cluster always gets the root
    /// resources, in order, and a non-empty namespace; the compiled matcher agrees.
    #[test]
    fn options_keep_the_root((spec, (c, groups)) in (arb_spec(), arb_world())) {
        let op = op_from(spec);
        let got = match_cluster(&op, &c, &groups).unwrap();
        prop_assert_eq!(Matcher::new(&op).unwrap().match_cluster(&c, &groups), got.clone());
        match cluster_options(&op, &got) {
            Some(o) => {
                prop_assert!(got.is_deployed());
                prop_assert_eq!(o.resources.first(), Some(&ResourceRef::secret("db")));
                prop_assert!(!o.namespace.is_empty());
                let mut seen = o.resources.clone();
                seen.dedup();
                prop_assert_eq!(seen.len(), o.resources.len());
            }
            None => prop_assert!(!got.is_deployed()),
        }
    }
}

/// Fleet labels every BundleDeployment with its Cluster's name: a name of 64 characters (a valid
/// object name) is no label value, so that Cluster never gets one; 63 is fine.
#[test]
fn a_cluster_named_beyond_a_label_value_is_never_deployed_to() {
    assert_eq!(never_deployed_to(&cluster(&"c".repeat(63), &[])), None);
    let reason = never_deployed_to(&cluster(&"c".repeat(64), &[])).unwrap_or_default();
    assert!(
        reason.contains("fleet.cattle.io/cluster") && reason.contains("(has 64)"),
        "{reason}"
    );
}
