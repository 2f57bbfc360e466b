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

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::SelectorExt;

use crate::name_rules::{label_value_error, qualified_name_error};

/// A compiled, validated label selector. Validation (what is a valid selector, and the messages) is helmop's;
/// matching is kube's, whose semantics are apimachinery's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector(kube::core::Selector);

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
        Selector(kube::core::Selector::default())
    }

    /// Compiles and validates a selector, reporting the first problem like apimachinery does.
    pub fn compile(selector: &LabelSelector) -> Result<Self, SelectorError> {
        Self::check(selector)?;
        // kube's conversion accepts selectors apimachinery rejects (`In` with an empty list, `Exists` with
        // values, any key), so it only sees selectors `validate` passed, which it cannot refuse.
        kube::core::Selector::try_from(selector.clone())
            .map(Selector)
            .map_err(|e| SelectorError::new("matchExpressions".to_owned(), e.0))
    }

    /// Whether [`Selector::compile`] accepts `selector`, and its first problem if not, without compiling it
    /// (the admission rules only need the verdict).
    pub fn check(selector: &LabelSelector) -> Result<(), SelectorError> {
        validate(selector)
    }

    /// Whether every requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.matches(labels)
    }

    /// True for the selector that matches everything.
    pub fn is_everything(&self) -> bool {
        self.0.selects_all()
    }
}

/// apimachinery's `LabelSelectorAsSelector` checks, first problem first.
fn validate(selector: &LabelSelector) -> Result<(), SelectorError> {
    for (key, value) in selector.match_labels.iter().flatten() {
        // Paths are formatted only for a problem: a valid selector allocates nothing here.
        let path = || format!("matchLabels.{key}");
        check_key(key, path)?;
        if let Some(problem) = label_value_error(value) {
            return Err(SelectorError::new(
                path(),
                format!("invalid label value {value:?}: {problem}"),
            ));
        }
    }
    for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
        let base = || format!("matchExpressions[{i}]");
        check_key(&expr.key, || format!("{}.key", base()))?;
        let takes_values = match expr.operator.as_str() {
            "In" | "NotIn" => true,
            "Exists" | "DoesNotExist" => false,
            other => {
                return Err(SelectorError::new(
                    format!("{}.operator", base()),
                    format!(
                        "{other:?} is not a valid label selector operator: use In, NotIn, Exists or DoesNotExist"
                    ),
                ));
            }
        };
        let values: &[String] = expr.values.as_deref().unwrap_or_default();
        if takes_values && values.is_empty() {
            return Err(SelectorError::new(
                format!("{}.values", base()),
                format!("operator {} needs at least one value", expr.operator),
            ));
        }
        if !takes_values && !values.is_empty() {
            return Err(SelectorError::new(
                format!("{}.values", base()),
                format!("operator {} takes no values", expr.operator),
            ));
        }
        for (j, value) in values.iter().enumerate() {
            if let Some(problem) = label_value_error(value) {
                return Err(SelectorError::new(
                    format!("{}.values[{j}]", base()),
                    format!("invalid label value {value:?}: {problem}"),
                ));
            }
        }
    }
    Ok(())
}

fn check_key(key: &str, path: impl FnOnce() -> String) -> Result<(), SelectorError> {
    match qualified_name_error(key) {
        Some(problem) => Err(SelectorError::new(
            path(),
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
