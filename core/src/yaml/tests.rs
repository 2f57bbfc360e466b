use proptest::prelude::*;
use serde_json::json;

use super::*;

#[test]
fn multi_document_with_lines() {
    let text = "\
# leading comment
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: a
---
---
kind: HelmOp
spec:
  helm: {chart: x}
...
";
    let docs = parse_documents(text.as_bytes()).unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].index, 0);
    assert_eq!(docs[0].line, 3);
    assert_eq!(docs[0].value["kind"], "ConfigMap");
    assert_eq!(docs[1].index, 1);
    assert_eq!(docs[1].line, 9);
    assert_eq!(docs[1].value["spec"]["helm"]["chart"], "x");
}

#[test]
fn json_is_yaml() {
    let docs = parse_documents(br#"{"kind": "HelmOp", "spec": {"downstreamResources": [{"kind": "Secret", "name": "db"}]}}"#).unwrap();
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0].line, 1);
    assert_eq!(
        docs[0].value,
        json!({"kind": "HelmOp", "spec": {"downstreamResources": [{"kind": "Secret", "name": "db"}]}})
    );
}

#[test]
fn scalars_keep_their_yaml_types() {
    let docs = parse_documents(b"a: 1\nb: true\nc: \"1\"\nd: ~\ne: 1.5\nf: hello\n").unwrap();
    assert_eq!(
        docs[0].value,
        json!({"a": 1, "b": true, "c": "1", "d": null, "e": 1.5, "f": "hello"})
    );
}

#[test]
fn empty_input_has_no_documents() {
    assert!(parse_documents(b"").unwrap().is_empty());
    assert!(parse_documents(b"# only a comment\n").unwrap().is_empty());
    assert!(parse_documents(b"---\n---\n").unwrap().is_empty());
}

#[test]
fn byte_order_mark_is_accepted() {
    let docs = parse_documents("\u{feff}kind: HelmOp\n".as_bytes()).unwrap();
    assert_eq!(docs[0].value["kind"], "HelmOp");
}

#[test]
fn malformed_yaml_names_the_line() {
    let text = "kind: HelmOp\nspec:\n  helm:\n    chart: [unclosed\n  other: x\n";
    let err = parse_documents(text.as_bytes()).unwrap_err();
    let line = err.line().expect("a line number");
    assert!((4..=6).contains(&line), "line {line}: {err}");
    assert!(
        err.to_string().starts_with(&format!("line {line}")),
        "{err}"
    );
}

#[test]
fn error_in_second_document_points_past_the_first() {
    let text = "a: 1\n---\nb: 2\n  c: 3\n";
    let err = parse_documents(text.as_bytes()).unwrap_err();
    assert!(err.line().unwrap() >= 3, "{err}");
}

#[test]
fn duplicate_keys_are_an_error() {
    let err = parse_documents(b"a: 1\na: 2\n").unwrap_err();
    assert_eq!(err.line(), Some(2), "{err}");
}

#[test]
fn non_utf8_is_an_error_with_line() {
    let err = parse_documents(b"a: 1\nb: \xff\xfe\n").unwrap_err();
    assert_eq!(err, YamlError::NotUtf8 { line: 2, offset: 8 });
    assert!(err.to_string().contains("line 2"));
}

#[test]
fn errors_do_not_echo_content() {
    let secret = "s3cr3t-p4ssw0rd";
    let text = format!("kind: Secret\nstringData:\n  password: {secret}\n  bad: [\n");
    let err = parse_documents(text.as_bytes()).unwrap_err();
    assert!(!err.to_string().contains(secret), "{err}");
}

#[test]
fn alias_bombs_and_deep_nesting_are_refused() {
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        bomb.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    assert!(parse_documents(bomb.as_bytes()).is_err());

    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(parse_documents(deep.as_bytes()).is_err());
    let deep_block: String = (0..2000)
        .map(|i| format!("{}k:\n", "  ".repeat(i)))
        .collect();
    assert!(parse_documents(deep_block.as_bytes()).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_documents(&bytes);
    }

    #[test]
    fn yaml_shaped_text_never_panics(text in "([-:{}\\[\\],&*!|>'\"#%@ \n\ta-z0-9]|---\n|\\.\\.\\.\n){0,200}") {
        let _ = parse_documents(text.as_bytes());
    }

    #[test]
    fn json_values_round_trip(value in arb_json()) {
        let text = serde_json::to_string(&value).unwrap();
        let docs = parse_documents(text.as_bytes()).unwrap();
        if value.is_null() {
            prop_assert!(docs.is_empty());
        } else {
            prop_assert_eq!(docs.len(), 1);
            prop_assert_eq!(&docs[0].value, &value);
        }
    }
}

fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[a-zA-Z0-9 _.:/-]{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::from),
            proptest::collection::btree_map("[a-z]{1,6}", inner, 0..5)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn messages_put_the_location_first_once() {
    let err = parse_documents(b"a: 1\na: 2\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 2 column 1: malformed YAML: duplicate mapping key: a"
    );
    let err = parse_documents(b"a: [b\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 1 column 4: malformed YAML: unclosed bracket '['"
    );
}

#[test]
fn budgets_apply_per_document_not_per_stream() {
    // 3000 documents of ~100 nodes each: beyond a whole-stream node budget, fine per document.
    let doc: String = (0..50).map(|i| format!("k{i}: v{i}\n")).collect();
    let stream = vec![doc.as_str(); 3000].join("---\n");
    let docs = parse_documents(stream.as_bytes()).unwrap();
    assert_eq!(docs.len(), 3000);
    assert_eq!(docs[2999].index, 2999);
    assert_eq!(docs[1].line, 52);
}

#[test]
fn tab_indented_json_and_crlf_yaml() {
    let docs =
        parse_documents(b"{\n\t\"kind\": \"HelmOp\",\n\t\"spec\": {\n\t\t\"a\": [1, 2]\n\t}\n}\n")
            .unwrap();
    assert_eq!(
        docs[0].value,
        json!({"kind": "HelmOp", "spec": {"a": [1, 2]}})
    );
    let docs = parse_documents(b"kind: HelmOp\r\nspec:\r\n  a: b\r\n---\r\nkind: X\r\n").unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].value, json!({"kind": "HelmOp", "spec": {"a": "b"}}));
    assert_eq!(docs[1].line, 5);
}

/// `parse_like_fleet` reads as `sigs.k8s.io/yaml.Unmarshal` (over non-strict yaml.v2) does.
#[test]
fn fleets_reader_takes_the_last_of_repeated_keys() {
    let read = |text: &str| parse_like_fleet(text.as_bytes());
    assert_eq!(
        read("a: 1\nb: x\na: 2\n").unwrap(),
        Some(serde_json::json!({"a": 2, "b": "x"}))
    );
    assert_eq!(
        read("top:\n  k: 1\n  k: [x]\n").unwrap(),
        Some(serde_json::json!({"top": {"k": ["x"]}}))
    );
    assert_eq!(
        read("{a: 1, a: {b: 2}}").unwrap(),
        Some(serde_json::json!({"a": {"b": 2}}))
    );
    assert_eq!(
        read("- {k: 1, k: 2}\n").unwrap(),
        Some(serde_json::json!([{"k": 2}]))
    );
    // The kubectl-side reader still refuses them.
    assert!(parse_documents(b"a: 1\na: 2\n").is_err());
}

#[test]
fn fleets_reader_reads_the_first_document_only() {
    let read = |text: &str| parse_like_fleet(text.as_bytes());
    assert_eq!(
        read("a: 1\n---\nb: 2\n").unwrap(),
        Some(serde_json::json!({"a": 1}))
    );
    // yaml.v2's Unmarshal never parses past the first document.
    assert_eq!(
        read("a: 1\n---\n: : [not yaml\n").unwrap(),
        Some(serde_json::json!({"a": 1}))
    );
    assert_eq!(read("").unwrap(), None);
    assert_eq!(read("# nothing\n").unwrap(), None);
    // A syntax error in the first document is an error, located, with no content quoted.
    let err = read("a: [1\nb: s3cr3t\n").unwrap_err();
    assert!(err.line().is_some(), "{err}");
    assert!(!err.to_string().contains("s3cr3t"), "{err}");
    assert!(matches!(
        parse_like_fleet(b"a: \xff\n"),
        Err(YamlError::NotUtf8 { .. })
    ));
}
