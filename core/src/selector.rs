//! Kubernetes label selectors (`matchLabels` + `matchExpressions`), with the exact semantics of
//! apimachinery's `LabelSelectorAsSelector` + `Selector.Matches`, which Fleet uses for
//! `clusterSelector`, `clusterGroupSelector` and `ClusterGroup.spec.selector`:
//! - an empty selector (`{}`) matches everything; a missing one is the caller's business
//!   (Fleet drops an absent target criterion and skips a ClusterGroup without a selector);
//! - every requirement must hold (AND);
//! - `In` needs the label present with one of the values, `NotIn` holds when the label is absent
//!   or has none of the values, `Exists`/`DoesNotExist` test presence only;
//! - keys must be qualified names and values valid label values, `In`/`NotIn` need at least one
//!   value and `Exists`/`DoesNotExist` none; anything else is an error, as in apimachinery.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::name_rules::{label_value_error, qualified_name_error};

/// A compiled, validated label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Operator,
    values: BTreeSet<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// Why a selector is invalid; `path` is relative to the selector (e.g. `matchExpressions[1].operator`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SelectorError {
    pub path: String,
    pub message: String,
}

impl SelectorError {
    fn new(path: String, message: impl Into<String>) -> Self {
        SelectorError {
            path,
            message: message.into(),
        }
    }
}

impl Selector {
    /// The selector that matches every label set (what `{}` means).
    pub fn everything() -> Self {
        Selector {
            requirements: Vec::new(),
        }
    }

    /// Compiles and validates a selector, reporting the first problem like apimachinery does.
    pub fn compile(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if let Some(labels) = &selector.match_labels {
            for (key, value) in labels {
                let path = format!("matchLabels.{key}");
                check_key(key, &path)?;
                if let Some(problem) = label_value_error(value) {
                    return Err(SelectorError::new(
                        path,
                        format!("invalid label value {value:?}: {problem}"),
                    ));
                }
                requirements.push(Requirement {
                    key: key.clone(),
                    op: Operator::In,
                    values: BTreeSet::from([value.clone()]),
                });
            }
        }
        for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
            let base = format!("matchExpressions[{i}]");
            check_key(&expr.key, &format!("{base}.key"))?;
            let op = match expr.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(SelectorError::new(
                        format!("{base}.operator"),
                        format!(
                            "{other:?} is not a valid label selector operator: use In, NotIn, Exists or DoesNotExist"
                        ),
                    ));
                }
            };
            let values: &[String] = expr.values.as_deref().unwrap_or_default();
            match op {
                Operator::In | Operator::NotIn if values.is_empty() => {
                    return Err(SelectorError::new(
                        format!("{base}.values"),
                        format!("operator {} needs at least one value", expr.operator),
                    ));
                }
                Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                    return Err(SelectorError::new(
                        format!("{base}.values"),
                        format!("operator {} takes no values", expr.operator),
                    ));
                }
                _ => {}
            }
            for (j, value) in values.iter().enumerate() {
                if let Some(problem) = label_value_error(value) {
                    return Err(SelectorError::new(
                        format!("{base}.values[{j}]"),
                        format!("invalid label value {value:?}: {problem}"),
                    ));
                }
            }
            requirements.push(Requirement {
                key: expr.key.clone(),
                op,
                values: values.iter().cloned().collect(),
            });
        }
        Ok(Selector { requirements })
    }

    /// Whether every requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| {
            let value = labels.get(&r.key);
            match r.op {
                Operator::In => value.is_some_and(|v| r.values.contains(v)),
                Operator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                Operator::Exists => value.is_some(),
                Operator::DoesNotExist => value.is_none(),
            }
        })
    }

    /// True for the selector that matches everything.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }
}

fn check_key(key: &str, path: &str) -> Result<(), SelectorError> {
    match qualified_name_error(key) {
        Some(problem) => Err(SelectorError::new(
            path.to_string(),
            format!("invalid label key {key:?}: {problem}"),
        )),
        None => Ok(()),
    }
}

/// Compiles `selector` and tests `labels` in one go.
pub fn matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    Selector::compile(selector).map(|s| s.matches(labels))
}

#[cfg(test)]
mod tests;
