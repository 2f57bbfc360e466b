//! The functions helmop evaluates: Go's builtins and the Sprig functions values templates
//! commonly use, with Go's and Sprig's semantics. Every other defined function is unknown.

use std::collections::BTreeMap;

use base64::Engine as _;

use super::lex::go_quote;
use super::value::{Value, format_value, go_float, sprig_strval};

pub enum CallError {
    /// Go fails the execution with this message (without the location prefix).
    Fail(String),
    Unknown(String),
}

type R = Result<Value, CallError>;

fn fail<T>(m: impl Into<String>) -> Result<T, CallError> {
    Err(CallError::Fail(m.into()))
}

fn unknown<T>(name: &str) -> Result<T, CallError> {
    Err(CallError::Unknown(format!(
        "function {name} with these arguments is not evaluated by helmop"
    )))
}

/// A string parameter: Go refuses anything else before calling.
fn string_arg(v: &Value) -> Result<&str, CallError> {
    match v {
        Value::Str(s) => Ok(s),
        Value::Nil => fail("invalid value; expected string"),
        other => fail(format!(
            "wrong type for value; expected string; got {}",
            match other {
                Value::Bool(_) => "bool",
                Value::Int(_) => "int",
                Value::Float(_) => "float64",
                Value::List(_) => "[]interface {}",
                _ => "map[string]interface {}",
            }
        )),
    }
}

fn arity(name: &str, args: &[Value], want: usize) -> Result<(), CallError> {
    if args.len() != want {
        return fail(format!(
            "wrong number of args for {name}: want {want} got {}",
            args.len()
        ));
    }
    Ok(())
}

fn strings(name: &str, args: &[Value], want: usize) -> Result<Vec<String>, CallError> {
    arity(name, args, want)?;
    args.iter()
        .map(|a| string_arg(a).map(str::to_string))
        .collect()
}

/// Go's `fmt.Sprint`: a space between operands when neither side is a string.
fn sprint(args: &[Value]) -> String {
    let mut out = String::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 && !matches!(a, Value::Str(_)) && !matches!(args[i - 1], Value::Str(_)) {
            out.push(' ');
        }
        format_value(a, true, &mut out);
    }
    out
}

fn printf(args: &[Value]) -> R {
    let Some((Value::Str(format), rest)) = args.split_first() else {
        return unknown("printf");
    };
    let mut out = String::new();
    let mut it = format.chars();
    let mut next_arg = rest.iter();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let verb = it.next();
        if verb == Some('%') {
            out.push('%');
            continue;
        }
        let Some(arg) = next_arg.next() else {
            return unknown("printf");
        };
        match (verb, arg) {
            (Some('s' | 'v'), Value::Str(_) | Value::Int(_) | Value::Bool(_)) | (Some('v'), _) => {
                format_value(arg, true, &mut out)
            }
            (Some('s'), Value::Float(f)) => {
                // Go: %s of a float64 is "%!s(float64=3)".
                out.push_str(&format!("%!s(float64={})", go_float(*f)));
            }
            (Some('d'), Value::Int(i)) => out.push_str(&i.to_string()),
            (Some('q'), Value::Str(s)) => out.push_str(&go_quote(s)),
            (Some('t'), Value::Bool(b)) => out.push_str(&b.to_string()),
            _ => return unknown("printf"),
        }
    }
    if next_arg.next().is_some() {
        return unknown("printf");
    }
    Ok(Value::Str(out))
}

#[derive(PartialEq, PartialOrd)]
enum Basic<'a> {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a str),
}

fn basic(v: &Value) -> Option<Basic<'_>> {
    match v {
        Value::Bool(b) => Some(Basic::Bool(*b)),
        Value::Int(i) => Some(Basic::Int(*i)),
        Value::Float(f) => Some(Basic::Float(*f)),
        Value::Str(s) => Some(Basic::Str(s)),
        _ => None,
    }
}

fn same_kind(a: &Basic<'_>, b: &Basic<'_>) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Go's `eq` (any number of right-hand operands).
fn eq(args: &[Value]) -> R {
    let Some((first, rest)) = args.split_first() else {
        return fail("missing argument for comparison");
    };
    if rest.is_empty() {
        return fail("missing argument for comparison");
    }
    let Some(a) = basic(first) else {
        return unknown("eq");
    };
    for other in rest {
        let Some(b) = basic(other) else {
            return unknown("eq");
        };
        if !same_kind(&a, &b) {
            return fail("incompatible types for comparison");
        }
        if a == b {
            return Ok(Value::Bool(true));
        }
    }
    Ok(Value::Bool(false))
}

fn ordered(name: &str, args: &[Value]) -> R {
    arity(name, args, 2)?;
    let (Some(a), Some(b)) = (basic(&args[0]), basic(&args[1])) else {
        return unknown(name);
    };
    if !same_kind(&a, &b) {
        return fail("incompatible types for comparison");
    }
    if matches!(a, Basic::Bool(_)) {
        return fail("invalid type for comparison");
    }
    let Some(ord) = a.partial_cmp(&b) else {
        return unknown(name);
    };
    use std::cmp::Ordering::*;
    Ok(Value::Bool(match name {
        "lt" => ord == Less,
        "le" => ord != Greater,
        "gt" => ord == Greater,
        _ => ord != Less,
    }))
}

/// Go's `encoding/json` of a value (map keys sorted, floats Go-formatted).
fn to_json(v: &Value, out: &mut String) {
    match v {
        Value::Nil | Value::Missing => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::Float(f) => {
            let a = f.abs();
            if a != 0.0 && !(1e-6..1e21).contains(&a) {
                out.push_str(&go_float(*f).replace("e-0", "e-").replace("e+0", "e+"));
            } else {
                out.push_str(
                    &serde_json::Number::from_f64(*f).map_or("null".into(), |n| {
                        let s = n.to_string();
                        s.strip_suffix(".0").map_or(s.clone(), str::to_string)
                    }),
                );
            }
        }
        Value::Str(s) => {
            out.push_str(
                &serde_json::Value::String(s.clone())
                    .to_string()
                    .replace('<', "\\u003c")
                    .replace('>', "\\u003e")
                    .replace('&', "\\u0026"),
            );
        }
        Value::List(l) => {
            out.push('[');
            for (i, x) in l.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                to_json(x, out);
            }
            out.push(']');
        }
        Value::Map(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                to_json(&Value::Str(k.clone()), out);
                out.push(':');
                to_json(x, out);
            }
            out.push('}');
        }
    }
}

/// Go's `strings.Title`: upper-cases each letter that follows a non-letter.
fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_letter = false;
    for c in s.chars() {
        let letter = c.is_alphanumeric() || c == '_' || c == '\'';
        if letter && !prev_letter {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
        prev_letter = letter;
    }
    out
}

/// Calls `name` with evaluated arguments (the piped value last).
pub fn call(name: &str, args: Vec<Value>) -> R {
    let v = |s: String| Ok(Value::Str(s));
    match name {
        "not" => {
            arity(name, &args, 1)?;
            Ok(Value::Bool(!args[0].truth()))
        }
        "len" => {
            arity(name, &args, 1)?;
            match &args[0] {
                Value::Str(s) => Ok(Value::Int(s.len() as i64)),
                Value::List(l) => Ok(Value::Int(l.len() as i64)),
                Value::Map(m) => Ok(Value::Int(m.len() as i64)),
                Value::Nil => fail("error calling len: len of nil pointer"),
                other => fail(format!(
                    "error calling len: len of type {}",
                    match other {
                        Value::Bool(_) => "bool",
                        Value::Int(_) => "int",
                        _ => "float64",
                    }
                )),
            }
        }
        "index" => {
            let Some((mut item, keys)) = args.split_first().map(|(a, b)| (a.clone(), b)) else {
                return fail("wrong number of args for index: want at least 1 got 0");
            };
            for k in keys {
                item = match (&item, k) {
                    (Value::Map(m), Value::Str(k)) => m.get(k).cloned().unwrap_or(Value::Nil),
                    (Value::List(l), Value::Int(i)) => match usize::try_from(*i)
                        .ok()
                        .and_then(|i| l.get(i))
                    {
                        Some(x) => x.clone(),
                        None => {
                            return fail(format!("error calling index: index out of range: {i}"));
                        }
                    },
                    (Value::Nil, _) => {
                        return fail("error calling index: index of untyped nil");
                    }
                    _ => return unknown(name),
                };
            }
            Ok(item)
        }
        "print" => v(sprint(&args)),
        "println" => {
            let parts: Vec<String> = args.iter().map(sprig_strval).collect();
            v(parts.join(" ") + "\n")
        }
        "printf" => printf(&args),
        "eq" => eq(&args),
        "ne" => {
            arity(name, &args, 2)?;
            match eq(&args)? {
                Value::Bool(b) => Ok(Value::Bool(!b)),
                other => Ok(other),
            }
        }
        "lt" | "le" | "gt" | "ge" => ordered(name, &args),
        "default" => {
            let Some((d, given)) = args.split_first() else {
                return fail("wrong number of args for default: want at least 1 got 0");
            };
            match given.first() {
                Some(g) if g.truth() => Ok(g.clone()),
                _ => Ok(d.clone()),
            }
        }
        "empty" => {
            arity(name, &args, 1)?;
            Ok(Value::Bool(!args[0].truth()))
        }
        "coalesce" => Ok(args.into_iter().find(Value::truth).unwrap_or(Value::Nil)),
        "ternary" => {
            arity(name, &args, 3)?;
            match &args[2] {
                Value::Bool(b) => Ok(if *b { args[0].clone() } else { args[1].clone() }),
                _ => unknown(name),
            }
        }
        "quote" => v(args
            .iter()
            .filter(|a| **a != Value::Nil)
            .map(|a| go_quote(&sprig_strval(a)))
            .collect::<Vec<_>>()
            .join(" ")),
        "squote" => v(args
            .iter()
            .filter(|a| **a != Value::Nil)
            .map(|a| format!("'{}'", sprig_strval(a)))
            .collect::<Vec<_>>()
            .join(" ")),
        "cat" => v(args
            .iter()
            .filter(|a| **a != Value::Nil)
            .map(sprig_strval)
            .collect::<Vec<_>>()
            .join(" ")),
        "upper" | "lower" | "trim" | "title" | "b64enc" => {
            let s = strings(name, &args, 1)?.remove(0);
            v(match name {
                "upper" => s.to_uppercase(),
                "lower" => s.to_lowercase(),
                "trim" => s.trim().to_string(),
                "title" => title(&s),
                _ => base64::engine::general_purpose::STANDARD.encode(s.as_bytes()),
            })
        }
        "trimPrefix" | "trimSuffix" | "contains" | "hasPrefix" | "hasSuffix" => {
            let s = strings(name, &args, 2)?;
            let (a, b) = (&s[0], &s[1]);
            match name {
                "trimPrefix" => v(b.strip_prefix(a.as_str()).unwrap_or(b).to_string()),
                "trimSuffix" => v(b.strip_suffix(a.as_str()).unwrap_or(b).to_string()),
                "contains" => Ok(Value::Bool(b.contains(a.as_str()))),
                "hasPrefix" => Ok(Value::Bool(b.starts_with(a.as_str()))),
                _ => Ok(Value::Bool(b.ends_with(a.as_str()))),
            }
        }
        "replace" => {
            let s = strings(name, &args, 3)?;
            // Go's strings.Replace with an empty old string inserts between runes; rare.
            if s[0].is_empty() {
                return unknown(name);
            }
            v(s[2].replace(&s[0], &s[1]))
        }
        "toString" => {
            arity(name, &args, 1)?;
            v(sprig_strval(&args[0]))
        }
        "toJson" => {
            arity(name, &args, 1)?;
            let mut out = String::new();
            to_json(&args[0], &mut out);
            v(out)
        }
        "hasKey" => {
            arity(name, &args, 2)?;
            match (&args[0], &args[1]) {
                (Value::Map(m), Value::Str(k)) => Ok(Value::Bool(m.contains_key(k))),
                _ => unknown(name),
            }
        }
        "get" => {
            arity(name, &args, 2)?;
            match (&args[0], &args[1]) {
                (Value::Map(m), Value::Str(k)) => {
                    Ok(m.get(k).cloned().unwrap_or(Value::Str(String::new())))
                }
                _ => unknown(name),
            }
        }
        "dict" => {
            let mut m = BTreeMap::new();
            for pair in args.chunks(2) {
                let key = sprig_strval(&pair[0]);
                m.insert(
                    key,
                    pair.get(1).cloned().unwrap_or(Value::Str(String::new())),
                );
            }
            Ok(Value::Map(m))
        }
        "list" | "tuple" => Ok(Value::List(args)),
        "fail" => {
            let s = strings(name, &args, 1)?.remove(0);
            fail(format!("error calling fail: {s}"))
        }
        _ => unknown(name),
    }
}
