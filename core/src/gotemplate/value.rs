//! The values a template works on (what Go sees after decoding JSON into `any`) and how Go's
//! `fmt` and Sprig print them; both the evaluator and the functions read them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A template value: what Go sees after decoding JSON into `any`.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A nil interface: a missing `index` entry, JSON null, `nil`.
    Nil,
    /// No value at all (Go's invalid `reflect.Value`): a missing map entry under
    /// `missingkey=default`, nil data, a `template` call without a pipeline. Only the
    /// evaluator makes it; functions receive [`Value::Nil`] instead, as Go passes them the
    /// parameter's zero value.
    Missing,
    Bool(bool),
    Int(i64),
    /// JSON numbers decode to float64 in Go.
    Float(f64),
    Str(String),
    List(Vec<Value>),
    Map(BTreeMap<String, Value>),
}

impl Value {
    pub fn from_json(v: &serde_json::Value) -> Value {
        match v {
            serde_json::Value::Null => Value::Nil,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => Value::Float(n.as_f64().unwrap_or(0.0)),
            serde_json::Value::String(s) => Value::Str(s.clone()),
            serde_json::Value::Array(a) => Value::List(a.iter().map(Value::from_json).collect()),
            serde_json::Value::Object(o) => Value::Map(
                o.iter()
                    .map(|(k, v)| (k.clone(), Value::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Go's `reflect.Type` name, for messages.
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Value::Nil | Value::Missing => "<nil>",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float64",
            Value::Str(_) => "string",
            Value::List(_) => "[]interface {}",
            Value::Map(_) => "map[string]interface {}",
        }
    }

    /// Go's `template.IsTrue` (and Sprig's `empty` is its negation).
    pub fn truth(&self) -> bool {
        match self {
            Value::Nil | Value::Missing => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.is_empty(),
        }
    }
}

/// Go's `%v` of a float64 (`strconv.FormatFloat(f, 'g', -1, 64)`).
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // Shortest round-trip digits and exponent, then Go's %g choice for the shortest precision:
    // exponent form when the exponent is < -4 or >= 6 (so 1000000 prints as 1e+06).
    let e = format!("{f:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let neg = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if neg { "-" } else { "" };
    if !(-4..6).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    let n = digits.len() as i32;
    if exp < 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
    } else if exp + 1 >= n {
        format!("{sign}{digits}{}", "0".repeat((exp + 1 - n) as usize))
    } else {
        let (a, b) = digits.split_at((exp + 1) as usize);
        format!("{sign}{a}.{b}")
    }
}

/// Go's `fmt` `%v` of a value (`inner`: inside a map or slice, where nil prints `<nil>`).
pub(super) fn format_value(v: &Value, inner: bool, out: &mut String) {
    match v {
        Value::Nil => out.push_str(if inner { "<nil>" } else { "<no value>" }),
        Value::Missing => out.push_str("<no value>"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) => out.push_str(&go_float(*f)),
        Value::Str(s) => out.push_str(s),
        Value::List(l) => {
            out.push('[');
            for (i, x) in l.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                format_value(x, true, out);
            }
            out.push(']');
        }
        Value::Map(m) => {
            out.push_str("map[");
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(k);
                out.push(':');
                format_value(x, true, out);
            }
            out.push(']');
        }
    }
}

/// Sprig's `strval`: strings as they are, anything else through `%v` (nil is `<nil>`).
pub(super) fn sprig_strval(v: &Value) -> String {
    let mut s = String::new();
    format_value(v, true, &mut s);
    s
}
