//! The YAML text Fleet templates: `sigs.k8s.io/yaml.Marshal` of the helm values (yaml.v2
//! block style, keys sorted, sequences not indented under their key), approximated: plain
//! scalars where yaml.v2 writes them plain, else single or double quotes, multi-line strings
//! as literal blocks. yaml.v2 also folds plain scalars longer than 80 columns; we do not.

use std::fmt::Write as _;

use super::value::go_float;

/// Most nesting we write; deeper values are cut off by the caller's depth check first.
const MAX_DEPTH: usize = 512;

/// The values as YAML text; `None` past `MAX_DEPTH`.
pub fn to_yaml(v: &serde_json::Value) -> Option<String> {
    let mut out = String::new();
    match v {
        serde_json::Value::Object(m) if m.is_empty() => out.push_str("{}\n"),
        serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
            block(v, 0, &mut out, 0)?;
        }
        other => {
            out.push_str(&scalar(other, 0));
            out.push('\n');
        }
    }
    Some(out)
}

fn block(v: &serde_json::Value, indent: usize, out: &mut String, depth: usize) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    let pad = " ".repeat(indent);
    match v {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 || !out.ends_with("- ") {
                    out.push_str(&pad);
                }
                out.push_str(&string(k, indent));
                out.push(':');
                let x = &m[k];
                match x {
                    serde_json::Value::Object(o) if !o.is_empty() => {
                        out.push('\n');
                        block(x, indent + 2, out, depth + 1)?;
                    }
                    serde_json::Value::Array(a) if !a.is_empty() => {
                        out.push('\n');
                        block(x, indent, out, depth + 1)?;
                    }
                    _ => {
                        out.push(' ');
                        out.push_str(&scalar(x, indent + 2));
                        out.push('\n');
                    }
                }
            }
        }
        serde_json::Value::Array(a) => {
            for x in a {
                out.push_str(&pad);
                out.push_str("- ");
                match x {
                    serde_json::Value::Object(o) if !o.is_empty() => {
                        block(x, indent + 2, out, depth + 1)?;
                    }
                    serde_json::Value::Array(inner) if !inner.is_empty() => {
                        // yaml.v2 writes a nested sequence on the next line.
                        out.push('\n');
                        block(x, indent + 2, out, depth + 1)?;
                    }
                    _ => {
                        out.push_str(&scalar(x, indent + 2));
                        out.push('\n');
                    }
                }
            }
        }
        other => {
            out.push_str(&pad);
            out.push_str(&scalar(other, indent));
            out.push('\n');
        }
    }
    Some(())
}

fn scalar(v: &serde_json::Value, indent: usize) -> String {
    match v {
        serde_json::Value::Null => "null".into(),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => i.to_string(),
            None => n
                .as_u64()
                .map(|u| u.to_string())
                .unwrap_or_else(|| go_float(n.as_f64().unwrap_or(0.0))),
        },
        serde_json::Value::String(s) => string(s, indent),
        serde_json::Value::Object(_) => "{}".into(),
        serde_json::Value::Array(_) => "[]".into(),
    }
}

/// Whether YAML 1.1 (yaml.v2's resolver) reads `s` as something other than a string.
fn resolves_to_non_string(s: &str) -> bool {
    const WORDS: &[&str] = &[
        "", "~", "null", "Null", "NULL", "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO",
        "true", "True", "TRUE", "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF",
        ".inf", ".Inf", ".INF", "-.inf", "-.Inf", "-.INF", "+.inf", ".nan", ".NaN", ".NAN", "<<",
    ];
    if WORDS.contains(&s) {
        return true;
    }
    let t = s.trim_start_matches(['+', '-']).replace('_', "");
    !t.is_empty()
        && (t.parse::<f64>().is_ok()
            && t.chars().all(|c| c.is_ascii_digit() || ".eE+-".contains(c))
            || t.strip_prefix("0x")
                .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
            || t.strip_prefix("0b")
                .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c == '0' || c == '1')))
}

fn plain_allowed(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if s.starts_with(' ') || s.ends_with(' ') || s.starts_with("---") || s.starts_with("...") {
        return false;
    }
    if "#,[]{}&*!|>'\"%@`".contains(first) {
        return false;
    }
    let second = s.chars().nth(1);
    if "-?:".contains(first) && second.is_none_or(|c| c == ' ') {
        return false;
    }
    if s.contains(": ") || s.ends_with(':') || s.contains(" #") || s.contains('\t') {
        return false;
    }
    s.chars().all(|c| !c.is_control() && c != '\u{feff}')
}

fn string(s: &str, indent: usize) -> String {
    if s.contains('\n') && s.chars().all(|c| c == '\n' || !c.is_control()) && !s.contains(" \n") {
        let chomp = if !s.ends_with('\n') {
            "-"
        } else if s.ends_with("\n\n") {
            "+"
        } else {
            ""
        };
        let pad = " ".repeat(indent.max(2));
        let lead = if s.starts_with(' ') { "2" } else { "" };
        let mut out = format!("|{lead}{chomp}");
        for line in s.strip_suffix('\n').unwrap_or(s).split('\n') {
            out.push('\n');
            if !line.is_empty() {
                out.push_str(&pad);
                out.push_str(line);
            }
        }
        return out;
    }
    if resolves_to_non_string(s) {
        return double(s);
    }
    if plain_allowed(s) {
        return s.to_string();
    }
    if s.chars().all(|c| !c.is_control()) {
        return format!("'{}'", s.replace('\'', "''"));
    }
    double(s)
}

fn double(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
