use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
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
    TargetMatch::Matched {
        target_index: Some(i),
    }
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
            want: TargetMatch::Matched { target_index: None },
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
    let opts = cluster_options(&op, &TargetMatch::Matched { target_index: None }).unwrap();
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
    assert!(
        TargetMatch::Matched {
            target_index: Some(0)
        }
        .is_deployed()
    );
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
