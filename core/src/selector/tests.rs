use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use proptest::prelude::*;

use super::*;
use crate::test_support::labels;

fn ml(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(pairs)),
        match_expressions: None,
    }
}

fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }]),
    }
}

#[test]
fn table() {
    let env_prod = labels(&[("env", "prod"), ("region", "eu")]);
    let env_dev = labels(&[("env", "dev")]);
    let none = labels(&[]);
    // (selector, labels, expected)
    let cases: Vec<(&str, LabelSelector, &BTreeMap<String, String>, bool)> = vec![
        (
            "empty matches all",
            LabelSelector::default(),
            &env_prod,
            true,
        ),
        (
            "empty matches no labels",
            LabelSelector::default(),
            &none,
            true,
        ),
        (
            "empty maps match all",
            LabelSelector {
                match_labels: Some(BTreeMap::new()),
                match_expressions: Some(vec![]),
            },
            &none,
            true,
        ),
        ("matchLabels hit", ml(&[("env", "prod")]), &env_prod, true),
        (
            "matchLabels miss value",
            ml(&[("env", "prod")]),
            &env_dev,
            false,
        ),
        ("matchLabels miss key", ml(&[("env", "prod")]), &none, false),
        (
            "matchLabels all ANDed",
            ml(&[("env", "prod"), ("region", "us")]),
            &env_prod,
            false,
        ),
        (
            "matchLabels empty value needs empty label",
            ml(&[("env", "")]),
            &none,
            false,
        ),
        (
            "In hit",
            expr("env", "In", &["dev", "prod"]),
            &env_prod,
            true,
        ),
        ("In miss", expr("env", "In", &["test"]), &env_prod, false),
        ("In absent key", expr("env", "In", &["prod"]), &none, false),
        ("NotIn hit", expr("env", "NotIn", &["dev"]), &env_prod, true),
        (
            "NotIn miss",
            expr("env", "NotIn", &["prod"]),
            &env_prod,
            false,
        ),
        (
            "NotIn absent key matches",
            expr("env", "NotIn", &["prod"]),
            &none,
            true,
        ),
        ("Exists hit", expr("env", "Exists", &[]), &env_dev, true),
        ("Exists miss", expr("tier", "Exists", &[]), &env_dev, false),
        (
            "DoesNotExist hit",
            expr("tier", "DoesNotExist", &[]),
            &env_dev,
            true,
        ),
        (
            "DoesNotExist miss",
            expr("env", "DoesNotExist", &[]),
            &env_dev,
            false,
        ),
    ];
    for (name, sel, l, want) in cases {
        assert_eq!(matches(&sel, l).unwrap(), want, "{name}");
    }
}

#[test]
fn labels_and_expressions_are_anded() {
    let sel = LabelSelector {
        match_labels: Some(labels(&[("env", "prod")])),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "region".into(),
            operator: "NotIn".into(),
            values: Some(vec!["us".into()]),
        }]),
    };
    assert!(matches(&sel, &labels(&[("env", "prod"), ("region", "eu")])).unwrap());
    assert!(!matches(&sel, &labels(&[("env", "prod"), ("region", "us")])).unwrap());
    assert!(!matches(&sel, &labels(&[("env", "dev"), ("region", "eu")])).unwrap());
}

#[test]
fn exists_without_values_field() {
    let sel = LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "env".into(),
            operator: "Exists".into(),
            values: None,
        }]),
    };
    assert!(matches(&sel, &labels(&[("env", "x")])).unwrap());
}

#[test]
fn invalid_selectors_are_errors_with_paths() {
    let cases = [
        (expr("env", "in", &["a"]), "matchExpressions[0].operator"),
        (
            expr("env", "Equals", &["a"]),
            "matchExpressions[0].operator",
        ),
        (expr("env", "In", &[]), "matchExpressions[0].values"),
        (expr("env", "NotIn", &[]), "matchExpressions[0].values"),
        (expr("env", "Exists", &["a"]), "matchExpressions[0].values"),
        (
            expr("env", "DoesNotExist", &["a"]),
            "matchExpressions[0].values",
        ),
        (expr("bad key", "Exists", &[]), "matchExpressions[0].key"),
        (expr("", "Exists", &[]), "matchExpressions[0].key"),
        (
            expr("env", "In", &["bad value"]),
            "matchExpressions[0].values[0]",
        ),
        (ml(&[("a/b/c", "x")]), "matchLabels.a/b/c"),
        (ml(&[("env", "-x")]), "matchLabels.env"),
    ];
    for (sel, path) in cases {
        let err = Selector::compile(&sel).unwrap_err();
        assert_eq!(err.path, path, "{err}");
        // The admission rules check without compiling: the same verdict, the same problem.
        let checked = Selector::check(&sel).unwrap_err();
        assert_eq!((checked.path, checked.message), (err.path, err.message));
    }
}

proptest! {
    /// `check` accepts exactly what `compile` compiles, whatever the keys, operators and values.
    #[test]
    fn check_agrees_with_compile(
        key in "[a-z/.-]{0,4}",
        op in "(In|NotIn|Exists|DoesNotExist|in)",
        values in proptest::collection::vec("[a-z -]{0,3}", 0..3),
        label in "[a-z/ ]{0,3}",
    ) {
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let mut sel = expr(&key, &op, &values);
        sel.match_labels = Some([(label.clone(), label)].into());
        let compiled = Selector::compile(&sel).map(|_| ()).map_err(|e| (e.path, e.message));
        let checked = Selector::check(&sel).map_err(|e| (e.path, e.message));
        prop_assert_eq!(checked, compiled);
    }
}

#[test]
fn everything() {
    assert!(Selector::everything().is_everything());
    assert!(
        Selector::compile(&LabelSelector::default())
            .unwrap()
            .is_everything()
    );
    assert!(
        !Selector::compile(&ml(&[("a", "b")]))
            .unwrap()
            .is_everything()
    );
}

proptest! {
    /// matchLabels {k: v} behaves exactly like `In [v]`, and `NotIn` is its complement.
    #[test]
    fn match_labels_equals_in_and_notin_is_complement(
        key in "[a-z]{1,3}",
        value in "[a-z]{1,3}",
        present in proptest::collection::btree_map("[a-z]{1,3}", "[a-z]{1,3}", 0..4),
    ) {
        let a = matches(&ml(&[(&key, &value)]), &present).unwrap();
        let b = matches(&expr(&key, "In", &[&value]), &present).unwrap();
        let c = matches(&expr(&key, "NotIn", &[&value]), &present).unwrap();
        let d = matches(&expr(&key, "Exists", &[]), &present).unwrap();
        let e = matches(&expr(&key, "DoesNotExist", &[]), &present).unwrap();
        prop_assert_eq!(a, b);
        prop_assert_eq!(a, !c);
        prop_assert_eq!(d, !e);
        prop_assert_eq!(d, present.contains_key(&key));
    }
}
