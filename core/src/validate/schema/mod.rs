//! The HelmOp CRD's own schema, checked offline: what the API server refuses before any webhook
//! runs, read from the CRD vendored in the repository (`vendor/fleet-crds`, Fleet v0.16.1), not
//! restated by hand. One home per rule: types, enums, formats, lengths, patterns, required
//! fields and the `x-kubernetes-validations` (CEL) rules are the CRD's and are checked here
//! only; the rest of [`super`] holds what helmop knows beyond the CRD (Fleet's controller and
//! agent, Helm, the API server's name rules).
//!
//! What the API server does to a HelmOp before it validates it, this does to a copy:
//! - fields the schema does not declare are pruned, not refused (a structural schema has no
//!   `additionalProperties: false`; `x-kubernetes-preserve-unknown-fields`, e.g. `helm.values`,
//!   keeps them). helmop's own rules still warn where a dropped field shows a mistake (a
//!   downstream resource's `namespace`);
//! - a `null` where the schema is not `nullable` is dropped, or replaced by the field's
//!   `default` (apiextensions' `PruneNonNullableNullsWithoutDefaults` and defaulting); a `null`
//!   list item is not dropped, and is refused;
//! - absent fields get their `default`;
//! - `status` is left out: with the status subresource, a create or update of the HelmOp itself
//!   does not write it;
//! - `metadata` is kept as it is: the API server checks it with ObjectMeta's rules, not the
//!   CRD's schema.
//!
//! The copy is then validated by the `jsonschema` crate against the schema converted to JSON
//! Schema draft 7 ([`convert`]). Two keywords are checked beside it, on the same copy: `pattern`,
//! a Go regexp the API server matches with Go's `regexp` (with [`crate::goregex`]; jsonschema
//! reads ECMA-262 patterns, whose classes and escapes mean other things), and the
//! `x-kubernetes-validations` rules, each evaluated by [`cel`] on the value it is attached to
//! unless some value has the wrong type (the API server skips them then too).
//!
//! The webhook does not run this: the API server has already applied the installed CRD's
//! schema to every object it sends for admission.

mod cel;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{Draft, JsonType, ValidationError};
use serde_json::{Map as JsonMap, Value as Json};

use super::{Finding, q};

/// The CRD whose schema is checked (`vendor/fleet-crds/SOURCE.md` says where it is from).
const CRD: &str = include_str!("../../../../vendor/fleet-crds/helmops.fleet.cattle.io.yaml");
/// The served version helmop writes (`crate::model::FLEET_API_VERSION`).
const VERSION: &str = "v1alpha1";

/// String formats checked, the way the API server's `strfmt` checks them. Others are dropped
/// from the converted schema (the CRD's `date-time` is only under `status`; `int32`/`int64`
/// are not string formats, and the API server does not check them on integers).
const FORMATS: &[&str] = &["byte"];

/// The CRD's schema, ready to check objects with.
struct Crd {
    /// The structural schema as the API server reads it before validating (pruning, nulls,
    /// defaults) and the CEL rules.
    root: Node,
    /// Its conversion to JSON Schema.
    validator: jsonschema::Validator,
}

/// One node of the structural schema: what pruning, null handling, defaulting and the CEL
/// rules need.
struct Node {
    nullable: bool,
    default: Option<Json>,
    preserve_unknown: bool,
    properties: BTreeMap<String, Node>,
    additional: Option<Box<Node>>,
    items: Option<Box<Node>>,
    /// `pattern`, as written and compiled with Go's meaning.
    pattern: Option<(String, regex::Regex)>,
    rules: Vec<cel::Rule>,
}

impl Node {
    fn build(raw: &Json) -> Result<Node, String> {
        let flag = |key: &str| raw.get(key) == Some(&Json::Bool(true));
        let child = |key: &str| -> Result<Option<Box<Node>>, String> {
            match raw.get(key) {
                Some(s @ Json::Object(_)) => Node::build(s).map(|n| Some(Box::new(n))),
                _ => Ok(None),
            }
        };
        let mut properties = BTreeMap::new();
        if let Some(props) = raw.get("properties").and_then(Json::as_object) {
            for (k, v) in props {
                properties.insert(k.clone(), Node::build(v)?);
            }
        }
        let rules = match raw.get("x-kubernetes-validations") {
            Some(Json::Array(entries)) => entries
                .iter()
                .map(cel::Rule::compile)
                .collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        let pattern = match raw.get("pattern").and_then(Json::as_str) {
            Some(p) => Some((p.to_string(), go_regex(p)?)),
            None => None,
        };
        Ok(Node {
            nullable: flag("nullable"),
            default: raw.get("default").cloned(),
            preserve_unknown: flag("x-kubernetes-preserve-unknown-fields"),
            properties,
            additional: child("additionalProperties")?,
            items: child("items")?,
            pattern,
            rules,
        })
    }

    /// The schema of field `key` of an object of this schema.
    fn field(&self, key: &str) -> Option<&Node> {
        self.properties.get(key).or(self.additional.as_deref())
    }

    /// The schema of the value at `at`.
    fn at(&self, at: &[Seg]) -> Option<&Node> {
        at.iter().try_fold(self, |node, seg| match seg {
            Seg::Key(k) => node.field(k),
            Seg::Index(_) => node.items.as_deref(),
        })
    }
}

fn loaded() -> Result<&'static Crd, &'static str> {
    static LOADED: OnceLock<Result<Crd, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| load(CRD))
        .as_ref()
        .map_err(String::as_str)
}

fn load(text: &str) -> Result<Crd, String> {
    let docs = crate::yaml::parse_documents(text.as_bytes()).map_err(|e| e.reason())?;
    let crd = docs
        .first()
        .map(|d| &d.value)
        .ok_or("the CRD file is empty")?;
    let raw = crd
        .pointer("/spec/versions")
        .and_then(Json::as_array)
        .and_then(|vs| vs.iter().find(|v| v["name"] == VERSION))
        .and_then(|v| v.pointer("/schema/openAPIV3Schema"))
        .ok_or_else(|| format!("the CRD has no openAPIV3Schema for {VERSION}"))?;
    let mut root = Node::build(raw)?;
    root.properties.remove("status");
    let mut schema = convert(raw);
    if let Some(props) = schema.get_mut("properties").and_then(Json::as_object_mut) {
        props.remove("status");
    }
    let validator = compile(&schema)?;
    Ok(Crd { root, validator })
}

/// A validator for the objects of another CRD: one version's `openAPIV3Schema` (or any node of
/// it), converted by `convert` and compiled the way the HelmOp schema is, for the places that
/// check other tools' objects against their vendored CRDs (the GitOps install examples' test) and
/// must not grow a second conversion. It checks the converted keywords only: no pruning, nulls or
/// defaults, Go `pattern`s or CEL rules, which this module applies to HelmOps alone.
pub fn crd_schema_validator(raw: &Json) -> Result<jsonschema::Validator, String> {
    compile(&convert(raw))
}

fn compile(schema: &Json) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_draft(Draft::Draft7)
        .should_validate_formats(true)
        .should_ignore_unknown_formats(true)
        .with_format("byte", is_go_base64)
        .build(schema)
        .map_err(|e| format!("the converted schema does not compile: {e}"))
}

/// A Go regexp as Go's `regexp.MatchString` matches it (anywhere in the value).
fn go_regex(pattern: &str) -> Result<regex::Regex, String> {
    let rust =
        crate::goregex::translate(pattern).map_err(|e| format!("pattern {pattern:?}: {e}"))?;
    regex::RegexBuilder::new(&rust)
        .size_limit(crate::goregex::COMPILED_SIZE_LIMIT)
        .build()
        .map_err(|e| format!("pattern {pattern:?}: {e}"))
}

/// A Kubernetes structural schema as JSON Schema draft 7: `nullable` becomes a `null` type (and
/// enum value), `x-kubernetes-int-or-string` the types integer and string, OpenAPI's boolean
/// `exclusiveMinimum`/`exclusiveMaximum` draft 7's numbers, `x-kubernetes-list-type: set`
/// `uniqueItems`; integers are bounded to int64, as the API server decodes a larger one as a
/// float it then refuses as an integer. `pattern` is left to [`Node`] (Go's regexps), and
/// annotations and the other `x-kubernetes-*` keys constrain nothing here.
fn convert(raw: &Json) -> Json {
    let Some(obj) = raw.as_object() else {
        // A boolean schema (additionalProperties: true) stays as it is.
        return raw.clone();
    };
    let mut out = JsonMap::new();
    let nullable = obj.get("nullable") == Some(&Json::Bool(true));
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Json::Bool(true));
    let mut types: Vec<&str> = if int_or_string {
        vec!["integer", "string"]
    } else {
        obj.get("type").and_then(Json::as_str).into_iter().collect()
    };
    let integer = types.contains(&"integer");
    if !types.is_empty() && nullable {
        types.push("null");
    }
    match types.as_slice() {
        [] => {}
        [one] => {
            out.insert("type".into(), (*one).into());
        }
        many => {
            out.insert("type".into(), many.into());
        }
    }
    for key in [
        "minimum",
        "maximum",
        "maxLength",
        "minLength",
        "maxItems",
        "minItems",
        "maxProperties",
        "minProperties",
        "multipleOf",
        "required",
    ] {
        if let Some(v) = obj.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    if integer {
        out.entry("minimum").or_insert(i64::MIN.into());
        out.entry("maximum").or_insert(i64::MAX.into());
    }
    for (flag, bound) in [
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ] {
        if obj.get(flag) == Some(&Json::Bool(true))
            && let Some(limit) = out.remove(bound)
        {
            out.insert(flag.into(), limit);
        }
    }
    if let Some(Json::Array(values)) = obj.get("enum") {
        let mut values = values.clone();
        if nullable {
            values.push(Json::Null);
        }
        out.insert("enum".into(), values.into());
    }
    if let Some(format) = obj.get("format").and_then(Json::as_str)
        && FORMATS.contains(&format)
    {
        out.insert("format".into(), format.into());
    }
    if obj.get("x-kubernetes-list-type").and_then(Json::as_str) == Some("set") {
        out.insert("uniqueItems".into(), true.into());
    }
    if let Some(props) = obj.get("properties").and_then(Json::as_object) {
        let mut converted = JsonMap::new();
        for (k, v) in props {
            converted.insert(k.clone(), convert(v));
        }
        out.insert("properties".into(), converted.into());
    }
    for key in ["additionalProperties", "items", "not"] {
        if let Some(sub) = obj.get(key) {
            out.insert(key.into(), convert(sub));
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Json::Array(subs)) = obj.get(key) {
            // `anyOf: [{type: integer}, {type: string}]` is how int-or-string is written beside
            // the extension: the types above say it once, and with a message naming both.
            let only_types = subs
                .iter()
                .all(|s| s.as_object().is_some_and(|o| o.keys().all(|k| k == "type")));
            if key == "anyOf" && int_or_string && only_types {
                continue;
            }
            let converted: Vec<Json> = subs.iter().map(convert).collect();
            out.insert(key.into(), converted.into());
        }
    }
    out.into()
}

/// The API server's `byte` format: Go's `base64.StdEncoding.DecodeString` succeeds, which needs
/// the padding, skips line breaks and (not being `Strict`) accepts non-zero trailing bits.
fn is_go_base64(s: &str) -> bool {
    const GO_STD: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
    );
    let kept: Vec<u8> = s.bytes().filter(|b| !matches!(b, b'\r' | b'\n')).collect();
    GO_STD.decode(kept).is_ok()
}

/// What the API server would store for `value` under `node` before validating it: unknown
/// fields pruned, non-nullable nulls dropped or defaulted, defaults filled in. Values of the
/// wrong type are left for the validator to report.
fn normalize(value: &mut Json, node: &Node) {
    match value {
        Json::Object(map) => {
            for (k, child) in &node.properties {
                if let Some(d) = &child.default
                    && !map.contains_key(k)
                {
                    map.insert(k.clone(), d.clone());
                }
            }
            map.retain(|k, v| {
                let Some(child) = node.field(k) else {
                    return node.preserve_unknown;
                };
                if v.is_null() && !child.nullable {
                    match &child.default {
                        Some(d) => *v = d.clone(),
                        None => return false,
                    }
                }
                normalize(v, child);
                true
            });
        }
        Json::Array(items) => {
            if let Some(child) = &node.items {
                for item in items {
                    normalize(item, child);
                }
            }
        }
        _ => {}
    }
}

/// The API server's schema checks on `obj` (a HelmOp), each refusal a denial at its path. A
/// non-object is left to the caller.
pub(crate) fn check(obj: &Json) -> Vec<Finding> {
    let Json::Object(map) = obj else {
        return Vec::new();
    };
    let crd = match loaded() {
        Ok(crd) => crd,
        Err(e) => {
            return vec![Finding::warn(
                "",
                format!(
                    "the HelmOp CRD's schema cannot be read ({e}): types, enums, formats and the CRD's rules were not checked"
                ),
            )];
        }
    };
    let mut copy = map.clone();
    copy.remove("status");
    let metadata = copy.remove("metadata").filter(|m| !m.is_null());
    let mut copy = Json::Object(copy);
    normalize(&mut copy, &crd.root);
    if let (Some(metadata), Json::Object(c)) = (metadata, &mut copy) {
        c.insert("metadata".into(), metadata);
    }

    let mut out = Vec::new();
    let mut wrong_type = false;
    for e in crd.validator.iter_errors(&copy) {
        wrong_type |= matches!(e.kind(), ValidationErrorKind::Type { .. });
        out.push(finding(&e, &copy, crd));
    }
    // The API server skips the CEL rules when a value has the wrong type.
    walk(&copy, &crd.root, !wrong_type, &mut Vec::new(), &mut out);
    out
}

/// A step of a path: a field or a list index.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// `spec.targets[0].helm`, as validate's other findings name places.
fn render(at: &[Seg]) -> String {
    let mut out = String::new();
    for seg in at {
        match seg {
            Seg::Key(k) if out.is_empty() => out.push_str(k),
            Seg::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Seg::Index(i) => {
                let _ = write!(out, "[{i}]");
            }
        }
    }
    out
}

/// The JSON pointer `pointer` into `root` as steps; a number is an index only where the value
/// is a list (a label key may be `"0"`).
fn segments(pointer: &str, root: &Json) -> Vec<Seg> {
    let mut out = Vec::new();
    let mut cur = Some(root);
    for raw in pointer.split('/').skip(1) {
        let key = raw.replace("~1", "/").replace("~0", "~");
        if let Some(Json::Array(items)) = cur
            && let Ok(i) = key.parse::<usize>()
        {
            cur = items.get(i);
            out.push(Seg::Index(i));
            continue;
        }
        cur = cur.and_then(|c| c.get(&key));
        out.push(Seg::Key(key));
    }
    out
}

/// What a message calls the value at `at`: its field (`chart`), or list and index (`targets[0]`).
fn subject(at: &[Seg]) -> String {
    let start = at
        .iter()
        .rposition(|s| matches!(s, Seg::Key(_)))
        .unwrap_or(0);
    match render(&at[start..]) {
        s if s.is_empty() => "the object".to_string(),
        s => s,
    }
}

fn type_name(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

fn expected(kind: &TypeKind) -> String {
    let types: Vec<JsonType> = match kind {
        TypeKind::Single(t) => vec![*t],
        TypeKind::Multiple(set) => set.into_iter().collect(),
    };
    let names: Vec<&str> = types
        .iter()
        .filter_map(|t| match t {
            JsonType::Null => None,
            JsonType::Boolean => Some("true or false"),
            JsonType::Integer => Some("an integer"),
            JsonType::Number => Some("a number"),
            JsonType::String => Some("a string"),
            JsonType::Array => Some("a list"),
            JsonType::Object => Some("an object"),
        })
        .collect();
    names.join(" or ")
}

/// A value for a message: strings quoted (and cut), the rest as JSON.
fn shown(v: &Json) -> String {
    match v {
        Json::String(s) => q(s),
        other => {
            let text = other.to_string();
            if text.chars().count() > 64 {
                type_name(other).to_string()
            } else {
                text
            }
        }
    }
}

/// For a refused `""`: the API server takes an empty string as a value, not as the field left
/// out (YAML writes `field:` with nothing after it as null, which is).
fn empty_hint(v: &Json, node: Option<&Node>) -> String {
    if v.as_str() != Some("") {
        return String::new();
    }
    match node.and_then(|n| n.default.as_ref()) {
        Some(d) => format!(
            ": an empty string is a value, not the field left out; remove the field to get the default {}",
            shown(d)
        ),
        None => ": an empty string is a value, not the field left out; remove the field".into(),
    }
}

fn one_of(options: &Json) -> String {
    let names: Vec<String> = options
        .as_array()
        .map(|a| a.iter().filter(|v| !v.is_null()).map(shown).collect())
        .unwrap_or_default();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => "any allowed value".into(),
    }
}

fn finding(e: &ValidationError<'_>, root: &Json, crd: &Crd) -> Finding {
    let at = segments(e.instance_path().as_str(), root);
    let v: &Json = e.instance();
    let name = subject(&at);
    let node = crd.root.at(&at);
    let message = match e.kind() {
        ValidationErrorKind::Type { kind } => {
            let expected = expected(kind);
            // YAML reads `version: 1.2` or `name: true` as a number or a boolean.
            let hint = match v {
                Json::Number(_) | Json::Bool(_) if expected == "a string" => ": quote it",
                _ => "",
            };
            format!("{name} must be {expected}, not {}{hint}", type_name(v))
        }
        ValidationErrorKind::Enum { options } => format!(
            "{name} {} is not {}{}",
            shown(v),
            one_of(options),
            empty_hint(v, node)
        ),
        ValidationErrorKind::Format { format } if format == "byte" => format!(
            "{name} is not base64 (the CRD's format byte): encode the data, e.g. with base64 -w0"
        ),
        ValidationErrorKind::Format { format } => format!("{name} is not a valid {format}"),
        ValidationErrorKind::MaxLength { limit } => format!(
            "{name} is {} characters long, more than the {limit} the CRD allows",
            v.as_str().map_or(0, |s| s.chars().count())
        ),
        ValidationErrorKind::MinLength { limit } => format!(
            "{name} must be at least {limit} {} long{}",
            if *limit == 1 {
                "character"
            } else {
                "characters"
            },
            empty_hint(v, node)
        ),
        ValidationErrorKind::Required { property } => {
            let property = property.as_str().unwrap_or_default();
            let mut at = at.clone();
            at.push(Seg::Key(property.to_string()));
            return Finding::deny(
                render(&at),
                format!("{property} is missing: the CRD requires it"),
            );
        }
        ValidationErrorKind::Maximum { limit } => {
            format!(
                "{name} {} is more than {limit}, the most the API server takes",
                shown(v)
            )
        }
        ValidationErrorKind::Minimum { limit } => {
            format!(
                "{name} {} is less than {limit}, the least the API server takes",
                shown(v)
            )
        }
        ValidationErrorKind::MaxItems { limit } => {
            format!("{name} has more than the {limit} items the CRD allows")
        }
        ValidationErrorKind::MinItems { limit } => {
            format!("{name} needs at least {limit} items")
        }
        ValidationErrorKind::UniqueItems => format!("{name} lists an item twice"),
        _ => format!("{name}: {}", e.to_string().to_lowercase()),
    };
    Finding::deny(render(&at), message)
}

/// Checks every string against its Go `pattern`, and (with `rules`) evaluates every CEL rule
/// whose value is present (the API server skips them on null).
fn walk(value: &Json, node: &Node, rules: bool, at: &mut Vec<Seg>, out: &mut Vec<Finding>) {
    if let (Some((pattern, re)), Json::String(s)) = (&node.pattern, value)
        && !re.is_match(s)
    {
        out.push(Finding::deny(
            render(at),
            format!(
                "{} {} does not match the CRD's pattern {pattern}{}",
                subject(at),
                q(s),
                empty_hint(value, Some(node))
            ),
        ));
    }
    if value.is_null() || !rules {
        return walk_children(value, node, rules, at, out);
    }
    for rule in &node.rules {
        let Some(failure) = rule.check(value) else {
            continue;
        };
        let name = subject(at);
        let value = match value {
            Json::Object(_) | Json::Array(_) => String::new(),
            scalar => format!(" {}", shown(scalar)),
        };
        let message = match failure {
            cel::Failure::False => format!("{name}{value}: {}", rule.message),
            cel::Failure::Error(e) => format!(
                "{name}{value}: {} (the CRD's rule {} fails on it: {e})",
                rule.message, rule.source
            ),
        };
        out.push(Finding::deny(render(at), message));
    }
    walk_children(value, node, rules, at, out);
}

fn walk_children(
    value: &Json,
    node: &Node,
    rules: bool,
    at: &mut Vec<Seg>,
    out: &mut Vec<Finding>,
) {
    match value {
        Json::Object(map) => {
            for (k, v) in map {
                if let Some(child) = node.field(k) {
                    at.push(Seg::Key(k.clone()));
                    walk(v, child, rules, at, out);
                    at.pop();
                }
            }
        }
        Json::Array(items) => {
            if let Some(child) = &node.items {
                for (i, v) in items.iter().enumerate() {
                    at.push(Seg::Index(i));
                    walk(v, child, rules, at, out);
                    at.pop();
                }
            }
        }
        _ => {}
    }
}

/// Every `x-kubernetes-validations` rule of the vendored CRD, with where it is and why it is not
/// evaluated offline (if it is not): the tests keep this list fully evaluated.
#[cfg(test)]
fn rules() -> Vec<(String, String, Result<(), String>)> {
    fn walk(node: &Node, at: &mut Vec<Seg>, out: &mut Vec<(String, String, Result<(), String>)>) {
        for rule in &node.rules {
            out.push((
                render(at),
                rule.source.clone(),
                rule.offline().map_err(str::to_string),
            ));
        }
        for (k, child) in &node.properties {
            at.push(Seg::Key(k.clone()));
            walk(child, at, out);
            at.pop();
        }
        if let Some(child) = &node.additional {
            at.push(Seg::Key("*".into()));
            walk(child, at, out);
            at.pop();
        }
        if let Some(child) = &node.items {
            at.push(Seg::Index(0));
            walk(child, at, out);
            at.pop();
        }
    }
    let mut out = Vec::new();
    if let Ok(crd) = loaded() {
        walk(&crd.root, &mut Vec::new(), &mut out);
    }
    out
}
