//! Fleet's per-cluster helm values preprocessing (rancher/fleet v0.16.1
//! `internal/cmd/controller/target/builder.go` `preprocessHelmValues`, `processLabelValues`,
//! `processTemplateValues`, `processTemplateValuesData`; constants in `target/target.go`;
//! the label cleaning is wrangler v3 `pkg/yaml` `CleanAnnotationsForExport`):
//!
//! - It runs for a cluster whose cleaned labels (no `kubectl.kubernetes.io/` prefix, nothing
//!   containing `cattle.io/`, then the `fleet.cattle.io/` and `management.cattle.io/` prefixed
//!   labels put back) are not empty, when the merged helm options exist and `values` or
//!   `templateValues` is set.
//! - `processLabelValues` always runs: a string value starting with
//!   `global.fleet.clusterLabels.` becomes that label's value (or ""); maps nested deeper than
//!   [`MAX_LABEL_DEPTH`] fail.
//! - Without `disablePreProcess` the values, marshalled to YAML, are one template (`${ }`,
//!   `missingkey=error`, Sprig) over `ClusterNamespace`, `ClusterName`, `ClusterLabels`,
//!   `ClusterAnnotations`, `ClusterValues`; the output must be a YAML mapping. Each
//!   `templateValues` entry is a template whose output must be YAML.
//!
//! Any failure fails the whole Bundle, on every cluster (the caller's business).

use std::collections::BTreeMap;

use serde_json::Value as Json;

use crate::gotemplate::{self, Render, Value, yaml_out};
use crate::model::{Cluster, HelmOptions};

/// Fleet's `clusterLabelPrefix`.
pub const CLUSTER_LABEL_PREFIX: &str = "global.fleet.clusterLabels.";
/// Fleet's `maxTemplateRecursionDepth`.
pub const MAX_LABEL_DEPTH: usize = 50;

/// The helm options that matter here after Fleet's `options.Merge` of root and targets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergedHelm {
    /// Whether any layer had helm options (Fleet skips everything when none did).
    pub present: bool,
    pub values: Option<Json>,
    pub template_values: Option<serde_json::Map<String, Json>>,
    pub disable_pre_process: bool,
}

impl MergedHelm {
    /// Merges one layer over this one (`options.Merge`): values deep-merged with
    /// wrangler's `MergeMaps`, templateValues copied over key by key, disablePreProcess ORed.
    pub fn merge(&mut self, layer: Option<&HelmOptions>) {
        let Some(h) = layer else { return };
        self.present = true;
        if let Some(v) = &h.values {
            self.values = Some(match self.values.take() {
                Some(base) => merge_maps(base, v),
                None => v.clone(),
            });
        }
        if let Some(Json::Object(t)) = &h.template_values {
            let into = self.template_values.get_or_insert_with(Default::default);
            for (k, v) in t {
                into.insert(k.clone(), v.clone());
            }
        }
        self.disable_pre_process |= h.disable_pre_process.unwrap_or(false);
    }
}

fn merge_maps(base: Json, overlay: &Json) -> Json {
    match (base, overlay) {
        (Json::Object(mut b), Json::Object(o)) => {
            for (k, v) in o {
                let merged = match b.remove(k) {
                    Some(old @ Json::Object(_)) if v.is_object() => merge_maps(old, v),
                    _ => v.clone(),
                };
                b.insert(k.clone(), merged);
            }
            Json::Object(b)
        }
        (_, o) => o.clone(),
    }
}

/// What Fleet's preprocessing does for one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to do, or it renders.
    Renders,
    /// Outside what helmop evaluates: assumed to render (reason for logs).
    Unknown(String),
    /// Fleet fails the Bundle with this error (Fleet's wording, without the cluster prefix).
    Fails(String),
}

fn cleaned(map: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    map.into_iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with("kubectl.kubernetes.io/") && !k.contains("cattle.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn dict(m: &BTreeMap<String, String>) -> Value {
    Value::Map(
        m.iter()
            .map(|(k, v)| (k.clone(), Value::Str(v.clone())))
            .collect(),
    )
}

/// Fleet's `preprocessHelmValues` for `cluster` with the merged helm options.
pub fn preprocess(cluster: &Cluster, helm: &MergedHelm) -> Outcome {
    let mut labels = cleaned(cluster.metadata.labels.as_ref());
    let annotations = cleaned(cluster.metadata.annotations.as_ref());
    for (k, v) in cluster.metadata.labels.iter().flatten() {
        if k.starts_with("fleet.cattle.io/") || k.starts_with("management.cattle.io/") {
            labels.insert(k.clone(), v.clone());
        }
    }
    if labels.is_empty() || !helm.present {
        return Outcome::Renders;
    }
    let mut values = match &helm.values {
        Some(Json::Object(m)) => m.clone(),
        // null or a non-object cannot come through Fleet's GenericMap; treat as empty.
        _ => serde_json::Map::new(),
    };
    if helm.template_values.is_none() && values.is_empty() {
        return Outcome::Renders;
    }
    if let Err(e) = label_values(&mut values, &labels, 0) {
        return Outcome::Fails(e);
    }
    if helm.disable_pre_process {
        return Outcome::Renders;
    }
    let cluster_values = match &cluster.spec.template_values {
        Some(v @ Json::Object(_)) => Value::from_json(v),
        _ => Value::Map(BTreeMap::new()),
    };
    let context = Value::Map(BTreeMap::from([
        (
            "ClusterNamespace".to_string(),
            Value::Str(cluster.metadata.namespace.clone().unwrap_or_default()),
        ),
        (
            "ClusterName".to_string(),
            Value::Str(cluster.metadata.name.clone().unwrap_or_default()),
        ),
        ("ClusterLabels".to_string(), dict(&labels)),
        ("ClusterAnnotations".to_string(), dict(&annotations)),
        ("ClusterValues".to_string(), cluster_values),
    ]));
    let mut unknown = None;
    let Some(text) = yaml_out::to_yaml(&Json::Object(values)) else {
        return Outcome::Unknown("values nest too deep to template".into());
    };
    match render(&text, &context, true) {
        Outcome::Renders => {}
        Outcome::Unknown(m) => unknown = Some(m),
        fails => return fails,
    }
    for (_, v) in helm.template_values.iter().flatten() {
        let Json::String(text) = v else { continue };
        match render(text, &context, false) {
            Outcome::Renders => {}
            Outcome::Unknown(m) => unknown = unknown.or(Some(m)),
            fails => return fails,
        }
    }
    unknown.map_or(Outcome::Renders, Outcome::Unknown)
}

/// One template as Fleet runs it; `mapping`: the output must unmarshal into a map.
fn render(text: &str, context: &Value, mapping: bool) -> Outcome {
    let out = match gotemplate::render(text, context) {
        Render::Ok(out) => out,
        Render::Unknown(m) => return Outcome::Unknown(m),
        Render::Fail(m) if m.contains(": executing ") => {
            return Outcome::Fails(format!("failed to render helm values template: {m}"));
        }
        Render::Fail(m) => {
            return Outcome::Fails(format!("failed to parse helm values template: {m}"));
        }
    };
    let interpret = |why: String| {
        Outcome::Fails(format!(
            "failed to interpret rendered template as helm values: {why}"
        ))
    };
    // Fleet reads the output with sigs.k8s.io/yaml.Unmarshal: first document only, a repeated
    // key taking its last value (crate::yaml::parse_like_fleet says where that is in Go).
    match crate::yaml::parse_like_fleet(out.as_bytes()) {
        Err(e) => interpret(e.to_string()),
        Ok(doc) => match &doc {
            Some(Json::Object(_) | Json::Null) | None => Outcome::Renders,
            Some(other) if mapping => interpret(format!(
                "the output is {}, not a mapping",
                match other {
                    Json::Bool(_) => "a boolean",
                    Json::Number(_) => "a number",
                    Json::String(_) => "a string",
                    _ => "a list",
                }
            )),
            Some(_) => Outcome::Renders,
        },
    }
}

/// Fleet's `processLabelValues`.
fn label_values(
    values: &mut serde_json::Map<String, Json>,
    labels: &BTreeMap<String, String>,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_LABEL_DEPTH {
        return Err(format!(
            "maximum recursion depth of {MAX_LABEL_DEPTH} exceeded for cluster label prefix processing, too many nested values"
        ));
    }
    for v in values.values_mut() {
        match v {
            Json::String(s) => {
                if let Some(label) = s.strip_prefix(CLUSTER_LABEL_PREFIX) {
                    *s = labels.get(label).cloned().unwrap_or_default();
                }
            }
            Json::Object(m) => label_values(m, labels, depth + 1)?,
            Json::Array(items) => {
                for item in items {
                    if let Json::Object(m) = item {
                        label_values(m, labels, depth + 1)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn helm(values: Json, disable: bool) -> MergedHelm {
        MergedHelm {
            present: true,
            values: Some(values),
            template_values: None,
            disable_pre_process: disable,
        }
    }

    #[test]
    fn fleet_rules() {
        let down1 = Cluster::new("fleet-default", "down1", &[("env", "prod")]);
        let bare = Cluster::new("fleet-default", "bare", &[("x.cattle.io/a", "b")]);
        let bad = json!({"tier": "${ .ClusterLabels.tier }"});
        assert!(
            matches!(preprocess(&down1, &helm(bad.clone(), false)), Outcome::Fails(m) if m.starts_with("failed to render helm values template: template: values:1:"))
        );
        // No labels left after cleaning: Fleet does not template.
        assert_eq!(
            preprocess(&bare, &helm(bad.clone(), false)),
            Outcome::Renders
        );
        assert_eq!(preprocess(&down1, &helm(bad, true)), Outcome::Renders);
        let ok = json!({"tier": "${ default \"none\" (index .ClusterLabels \"tier\") }", "env": "global.fleet.clusterLabels.env"});
        assert_eq!(preprocess(&down1, &helm(ok, false)), Outcome::Renders);
        let unparsable = json!({"a": "${ nope }"});
        assert!(
            matches!(preprocess(&down1, &helm(unparsable, false)), Outcome::Fails(m) if m.starts_with("failed to parse helm values template:"))
        );
        // The label substitution happens before templating: its value is templated too.
        let mut deep = json!("x");
        for _ in 0..=MAX_LABEL_DEPTH {
            deep = json!({ "a": deep });
        }
        assert!(
            matches!(preprocess(&down1, &helm(json!({"d": deep}), true)), Outcome::Fails(m) if m.contains("maximum recursion depth of 50"))
        );
        let mut t = helm(json!({}), false);
        t.template_values = Some(serde_json::Map::from_iter([(
            "k".to_string(),
            json!("${ .ClusterValues.x }"),
        )]));
        assert!(matches!(preprocess(&down1, &t), Outcome::Fails(_)));
        // A render that is not a mapping fails.
        assert!(matches!(
            preprocess(&down1, &helm(json!({"${ \"- x\" }": 1}), false)),
            Outcome::Fails(_)
        ));
    }

    /// Fleet reads rendered values with sigs.k8s.io/yaml.Unmarshal (non-strict yaml.v2): a key
    /// repeated in one mapping takes the last value and only the first document counts, so
    /// neither fails the Bundle.
    #[test]
    fn rendered_values_are_read_as_fleet_reads_them() {
        let down1 = Cluster::new("fleet-default", "down1", &[("env", "prod")]);
        // `values`: a templated key that renders to a key already there.
        let dup_key = json!({"region": "eu", "${ \"region\" }": "${ .ClusterLabels.env }"});
        assert_eq!(preprocess(&down1, &helm(dup_key, false)), Outcome::Renders);
        // `templateValues`: an entry whose output repeats a key, at the top and nested.
        for text in [
            "a: 1\na: ${ .ClusterName }",
            "cfg:\n  x: 1\n  x: 2\nother: ${ .ClusterLabels.env }",
            "{a: 1, a: 2}",
            "a: 1\n---\n: not: [yaml",
        ] {
            let mut t = helm(json!({}), false);
            t.template_values = Some(serde_json::Map::from_iter([("k".to_string(), json!(text))]));
            assert_eq!(preprocess(&down1, &t), Outcome::Renders, "{text}");
        }
        // Malformed YAML in the first document still fails, as in Fleet.
        let mut t = helm(json!({}), false);
        t.template_values = Some(serde_json::Map::from_iter([(
            "k".to_string(),
            json!("a: [1\nb: 2"),
        )]));
        assert!(
            matches!(preprocess(&down1, &t), Outcome::Fails(m) if m.starts_with("failed to interpret rendered template as helm values"))
        );
    }
}
