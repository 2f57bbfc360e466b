use std::collections::BTreeMap;

use super::value::go_float;
use super::*;

fn err(text: &str) -> String {
    match parse(FLEET_TEMPLATE_NAME, text) {
        Ok(_) => "ok".into(),
        Err(e) => e.message,
    }
}

#[test]
fn parser_accepts_what_go_accepts() {
    for text in [
        "plain: text",
        "a: { b }",
        "a: ${ .ClusterName }",
        "a: ${- .ClusterName -} ",
        "a: ${/* a comment */}",
        "a: ${- /* trimmed */ -}",
        "a: ${ .ClusterLabels.env | upper | quote }",
        "a: ${ $.ClusterLabels.env }",
        "a: ${ $x := .ClusterLabels }${ $x.env }",
        "a: ${ $x := 1 }${ $x = 2 }${ $x }",
        "a: ${ default \"none\" (index .ClusterLabels \"tier\") }",
        "a: ${ if eq .ClusterName \"a\" }x${ else if .ClusterLabels }y${ else }z${ end }",
        "a: ${ with .ClusterLabels }${ .env }${ else }none${ end }",
        "a: ${ range $k, $v := .ClusterLabels }${ $k }=${ $v },${ end }",
        "a: ${ range .ClusterValues.list }${ if . }${ break }${ end }${ continue }${ end }",
        "${ define \"t\" }x${ end }a: ${ template \"t\" . }",
        "a: ${ block \"b\" . }default${ end }",
        "a: ${ printf \"%s-%d\" \"x\" 1 }",
        "a: ${ 'x' } ${ '\\n' } ${ 0x1F } ${ 1e3 } ${ -1.5 } ${ 1_000 } ${ 0o17 } ${ 1+2i }",
        "a: ${ `raw ${ string` }",
        "a: ${ \"esc \\\" \\n \\u00e9\" }",
        "a: ${ true } ${ false } ${ nil | print }",
        "a: ${ (.ClusterLabels).env }",
        "a: ${ ( .ClusterName | lower ) }",
        "a: ${ sha256sum .ClusterName | trunc 8 }",
        "a: ${\n  .ClusterName\n}",
    ] {
        assert_eq!(err(text), "ok", "{text}");
    }
}

#[test]
fn parser_refuses_what_go_refuses_with_gos_message() {
    for (text, want) in [
        ("a: ${", "template: values:1: unclosed action"),
        ("a: ${ .ClusterName ", "template: values:1: unclosed action"),
        (
            "a: ${ foo }",
            "template: values:1: function \"foo\" not defined",
        ),
        (
            "a: ${ toYaml . }",
            "template: values:1: function \"toYaml\" not defined",
        ),
        (
            "a: ${ env \"HOME\" }",
            "template: values:1: function \"env\" not defined",
        ),
        (
            "a: ${ required \"x\" .A }",
            "template: values:1: function \"required\" not defined",
        ),
        ("a: ${ if .A }x", "template: values:1: unexpected EOF"),
        ("a: ${ end }", "template: values:1: unexpected {{end}}"),
        ("a: ${ else }", "template: values:1: unexpected {{else}}"),
        (
            "a: ${ $x }",
            "template: values:1: undefined variable \"$x\"",
        ),
        (
            "a: ${ \"x }",
            "template: values:1: unterminated quoted string",
        ),
        (
            "a: ${ `x",
            "template: values:1: unterminated raw quoted string",
        ),
        (
            "a: ${ . | \"x\" }",
            "template: values:1: non executable command in pipeline stage 2",
        ),
        ("a: ${ }", "template: values:1: missing value for command"),
        (
            "a: ${ break }",
            "template: values:1: {{break}} outside {{range}}",
        ),
        (
            "a: ${ continue }",
            "template: values:1: {{continue}} outside {{range}}",
        ),
        (
            "a: ${/* x */ .A }",
            "template: values:1: comment ends before closing delimiter",
        ),
        ("a: ${/* x ", "template: values:1: unclosed comment"),
        ("a: ${ .A :x }", "template: values:1: expected :="),
        ("a: ${ (.A }", "template: values:1: unclosed left paren"),
        // Go's parser meets the ")" before the lexer's error.
        (
            "a: ${ .A) }",
            "template: values:1: unexpected \")\" in command",
        ),
        (
            "a: ${ \"x\".y }",
            "template: values:1: unexpected . after term \"\\\"x\\\"\"",
        ),
        (
            "a: ${ if }x${ end }",
            "template: values:1: missing value for if",
        ),
        (
            "a: ${ 1x }",
            "template: values:1: bad number syntax: \"1x\"",
        ),
        (
            "a: ${ .A { }",
            "template: values:1: unexpected \"{\" in operand",
        ),
        ("a: ${ \"\\q\" }", "template: values:1: invalid syntax"),
        (
            "a: ok\nb: ${ nope }",
            "template: values:2: function \"nope\" not defined",
        ),
        (
            "a: ${ range $a, $b, $c := . }${ end }",
            "template: values:1: too many declarations in range",
        ),
    ] {
        assert_eq!(err(text), want, "{text}");
    }
}

#[test]
fn deep_nesting_is_bounded_and_not_a_refusal() {
    let text = format!("${{ {}.A{} }}", "(".repeat(5000), ")".repeat(5000));
    assert_eq!(parse_error(&text), None);
    assert!(matches!(render(&text, &Value::Nil), Render::Unknown(_)));
}

fn context() -> Value {
    let labels = Value::Map(BTreeMap::from([(
        "env".to_string(),
        Value::Str("prod".into()),
    )]));
    let values =
        Value::from_json(&serde_json::json!({"replicas": 3, "big": 1000000, "list": ["a", "b"]}));
    Value::Map(BTreeMap::from([
        ("ClusterName".to_string(), Value::Str("down1".into())),
        (
            "ClusterNamespace".to_string(),
            Value::Str("fleet-default".into()),
        ),
        ("ClusterLabels".to_string(), labels),
        (
            "ClusterAnnotations".to_string(),
            Value::Map(BTreeMap::new()),
        ),
        ("ClusterValues".to_string(), values),
    ]))
}

fn run(text: &str) -> Render {
    render(text, &context())
}

#[test]
fn evaluator_renders_the_common_subset() {
    for (text, want) in [
        ("${ .ClusterName }", "down1"),
        ("${ .ClusterLabels.env | upper | quote }", "\"PROD\""),
        (
            "${ default \"none\" (index .ClusterLabels \"tier\") }",
            "none",
        ),
        ("${ index .ClusterLabels \"tier\" }", "<no value>"),
        (
            "${ if hasKey .ClusterLabels \"tier\" }a${ else }b${ end }",
            "b",
        ),
        (
            "${ .ClusterValues.replicas } ${ .ClusterValues.big }",
            "3 1e+06",
        ),
        (
            "${ range $i, $v := .ClusterValues.list }${ $i }${ $v }${ end }",
            "0a1b",
        ),
        (
            "${ range $k, $v := .ClusterLabels }${ $k }=${ $v }${ end }",
            "env=prod",
        ),
        (
            "${ printf \"%s-%s\" .ClusterName .ClusterNamespace }",
            "down1-fleet-default",
        ),
        (
            "${ $n := .ClusterName }${ with .ClusterLabels }${ .env }-${ $n }${ end }",
            "prod-down1",
        ),
        (
            "${ if and .ClusterName (not .ClusterAnnotations) }y${ end }",
            "y",
        ),
        (
            "${ len .ClusterValues.list } ${ eq .ClusterName \"down1\" }",
            "2 true",
        ),
        (
            "${ toJson .ClusterLabels } ${ b64enc \"a\" } ${ squote \"x\" }",
            "{\"env\":\"prod\"} YQ== 'x'",
        ),
        ("${- \" a \" | trim -}\n", "a"),
        (
            "${ define \"t\" }[${ . }]${ end }${ template \"t\" .ClusterName }",
            "[down1]",
        ),
        (
            "${ .ClusterValues }",
            "map[big:1e+06 list:[a b] replicas:3]",
        ),
    ] {
        assert_eq!(run(text), Render::Ok(want.into()), "{text}");
    }
}

#[test]
fn evaluator_fails_where_go_fails() {
    assert_eq!(
        run("a: ${ .ClusterLabels.tier }"),
        Render::Fail("template: values:1:20: executing \"values\" at <.ClusterLabels.tier>: map has no entry for key \"tier\"".into())
    );
    assert_eq!(
        run("x\ny: ${ .Nope }"),
        Render::Fail("template: values:2:6: executing \"values\" at <.Nope>: map has no entry for key \"Nope\"".into())
    );
    for text in [
        "${ fail \"boom\" }",
        "${ eq .ClusterValues.replicas 3 }",
        "${ upper .ClusterValues.replicas }",
        "${ upper (index .ClusterLabels \"x\") }",
        "${ .ClusterName.x }",
        "${ index .ClusterValues.list 5 }",
        "${ template \"missing\" }",
    ] {
        assert!(
            matches!(run(text), Render::Fail(_)),
            "{text}: {:?}",
            run(text)
        );
    }
}

#[test]
fn evaluator_says_unknown_outside_its_subset() {
    for text in [
        "${ sha256sum .ClusterName }",
        "${ now }",
        "${ printf \"%x\" 1 }",
        "${ 1+2i }",
    ] {
        assert!(
            matches!(run(text), Render::Unknown(_)),
            "{text}: {:?}",
            run(text)
        );
    }
    // Bounded: endless template recursion and huge output are unknown, not a hang.
    let rec = "${ define \"r\" }${ template \"r\" . }${ end }${ template \"r\" . }";
    assert!(matches!(run(rec), Render::Unknown(_)));
    let big = "${ range 200000 }xxxxxxxxxx${ end }";
    assert!(matches!(run(big), Render::Unknown(_)));
}

#[test]
fn floats_print_like_go() {
    for (f, want) in [
        (3.0, "3"),
        (1e6, "1e+06"),
        (123456.0, "123456"),
        (0.5, "0.5"),
        (1.5e-5, "1.5e-05"),
        (-2.25, "-2.25"),
        (1234567.0, "1.234567e+06"),
    ] {
        assert_eq!(go_float(f), want);
    }
}

#[test]
fn values_marshal_like_yaml_v2() {
    let v = serde_json::json!({"b": 1, "a": {"c": "x ${ .ClusterName }"}, "l": ["p", {"q": true, "r": "yes"}], "e": {}, "s": "a: b", "m": "l1\nl2"});
    assert_eq!(
        yaml_out::to_yaml(&v).as_deref(),
        Some(
            "a:\n  c: x ${ .ClusterName }\nb: 1\ne: {}\nl:\n- p\n- q: true\n  r: \"yes\"\nm: |-\n  l1\n  l2\ns: 'a: b'\n"
        )
    );
}

/// `{{else with}}` (go1.23, so in Fleet v0.16.1's go1.26): `{{with A}}X{{else with B}}Y{{else}}Z{{end}}`
/// is `{{with A}}X{{else}}{{with B}}Y{{else}}Z{{end}}{{end}}`. Outputs and messages are what
/// go1.26.6 `text/template` gives with Fleet's options for the same text and data.
#[test]
fn else_with_is_a_nested_with_sharing_the_end() {
    for (text, want) in [
        (
            "${ with index .ClusterLabels \"tier\" }t=${ . }${ else with index .ClusterLabels \"env\" }e=${ . }${ else }none${ end }",
            "e=prod",
        ),
        (
            "${ with index .ClusterLabels \"tier\" }t=${ . }${ else with index .ClusterLabels \"zone\" }z=${ . }${ else }none${ end }",
            "none",
        ),
        // The first branch's variables stay visible in the else-with, as in Go.
        (
            "${ with $x := index .ClusterLabels \"tier\" }${ else with $y := .ClusterLabels.env }${ $x }|${ $y }|${ . }${ end }",
            "<no value>|prod|prod",
        ),
        (
            "${ with .ClusterValues.list }${ len . }${ else with 0 }x${ end }",
            "2",
        ),
        ("${ with 0 }a${ else with 1 }${ . }${ end }", "1"),
        (
            "${ with 0 }a${ else with false }b${ else with `c` }${ . }${ end }",
            "c",
        ),
        ("${ with 0 }a${ else with 1 -}  x ${- end }", "x"),
    ] {
        assert_eq!(run(text), Render::Ok(want.into()), "{text}");
        let nested = text.replacen("${ else with", "${ else }${ with", 1);
        let nested = format!("{nested}${{ end }}");
        if !text.contains("else with `c`") && !text.contains("-}") {
            assert_eq!(run(&nested), run(text), "{nested}");
        }
    }
    // The else-with's pipeline fails like any other (missingkey=error).
    assert_eq!(
        run("${ with 0 }${ else with .ClusterLabels.tier }${ end }"),
        Render::Fail(
            "template: values:1:38: executing \"values\" at <.ClusterLabels.tier>: map has no entry for key \"tier\""
                .into()
        )
    );
    // Only `with` takes `else with`, only `if` takes `else if`; one `end` closes the chain.
    for (text, want) in [
        (
            "a: ${ if .A }${ else with .B }${ end }",
            "template: values:1: unexpected <with> in input",
        ),
        (
            "a: ${ range .A }${ else with .B }${ end }",
            "template: values:1: unexpected <with> in input",
        ),
        (
            "a: ${ with .A }${ else if .B }${ end }",
            "template: values:1: unexpected <if> in input",
        ),
        (
            "a: ${ with 0 }${ else with }${ end }",
            "template: values:1: missing value for with",
        ),
        (
            "a: ${ with 0 }${ else with 1 }x${ else }y${ else }z${ end }",
            "template: values:1: expected end; found {{else}}",
        ),
        (
            "a: ${ with 0 }${ else with 1 }x${ end }${ end }",
            "template: values:1: unexpected {{end}}",
        ),
    ] {
        assert_eq!(err(text), want, "{text}");
    }
}

/// `range` as go1.26 runs it: integers (go1.22) with at most one variable, `=` assigning the
/// variables declared before (go1.21), anything but a list, map, integer or nothing failing.
#[test]
fn range_follows_go_1_26() {
    for (text, want) in [
        ("${ range 3 }${ . }${ end }", "012"),
        ("${ range $x := 3 }${ $x }${ end }", "012"),
        ("${ range $i := 0 }x${ else }empty${ end }", "empty"),
        ("${ $i := 9 }${ range $i = 3 }${ end }${ $i }", "2"),
        (
            "${ $k := 0 }${ $v := 0 }${ range $k, $v = .ClusterValues.list }${ end }${ $k }=${ $v }",
            "1=b",
        ),
        (
            "${ range .ClusterValues.list }${ if eq . \"a\" }${ continue }${ end }${ . }${ break }${ end }",
            "b",
        ),
    ] {
        assert_eq!(run(text), Render::Ok(want.into()), "{text}");
    }
    for (text, want) in [
        (
            "${ range $i, $v := 3 }${ end }",
            "template: values:1:19: executing \"values\" at <3>: can't use 3 to iterate over more than one variable",
        ),
        // JSON numbers are float64 in Go: not an integer to range over.
        (
            "${ range .ClusterValues.replicas }x${ end }",
            "template: values:1:23: executing \"values\" at <.ClusterValues.replicas>: range can't iterate over 3",
        ),
        (
            "${ range .ClusterName }${ end }",
            "template: values:1:9: executing \"values\" at <.ClusterName>: range can't iterate over down1",
        ),
    ] {
        assert_eq!(run(text), Render::Fail(want.into()), "{text}");
    }
}

/// Execution errors name the node Go's evaluator is at: the command for a failing call, the
/// template node for a missing template, and the parse name with the executing template's.
#[test]
fn execution_errors_name_the_node_go_names() {
    for (text, want) in [
        (
            "${ index .ClusterValues.list 5 }",
            "template: values:1:3: executing \"values\" at <index .ClusterValues.list 5>: error calling index: index out of range: 5",
        ),
        (
            "${ template \"missing\" }",
            "template: values:1:12: executing \"values\" at <{{template \"missing\"}}>: template \"missing\" not defined",
        ),
        (
            "${ define \"t\" }${ .X }${ end }${ template \"t\" . }",
            "template: values:1:18: executing \"t\" at <.X>: map has no entry for key \"X\"",
        ),
    ] {
        assert_eq!(run(text), Render::Fail(want.into()), "{text}");
    }
}
