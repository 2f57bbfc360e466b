//! Offline HelmOp validation: every admission rule that needs no cluster.
//!
//! Two homes, one per kind of rule: `schema` checks what the CRD itself says (types, enums,
//! formats, lengths, patterns, its CEL rules), read from the vendored CRD; the rest of this
//! module checks what helmop knows beyond the CRD (Fleet's controller and agent, Helm, name
//! rules). `kubectl helmop validate` runs both ([`validate_helmop`]); the webhook runs only the
//! second ([`check_helmop`]), since the API server has applied the CRD's schema before any
//! admission webhook sees the object.
//!
//! Works on the raw JSON object (not on [`crate::model::HelmOp`]) so that a wrong type, e.g.
//! `downstreamResources: "x"`, is skipped by the rules here (and reported by the schema check)
//! instead of failing deserialization, and so that one pass can list every problem. The webhook
//! (admission), `kubectl helmop validate` and any later existence check share these functions.

mod error;
pub mod fleet;
mod helm;
mod missing;
mod model;
mod resources;
mod schema;
pub mod semver;
mod spec;
mod targets;

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::resource::ResourceRef;

pub use error::Error;
pub use missing::missing_reference_finding;
pub use schema::crd_schema_validator;

/// How bad a finding is: `Deny` rejects the HelmOp, `Warn` lets it through with a warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Deny,
    Warn,
}

impl Severity {
    pub fn as_str(&self) -> &'static str {
        match self {
            Severity::Deny => "deny",
            Severity::Warn => "warn",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem: where it is (`spec.targets[1].downstreamResources[0].kind`) and what to do.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Finding {
    pub severity: Severity,
    pub path: String,
    pub message: String,
}

impl Finding {
    pub fn deny(path: impl Into<String>, message: impl Into<String>) -> Self {
        Finding {
            severity: Severity::Deny,
            path: path.into(),
            message: message.into(),
        }
    }

    pub fn warn(path: impl Into<String>, message: impl Into<String>) -> Self {
        Finding {
            severity: Severity::Warn,
            path: path.into(),
            message: message.into(),
        }
    }

    pub fn is_deny(&self) -> bool {
        self.severity == Severity::Deny
    }
}

impl fmt::Display for Finding {
    /// `spec.helm.chart: message` (the path is left out when it is the whole object).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// True if any finding denies.
pub fn has_denials(findings: &[Finding]) -> bool {
    findings.iter().any(Finding::is_deny)
}

/// A [`JsonView`] together with the text it borrows from.
pub use serde_json_borrow::OwnedValue;
/// A borrowed JSON tree: strings and keys point into the text it was parsed from, objects are
/// vectors of entries. The webhook parses an admission review's object straight into it; one
/// `serde_json::Value` tree per review (a `String` per key and value, a map node per object)
/// cost more than every rule together.
pub use serde_json_borrow::Value as JsonView;

type Map<'a> = serde_json_borrow::ObjectAsVec<'a>;

/// A HelmOp as the rules read it: a [`JsonView`] (the webhook's), or one made from a
/// `serde_json::Value` (the plugin's, which reads YAML), borrowing its strings.
pub enum Doc<'a> {
    Borrowed(&'a JsonView<'a>),
    Converted(JsonView<'a>),
}

impl<'a> std::ops::Deref for Doc<'a> {
    type Target = JsonView<'a>;

    fn deref(&self) -> &JsonView<'a> {
        match self {
            Doc::Borrowed(v) => v,
            Doc::Converted(v) => v,
        }
    }
}

impl<'a, 'b: 'a> From<&'a JsonView<'b>> for Doc<'a> {
    fn from(v: &'a JsonView<'b>) -> Self {
        Doc::Borrowed(v)
    }
}

impl<'a> From<&'a Value> for Doc<'a> {
    fn from(v: &'a Value) -> Self {
        Doc::Converted(JsonView::from(v))
    }
}

/// Validates a HelmOp object offline, as the API server and then the webhook would: first the
/// CRD's schema (module `schema`), then helmop's rules; the source namespace is taken from
/// `metadata.namespace`.
pub fn validate_helmop(obj: &Value) -> Vec<Finding> {
    let mut findings = schema::check(obj);
    let doc = Doc::from(obj);
    let namespace = field_of(&doc, "metadata")
        .and_then(|m| field_of(m, "namespace"))
        .and_then(JsonView::as_str)
        .filter(|ns| !ns.is_empty());
    findings.extend(check_helmop(&*doc, namespace).findings);
    findings
}

/// Validates a HelmOp object living in `namespace` (on admission the object's own
/// `metadata.namespace` may still be empty; the request's namespace is authoritative).
/// No rule depends on the namespace any more (the valuesFrom rule compared with it until it
/// turned out Fleet reads valuesFrom downstream, see `resources::check_values_from`); callers
/// keep passing it so a rule that needs it does not change their signature.
pub fn validate_helmop_in<'a>(obj: impl Into<Doc<'a>>, namespace: Option<&str>) -> Vec<Finding> {
    check_helmop(&*obj.into(), namespace).findings
}

/// What one validation pass found: the findings, and the well-formed `downstreamResources`
/// references (what [`downstream_refs`] lists) with where each is, rendered only when asked.
#[derive(Debug)]
pub struct Checked {
    pub findings: Vec<Finding>,
    pub references: Vec<(EntryPath, ResourceRef)>,
}

/// [`validate_helmop_in`] and [`downstream_refs`] in one pass over the object.
pub fn check_helmop<'a>(obj: impl Into<Doc<'a>>, _namespace: Option<&str>) -> Checked {
    let obj = obj.into();
    let mut cx = Ctx {
        findings: Vec::new(),
    };
    let root = Path::Root;
    let Some(obj) = obj.as_object() else {
        cx.deny(
            &root,
            format!("a HelmOp must be an object, not {}", type_name(&obj)),
        );
        return cx.done(Vec::new());
    };
    let spec_path = root.key("spec");
    let spec = match field(obj, "spec") {
        None | Some(JsonView::Null) => {
            cx.deny(
                &spec_path,
                "spec is missing: a HelmOp needs at least spec.helm with the chart to deploy",
            );
            return cx.done(Vec::new());
        }
        Some(JsonView::Object(spec)) => spec,
        // A wrong type is the CRD's to report (schema.rs).
        Some(_) => return cx.done(Vec::new()),
    };
    let model = spec::check_spec(&mut cx, spec);
    resources::check_cross_references(&mut cx, &model);
    check_bundle_labels(&mut cx, obj, spec);
    let references = model
        .root_entries
        .into_iter()
        .chain(model.targets.into_iter().flat_map(|t| t.entries))
        .map(|e| (e.at, e.reference))
        .collect();
    cx.done(references)
}

/// The labels Fleet would write on the HelmOp's Bundle: its name and `spec.labels` (strings, by
/// the CRD) must all be labels the API server takes ([`fleet::bundle_label_problems`]).
fn check_bundle_labels(cx: &mut Ctx, obj: &Map<'_>, spec: &Map<'_>) {
    let name = field(obj, "metadata")
        .and_then(|m| field_of(m, "name"))
        .and_then(JsonView::as_str)
        .filter(|n| !n.is_empty());
    let mut labels = Vec::new();
    if let Some(map) = object(spec, "labels") {
        for (k, _) in sorted_entries(map) {
            if let Some(v) = string(map, k) {
                labels.push((k, v));
            }
        }
    }
    for (path, message) in fleet::bundle_label_problems(name, labels) {
        cx.deny(&path, message);
    }
}

/// Every well-formed `downstreamResources` reference (valid kind, valid name), root and per
/// target, with the JSON path of its entry, in document order. Malformed entries are left to
/// [`validate_helmop`]; this is what existence checks look up.
pub fn downstream_refs<'a>(obj: impl Into<Doc<'a>>) -> Vec<(String, ResourceRef)> {
    let obj = obj.into();
    let Some(spec) = field_of(&obj, "spec").and_then(JsonView::as_object) else {
        return Vec::new();
    };
    let mut out: Vec<(String, ResourceRef)> =
        resources::well_formed_entries(field(spec, "downstreamResources"), None)
            .into_iter()
            .map(|e| (e.at.to_string(), e.reference))
            .collect();
    if let Some(targets) = field(spec, "targets").and_then(JsonView::as_array) {
        for (i, target) in targets.iter().enumerate() {
            out.extend(
                resources::well_formed_entries(field_of(target, "downstreamResources"), Some(i))
                    .into_iter()
                    .map(|e| (e.at.to_string(), e.reference)),
            );
        }
    }
    out
}

/// Where a `downstreamResources` entry is: `spec.downstreamResources[index]`, or
/// `spec.targets[target].downstreamResources[index]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryPath {
    pub target: Option<usize>,
    pub index: usize,
}

impl fmt::Display for EntryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = Path::Root.key("spec");
        match self.target {
            None => spec.key("downstreamResources").index(self.index).fmt(f),
            Some(t) => {
                let target = spec.key("targets");
                let target = target.index(t);
                target.key("downstreamResources").index(self.index).fmt(f)
            }
        }
    }
}

/// Where a value is in the HelmOp (`spec.targets[1].helm.chart`), as a chain of borrowed
/// segments: a finding renders it; a clean HelmOp never formats a path.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Path<'p> {
    /// The whole object (rendered empty).
    Root,
    Key(&'p Path<'p>, &'p str),
    Index(&'p Path<'p>, usize),
}

impl<'p> Path<'p> {
    /// `self.key` (or `key` at the root).
    pub fn key<'q>(&'q self, key: &'q str) -> Path<'q> {
        Path::Key(self, key)
    }

    /// `self[i]`.
    pub fn index(&self, i: usize) -> Path<'_> {
        Path::Index(self, i)
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// The value of `key`; of duplicated keys the last, as `serde_json::Map` keeps it.
pub(crate) fn field<'m, 'a>(map: &'m Map<'a>, key: &str) -> Option<&'m JsonView<'a>> {
    map.as_vec()
        .iter()
        .rev()
        .find_map(|(k, v)| (&**k == key).then_some(v))
}

/// [`field`] of `value` when it is an object.
pub(crate) fn field_of<'m, 'a>(value: &'m JsonView<'a>, key: &str) -> Option<&'m JsonView<'a>> {
    value.as_object().and_then(|m| field(m, key))
}

/// The entries of `map` in key order, each key once (the last value): the order in which a
/// `serde_json::Map` lists them, so findings come in the same order whatever the input's order.
pub(crate) fn sorted_entries<'m, 'a>(map: &'m Map<'a>) -> Vec<(&'m str, &'m JsonView<'a>)> {
    let mut entries: Vec<(&str, &JsonView<'a>)> =
        map.as_vec().iter().map(|(k, v)| (&**k, v)).collect();
    // Stable: of equal keys the last stays last, and `dedup_by` keeps the first of a run.
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries.reverse();
    entries.dedup_by(|a, b| a.0 == b.0);
    entries.reverse();
    entries
}

/// Whether two JSON trees are the same document, as two `serde_json::Value`s of them would compare:
/// keys in any order, of a repeated key the last value. O(n log n) in the entries, with no copy of
/// the trees (an UPDATE's "spec unchanged" test must not double the review's memory).
pub fn same_json(a: &JsonView<'_>, b: &JsonView<'_>) -> bool {
    match (a, b) {
        (JsonView::Object(x), JsonView::Object(y)) => {
            let (x, y) = (sorted_entries(x), sorted_entries(y));
            x.len() == y.len()
                && x.iter()
                    .zip(&y)
                    .all(|((kx, vx), (ky, vy))| kx == ky && same_json(vx, vy))
        }
        (JsonView::Array(x), JsonView::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(vx, vy)| same_json(vx, vy))
        }
        _ => a == b,
    }
}

/// True when the HelmOp carries `helmop.dev/allow-missing: "true"` (exactly that value, as for
/// every boolean annotation Kubernetes reads): missing downstream resources then warn instead
/// of deny, for sources created later (e.g. by External Secrets).
pub fn allows_missing<'a>(helmop: impl Into<Doc<'a>>) -> bool {
    missing::allows_missing(&helmop.into())
}

/// Shared state of one validation pass.
pub(crate) struct Ctx {
    pub findings: Vec<Finding>,
}

impl Ctx {
    fn done(self, references: Vec<(EntryPath, ResourceRef)>) -> Checked {
        Checked {
            findings: self.findings,
            references,
        }
    }

    pub fn deny(&mut self, path: &impl fmt::Display, message: impl Into<String>) {
        self.findings.push(Finding::deny(path.to_string(), message));
    }

    pub fn warn(&mut self, path: &impl fmt::Display, message: impl Into<String>) {
        self.findings.push(Finding::warn(path.to_string(), message));
    }
}

// The typed getters below read a field for the rules here. A value of the wrong type is
// skipped, not reported: types are the CRD's rule, reported by [`schema`] offline and enforced
// by the API server before admission. `null` counts as absent (the API server drops a null
// where the schema is not nullable, and every field read here either is or has no default).

/// A string field: `Some("")` stays distinguishable from absent.
pub(crate) fn string<'v>(obj: &'v Map<'_>, key: &str) -> Option<&'v str> {
    match field(obj, key) {
        Some(JsonView::Str(s)) => Some(s),
        _ => None,
    }
}

/// An object field.
pub(crate) fn object<'v, 'a>(obj: &'v Map<'a>, key: &str) -> Option<&'v Map<'a>> {
    match field(obj, key) {
        Some(JsonView::Object(m)) => Some(m),
        _ => None,
    }
}

/// A list field.
pub(crate) fn array<'v, 'a>(obj: &'v Map<'a>, key: &str) -> Option<&'v [JsonView<'a>]> {
    match field(obj, key) {
        Some(JsonView::Array(a)) => Some(a),
        _ => None,
    }
}

/// `s` quoted for a message, cut short if long (users paste huge values by mistake).
pub(crate) fn q(s: &str) -> String {
    const MAX: usize = 64;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}... ({} characters)", s.chars().count())
    }
}

pub(crate) fn type_name(v: &JsonView<'_>) -> &'static str {
    match v {
        JsonView::Null => "null",
        JsonView::Bool(_) => "a boolean",
        JsonView::Number(_) => "a number",
        JsonView::Str(_) => "a string",
        JsonView::Array(_) => "a list",
        JsonView::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
