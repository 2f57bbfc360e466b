//! Target criteria: label selectors Fleet can compile.

use std::collections::BTreeMap;

use super::{Ctx, JsonView, Map, Path, field, sorted_entries};
use crate::selector::Selector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// Checks `clusterName`, `clusterGroup`, `clusterSelector`, `clusterGroupSelector` of a target
/// (or target restriction). Returns whether the entry has at least one criterion; Fleet's
/// `ClusterMatcher` matches nothing without one.
pub(crate) fn check_criteria(cx: &mut Ctx, obj: &Map<'_>, base: &Path<'_>) -> bool {
    let mut has = false;
    for key in ["clusterName", "clusterGroup"] {
        if super::string(obj, key).is_some_and(|s| !s.is_empty()) {
            has = true;
        }
    }
    for key in ["clusterSelector", "clusterGroupSelector"] {
        match field(obj, key) {
            None | Some(JsonView::Null) => {}
            Some(value) => {
                has = true;
                let path = base.key(key);
                if let Some(selector) = parse_selector(value)
                    && let Err(e) = Selector::check(&selector)
                {
                    // rancher/fleet internal/cmd/controller/target/matcher: NewClusterMatcher
                    // returns the selector error and the whole HelmOp gets no deployments.
                    cx.deny(
                        &path.key(&e.path),
                        format!(
                            "{}; Fleet cannot compile this selector and deploys the HelmOp nowhere",
                            e.message
                        ),
                    );
                }
            }
        }
    }
    has
}

/// Reads a raw label selector; `None` when a part has the wrong type (the CRD's to report, see
/// [`super::schema`]), as the API server would have refused it. A `null` label value is
/// skipped: the API server drops it.
pub(crate) fn parse_selector(value: &JsonView<'_>) -> Option<LabelSelector> {
    let obj = value.as_object()?;
    let mut selector = LabelSelector::default();
    if let Some(labels) = super::object(obj, "matchLabels") {
        let mut out = BTreeMap::new();
        for (k, v) in sorted_entries(labels) {
            match v {
                JsonView::Str(v) => {
                    out.insert(k.to_string(), v.to_string());
                }
                JsonView::Null => {}
                _ => return None,
            }
        }
        selector.match_labels = Some(out);
    }
    if let Some(exprs) = super::array(obj, "matchExpressions") {
        let mut out = Vec::new();
        for expr in exprs {
            let expr = expr.as_object()?;
            let key = super::string(expr, "key")?;
            let operator = super::string(expr, "operator")?;
            let values = match super::array(expr, "values") {
                Some(list) => Some(
                    list.iter()
                        .map(|v| v.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()?,
                ),
                None => None,
            };
            out.push(LabelSelectorRequirement {
                key: key.to_string(),
                operator: operator.to_string(),
                values,
            });
        }
        selector.match_expressions = Some(out);
    }
    Some(selector)
}
