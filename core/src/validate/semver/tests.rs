//! What Masterminds/semver v3 `NewConstraint` accepts and rejects, case by case, each with where
//! it comes from:
//! - `MM NewConstraint`: Masterminds/semver `constraints_test.go` `TestNewConstraint` (master
//!   71f2b39, after v3.4.0), `err` column;
//! - `MM Check`: constraints of `TestConstraintsCheck` (all of them parse);
//! - `MM ParseConstraint`: `TestParseConstraint`;
//! - `Fleet OCI`: rancher/fleet v0.16.1 `internal/bundlereader/charturl_test.go` `Test_getOCITag`;
//! - `Fleet helmops`: `internal/cmd/controller/helmops/reconciler/*_test.go` versions;
//! - `regex`: derived from reading `constraints.go` (`cvRegex`, `validConstraintRegex`,
//!   `rewriteRange`, `parseConstraint`) and `version.go` (`coerceNewVersion`,
//!   `validatePrerelease`), with the step that decides it.

use proptest::prelude::*;

use super::*;

const CASES: &[(&str, bool, &str)] = &[
    // --- MM NewConstraint
    (">= 1.1", true, "MM NewConstraint"),
    (">40.50.60, < 50.70", true, "MM NewConstraint"),
    ("2.0", true, "MM NewConstraint"),
    (
        "v2.3.5-20161202202307-sha.e8fc5e5",
        true,
        "MM NewConstraint",
    ),
    ("v1.2.3-0abc", true, "MM NewConstraint"),
    ("v1.2.3-beta.01", false, "MM NewConstraint"),
    (">= bar", false, "MM NewConstraint"),
    ("BAR >= 1.2.3", false, "MM NewConstraint"),
    (">= 1.2.3 < 2.0", true, "MM NewConstraint"),
    (">= 1.2.3 < 2.0 || => 3.0 < 4", true, "MM NewConstraint"),
    (">= 1.2.3, < 2.0", true, "MM NewConstraint"),
    (">= 1.2.3, < 2.0 || => 3.0, < 4", true, "MM NewConstraint"),
    ("3 - 4 || => 3.0, < 4", true, "MM NewConstraint"),
    ("12.3.4.1234", false, "MM NewConstraint"),
    ("12.23.4.1234", false, "MM NewConstraint"),
    ("12.3.34.1234", false, "MM NewConstraint"),
    ("12.3.34 ~1.2.3", true, "MM NewConstraint"),
    ("12.3.34~ 1.2.3", false, "MM NewConstraint"),
    ("1.0.0 - 2.0.0, <=2.0.0", true, "MM NewConstraint"),
    // --- MM ParseConstraint
    ("foo", false, "MM ParseConstraint"),
    ("=< 1.2", true, "MM ParseConstraint"),
    ("=> 1.2", true, "MM ParseConstraint"),
    ("v1.2", true, "MM ParseConstraint"),
    ("< 40.50.10", true, "MM ParseConstraint"),
    // --- MM Check (wildcards, tilde, caret, spaces and commas, hyphen ranges)
    ("*", true, "MM Check"),
    ("~*", true, "MM Check"),
    ("0.x.x", true, "MM Check"),
    ("0.0.x", true, "MM Check"),
    ("!=4.x", true, "MM Check"),
    ("!=4.1-alpha", true, "MM Check"),
    ("<1.2.x", true, "MM Check"),
    ("<=1.1-a", true, "MM Check"),
    ("^1.2.x-alpha", true, "MM Check"),
    ("^0.0.1", true, "MM Check"),
    ("~1.1.1-beta", true, "MM Check"),
    ("~1", true, "MM Check"),
    ("1.1 - 2", true, "MM Check"),
    ("1.1-3", true, "MM Check"),
    ("1.5.0 - 4.5", true, "MM Check"),
    ("1.0.0 - 2.0.0 <=2.0.0", true, "MM Check"),
    (">   1.1, <2", true, "MM Check"),
    ("> 1.1    <3", true, "MM Check"),
    (
        ">= 1.0.0  <= 2.0.0-beta != 1.0.1-beta || > 3",
        true,
        "MM Check",
    ),
    (">= 1.0.0-0  <= 2.0.0", true, "MM Check"),
    (">=1.1, <2, !=1.2.3 || >= 3", true, "MM Check"),
    // --- Fleet OCI / helmops
    ("0.2.0", true, "Fleet OCI"),
    ("0.*.0", true, "Fleet OCI"),
    ("> 0.1.0, <= 1.0.0", true, "Fleet OCI"),
    (
        "   ",
        false,
        "Fleet OCI (\"failed to compute version constraint\")",
    ),
    ("0.2.x", true, "Fleet helmops"),
    (
        "latest",
        false,
        "Fleet helmops (a version Helm's index lookup cannot parse)",
    ),
    // --- regex: step 2, the group grammar
    (
        "",
        false,
        "regex: validConstraintRegex needs at least one version",
    ),
    ("1.2.3 ||", false, "regex: empty || group"),
    ("|| 1", false, "regex: empty || group"),
    (
        ">=1.2.3<2",
        false,
        "regex: constraints need whitespace or a comma between them",
    ),
    (
        "1.2.3,",
        false,
        "regex: a comma needs a constraint after it",
    ),
    ("1,,2", false, "regex: one comma between constraints"),
    ("1.2.3 , 4", true, "regex: whitespace before the comma"),
    ("=>=1", false, "regex: not an operator"),
    ("==1", false, "regex: not an operator"),
    (
        "> =1",
        false,
        "regex: nothing between an operator's characters",
    ),
    (
        "~ >1",
        false,
        "regex: nothing between an operator's characters",
    ),
    ("V1.2.3", false, "regex: only a lower-case v prefix"),
    ("1.2.3\u{b}", false, "regex: Go's \\s has no vertical tab"),
    ("\t1.2.3\r\n", true, "regex: \\s is space, tab, CR, LF, FF"),
    // --- regex: step 3, versions
    ("1.2.3.4", false, "regex: at most three parts"),
    ("1..2", false, "regex: empty part"),
    ("1.2.3-", false, "regex: empty pre-release"),
    ("1.2.3+", false, "regex: empty build metadata"),
    ("1.2-1.4", true, "regex: -1.4 is a pre-release"),
    ("1.2.3-beta.1+build.5", true, "regex: pre-release and build"),
    ("x+build", true, "regex: build metadata after a wildcard"),
    // --- regex: step 4, parts up to the first wildcard
    (
        "1x",
        false,
        "regex: parts are runs of [0-9xX*|]; 1x is not a number",
    ),
    ("x1", false, "regex: x1 is not exactly a wildcard"),
    (
        "1|2",
        false,
        "regex: | is in the part class, but 1|2 is not a number",
    ),
    ("1 |", false, "regex: | alone is a part, not a number"),
    ("1.x.3", true, "regex: parts after a wildcard are ignored"),
    (
        "x.99999999999999999999",
        true,
        "regex: parts after a wildcard are ignored",
    ),
    ("*.|.|", true, "regex: parts after a wildcard are ignored"),
    ("1.2.x3", false, "regex: x3 is not exactly a wildcard"),
    ("01.2.3", true, "regex: NewVersion coerces leading zeros"),
    ("18446744073709551615", true, "regex: u64::MAX fits"),
    (
        "18446744073709551616",
        false,
        "regex: u64::MAX + 1 does not",
    ),
    (
        "99999999999999999999.x",
        false,
        "regex: the part before the wildcard must fit",
    ),
    ("1.2.3-01", false, "regex: validatePrerelease, leading zero"),
    (
        "x-01",
        false,
        "regex: the pre-release is checked after a wildcard too",
    ),
    ("1.2.3-0", true, "regex: a lone 0 is fine"),
    ("1.2.3-01a", true, "regex: 01a is not numeric"),
    // --- regex: step 1, hyphen ranges
    ("1.2 - 1.4.5", true, "regex: rewriteRange"),
    (
        "1.2 -1.4",
        false,
        "regex: a range needs whitespace on both sides of -",
    ),
    (">1.2 - 1.4", false, "regex: rewritten to >>= 1.2, ..."),
    ("=1 - 2", false, "regex: rewritten to =>= 1, ..."),
    (
        ">=1 1.2 - 1.4",
        false,
        "regex: the range swallows the whitespace before it",
    ),
    (
        ">=1, 1.2 - 1.4",
        true,
        "regex: a comma survives the rewrite",
    ),
    ("1 - 2>=3", true, "regex: the rewrite ends with a space"),
    ("1.2 - 1.4 - 1.6", false, "regex: one range, then a stray -"),
    (
        "1 - 2||3",
        true,
        "regex: the range's second version takes ||3, split again after",
    ),
    ("1 - 2 || 1 - 2", true, "regex: both ranges rewritten"),
    (
        "1||2 - 3",
        true,
        "regex: the range's first version is 1||2, split again after",
    ),
    (
        "0+a||0 - 0",
        false,
        "regex: the range's first version takes the || before it",
    ),
];

#[test]
fn masterminds_table() {
    let mut wrong = Vec::new();
    for (input, ok, source) in CASES {
        let got = masterminds_error(input);
        if got.is_none() != *ok {
            wrong.push(format!(
                "{input:?} ({source}): expected ok={ok}, got {got:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn rewrite_matches_masterminds() {
    // Masterminds constraints_test.go TestRewriteRange, verbatim inputs and outputs.
    for (input, want) in [
        ("2 - 3", ">= 2, <= 3 "),
        ("2 - 3, 2 - 3", ">= 2, <= 3 ,>= 2, <= 3 "),
        ("2 - 3, 4.0.0 - 5.1", ">= 2, <= 3 ,>= 4.0.0, <= 5.1 "),
        ("2 - 3 4.0.0 - 5.1", ">= 2, <= 3 >= 4.0.0, <= 5.1 "),
        ("1.0.0 - 2.0.0 <=2.0.0", ">= 1.0.0, <= 2.0.0 <=2.0.0"),
    ] {
        assert_eq!(rewrite_ranges(input), want, "{input:?}");
    }
}

#[test]
fn reasons_name_the_problem() {
    let r = masterminds_error("latest").unwrap_or_default();
    assert!(
        r.contains("improper constraint") && r.contains("latest"),
        "{r}"
    );
    let r = masterminds_error("18446744073709551616").unwrap_or_default();
    assert!(r.contains("too large"), "{r}");
    let r = masterminds_error("1.2.3-01").unwrap_or_default();
    assert!(r.contains("leading zero"), "{r}");
}

const OPS: &[&str] = &[
    "", "=", "!=", ">", "<", ">=", "=>", "<=", "=<", "~", "~>", "^",
];

fn part() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..100).prop_map(|n| n.to_string()),
        prop::sample::select(vec!["x", "X", "*"]).prop_map(str::to_string),
    ]
}

/// A version from the documented grammar: `v?P(.P(.P)?)?(-pre)?(+meta)?`.
fn version() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        prop::collection::vec(part(), 1..=3),
        prop::option::of("[a-z][a-z0-9-]{0,5}(\\.[a-z][a-z0-9]{0,3}){0,2}"),
        prop::option::of("[0-9A-Za-z-]{1,6}(\\.[0-9A-Za-z-]{1,4}){0,2}"),
    )
        .prop_map(|(v, parts, pre, meta)| {
            let mut s = if v { "v".to_string() } else { String::new() };
            s.push_str(&parts.join("."));
            if let Some(pre) = pre {
                s.push('-');
                s.push_str(&pre);
            }
            if let Some(meta) = meta {
                s.push('+');
                s.push_str(&meta);
            }
            s
        })
}

fn constraint() -> impl Strategy<Value = String> {
    (prop::sample::select(OPS), "[ ]{0,2}", version())
        .prop_map(|(op, ws, v)| format!("{op}{ws}{v}"))
}

/// Groups of constraints separated by whitespace or commas, a group optionally starting with a
/// hyphen range, groups joined by `||`.
fn constraints() -> impl Strategy<Value = String> {
    let group = (
        prop::option::of((version(), version())),
        prop::collection::vec(
            (
                prop::sample::select(vec![" ", "  ", ",", ", ", " , "]),
                constraint(),
            ),
            1..4,
        ),
    )
        .prop_map(|(range, items)| {
            let mut s = String::new();
            if let Some((a, z)) = range {
                // The leading space matters: right after `||` the range's first version would
                // take the `||` (its character class has `|`), see the table.
                s.push_str(&format!(" {a} - {z}, "));
            }
            for (i, (sep, c)) in items.iter().enumerate() {
                if i > 0 {
                    s.push_str(sep);
                }
                s.push_str(c);
            }
            s
        });
    (
        prop::collection::vec(group, 1..3),
        prop::sample::select(vec!["||", " || ", " ||"]),
    )
        .prop_map(|(groups, or)| groups.join(or))
}

proptest! {
    /// Everything the documented grammar produces parses.
    #[test]
    fn grammar_is_accepted(c in constraints()) {
        prop_assert_eq!(masterminds_error(&c), None, "{:?}", c);
    }

    /// Surrounding whitespace never changes the verdict.
    #[test]
    fn surrounding_whitespace_is_ignored(c in constraints(), l in "[ \t]{0,3}", r in "[ \t\n]{0,3}") {
        prop_assert_eq!(masterminds_error(&format!("{l}{c}{r}")).is_none(), masterminds_error(&c).is_none());
    }

    /// A fourth numeric part makes any single constraint invalid.
    #[test]
    fn four_parts_are_rejected(op in prop::sample::select(OPS), parts in prop::collection::vec(any::<u32>(), 4)) {
        let v: Vec<String> = parts.iter().map(u32::to_string).collect();
        let c = format!("{op}{}", v.join("."));
        prop_assert!(masterminds_error(&c).is_some(), "{:?}", c);
    }

    /// A number is accepted exactly when it fits a u64 (NewVersion's ParseUint).
    #[test]
    fn numbers_fit_u64(digits in "[0-9]{1,25}") {
        let fits = digits.parse::<u64>().is_ok();
        prop_assert_eq!(masterminds_error(&digits).is_none(), fits, "{:?}", digits);
    }

    /// Never panics, whatever the input (the webhook feeds it user strings).
    #[test]
    fn total_on_any_input(s in "[0-9xX*|.v ,<>=!~^+a-z\t-]{0,40}") {
        let _ = masterminds_error(&s);
    }

    #[test]
    fn total_on_unicode(s in any::<String>()) {
        let _ = masterminds_error(&s);
    }
}

#[test]
fn constraints_over_the_bound_are_refused_before_parsing() {
    let message = constraint_error(&"1".repeat(600_000)).unwrap_or_default();
    assert!(
        message.contains("600000 bytes") && message.contains("256"),
        "{message}"
    );
    // At the bound the parser decides (here: a number too large for a version part).
    let at = constraint_error(&"1".repeat(MAX_CONSTRAINT_LEN)).unwrap_or_default();
    assert!(!at.contains("bytes"), "{at}");
    let ok = format!("{}1.2.3", " ".repeat(MAX_CONSTRAINT_LEN - 5));
    assert_eq!(constraint_error(&ok), None);
}
