//! The CRD's `x-kubernetes-validations` rules, evaluated with the `cel` crate (cel-rust).
//!
//! The API server evaluates them with cel-go and Kubernetes' CEL libraries. cel-rust parses the
//! same language; where its library differs from cel-go on what a rule of this CRD calls, helmop
//! declares the function itself instead (`cel` is built without its `chrono` and `regex`
//! features, which would declare these two and forbid redeclaring them):
//! - `duration(string)`: cel-go parses with Go's `time.ParseDuration`; cel-rust's own parser
//!   knows no `µs` and reads numbers as floats. Here it is Go's algorithm ([`go_duration`]),
//!   and a duration is its count of nanoseconds (an int): without `chrono` cel-rust has no
//!   duration type, and comparing or adding two durations gives the same answer either way.
//! - `string.matches(regex)`: Go's `regexp` syntax and meaning ([`crate::goregex`]), unanchored,
//!   as RE2's `MatchString`.
//!
//! A rule that calls anything else, or reads `oldSelf` (a transition rule, only evaluated on
//! update), is not evaluated offline: [`Rule::offline`] says so, and a unit test fails when
//! the vendored CRD gains such a rule, so that the gap is seen when the CRD is updated.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cel::extractors::This;
use cel::objects::Key;
use cel::{Context, Env, ExecutionError, Program, Value};
use serde_json::Value as Json;

/// Functions whose cel-rust implementation gives cel-go's answer on the values a structural
/// schema admits, plus the two declared here. Operators (`_==_`, `!_`, `@in`, ...) are cel-rust's.
const SUPPORTED: &[&str] = &[
    "duration",
    "matches",
    "size",
    "startsWith",
    "endsWith",
    "contains",
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
];

/// One `x-kubernetes-validations` entry.
pub(crate) struct Rule {
    /// The CEL source, as written in the CRD.
    pub source: String,
    /// `message`, else the API server's default (`failed rule: RULE`).
    pub message: String,
    /// The compiled rule, or why it is not evaluated offline.
    program: Result<Program, String>,
}

impl Rule {
    /// Compiles one entry of a schema's `x-kubernetes-validations`.
    pub fn compile(entry: &Json) -> Result<Rule, String> {
        let source = entry
            .get("rule")
            .and_then(Json::as_str)
            .ok_or("an x-kubernetes-validations entry has no rule")?
            .to_string();
        // messageExpression would need the same library again; the static message is what
        // every Fleet rule has.
        let message = entry
            .get("message")
            .and_then(Json::as_str)
            .filter(|m| !m.trim().is_empty())
            .map_or_else(|| format!("failed rule: {source}"), str::to_string);
        let program = env()
            .compile(&source)
            .map_err(|e| format!("cel-rust cannot parse it: {e}"))
            .and_then(|p| {
                let refs = p.references();
                if refs.has_variable("oldSelf") {
                    return Err("a transition rule (oldSelf), checked on update only".into());
                }
                let mut unknown: Vec<&str> = refs
                    .functions()
                    .into_iter()
                    .filter(|f| !is_operator(f) && !SUPPORTED.contains(f))
                    .collect();
                unknown.sort_unstable();
                if unknown.is_empty() {
                    Ok(p)
                } else {
                    Err(format!(
                        "it calls {}, which helmop does not evaluate as Kubernetes does",
                        unknown.join(", ")
                    ))
                }
            });
        Ok(Rule {
            source,
            message,
            program,
        })
    }

    /// Why the rule is not evaluated offline, if it is not.
    #[cfg(test)]
    pub fn offline(&self) -> Result<(), &str> {
        self.program.as_ref().map(|_| ()).map_err(String::as_str)
    }

    /// Evaluates the rule with `self` bound to `value`: `None` when it holds (or is not
    /// evaluated offline), else why not. The API server refuses the object on an evaluation
    /// error too, so that is a failure as well.
    pub fn check(&self, value: &Json) -> Option<Failure> {
        let program = self.program.as_ref().ok()?;
        let mut cx = Context::with_env(Arc::clone(env_arc()));
        // Neither name is declared by `Env::stdlib()` without cel's `chrono` and `regex`
        // features: a clash would be a build mistake, and leaves the rule unevaluated.
        cx.add_function("duration", duration).ok()?;
        cx.add_function("matches", matches).ok()?;
        cx.add_variable_from_value("self", to_cel(value));
        match program.execute(&cx) {
            Ok(Value::Bool(true)) => None,
            Ok(Value::Bool(false)) => Some(Failure::False),
            Ok(other) => Some(Failure::Error(format!(
                "the rule gave {other:?}, not a boolean"
            ))),
            Err(e) => Some(Failure::Error(e.to_string())),
        }
    }
}

/// How a rule failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// It evaluated to false.
    False,
    /// It could not be evaluated (e.g. a duration past Go's range).
    Error(String),
}

fn is_operator(name: &str) -> bool {
    name.starts_with('_') || name.starts_with('@') || name == "!_" || name == "-_"
}

/// cel-rust's standard environment (macros, operators, `size` ...), built once.
fn env_arc() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(Env::stdlib()))
}

fn env() -> &'static Env {
    env_arc()
}

/// A JSON value as CEL sees it in Kubernetes: integers are `int` (the schema keeps them in
/// int64), objects are maps with string keys.
fn to_cel(v: &Json) -> Value {
    match v {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::Int(i),
            (None, Some(u)) => Value::UInt(u),
            _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::String(Arc::new(s.clone())),
        Json::Array(items) => Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Json::Object(map) => {
            let map: HashMap<Key, Value> = map
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            Value::Map(map.into())
        }
    }
}

/// `duration(string)`, as cel-go: Go's `time.ParseDuration`, as nanoseconds.
fn duration(arg: Value) -> Result<Value, ExecutionError> {
    match arg {
        Value::String(s) => go_duration(&s)
            .map(Value::Int)
            .map_err(|e| ExecutionError::function_error("duration", e)),
        _ => Err(ExecutionError::function_error(
            "duration",
            "no such overload: duration needs a string",
        )),
    }
}

/// `string.matches(string)`, as cel-go: Go's regexp, matching anywhere in the string.
fn matches(This(this): This<Value>, pattern: Value) -> Result<Value, ExecutionError> {
    let (Value::String(text), Value::String(pattern)) = (&this, &pattern) else {
        return Err(ExecutionError::function_error(
            "matches",
            "no such overload: matches needs two strings",
        ));
    };
    let rust = crate::goregex::translate(pattern)
        .map_err(|e| ExecutionError::function_error("matches", e))?;
    let re = regex::RegexBuilder::new(&rust)
        .size_limit(crate::goregex::COMPILED_SIZE_LIMIT)
        .build()
        .map_err(|e| ExecutionError::function_error("matches", e))?;
    Ok(Value::Bool(re.is_match(text)))
}

/// Go's `time.ParseDuration` (go1.26 `time/format.go`), step for step, in nanoseconds: an
/// optional sign, then one or more decimal numbers (`1`, `1.5`, `.5`), each with a unit of
/// `ns`, `us`, `µs` (U+00B5), `μs` (U+03BC), `ms`, `s`, `m` or `h`; `0` alone needs no unit.
/// Errors are worded as Go's.
pub(crate) fn go_duration(orig: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {orig:?}");
    let mut s = orig.as_bytes();
    let mut neg = false;
    if let Some((&c, rest)) = s.split_first()
        && (c == b'-' || c == b'+')
    {
        neg = c == b'-';
        s = rest;
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut d: u64 = 0;
    while let Some(&c) = s.first() {
        // The next character must be [0-9.].
        if !(c == b'.' || c.is_ascii_digit()) {
            return Err(invalid());
        }
        let before = s.len();
        let (mut v, rest) = leading_int(s).ok_or_else(invalid)?;
        s = rest;
        let pre = before != s.len();
        let (mut f, mut scale, mut post) = (0u64, 1f64, false);
        if let Some(rest) = s.strip_prefix(b".") {
            let rest_after;
            (f, scale, rest_after) = leading_fraction(rest);
            post = rest.len() != rest_after.len();
            s = rest_after;
        }
        if !pre && !post {
            // No digits, e.g. ".s" or "-.s".
            return Err(invalid());
        }
        let i = s
            .iter()
            .position(|&c| c == b'.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if i == 0 {
            return Err(format!("time: missing unit in duration {orig:?}"));
        }
        let (u, rest) = s.split_at(i);
        s = rest;
        let unit = unit_nanos(u).ok_or_else(|| {
            format!(
                "time: unknown unit {:?} in duration {orig:?}",
                String::from_utf8_lossy(u)
            )
        })?;
        if v > (1u64 << 63) / unit {
            return Err(invalid());
        }
        v *= unit;
        if f > 0 {
            // Go: float64 keeps fractions of an hour nanosecond-exact (f*unit/scale <= 3.6e12).
            v += (f as f64 * (unit as f64 / scale)) as u64;
            if v > 1 << 63 {
                return Err(invalid());
            }
        }
        // Go adds in uint64: both terms are at most 2^63, so only 2^63 + 2^63 wraps (to 0),
        // as it does in Go.
        d = d.wrapping_add(v);
        if d > 1 << 63 {
            return Err(invalid());
        }
    }
    if neg {
        // -Duration(d): 2^63 becomes math.MinInt64.
        return Ok((d as i64).wrapping_neg());
    }
    if d > (1u64 << 63) - 1 {
        return Err(invalid());
    }
    Ok(d as i64)
}

fn unit_nanos(unit: &[u8]) -> Option<u64> {
    Some(match unit {
        b"ns" => 1,
        b"us" => 1_000,
        b"\xc2\xb5s" => 1_000, // U+00B5 MICRO SIGN
        b"\xce\xbcs" => 1_000, // U+03BC GREEK SMALL LETTER MU
        b"ms" => 1_000_000,
        b"s" => 1_000_000_000,
        b"m" => 60_000_000_000,
        b"h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Go's `leadingInt`: the leading digits as a number, `None` past 2^63.
fn leading_int(s: &[u8]) -> Option<(u64, &[u8])> {
    let mut x: u64 = 0;
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        if x > (1u64 << 63) / 10 {
            return None;
        }
        x = x * 10 + u64::from(c - b'0');
        if x > 1 << 63 {
            return None;
        }
        i += 1;
    }
    Some((x, &s[i..]))
}

/// Go's `leadingFraction`: the leading digits as a number and its scale (10^digits kept);
/// digits past what fits are consumed and ignored.
fn leading_fraction(s: &[u8]) -> (u64, f64, &[u8]) {
    let (mut x, mut scale, mut overflow) = (0u64, 1f64, false);
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        i += 1;
        if overflow {
            continue;
        }
        if x > ((1u64 << 63) - 1) / 10 {
            overflow = true;
            continue;
        }
        let y = x * 10 + u64::from(c - b'0');
        if y > 1 << 63 {
            overflow = true;
            continue;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale, &s[i..])
}
