//! Go's own test tables for `text/template` (go1.26.6, the toolchain Fleet v0.16.1 builds with),
//! run through the port: `parseTests` (`parse/parse_test.go`) and `execTests`
//! (`exec_test.go`), vendored as data in `go_tables/` with Go's license.
//!
//! Every row either produces Go's result here (parses or not; the same tree, printed as Go's
//! `Root.String()`; the same output, or a failure where Go fails) or is listed below with why
//! the port does not cover it. A listed parse row that the port would now pass fails the test;
//! a listed exec row the port can run must come out unknown.
//!
//! go1.26.6: 108 parse rows (105 run, 3 listed), 356 exec rows (150 run and give Go's result, 72
//! run and come out unknown, 134 not run: their data is Go values JSON cannot hold).

use std::collections::BTreeMap;

use super::exec::{MissingKey, Stop, Value, execute_with};
use super::parse::{Syntax, list_string, parse_with};

mod exec_tests;
mod parse_tests;

/// One row of Go's `parseTests`.
pub struct ParseRow {
    pub name: &'static str,
    pub input: &'static str,
    pub ok: bool,
    pub result: &'static str,
}

/// One row of Go's `execTests`; `data` is the Go source of the data argument.
pub struct ExecRow {
    pub name: &'static str,
    pub input: &'static str,
    pub output: &'static str,
    pub data: &'static str,
    pub ok: bool,
}

/// `parseTests` rows the port does not reproduce, by name, and why.
const PARSE_SKIPPED: &[(&str, &str)] = &[
    (
        "paren nesting exceeds limit",
        "parse_test.go's init lowers Go's maxStackDepth to 3; with Go's real 10,000 (and helmop's 200) it parses",
    ),
    (
        "paren nesting in pipeline exceeds limit",
        "parse_test.go's init lowers Go's maxStackDepth to 3; with Go's real 10,000 (and helmop's 200) it parses",
    ),
    (
        "paren nesting with other constructs exceeds limit",
        "parse_test.go's init lowers Go's maxStackDepth to 3; with Go's real 10,000 (and helmop's 200) it parses",
    ),
];

/// Why whole groups of `execTests` rows are out of the port's reach. Fleet's data is JSON
/// decoded into `map[string]any` (maps, slices, strings, float64, bool, nil): no methods, struct
/// fields, pointers, funcs, channels, iterators, complex or unsigned numbers, and no functions
/// beyond Go's builtins and Sprig's.
const GO_TYPES: &str = "needs Go values JSON cannot hold (methods, struct fields and their errors, pointers, \
     func fields, channels, iter.Seq, complex, unsigned or typed-key maps, Stringer/error types)";
const NOT_EVALUATED: &str = "calls a function helmop does not evaluate (call, html, js, urlquery, slice, or one \
     of the test's own Go funcs): the port answers unknown, never a wrong result";
const TYPED_INTS: &str =
    "prints Go's %T of typed integers (int8, uint, uintptr...): JSON has one number type";
const PRINTF_VERBS: &str = "printf verbs or operands outside the port's %s %v %d %q %t, e.g. %T %x %g (unknown, never wrong)";
const NUMBERS: &str =
    "complex numbers, hex floats or integers past int64 (the port evaluates none of them: unknown)";

/// `execTests` rows the port does not reproduce, by name, and why. Rows skipped for
/// [`GO_TYPES`] or [`TYPED_INTS`] are not run (their data cannot be written as a template value
/// here, or only partly, so a match would be luck); the others are run and the port must answer
/// unknown (helmop then assumes Fleet renders the template), never a result of its own.
const EXEC_SKIPPED: &[(&str, &str)] = &[
    ("ideal int", NOT_EVALUATED),
    ("ideal float", NOT_EVALUATED),
    ("ideal exp float", NOT_EVALUATED),
    ("ideal complex", NUMBERS),
    ("ideal too big", NUMBERS),
    (".unexported", GO_TYPES),
    ("map .one interface", GO_TYPES),
    ("map .WRONG type", GO_TYPES),
    ("dot uint", TYPED_INTS),
    ("dot complex", GO_TYPES),
    ("dot struct", GO_TYPES),
    ("V{6666}.String()", GO_TYPES),
    ("&V{7777}.String()", GO_TYPES),
    ("(*V)(nil).String()", GO_TYPES),
    ("W{888}.Error()", GO_TYPES),
    ("&W{999}.Error()", GO_TYPES),
    ("(*W)(nil).Error()", GO_TYPES),
    ("*int", GO_TYPES),
    ("*string", GO_TYPES),
    ("*[]int", GO_TYPES),
    ("*[]int[1]", GO_TYPES),
    ("NIL", GO_TYPES),
    ("empty with struct", GO_TYPES),
    ("empty with struct, field", GO_TYPES),
    (".Method0", GO_TYPES),
    (".Method1(1234)", GO_TYPES),
    (".Method1(.I)", GO_TYPES),
    (".Method2(3, .X)", GO_TYPES),
    (".Method2(.U16, `str`)", GO_TYPES),
    (".Method2(.U16, $x)", GO_TYPES),
    (".Method3(nil constant)", GO_TYPES),
    (".Method3(nil value)", GO_TYPES),
    ("method on var", GO_TYPES),
    ("method on chained var", GO_TYPES),
    ("chained method", GO_TYPES),
    ("chained method on variable", GO_TYPES),
    (".NilOKFunc not nil", GO_TYPES),
    (".NilOKFunc nil", GO_TYPES),
    ("method on nil value from slice", GO_TYPES),
    ("method on typed nil interface value", GO_TYPES),
    (".BinaryFunc", GO_TYPES),
    (".VariadicFunc0", GO_TYPES),
    (".VariadicFunc2", GO_TYPES),
    (".VariadicFuncInt", GO_TYPES),
    ("if .BinaryFunc call", GO_TYPES),
    ("if not .BinaryFunc call", GO_TYPES),
    ("Interface Call", GO_TYPES),
    (".ErrFunc", GO_TYPES),
    ("call nil", NOT_EVALUATED),
    ("empty call", NOT_EVALUATED),
    ("empty call after pipe valid", GO_TYPES),
    ("empty call after pipe invalid", NOT_EVALUATED),
    (".BinaryFuncTooFew", GO_TYPES),
    (".BinaryFuncTooMany", GO_TYPES),
    (".BinaryFuncBad0", GO_TYPES),
    (".BinaryFuncBad1", GO_TYPES),
    (".VariadicFuncBad0", GO_TYPES),
    (".VariadicFuncIntBad0", GO_TYPES),
    (".VariadicFuncIntBad`", GO_TYPES),
    (".VariadicFuncNilBad", GO_TYPES),
    ("pipeline", GO_TYPES),
    ("pipeline func", GO_TYPES),
    ("nil pipeline", GO_TYPES),
    ("nil call arg", GO_TYPES),
    ("bad nil pipeline", GO_TYPES),
    ("parens in pipeline", NOT_EVALUATED),
    ("parens: $.GetU in paren", GO_TYPES),
    ("parens: $ in paren in pipe", NOT_EVALUATED),
    ("parens: spaces and args", NOT_EVALUATED),
    ("if on typed nil interface value", GO_TYPES),
    ("if 1.5i", NUMBERS),
    ("if 0.0i", GO_TYPES),
    ("if nonNilPointer", GO_TYPES),
    ("if nilPointer", GO_TYPES),
    ("if UPI", GO_TYPES),
    ("if EmptyUPI", GO_TYPES),
    ("if map unset", GO_TYPES),
    ("if map not unset", GO_TYPES),
    ("printf int", PRINTF_VERBS),
    ("printf float", PRINTF_VERBS),
    ("printf complex", NUMBERS),
    ("printf function", NOT_EVALUATED),
    ("printf method", GO_TYPES),
    ("printf lots", GO_TYPES),
    ("html", NOT_EVALUATED),
    ("html pipeline", NOT_EVALUATED),
    ("html typed nil", GO_TYPES),
    ("html untyped nil", NOT_EVALUATED),
    ("js", NOT_EVALUATED),
    ("urlquery", NOT_EVALUATED),
    ("or short-circuit2", NOT_EVALUATED),
    ("and short-circuit2", NOT_EVALUATED),
    ("slice[WRONG]", NOT_EVALUATED),
    ("slice[nil]", NOT_EVALUATED),
    ("map[NO]", GO_TYPES),
    ("map[nil]", NOT_EVALUATED),
    ("map[``]", GO_TYPES),
    ("map[WRONG]", NOT_EVALUATED),
    ("map MI64S", GO_TYPES),
    ("map MI32S", GO_TYPES),
    ("map MUI64S", GO_TYPES),
    ("map MI8S", GO_TYPES),
    ("map MUI8S", GO_TYPES),
    ("slice[:]", NOT_EVALUATED),
    ("slice[1:]", NOT_EVALUATED),
    ("slice[1:2]", NOT_EVALUATED),
    ("slice[-1:]", NOT_EVALUATED),
    ("slice[1:-2]", NOT_EVALUATED),
    ("slice[1:2:-1]", NOT_EVALUATED),
    ("slice[2:1]", NOT_EVALUATED),
    ("slice[2:2:1]", NOT_EVALUATED),
    ("out of range", NOT_EVALUATED),
    ("len(s) < indexes < cap(s)", GO_TYPES),
    ("indexes > cap(s)", GO_TYPES),
    ("array[:]", NOT_EVALUATED),
    ("array[1:]", NOT_EVALUATED),
    ("array[1:2]", NOT_EVALUATED),
    ("pointer to array[:]", GO_TYPES),
    ("pointer to array[1:]", GO_TYPES),
    ("pointer to array[1:2]", GO_TYPES),
    ("string[:]", NOT_EVALUATED),
    ("string[0:1]", NOT_EVALUATED),
    ("string[1:]", NOT_EVALUATED),
    ("string[1:2]", NOT_EVALUATED),
    ("3-index slice of string", NOT_EVALUATED),
    ("slice of an interface field", NOT_EVALUATED),
    ("with 1.5i", NUMBERS),
    ("with 0.0i", GO_TYPES),
    ("with empty interface, struct field", GO_TYPES),
    ("with on typed nil interface value", GO_TYPES),
    ("range []int method", GO_TYPES),
    ("range $x PSI", GO_TYPES),
    ("declare in range", GO_TYPES),
    ("range count", NOT_EVALUATED),
    ("range nil count", NOT_EVALUATED),
    ("range iter.Seq[int]", GO_TYPES),
    ("i = range iter.Seq[int]", GO_TYPES),
    ("range iter.Seq[int] over two var", GO_TYPES),
    ("i, c := range iter.Seq2[int,int]", GO_TYPES),
    ("i, c = range iter.Seq2[int,int]", GO_TYPES),
    ("i = range iter.Seq2[int,int]", GO_TYPES),
    ("i := range iter.Seq2[int,int]", GO_TYPES),
    ("i,c,x range iter.Seq2[int,int]", GO_TYPES),
    ("i,x range iter.Seq[int]", GO_TYPES),
    ("range iter.Seq[int] else", GO_TYPES),
    ("range iter.Seq2[int,int] else", GO_TYPES),
    ("range int8", TYPED_INTS),
    ("range int16", TYPED_INTS),
    ("range int32", TYPED_INTS),
    ("range int64", TYPED_INTS),
    ("range int", PRINTF_VERBS),
    ("range uint8", TYPED_INTS),
    ("range uint16", TYPED_INTS),
    ("range uint32", TYPED_INTS),
    ("range uint64", TYPED_INTS),
    ("range uint", TYPED_INTS),
    ("range uintptr", TYPED_INTS),
    ("range uintptr(0)", TYPED_INTS),
    ("range 5", PRINTF_VERBS),
    ("error method, error", GO_TYPES),
    ("error method, no error", GO_TYPES),
    ("hex float", NUMBERS),
    ("hex float _", NUMBERS),
    ("HEX float", NUMBERS),
    ("print multi2", NUMBERS),
    ("bug0", GO_TYPES),
    ("bug1", GO_TYPES),
    ("bug2", GO_TYPES),
    ("bug3", GO_TYPES),
    ("bug5", GO_TYPES),
    ("bug5a", GO_TYPES),
    ("bug6a", GO_TYPES),
    ("bug6b", GO_TYPES),
    ("bug6c", GO_TYPES),
    ("bug6d", GO_TYPES),
    ("bug8a", NOT_EVALUATED),
    ("bug8b", NOT_EVALUATED),
    ("bug10", NOT_EVALUATED),
    ("bug11", GO_TYPES),
    ("bug12xe", GO_TYPES),
    ("bug12xE", GO_TYPES),
    ("bug12Xe", GO_TYPES),
    ("bug12XE", GO_TYPES),
    ("bug13", GO_TYPES),
    ("bug15", NOT_EVALUATED),
    ("bug16a", PRINTF_VERBS),
    ("bug16b", PRINTF_VERBS),
    ("bug16c", PRINTF_VERBS),
    ("bug16d", PRINTF_VERBS),
    ("bug16e", NUMBERS),
    ("bug16f", NOT_EVALUATED),
    ("bug16g", NOT_EVALUATED),
    ("bug16h", NOT_EVALUATED),
    ("bug16i", NOT_EVALUATED),
    ("bug16j", NUMBERS),
    ("bug17a", GO_TYPES),
    ("bug17b", GO_TYPES),
    ("bug17c", GO_TYPES),
    ("bug17d", GO_TYPES),
    ("bug17e", GO_TYPES),
];

fn parse_syntax() -> Syntax<'static> {
    // parse_test.go parses with the function map {printf, contains}.
    Syntax {
        left: "",
        right: "",
        is_function: &|name| matches!(name, "printf" | "contains"),
    }
}

fn exec_syntax() -> Syntax<'static> {
    // exec_test.go's testExecute: Go's builtins plus its own funcs.
    Syntax {
        left: "",
        right: "",
        is_function: &|name| {
            matches!(
                name,
                "and"
                    | "call"
                    | "html"
                    | "index"
                    | "slice"
                    | "js"
                    | "len"
                    | "not"
                    | "or"
                    | "print"
                    | "printf"
                    | "println"
                    | "urlquery"
                    | "eq"
                    | "ge"
                    | "gt"
                    | "le"
                    | "lt"
                    | "ne"
                    | "add"
                    | "count"
                    | "dddArg"
                    | "die"
                    | "echo"
                    | "makemap"
                    | "mapOfThree"
                    | "oneArg"
                    | "returnInt"
                    | "stringer"
                    | "twoArgs"
                    | "typeOf"
                    | "valueString"
                    | "vfunc"
                    | "zeroArgs"
            )
        },
    }
}

fn ints(v: &[i64]) -> Value {
    Value::List(v.iter().map(|i| Value::Int(*i)).collect())
}

fn map_of(entries: &[(&str, Value)]) -> Value {
    Value::Map(
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// `tVal` as far as JSON can hold it: the fields of plain data, as maps and lists. Its other
/// fields (methods, pointers, funcs, typed maps) are left out; rows reading them are skipped.
fn t_val() -> Value {
    let msi = map_of(&[
        ("one", Value::Int(1)),
        ("two", Value::Int(2)),
        ("three", Value::Int(3)),
    ]);
    map_of(&[
        ("True", Value::Bool(true)),
        ("I", Value::Int(17)),
        ("U16", Value::Int(16)),
        ("X", Value::Str("x".into())),
        ("S", Value::Str("xyz".into())),
        ("FloatZero", Value::Float(0.0)),
        ("U", map_of(&[("V", Value::Str("v".into()))])),
        ("SI", ints(&[3, 4, 5])),
        ("SIEmpty", ints(&[])),
        (
            "SB",
            Value::List(vec![Value::Bool(true), Value::Bool(false)]),
        ),
        ("AI", ints(&[3, 4, 5])),
        ("MSI", msi),
        ("MSIone", map_of(&[("one", Value::Int(1))])),
        ("MSIEmpty", map_of(&[])),
        (
            "SMSI",
            Value::List(vec![
                map_of(&[("one", Value::Int(1)), ("two", Value::Int(2))]),
                map_of(&[("eleven", Value::Int(11)), ("twelve", Value::Int(12))]),
            ]),
        ),
        ("Empty0", Value::Nil),
        ("Empty1", Value::Int(3)),
        ("Empty2", Value::Str("empty2".into())),
        ("Empty3", ints(&[7, 8])),
    ])
}

/// The row's data as a template value, when JSON-like data can stand for it.
fn data(go: &str) -> Option<Value> {
    Some(match go {
        "nil" => Value::Missing,
        "tVal" => t_val(),
        "0" => Value::Int(0),
        "13" => Value::Int(13),
        "123" => Value::Int(123),
        "15.1" => Value::Float(15.1),
        "true" => Value::Bool(true),
        "\"hello\"" => Value::Str("hello".into()),
        "`It'd be nice.`" => Value::Str("It'd be nice.".into()),
        "[]int{-1, -2, -3}" => ints(&[-1, -2, -3]),
        "map[string]int{\"two\": 22}" => map_of(&[("two", Value::Int(22))]),
        "map[string]string{\"cause\": \"neglect\"}" => {
            map_of(&[("cause", Value::Str("neglect".into()))])
        }
        "int(5)" => Value::Int(5),
        "'.'" => Value::Int('.' as i64),
        "'e'" => Value::Int('e' as i64),
        "'P'" => Value::Int('P' as i64),
        _ => return None,
    })
}

fn skipped(list: &'static [(&str, &str)], name: &str) -> Option<&'static str> {
    list.iter().find(|(n, _)| *n == name).map(|(_, why)| *why)
}

/// What the port makes of a parse row: `Ok(tree)` or `Err(())` when it refuses.
fn parse_row(row: &ParseRow) -> Result<String, String> {
    match parse_with(row.name, row.input, parse_syntax()) {
        Ok(t) => Ok(list_string(&t.root, true)),
        Err(e) if e.too_deep => Err(format!("too deep for helmop: {e}")),
        Err(e) => Err(e.message),
    }
}

fn parse_row_matches(row: &ParseRow) -> Result<(), String> {
    match (parse_row(row), row.ok) {
        (Ok(tree), true) if tree == row.result => Ok(()),
        (Ok(tree), true) => Err(format!("tree {tree:?}, Go's {:?}", row.result)),
        (Ok(tree), false) => Err(format!("parses ({tree:?}); Go refuses it")),
        (Err(e), true) => Err(format!("refused ({e}); Go parses it")),
        (Err(e), false) if e.starts_with("too deep") => Err(e),
        (Err(_), false) => Ok(()),
    }
}

/// What the port makes of an exec row: its output or why it stopped.
fn exec_row(row: &ExecRow) -> Result<Result<String, Stop>, String> {
    let Some(data) = data(row.data) else {
        return Err(format!("data {} has no template value", row.data));
    };
    let tmpl = parse_with(row.name, row.input, exec_syntax())
        .map_err(|e| format!("parse error {}; Go parses it", e.message))?;
    Ok(execute_with(&tmpl, row.name, &data, MissingKey::Default))
}

/// Whether the port gives Go's result for an exec row.
fn exec_row_matches(row: &ExecRow) -> Result<(), String> {
    match (exec_row(row)?, row.ok) {
        (Ok(out), true) if out == row.output => Ok(()),
        (Ok(out), true) => Err(format!("output {out:?}, Go's {:?}", row.output)),
        (Ok(out), false) => Err(format!("renders {out:?}; Go fails")),
        (Err(Stop::Fail(m)), true) => Err(format!("fails ({m}); Go renders {:?}", row.output)),
        (Err(Stop::Fail(_)), false) => Ok(()),
        (Err(Stop::Unknown(m)), _) => Err(format!("unknown to the port: {m}")),
    }
}

#[test]
fn gos_parse_tests() {
    let mut wrong = Vec::new();
    for row in parse_tests::PARSE_TESTS {
        let result = parse_row_matches(row);
        match (skipped(PARSE_SKIPPED, row.name), result) {
            (None, Ok(())) | (Some(_), Err(_)) => {}
            (None, Err(e)) => wrong.push(format!("{} {:?}: {e}", row.name, row.input)),
            (Some(_), Ok(())) => wrong.push(format!(
                "{} {:?}: passes, remove it from PARSE_SKIPPED",
                row.name, row.input
            )),
        }
    }
    for (name, _) in PARSE_SKIPPED {
        assert!(
            parse_tests::PARSE_TESTS.iter().any(|r| r.name == *name),
            "PARSE_SKIPPED names no row {name:?}"
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn gos_exec_tests() {
    let mut wrong = Vec::new();
    for row in exec_tests::EXEC_TESTS {
        match skipped(EXEC_SKIPPED, row.name) {
            Some(GO_TYPES | TYPED_INTS) => {}
            // Outside the port's evaluator: it must say so (unknown), never answer.
            Some(_) => match exec_row(row) {
                Ok(Err(Stop::Unknown(_))) => {}
                other => wrong.push(format!(
                    "{} {:?}: listed as unknown to the port, but {other:?}",
                    row.name, row.input
                )),
            },
            None => {
                if let Err(e) = exec_row_matches(row) {
                    wrong.push(format!("{} {:?}: {e}", row.name, row.input));
                }
            }
        }
    }
    for (name, _) in EXEC_SKIPPED {
        assert!(
            exec_tests::EXEC_TESTS.iter().any(|r| r.name == *name),
            "EXEC_SKIPPED names no row {name:?}"
        );
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
