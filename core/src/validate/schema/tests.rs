use serde_json::{Value, json};

use super::cel::{Failure, Rule, go_duration};
use super::*;

/// A HelmOp Fleet accepts, with `patch` merged into its spec.
fn helmop(patch: Value) -> Value {
    let mut spec = json!({"helm": {"repo": "https://charts.example.com", "chart": "app"}});
    for (k, v) in patch.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({
        "apiVersion": "fleet.cattle.io/v1alpha1",
        "kind": "HelmOp",
        "metadata": {"name": "app", "namespace": "apps"},
        "spec": spec,
    })
}

/// `(path, message)` of every finding of the schema check.
fn findings(patch: Value) -> Vec<(String, String)> {
    check(&helmop(patch))
        .into_iter()
        .map(|f| {
            assert!(f.is_deny(), "{f}");
            (f.path, f.message)
        })
        .collect()
}

/// The one finding of `patch`, which must be at `path`.
fn one(patch: Value, path: &str) -> String {
    let found = findings(patch);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, path, "{found:?}");
    found[0].1.clone()
}

#[test]
fn the_vendored_crd_loads_and_a_valid_helmop_passes() {
    assert!(loaded().is_ok(), "{:?}", loaded().err());
    assert_eq!(findings(json!({})), vec![]);
    assert_eq!(
        findings(json!({
            "helm": {"repo": "oci://r/app", "version": "1.x", "releaseName": "my-app.v2",
                     "values": {"any": {"thing": [1, null, "x"]}}, "maxHistory": 3},
            "targets": [{"clusterSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["a"]}]}}],
            "rolloutStrategy": {"maxUnavailable": "10%", "autoPartitionSize": 3},
            "pollingInterval": "1h30m",
            "targetCustomizationMode": "AllMatches",
            "forceSyncGeneration": 5,
        })),
        vec![]
    );
}

#[test]
fn every_rule_of_the_crd_is_evaluated_offline() {
    let rules = rules();
    assert!(
        rules.iter().any(|(at, _, _)| at == "spec.pollingInterval"),
        "{rules:?}"
    );
    for (at, rule, offline) in rules {
        assert_eq!(
            offline,
            Ok(()),
            "{at}: rule {rule} is not evaluated offline: teach schema/cel.rs its functions"
        );
    }
}

#[test]
fn wrong_types() {
    assert_eq!(
        one(
            json!({"helm": {"chart": 1.2, "repo": "https://x"}}),
            "spec.helm.chart"
        ),
        "chart must be a string, not a number: quote it"
    );
    assert_eq!(
        one(json!({"paused": "yes"}), "spec.paused"),
        "paused must be true or false, not a string"
    );
    assert_eq!(
        one(
            json!({"downstreamResources": "x"}),
            "spec.downstreamResources"
        ),
        "downstreamResources must be a list, not a string"
    );
    assert_eq!(
        one(json!({"targets": ["x"]}), "spec.targets[0]"),
        "targets[0] must be an object, not a string"
    );
    assert_eq!(
        one(
            json!({"helm": {"repo": "https://x", "chart": "a", "values": "x"}}),
            "spec.helm.values"
        ),
        "values must be an object, not a string"
    );
    assert_eq!(
        one(
            json!({"rolloutStrategy": {"maxUnavailable": true}}),
            "spec.rolloutStrategy.maxUnavailable"
        ),
        "maxUnavailable must be an integer or a string, not a boolean"
    );
    assert_eq!(
        one(json!({"labels": {"a": 1}}), "spec.labels.a"),
        "a must be a string, not a number: quote it"
    );
    assert_eq!(
        one(
            json!({"helm": {"repo": "https://x", "chart": "a", "maxHistory": 1.5}}),
            "spec.helm.maxHistory"
        ),
        "maxHistory must be an integer, not a number"
    );
    // A null list item is not dropped (only null fields are).
    assert_eq!(
        one(
            json!({"downstreamResources": [null]}),
            "spec.downstreamResources[0]"
        ),
        "downstreamResources[0] must be an object, not null"
    );
    // The whole spec: the rules of helmop's walk skip it and leave it to this check.
    let mut op = helmop(json!({}));
    op["spec"] = json!("x");
    let found = check(&op);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].path, "spec");
    assert_eq!(found[0].message, "spec must be an object, not a string");
}

#[test]
fn integers_are_int64() {
    assert_eq!(findings(json!({"forceSyncGeneration": i64::MAX})), vec![]);
    assert_eq!(findings(json!({"forceSyncGeneration": 5.0})), vec![]);
    let message = one(
        json!({"forceSyncGeneration": 9_223_372_036_854_775_808u64}),
        "spec.forceSyncGeneration",
    );
    assert!(
        message.contains("is more than 9223372036854775807"),
        "{message}"
    );
}

#[test]
fn enums_take_an_explicit_empty_string_as_a_value() {
    for ok in [json!("FirstMatch"), json!("AllMatches"), Value::Null] {
        assert_eq!(
            findings(json!({"targetCustomizationMode": ok})),
            vec![],
            "{ok}"
        );
    }
    assert_eq!(
        one(
            json!({"targetCustomizationMode": ""}),
            "spec.targetCustomizationMode"
        ),
        "targetCustomizationMode \"\" is not \"FirstMatch\" or \"AllMatches\": an empty string is a value, not the field left out; remove the field to get the default \"FirstMatch\""
    );
    assert_eq!(
        one(
            json!({"targetCustomizationMode": "firstMatch"}),
            "spec.targetCustomizationMode"
        ),
        "targetCustomizationMode \"firstMatch\" is not \"FirstMatch\" or \"AllMatches\""
    );
}

#[test]
fn formats() {
    let bundle = |v: Value| json!({"helmOpOptions": {"helmOpCABundle": v}});
    for ok in [
        "",
        "YQ==",
        "LS0tLS1CRUdJTg==",
        "LS0t\nLS1C\r\nRUdJTg==",
        "YR==",
    ] {
        assert_eq!(findings(bundle(json!(ok))), vec![], "{ok:?}");
    }
    for bad in ["not base64!", "YQ", "-----BEGIN CERTIFICATE-----"] {
        assert_eq!(
            one(bundle(json!(bad)), "spec.helmOpOptions.helmOpCABundle"),
            "helmOpCABundle is not base64 (the CRD's format byte): encode the data, e.g. with base64 -w0",
            "{bad:?}"
        );
    }
}

#[test]
fn lengths_and_patterns() {
    let release =
        |name: &str| json!({"helm": {"repo": "https://x", "chart": "a", "releaseName": name}});
    assert_eq!(findings(release(&"a".repeat(53))), vec![]);
    assert_eq!(
        one(release(&"a".repeat(54)), "spec.helm.releaseName"),
        "releaseName is 54 characters long, more than the 53 the CRD allows"
    );
    assert_eq!(
        one(release("MyApp"), "spec.helm.releaseName"),
        r#"releaseName "MyApp" does not match the CRD's pattern ^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"#
    );
    let empty = one(release(""), "spec.helm.releaseName");
    assert!(
        empty.ends_with(": an empty string is a value, not the field left out; remove the field"),
        "{empty}"
    );
    // The target's helm options have the same schema.
    assert_eq!(
        findings(
            json!({"targets": [{"clusterSelector": {}, "helm": {"releaseName": "bad_name"}}]})
        )[0]
        .0,
        "spec.targets[0].helm.releaseName"
    );
}

#[test]
fn required_fields() {
    assert_eq!(
        one(
            json!({"targets": [{"clusterSelector": {"matchExpressions": [{"key": "env"}]}}]}),
            "spec.targets[0].clusterSelector.matchExpressions[0].operator"
        ),
        "operator is missing: the CRD requires it"
    );
    // A null where the schema is not nullable is dropped first, so it is missing too.
    assert_eq!(
        findings(json!({"allowedTargetNamespaceSelector": {"matchExpressions": [{"key": "env", "operator": null}]}}))[0].0,
        "spec.allowedTargetNamespaceSelector.matchExpressions[0].operator"
    );
}

#[test]
fn what_the_api_server_prunes_or_ignores_is_not_refused() {
    assert_eq!(
        findings(json!({
            "unknownField": {"x": 1},
            "downstreamResources": [{"kind": "Secret", "name": "a", "namespace": 7}],
            "paused": null,
            "labels": {"a": null},
            "helm": {"repo": "https://x", "chart": "a", "chartTypo": 1},
        })),
        vec![]
    );
    let mut op = helmop(json!({}));
    op["status"] = json!({"lastPollingTriggered": "not a time", "readyClusters": "x"});
    op["metadata"] = json!({"name": "app", "labels": {"a": "b"}, "anything": 1});
    op["extra"] = json!(1);
    assert_eq!(check(&op), vec![]);
    // Not an object: the caller reports it.
    assert_eq!(check(&json!("x")), vec![]);
}

#[test]
fn polling_interval_rule() {
    for ok in [
        "0", "15s", "5m", "2h", "1h30m", "1.5h", "500ms", "10us", "10µs", "100ns", "2562047h",
    ] {
        assert_eq!(findings(json!({"pollingInterval": ok})), vec![], "{ok:?}");
    }
    const MESSAGE: &str = "must be a valid Go duration using units ns, us, µs, ms, s, m, h (e.g. 15s, 5m, 2h, 1h30m); units like d (days) or w (weeks) are not supported";
    for bad in [
        "1d",
        "2w",
        "15",
        "-1s",
        "1h 30m",
        "+5s",
        ".5s",
        "2562047h1s",
        "0s0d",
    ] {
        assert_eq!(
            one(json!({"pollingInterval": bad}), "spec.pollingInterval"),
            format!("pollingInterval {bad:?}: {MESSAGE}"),
        );
    }
    // Past Go's range duration() fails, and so does the rule.
    let message = one(
        json!({"pollingInterval": "2562048h"}),
        "spec.pollingInterval",
    );
    assert!(
        message.starts_with(&format!(
            "pollingInterval \"2562048h\": {MESSAGE} (the CRD's rule "
        )),
        "{message}"
    );
    assert!(
        message.ends_with("time: invalid duration \"2562048h\")"),
        "{message}"
    );
    // minLength and the rule both refuse "", as the API server reports both.
    let found = findings(json!({"pollingInterval": ""}));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0]
            .1
            .starts_with("pollingInterval must be at least 1 character long")
    );
    assert_eq!(found[1].1, format!("pollingInterval \"\": {MESSAGE}"));
    // maxLength 32, whatever the rule says.
    assert_eq!(
        one(
            json!({"pollingInterval": "1h".repeat(17)}),
            "spec.pollingInterval"
        ),
        "pollingInterval is 34 characters long, more than the 32 the CRD allows"
    );
    // A wrong type: the API server skips the rules then.
    assert_eq!(
        one(json!({"pollingInterval": 15}), "spec.pollingInterval"),
        "pollingInterval must be a string, not a number: quote it"
    );
    // Null is nullable here: no value, no rule.
    assert_eq!(findings(json!({"pollingInterval": null})), vec![]);
}

#[test]
fn go_durations() {
    const S: i64 = 1_000_000_000;
    for (text, nanos) in [
        ("0", 0),
        ("-0", 0),
        ("+0", 0),
        ("5s", 5 * S),
        ("-5s", -5 * S),
        ("+5s", 5 * S),
        ("1h30m", 5400 * S),
        ("1.5h", 5400 * S),
        (".5s", S / 2),
        ("1.s", S),
        ("10µs", 10_000),
        ("10μs", 10_000),
        ("1.0000000000000000000001s", S),
        ("9223372036854775807ns", i64::MAX),
        ("2562047h47m16.854775807s", i64::MAX),
        ("-9223372036854775808ns", i64::MIN),
    ] {
        assert_eq!(go_duration(text), Ok(nanos), "{text}");
    }
    for (text, error) in [
        ("", "time: invalid duration \"\""),
        ("1", "time: missing unit in duration \"1\""),
        ("1d", "time: unknown unit \"d\" in duration \"1d\""),
        (".s", "time: invalid duration \".s\""),
        ("s", "time: invalid duration \"s\""),
        ("1h 2m", "time: unknown unit \"h \" in duration \"1h 2m\""),
        (
            "9223372036854775808ns",
            "time: invalid duration \"9223372036854775808ns\"",
        ),
        (
            "2562047h47m16.854775808s",
            "time: invalid duration \"2562047h47m16.854775808s\"",
        ),
        (
            "99999999999999999999ns",
            "time: invalid duration \"99999999999999999999ns\"",
        ),
    ] {
        assert_eq!(go_duration(text), Err(error.to_string()), "{text}");
    }
}

#[test]
fn cel_rules() {
    let rule = |r: &str| Rule::compile(&json!({"rule": r, "message": "no"})).unwrap();
    // Go's regexp: `\d` is ASCII only there, Unicode in Rust's.
    let digits = rule("self.matches('^\\\\d+$')");
    assert_eq!(digits.check(&json!("123")), None);
    assert_eq!(digits.check(&json!("١٢٣")), Some(Failure::False));
    assert_eq!(rule("self.matches('b')").check(&json!("abc")), None);
    assert_eq!(
        rule("duration(self) < duration('1m')").check(&json!("59.9s")),
        None
    );
    assert_eq!(
        rule("size(self) <= 2 && self.all(x, x > 0)").check(&json!([1, 2])),
        None
    );
    assert_eq!(
        rule("has(self.a) && self.a == 'x'").check(&json!({"a": "y"})),
        Some(Failure::False)
    );
    assert!(matches!(
        rule("duration(self) > duration('0s')").check(&json!("1d")),
        Some(Failure::Error(_))
    ));
    // What is not evaluated offline is said, and never fails an object.
    let url = rule("isURL(self)");
    assert_eq!(
        url.offline(),
        Err("it calls isURL, which helmop does not evaluate as Kubernetes does")
    );
    assert_eq!(url.check(&json!("x")), None);
    let transition = rule("self == oldSelf");
    assert!(transition.offline().is_err());
    assert_eq!(transition.check(&json!("x")), None);
    assert!(rule("self ==").offline().is_err());
    // No message: the API server's default.
    let unnamed = Rule::compile(&json!({"rule": "self > 1"})).unwrap();
    assert_eq!(unnamed.message, "failed rule: self > 1");
    assert!(Rule::compile(&json!({"message": "m"})).is_err());
}

#[test]
fn paths_name_list_items_only_in_lists() {
    let root = json!({"spec": {"labels": {"0": "x"}, "targets": [{"a/b": 1}]}});
    assert_eq!(render(&segments("/spec/labels/0", &root)), "spec.labels.0");
    assert_eq!(
        render(&segments("/spec/targets/0/a~1b", &root)),
        "spec.targets[0].a/b"
    );
    assert_eq!(render(&segments("", &root)), "");
}
