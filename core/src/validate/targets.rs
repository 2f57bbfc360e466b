//! Target criteria: types, and label selectors Fleet can compile.

use std::collections::BTreeMap;

use super::{Ctx, JsonView, Map, Path, field, sorted_entries, type_name};
use crate::selector::Selector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// Checks `clusterName`, `clusterGroup`, `clusterSelector`, `clusterGroupSelector` of a target
/// (or target restriction). Returns whether the entry has at least one criterion; Fleet's
/// `ClusterMatcher` matches nothing without one.
pub(crate) fn check_criteria(cx: &mut Ctx, obj: &Map<'_>, base: &Path<'_>) -> bool {
    let mut has = false;
    for key in ["clusterName", "clusterGroup"] {
        if cx.string(obj, key, base).is_some_and(|s| !s.is_empty()) {
            has = true;
        }
    }
    for key in ["clusterSelector", "clusterGroupSelector"] {
        match field(obj, key) {
            None | Some(JsonView::Null) => {}
            Some(value) => {
                has = true;
                let path = base.key(key);
                if let Some(selector) = parse_selector(cx, value, &path)
                    && let Err(e) = Selector::compile(&selector)
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

/// Reads a raw label selector, denying type errors with their exact path.
pub(crate) fn parse_selector(
    cx: &mut Ctx,
    value: &JsonView<'_>,
    path: &Path<'_>,
) -> Option<LabelSelector> {
    let Some(obj) = value.as_object() else {
        cx.deny(
            path,
            format!(
                "a label selector must be an object, not {}",
                type_name(value)
            ),
        );
        return None;
    };
    let mut ok = true;
    let mut selector = LabelSelector::default();
    if let Some(labels) = cx.object(obj, "matchLabels", path) {
        let mut out = BTreeMap::new();
        let labels_path = path.key("matchLabels");
        for (k, v) in sorted_entries(labels) {
            match v.as_str() {
                Some(v) => {
                    out.insert(k.to_string(), v.to_string());
                }
                None => {
                    ok = false;
                    cx.deny(
                        &labels_path.key(k),
                        format!(
                            "label values must be strings, not {}: quote it",
                            type_name(v)
                        ),
                    );
                }
            }
        }
        selector.match_labels = Some(out);
    }
    if let Some(exprs) = cx.array(obj, "matchExpressions", path) {
        let base = path.key("matchExpressions");
        let mut out = Vec::new();
        for (i, expr) in exprs.iter().enumerate() {
            let epath = base.index(i);
            let Some(expr) = expr.as_object() else {
                ok = false;
                cx.deny(
                    &epath,
                    format!(
                        "a match expression must be an object, not {}",
                        type_name(expr)
                    ),
                );
                continue;
            };
            let key = cx.string(expr, "key", &epath);
            let operator = cx.string(expr, "operator", &epath);
            let (Some(key), Some(operator)) = (key, operator) else {
                if !expr.contains_key("key") || !expr.contains_key("operator") {
                    cx.deny(&epath, "a match expression needs key and operator");
                }
                ok = false;
                continue;
            };
            let mut values = None;
            if let Some(list) = cx.array(expr, "values", &epath) {
                let mut vs = Vec::new();
                let values_path = epath.key("values");
                for (j, v) in list.iter().enumerate() {
                    match v.as_str() {
                        Some(v) => vs.push(v.to_string()),
                        None => {
                            ok = false;
                            cx.deny(
                                &values_path.index(j),
                                format!("values must be strings, not {}: quote it", type_name(v)),
                            );
                        }
                    }
                }
                values = Some(vs);
            }
            out.push(LabelSelectorRequirement {
                key: key.to_string(),
                operator: operator.to_string(),
                values,
            });
        }
        selector.match_expressions = Some(out);
    }
    ok.then_some(selector)
}
