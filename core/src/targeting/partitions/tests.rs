use serde_json::json;

use super::*;

const NS: &str = "fleet-default";

fn strategy(v: serde_json::Value) -> RolloutStrategy {
    serde_json::from_value(v).unwrap_or_default()
}

fn clusters() -> Vec<Cluster> {
    vec![
        Cluster::new(NS, "eu1", &[("region", "eu")]),
        Cluster::new(NS, "us1", &[("region", "us")]),
        Cluster::new(NS, "ap1", &[("region", "ap")]),
    ]
}

fn gate(v: serde_json::Value) -> Result<Vec<bool>, RolloutError> {
    let all = clusters();
    let matched: Vec<&Cluster> = all.iter().collect();
    let groups = [ClusterGroup::new(
        NS,
        "americas",
        &[("continent", "america")],
        Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([("region".to_string(), "us".to_string())].into()),
                match_expressions: None,
            },
        ),
    )];
    deployable(Some(&strategy(v)), &matched, &groups)
}

#[test]
fn without_partitions_every_matched_cluster_deploys() {
    assert_eq!(gate(json!({})), Ok(vec![true, true, true]));
    assert_eq!(deployable(None, &[], &[]), Ok(vec![]));
}

#[test]
fn only_clusters_some_partition_holds_get_a_bundle_deployment() {
    let got = gate(json!({"partitions": [
        {"name": "eu", "clusterSelector": {"matchLabels": {"region": "eu"}}},
        {"name": "americas", "clusterGroupSelector": {"matchLabels": {"continent": "america"}}},
    ]}));
    assert_eq!(got, Ok(vec![true, true, false]), "ap1 is in no partition");
    // By name, and by group name.
    let got = gate(json!({"partitions": [{"clusterName": "ap1"}, {"clusterGroup": "americas"}]}));
    assert_eq!(got, Ok(vec![false, true, true]));
}

#[test]
fn a_partition_without_criteria_matches_nothing() {
    let got = gate(json!({"partitions": [{"name": "all?"}]}));
    assert_eq!(got, Ok(vec![false, false, false]));
    // An empty selector is a criterion that matches every cluster.
    let got = gate(json!({"partitions": [{"clusterSelector": {}}]}));
    assert_eq!(got, Ok(vec![true, true, true]));
}

#[test]
fn values_fleet_cannot_read_fail_the_whole_bundle() {
    let cases = [
        (
            json!({"maxUnavailable": "25 %"}),
            "failed to reset bundle status from targets: failed to parse 25 %: strconv.ParseFloat: parsing \"25 \": invalid syntax",
        ),
        (
            json!({"maxUnavailable": "half"}),
            "failed to reset bundle status from targets: invalid maxUnavailable, must be int or percentage (ending with %): half",
        ),
        (json!({"maxUnavailable": "0"}), "invalid maxUnavailable"),
        (
            json!({"maxUnavailablePartitions": "x%"}),
            "failed to update partitions: failed to parse x%",
        ),
        (
            json!({"partitions": [{"clusterName": "eu1", "maxUnavailable": "1 0%"}]}),
            "failed to update partitions: failed to parse 1 0%",
        ),
        (
            json!({"partitions": [{"clusterSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]}),
            "spec.rolloutStrategy.partitions[0].clusterSelector",
        ),
    ];
    for (v, phrase) in cases {
        let got = gate(v.clone()).map_err(|e| e.to_string());
        assert!(
            got.as_ref().is_err_and(|e| e.contains(phrase)),
            "{v}: {got:?}"
        );
    }
}

#[test]
fn readable_values_pass() {
    for v in [
        json!({"maxUnavailable": 1}),
        json!({"maxUnavailable": "3"}),
        json!({"maxUnavailable": "25%"}),
        json!({"maxUnavailable": "12.5%"}),
        json!({"maxUnavailable": "-5%"}),
        json!({"maxUnavailable": "1e1%"}),
        json!({"maxUnavailable": "Inf%"}),
        json!({"maxUnavailable": "0x1p4%"}),
        json!({"maxUnavailable": null}),
        json!({"maxUnavailablePartitions": 0}),
    ] {
        assert_eq!(gate(v.clone()), Ok(vec![true, true, true]), "{v}");
    }
}

#[test]
fn values_are_read_only_when_something_uses_them() {
    // Nothing matched: Fleet reads no strategy at all.
    let bad = strategy(
        json!({"maxUnavailable": "25 %", "partitions": [{"clusterSelector":
        {"matchExpressions": [{"key": "a", "operator": "Bad"}]}}]}),
    );
    assert_eq!(deployable(Some(&bad), &[], &[]), Ok(vec![]));
    // A partition that holds no cluster does not read its maxUnavailable.
    let got = gate(json!({"partitions": [
        {"clusterName": "eu1"},
        {"clusterName": "nowhere", "maxUnavailable": "25 %"},
    ]}));
    assert_eq!(got, Ok(vec![true, false, false]));
    // autoPartitionSize only counts with automatic partitions (200 clusters by default).
    assert!(gate(json!({"autoPartitionSize": "1 %"})).is_ok());
    assert!(
        gate(json!({"autoPartitionSize": "1 %", "autoPartitionThreshold": 3})).is_err(),
        "three clusters reach a threshold of three"
    );
    assert!(gate(json!({"autoPartitionSize": 0, "autoPartitionThreshold": 3})).is_ok());
}

#[test]
fn go_float_syntax() {
    for ok in [
        "1",
        "1.",
        ".5",
        "1e5",
        "+1",
        "-0",
        "inf",
        "+Infinity",
        "NaN",
        "0x1p-2",
        "0x_1p0",
    ] {
        assert!(go_parse_float_ok(ok), "{ok}");
    }
    for bad in [
        "", " 1", "1 ", "1_000", "+nan", "0x1", "0x1.8", "e5", "1e", "abc", "1e400",
    ] {
        assert!(!go_parse_float_ok(bad), "{bad}");
    }
}
