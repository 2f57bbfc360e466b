//! Offline HelmOp validation: every admission rule that needs no cluster.
//!
//! Works on the raw JSON object (not on [`crate::model::HelmOp`]) so that a wrong type, e.g.
//! `downstreamResources: "x"`, becomes a finding with a path instead of a deserialization error,
//! and so that one pass can list every problem. The webhook (admission), `kubectl helmop
//! validate` and any later existence check share these functions.

pub mod fleet;
mod helm;
mod missing;
mod model;
mod resources;
pub mod semver;
mod spec;
mod targets;

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::resource::ResourceRef;

pub use missing::{allows_missing, missing_reference_finding};

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

/// Validates a HelmOp object; the source namespace is taken from `metadata.namespace`.
pub fn validate_helmop(obj: &Value) -> Vec<Finding> {
    let namespace = obj
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .filter(|ns| !ns.is_empty());
    validate_helmop_in(obj, namespace)
}

/// Validates a HelmOp object living in `namespace` (on admission the object's own
/// `metadata.namespace` may still be empty; the request's namespace is authoritative).
/// No rule depends on the namespace any more (the valuesFrom rule compared with it until it
/// turned out Fleet reads valuesFrom downstream, see `resources::check_values_from`); callers
/// keep passing it so a rule that needs it does not change their signature.
pub fn validate_helmop_in(obj: &Value, _namespace: Option<&str>) -> Vec<Finding> {
    let mut cx = Ctx {
        findings: Vec::new(),
    };
    let Some(obj) = obj.as_object() else {
        cx.deny(
            "",
            format!("a HelmOp must be an object, not {}", type_name(obj)),
        );
        return cx.findings;
    };
    let spec = match obj.get("spec") {
        None | Some(Value::Null) => {
            cx.deny(
                "spec",
                "spec is missing: a HelmOp needs at least spec.helm with the chart to deploy",
            );
            return cx.findings;
        }
        Some(Value::Object(spec)) => spec,
        Some(other) => {
            cx.deny(
                "spec",
                format!("spec must be an object, not {}", type_name(other)),
            );
            return cx.findings;
        }
    };
    let model = spec::check_spec(&mut cx, spec);
    resources::check_cross_references(&mut cx, &model);
    cx.findings
}

/// Every well-formed `downstreamResources` reference (valid kind, valid name), root and per
/// target, with the JSON path of its entry, in document order. Malformed entries are left to
/// [`validate_helmop`]; this is what existence checks look up.
pub fn downstream_refs(obj: &Value) -> Vec<(String, ResourceRef)> {
    let Some(spec) = obj.get("spec").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut out: Vec<(String, ResourceRef)> =
        resources::well_formed_entries(spec.get("downstreamResources"), "spec.downstreamResources")
            .into_iter()
            .map(|e| (e.path, e.reference))
            .collect();
    if let Some(targets) = spec.get("targets").and_then(Value::as_array) {
        for (i, target) in targets.iter().enumerate() {
            let base = format!("spec.targets[{i}].downstreamResources");
            out.extend(
                resources::well_formed_entries(target.get("downstreamResources"), &base)
                    .into_iter()
                    .map(|e| (e.path, e.reference)),
            );
        }
    }
    out
}

/// Shared state of one validation pass.
pub(crate) struct Ctx {
    pub findings: Vec<Finding>,
}

impl Ctx {
    pub fn deny(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.findings.push(Finding::deny(path, message));
    }

    pub fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.findings.push(Finding::warn(path, message));
    }

    /// A string field: `Some("")` stays distinguishable from absent; `null` counts as absent
    /// (every string field of the CRD is nullable). A wrong type is denied.
    pub fn string<'v>(
        &mut self,
        obj: &'v Map<String, Value>,
        key: &str,
        base: &str,
    ) -> Option<&'v str> {
        match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                // YAML reads `version: 1.2` or `name: true` as a number or boolean.
                let hint = if other.is_number() || other.is_boolean() {
                    ": quote it"
                } else {
                    ""
                };
                self.deny(
                    join(base, key),
                    format!("{key} must be a string, not {}{hint}", type_name(other)),
                );
                None
            }
        }
    }

    /// A boolean field; a wrong type is denied.
    pub fn boolean(&mut self, obj: &Map<String, Value>, key: &str, base: &str) -> Option<bool> {
        match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                self.deny(
                    join(base, key),
                    format!("{key} must be true or false, not {}", type_name(other)),
                );
                None
            }
        }
    }

    /// An object field; a wrong type is denied.
    pub fn object<'v>(
        &mut self,
        obj: &'v Map<String, Value>,
        key: &str,
        base: &str,
    ) -> Option<&'v Map<String, Value>> {
        match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(other) => {
                self.deny(
                    join(base, key),
                    format!("{key} must be an object, not {}", type_name(other)),
                );
                None
            }
        }
    }

    /// An array field; a wrong type is denied.
    pub fn array<'v>(
        &mut self,
        obj: &'v Map<String, Value>,
        key: &str,
        base: &str,
    ) -> Option<&'v [Value]> {
        match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => Some(a),
            Some(other) => {
                self.deny(
                    join(base, key),
                    format!("{key} must be a list, not {}", type_name(other)),
                );
                None
            }
        }
    }
}

/// `base.key` (or `key` at the root).
pub(crate) fn join(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_string()
    } else {
        format!("{base}.{key}")
    }
}

/// `base[i]`.
pub(crate) fn index(base: &str, i: usize) -> String {
    format!("{base}[{i}]")
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

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
