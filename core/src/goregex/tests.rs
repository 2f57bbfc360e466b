use super::*;

/// What Go's `regexp.MatchString("^(?:" + pattern + ")$", value)` gives.
enum Go {
    Matches(&'static str),
    NoMatch(&'static str),
    /// `regexp.Compile` fails with this error code and expression.
    Refuses(&'static str, &'static str),
}
use Go::*;

/// Each case cites where Go says so: `syntax` is the package documentation of `regexp/syntax`
/// (doc.go), `parse.go` its parser, `perl_groups.go` its Perl and POSIX classes. Most are cases
/// where Rust's `regex`, used directly, answers differently.
const CASES: &[(&str, Go, &str)] = &[
    // Perl classes are ASCII (syntax: "\d digits (== [0-9])", "\s whitespace (== [\t\n\f\r ])",
    // "\w word characters (== [0-9A-Za-z_])").
    (r"\d", NoMatch("\u{663}"), "syntax: \\d == [0-9]"),
    (r"\D", Matches("\u{663}"), "syntax: \\D == [^0-9]"),
    (r"\w+", NoMatch("héllo"), "syntax: \\w == [0-9A-Za-z_]"),
    (r"\w+", Matches("hello_1"), "syntax: \\w == [0-9A-Za-z_]"),
    (r"\s", NoMatch("\u{a0}"), "syntax: \\s == [\\t\\n\\f\\r ]"),
    (r"\s", NoMatch("\u{b}"), "syntax: \\s has no vertical tab"),
    (r"\s", Matches("\u{c}"), "syntax: \\s has the form feed"),
    (
        r"[\d]",
        NoMatch("\u{663}"),
        "parse.go parseClass: parsePerlClassEscape",
    ),
    (
        r"[^\d]",
        Matches("\u{663}"),
        "parse.go parseClass: negated after",
    ),
    (
        r"[x\D]",
        Matches("\u{663}"),
        "parse.go parseClass: \\D inside a class",
    ),
    // \b is an ASCII word boundary (syntax: "\b at ASCII word boundary").
    (
        r".*\bb",
        Matches("éb"),
        "syntax: \\b at ASCII word boundary",
    ),
    (
        r"é\B",
        Matches("é"),
        "syntax: \\B not at ASCII word boundary",
    ),
    // Case folding reaches the Kelvin sign and the long s (parse.go appendFoldedRange,
    // unicode.SimpleFold), also through \w, and not through \W.
    (
        r"(?i)k",
        Matches("\u{212a}"),
        "parse.go minFoldRune / SimpleFold",
    ),
    (
        r"(?i)\w",
        Matches("\u{17f}"),
        "parse.go appendGroup folds the Perl class",
    ),
    (
        r"(?i)\W",
        NoMatch("\u{212a}"),
        "parse.go appendGroup folds, then negates",
    ),
    (r"(?i)É", Matches("é"), "syntax: i case-insensitive"),
    // \Q...\E quotes literally, to the end of the text without \E (parse.go "\Q ... \E").
    (r"\Qa.b\E", Matches("a.b"), "syntax: \\Q...\\E literal text"),
    (r"\Qa.b\E", NoMatch("axb"), "syntax: \\Q...\\E literal text"),
    (
        r"\Qa.b",
        Matches("a.b"),
        "parse.go: strings.Cut, no \\E needed",
    ),
    (
        r"x\Q*\E+",
        Matches("x**"),
        "parse.go: the quoted text is literals, + repeats the last",
    ),
    (
        r"\Q\E*",
        Refuses(MISSING_REPEAT_ARGUMENT, "*"),
        "parse.go repeat: empty stack",
    ),
    (
        r"a*\Q\E*",
        Matches("aaa"),
        "parse.go: \\Q\\E resets lastRepeat",
    ),
    // Inside a class, [ && -- ~~ are literals; classes do not nest (parse.go parseClass).
    (
        r"[[a]]",
        Matches("a]"),
        "parse.go parseClass: [ is a class character",
    ),
    (
        r"[[a]]",
        NoMatch("a"),
        "parse.go parseClass: the first ] closes",
    ),
    (
        r"[a&&b]",
        Matches("&"),
        "parse.go parseClass: & is a class character",
    ),
    (
        r"[a-c--b]",
        Matches("0"),
        "parse.go parseClass: --b is the range - to b",
    ),
    (
        r"[a~~b]",
        Matches("~"),
        "parse.go parseClass: ~ is a class character",
    ),
    (
        r"[]a]",
        Matches("]"),
        "parse.go parseClass: ] first is a literal",
    ),
    (
        r"[a-]",
        Matches("-"),
        "parse.go parseClass: [a-] means a or -",
    ),
    (r"[^a]", Matches("\n"), "syntax: Perl flags include ClassNL"),
    (
        r"[z-a]",
        Refuses(INVALID_CHAR_RANGE, "z-a"),
        "parse.go parseClass: hi < lo",
    ),
    (
        r"[a",
        Refuses(MISSING_BRACKET, "[a"),
        "parse.go parseClassChar",
    ),
    (
        r"[\b]",
        Refuses(INVALID_ESCAPE, r"\b"),
        "parse.go parseEscape: no case 'b'",
    ),
    (
        r"[[:alpha:]]+",
        NoMatch("é"),
        "perl_groups.go: POSIX classes are ASCII",
    ),
    (
        r"[[:^digit:]]",
        Matches("a"),
        "syntax: [[:^digit:]] negated",
    ),
    (
        r"[[:foo:]]",
        Refuses(INVALID_CHAR_RANGE, "[:foo:]"),
        "parse.go parseNamedClass",
    ),
    (
        r"[[:a]",
        Matches(":"),
        "parse.go parseNamedClass: no :] is no named class",
    ),
    // Escapes (parse.go parseEscape).
    (
        r"\<a\>",
        Matches("<a>"),
        "parse.go: escaped punctuation is itself",
    ),
    (r"\_", Matches("_"), "parse.go: \\_ is allowed"),
    (
        r"\u0041",
        Refuses(INVALID_ESCAPE, r"\u"),
        "parse.go parseEscape: no \\u",
    ),
    (
        r"\1",
        Refuses(INVALID_ESCAPE, r"\1"),
        "parse.go: a single non-zero digit is refused",
    ),
    (
        r"\01",
        Matches("\u{1}"),
        "syntax: \\123 octal character code",
    ),
    (r"\101", Matches("A"), "syntax: \\123 octal character code"),
    (
        r"\8",
        Refuses(INVALID_ESCAPE, r"\8"),
        "parse.go parseEscape",
    ),
    (r"\x41", Matches("A"), "syntax: \\x7F hex character code"),
    (
        r"\x{1F600}",
        Matches("\u{1f600}"),
        "syntax: \\x{10FFFF} hex character code",
    ),
    (
        r"\x{110000}",
        Refuses(INVALID_ESCAPE, r"\x{110000}"),
        "parse.go: > MaxRune",
    ),
    (
        r"\C",
        Refuses(INVALID_ESCAPE, r"\C"),
        "syntax: \\C NOT SUPPORTED",
    ),
    (
        r"\Z",
        Refuses(INVALID_ESCAPE, r"\Z"),
        "syntax: \\Z NOT SUPPORTED",
    ),
    (
        r"a\",
        Refuses(TRAILING_BACKSLASH, ""),
        "parse.go parseEscape",
    ),
    // Unicode classes (parse.go parseUnicodeClass, unicodeTable).
    (
        r"\pL+",
        Matches("héllo"),
        "syntax: \\pN Unicode character class",
    ),
    (r"\p{Greek}", Matches("α"), "syntax: \\p{Greek}"),
    (r"\p{greek}", Matches("α"), "parse.go canonicalName"),
    (
        r"\p{Uppercase_Letter}",
        Matches("A"),
        "parse.go: unicode.CategoryAliases",
    ),
    (r"\p{^Greek}", Matches("a"), "syntax: \\p{^Greek} negated"),
    (
        r"\P{^Greek}",
        Matches("α"),
        "syntax: \\P{^Greek} == \\p{Greek}",
    ),
    (
        r"\p{Cs}",
        NoMatch("a"),
        "unicode.Categories has Cs; no UTF-8 text holds one",
    ),
    (r"\P{Cs}", Matches("a"), "unicode.Categories has Cs"),
    (
        r"\p{Alphabetic}",
        Refuses(INVALID_CHAR_RANGE, r"\p{Alphabetic}"),
        "parse.go unicodeTable: no binary properties",
    ),
    (
        r"\p{sc=Greek}",
        Refuses(INVALID_CHAR_RANGE, r"\p{sc=Greek}"),
        "parse.go unicodeTable",
    ),
    (
        r"\p",
        Refuses(INVALID_CHAR_RANGE, r"\p"),
        "parse.go parseUnicodeClass",
    ),
    // Flags (syntax: "(?flags) set flags within current group; flags are i m s U").
    (
        r"(?x)a",
        Refuses(INVALID_PERL_OP, "(?x"),
        "syntax: flags i m s U only",
    ),
    (
        r"(?u)a",
        Refuses(INVALID_PERL_OP, "(?u"),
        "syntax: flags i m s U only",
    ),
    (
        r"(?ii)a",
        Matches("A"),
        "parse.go parsePerlFlags: a flag twice",
    ),
    (
        r"(?i-i)a",
        NoMatch("A"),
        "parse.go parsePerlFlags: cleared after set",
    ),
    (
        r"(?i-)a",
        Refuses(INVALID_PERL_OP, "(?i-)"),
        "parse.go: - needs a flag",
    ),
    (
        r"(?)a",
        Matches("a"),
        "parse.go parsePerlFlags: no flag at all",
    ),
    (
        r"a(?i)b|c",
        Matches("C"),
        "syntax: flags hold to the end of the group",
    ),
    (
        r"(?:(?i)a)b",
        NoMatch("aB"),
        "syntax: flags end with their group",
    ),
    (
        r".",
        NoMatch("\n"),
        "syntax: s let . match \\n (default false)",
    ),
    (r"(?s).", Matches("\n"), "syntax: s let . match \\n"),
    // Groups.
    (
        r"(?P<1st>a)",
        Matches("a"),
        "parse.go isValidCaptureName: [A-Za-z0-9_]+",
    ),
    (
        r"(?<n>a)(?<n>b)",
        Matches("ab"),
        "parse.go: names may repeat",
    ),
    (
        r"(?P<a-b>a)",
        Refuses(INVALID_NAMED_CAPTURE, "(?P<a-b>"),
        "parse.go",
    ),
    (
        r"(?'n'a)",
        Refuses(INVALID_PERL_OP, "(?'"),
        "parse.go: no (?'name')",
    ),
    (
        r"(?=a)",
        Refuses(INVALID_PERL_OP, "(?="),
        "syntax: no lookahead",
    ),
    (
        r"a)",
        Refuses(UNEXPECTED_PAREN, "a)"),
        "parse.go parseRightParen",
    ),
    (r"(a", Refuses(MISSING_PAREN, "(a"), "parse.go"),
    (r"a()", Matches("a"), "parse.go: empty group"),
    (r"a|", Matches("a"), "parse.go: empty alternative"),
    // Repetition (parse.go repeat, parseRepeat, repeatIsValid; maxRepeat 1000).
    (
        r"a**",
        Refuses(INVALID_REPEAT_OP, "**"),
        "parse.go repeat: no a**",
    ),
    (
        r"a*??",
        Refuses(INVALID_REPEAT_OP, "*??"),
        "parse.go repeat",
    ),
    (r"a*?", Matches("aa"), "syntax: x*? prefer fewer"),
    (
        r"x{2}{3}",
        Refuses(INVALID_REPEAT_OP, "{2}{3}"),
        "parse.go repeat",
    ),
    (
        r"(x{2}){3}",
        Matches("xxxxxx"),
        "parse.go: a group may be repeated",
    ),
    (
        r"*a",
        Refuses(MISSING_REPEAT_ARGUMENT, "*"),
        "parse.go repeat",
    ),
    (
        r"a|*",
        Refuses(MISSING_REPEAT_ARGUMENT, "*"),
        "parse.go repeat",
    ),
    (
        r"(?i)*",
        Refuses(MISSING_REPEAT_ARGUMENT, "*"),
        "parse.go: a flag is no operand",
    ),
    (
        r"a(?i)*",
        Matches("aaa"),
        "parse.go: the operand is below the flag change",
    ),
    (
        r"^*a",
        Matches("a"),
        "parse.go: an assertion may be repeated",
    ),
    (
        r"a{1001}",
        Refuses(INVALID_REPEAT_SIZE, "{1001}"),
        "syntax: limit 1000",
    ),
    (
        r"a{2,1}",
        Refuses(INVALID_REPEAT_SIZE, "{2,1}"),
        "parse.go: min > max",
    ),
    (
        r"a{100000000}",
        Refuses(INVALID_REPEAT_SIZE, "{100000000}"),
        "parse.go parseInt",
    ),
    (
        r"(a{100}){11}",
        Refuses(INVALID_REPEAT_SIZE, "{11}"),
        "parse.go repeatIsValid",
    ),
    (
        r"((a{100}){11}){0}",
        Refuses(INVALID_REPEAT_SIZE, "{11}"),
        "checked when made",
    ),
    (
        r"a{,5}",
        Matches("a{,5}"),
        "parse.go parseRepeat: not a repeat, { literal",
    ),
    (
        r"a{01}",
        Matches("a{01}"),
        "parse.go parseInt: no leading zero",
    ),
    (r"a{2,}", Matches("aaaa"), "syntax: x{n,}"),
];

#[test]
fn patterns_mean_what_they_mean_in_go() {
    let mut failures = Vec::new();
    for (pattern, go, why) in CASES {
        let got = compile_anchored(pattern);
        let ok = match (go, &got) {
            (Matches(v), Ok(re)) => re.is_match(v),
            (NoMatch(v), Ok(re)) => !re.is_match(v),
            (Refuses(code, expr), Err(e)) => e.code == *code && e.expr == *expr,
            _ => false,
        };
        if !ok {
            let got = got.map(|re| re.as_str().to_owned());
            failures.push(format!("{pattern:?} ({why}): got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_printed_form_spells_out_go_meanings() {
    let cases = [
        (r"\d\w", r"[0-9][0-9A-Za-z_]"),
        (r"[\D.]", r"[[^0-9]\x{2E}]"),
        (r"a\b", r"a(?-u:\b)"),
        (r"\Qa.\E", r"a\x{2E}"),
        (r"(?ii-s)x", r"(?i)x"),
        (r"(a)*", r"(?:(?:a))*"),
        (r"\p{old italic}", r"[\p{Olditalic}]"),
    ];
    for (go, rust) in cases {
        assert_eq!(translate(go).as_deref(), Ok(rust), "{go}");
    }
}

#[test]
fn nesting_stops_where_go_stops() {
    let nested = |n: usize| format!("{}a{}", "(".repeat(n), ")".repeat(n));
    assert!(compile_anchored(&nested(999)).is_ok_and(|re| re.is_match("a")));
    let deep = compile_anchored(&nested(1000)).map(|_| ());
    assert_eq!(deep.map_err(|e| e.code), Err(NESTING_DEPTH));
}

#[test]
fn a_program_over_the_compiled_size_bound_is_refused_as_too_large() {
    // Go accepts this (1,000 instructions); Rust's program for it exceeds 10 MiB.
    let e = compile_anchored(r"\pL{1000}").map(|_| ());
    assert_eq!(e.map_err(|e| e.code), Err(LARGE));
}

#[test]
fn errors_read_like_go() {
    let e = compile_anchored("a**").map(|_| ());
    assert_eq!(
        e.map_err(|e| e.to_string()),
        Err("error parsing regexp: invalid nested repetition operator: `**`".into())
    );
}

#[test]
fn every_known_unicode_name_compiles_in_rust() {
    for name in unicode_names::NAMES {
        if name == "Cs" || name == "Surrogate" {
            continue;
        }
        let pattern = format!(r"\p{{{name}}}");
        assert!(compile_anchored(&pattern).is_ok(), "{pattern}");
    }
}

proptest::proptest! {
    /// Nothing Go's parser could be handed makes this one panic.
    #[test]
    fn any_text_parses_or_is_refused(s in "[a-z\\\\()\\[\\]{}*+?|^$.:,0-9QEpPdwsb<>=-]{0,24}") {
        let _ = compile_anchored(&s);
    }
}
