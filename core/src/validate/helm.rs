//! Helm options: chart/repo/version combinations, the version constraint, and the valuesFrom
//! references. `releaseName`'s pattern and length are the CRD's ([`super::schema`]).

use super::{Ctx, JsonView, Map, Path, field, q, semver};
use crate::resource::ResourceKind;

/// A `valuesFrom` entry that names a ConfigMap or Secret.
pub(crate) struct ValuesFromRef {
    pub path: String,
    pub kind: ResourceKind,
    pub name: String,
    pub namespace: Option<String>,
}

/// `spec.helm`: Fleet's controller rules are denials.
pub(crate) fn check_root_helm(cx: &mut Ctx, helm: &Map<'_>, base: &Path<'_>) -> Vec<ValuesFromRef> {
    let chart = super::string(helm, "chart").unwrap_or_default();
    let repo = super::string(helm, "repo").unwrap_or_default();
    let version = super::string(helm, "version").unwrap_or_default();
    for (field, message) in source_problems(chart, repo, version) {
        cx.deny(&base.key(field), message);
    }
    if let Some(message) = oci_version_problem(repo, version) {
        cx.deny(&base.key("version"), message);
    }
    check_templates(cx, helm, base, None);
    values_from(helm, base)
}

/// Fleet templates `values` (marshalled to YAML, as one template) and each `templateValues`
/// entry for every targeted cluster with labels, unless `disablePreProcess` (here or in the
/// root options, which every target's options are merged with). Go refuses to parse these, so
/// the Bundle fails on every cluster (`target/builder.go` `processTemplateValues`): a denial.
fn check_templates(cx: &mut Ctx, helm: &Map<'_>, base: &Path<'_>, root: Option<&Map<'_>>) {
    let disabled =
        |m: &Map<'_>| matches!(field(m, "disablePreProcess"), Some(JsonView::Bool(true)));
    if disabled(helm) || root.is_some_and(disabled) {
        return;
    }
    let why = |e: crate::gotemplate::ParseError| {
        format!(
            "Fleet cannot parse this as a helm values template (${{ }} delimiters), so the Bundle fails on every cluster with labels: {e}"
        )
    };
    // Rendering the values as YAML is most of what validating a HelmOp costs; without a `$` in any key
    // or string the text has no `${`, so Go parses it as plain text whatever it holds.
    if let Some(values @ JsonView::Object(_)) = field(helm, "values")
        && has_dollar(values)
        && let Ok(json) = serde_json::to_value(values)
        && let Some(text) = crate::gotemplate::yaml_out::to_yaml(&json)
        && let Some(e) = crate::gotemplate::parse_error(&text)
    {
        cx.deny(&base.key("values"), why(e));
    }
    if let Some(JsonView::Object(entries)) = field(helm, "templateValues") {
        for (key, v) in super::sorted_entries(entries) {
            if let Some(text) = v.as_str()
                && let Some(e) = crate::gotemplate::parse_error(text)
            {
                cx.deny(&base.key("templateValues").key(key), why(e));
            }
        }
    }
}

/// Whether any key or string of `v` holds a `$`: the only way its YAML (which adds no `$` of its own)
/// can open a `${ }` action. Walked with a stack, not recursion: the depth is the sender's.
fn has_dollar(v: &JsonView<'_>) -> bool {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            JsonView::Str(s) if s.contains('$') => return true,
            JsonView::Array(items) => stack.extend(items.iter()),
            JsonView::Object(map) => {
                for (k, v) in map.as_vec() {
                    if k.contains('$') {
                        return true;
                    }
                    stack.push(v);
                }
            }
            _ => {}
        }
    }
    false
}

/// Fleet's controller resolves an `oci://` repo's version itself (`bundlereader.ChartVersion`
/// -> `GetOCITag` -> `semver.NewConstraint(version)`) and, unlike Helm's index lookup for
/// HTTP repos, does not turn an empty version into `*`: `NewConstraint("")` fails, so the
/// HelmOp never gets a Bundle ("could not find tag matching constraint \"\""). Only the root
/// options go through the controller; a target's are downloaded by the agent.
fn oci_version_problem(repo: &str, version: &str) -> Option<String> {
    (repo.starts_with(OCI_PREFIX) && version.is_empty()).then(|| {
        "an oci:// repo needs a version: Fleet resolves it as a semver constraint against the registry's tags and an empty one fails; use \"*\" for the newest release, or e.g. 1.2.x".to_string()
    })
}

/// Fleet matches this prefix case-sensitively where it resolves and downloads charts
/// (`bundlereader.ChartVersion`, `isOCIChart`), case-insensitively in `validate`.
const OCI_PREFIX: &str = "oci://";

/// `spec.targets[i].helm`: Fleet copies the root chart, repo and version into a target's helm
/// options where the target leaves them empty (`propagateHelmOpProperties`), and the agent
/// downloads what results. The controller never checks these, so a bad combination only fails
/// on the clusters the target matches: a warning, reported only when the target sets one of
/// the three itself (otherwise the root finding already covers it).
pub(crate) fn check_target_helm(
    cx: &mut Ctx,
    helm: &Map<'_>,
    base: &Path<'_>,
    root: Option<&Map<'_>>,
) -> Vec<ValuesFromRef> {
    let own = |key: &str| super::string(helm, key).unwrap_or_default().to_string();
    let (chart, repo, version) = (own("chart"), own("repo"), own("version"));
    if !(chart.is_empty() && repo.is_empty() && version.is_empty()) {
        let inherit = |own: String, key: &str| {
            if own.is_empty() {
                root.and_then(|r| field(r, key))
                    .and_then(JsonView::as_str)
                    .unwrap_or_default()
                    .to_string()
            } else {
                own
            }
        };
        let chart = inherit(chart, "chart");
        let repo = inherit(repo, "repo");
        let version = inherit(version, "version");
        for (field, message) in source_problems(&chart, &repo, &version) {
            cx.warn(
                &base.key(field),
                format!("{message} (with the root helm options filled in; Fleet's agent fails on the clusters this target matches)"),
            );
        }
    }
    check_templates(cx, helm, base, root);
    values_from(helm, base)
}

/// Fleet v0.16's HelmOp rules, from rancher/fleet
/// `internal/cmd/controller/helmops/reconciler/helmop_controller.go` (`validate`, documented in
/// fleet-docs `helm-ops.md` "Supported use cases"):
/// - `chart` ending in `.tgz` (any case): a tarball URL; `repo` and `version` must be empty;
/// - else `repo` starting with `oci://` (any case): `chart` must be empty;
/// - else both `chart` and `repo` are required;
///
/// and from `handleVersion`/`bundlereader.ChartVersion`, which the controller runs next:
/// - a non-empty `version` must parse as a Masterminds semver constraint (see [`semver`]);
///   an empty one means "latest" for HTTP repos (Helm's `IndexFile.Get` substitutes `*`);
/// - an `oci://` repo is recognised by the lower-case prefix only: `OCI://...` passes
///   `validate` and then goes down the HTTP path, where Go's HTTP client refuses scheme `oci`;
/// - any other repo is fetched as `<repo>/index.yaml` with Go's HTTP client: it needs an
///   `http://` or `https://` scheme (any case: `url.Parse` lower-cases it) and a host.
///
/// Returns `(field, message)` pairs.
pub(crate) fn source_problems(
    chart: &str,
    repo: &str,
    version: &str,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let tarball = chart.to_ascii_lowercase().ends_with(".tgz");
    if tarball {
        if !repo.is_empty() {
            out.push((
                "repo",
                format!("chart {} is a .tgz URL, which takes no repo: remove repo (Fleet rejects a tarball chart with a repo)", q(chart)),
            ));
        }
        if !version.is_empty() {
            out.push((
                "version",
                "chart is a .tgz URL, which takes no version (the URL pins it): remove version (Fleet rejects a tarball chart with a version)".to_string(),
            ));
        }
        return out;
    }
    if repo.to_ascii_lowercase().starts_with(OCI_PREFIX) {
        if !chart.is_empty() {
            out.push((
                "chart",
                format!("with an OCI repo the chart is part of the repo URL: remove chart, or append it to repo (e.g. {}/{chart}); Fleet rejects an OCI repo with a chart", repo.trim_end_matches('/')),
            ));
        }
        if !repo.starts_with(OCI_PREFIX) {
            out.push((
                "repo",
                format!("write the scheme of {} in lower case (oci://...): Fleet takes only a lower-case oci:// as an OCI registry and otherwise fetches an HTTP index from it, which fails", q(repo)),
            ));
        }
    } else if let Some(problem) = (!chart.is_empty() && !repo.is_empty())
        .then(|| http_repo_problem(repo))
        .flatten()
    {
        out.push(("repo", problem));
    } else if chart.is_empty() && repo.is_empty() {
        out.push((
            "chart",
            "no chart given: set repo (https://...) and chart, an OCI repo (repo: oci://registry/path/chart), or chart as a .tgz URL".to_string(),
        ));
    } else if chart.is_empty() {
        out.push((
            "chart",
            format!("chart is empty: with the HTTP(S) repo {} set chart to the chart's name (or make repo an oci:// URL)", q(repo)),
        ));
    } else if repo.is_empty() {
        let message = if chart.to_ascii_lowercase().starts_with("oci://") {
            format!(
                "Fleet expects OCI charts in repo: set repo to {} and remove chart",
                q(chart)
            )
        } else {
            format!(
                "repo is empty: set the Helm repository URL that serves chart {}, or make chart a .tgz URL",
                q(chart)
            )
        };
        out.push(("repo", message));
    }
    if !version.is_empty()
        && let Some(problem) = semver::constraint_error(version)
    {
        out.push((
            "version",
            format!("version {} is not a version or semver constraint Fleet can resolve ({problem}): use e.g. 1.2.3, 1.2.x or \">=1.2.0 <2.0.0\", or leave it empty for the latest", q(version)),
        ));
    }
    out
}

/// Why Go's HTTP client cannot fetch `<repo>/index.yaml`, if it cannot.
fn http_repo_problem(repo: &str) -> Option<String> {
    if repo.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Some(format!(
            "repo {} contains a control character, which Go's URL parser rejects",
            q(repo)
        ));
    }
    let lower = repo.to_ascii_lowercase();
    let Some(rest) = ["https://", "http://"]
        .iter()
        .find_map(|scheme| lower.strip_prefix(scheme))
    else {
        return Some(format!(
            "repo {} is not an http:// or https:// URL: Fleet fetches the repo's index.yaml over HTTP(S) only (use oci://... for an OCI registry, or put a .tgz URL in chart)",
            q(repo)
        ));
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    host.is_empty()
        .then(|| format!("repo {} has no host", q(repo)))
}

fn values_from(helm: &Map<'_>, base: &Path<'_>) -> Vec<ValuesFromRef> {
    let mut out = Vec::new();
    let Some(list) = super::array(helm, "valuesFrom") else {
        return out;
    };
    let list_path = base.key("valuesFrom");
    for (i, entry) in list.iter().enumerate() {
        let path = list_path.index(i);
        let Some(entry) = entry.as_object() else {
            continue;
        };
        for (key, kind) in [
            ("configMapKeyRef", ResourceKind::ConfigMap),
            ("secretKeyRef", ResourceKind::Secret),
        ] {
            let Some(r) = super::object(entry, key) else {
                continue;
            };
            let rpath = path.key(key);
            let name = super::string(r, "name");
            let namespace = super::string(r, "namespace");
            if let Some(name) = name.filter(|n| !n.is_empty()) {
                out.push(ValuesFromRef {
                    path: rpath.to_string(),
                    kind,
                    name: name.to_string(),
                    namespace: namespace.filter(|n| !n.is_empty()).map(str::to_string),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::has_dollar;

    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let text = "[a-z${} :\"'\\-\n]{0,8}";
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| serde_json::json!(n)),
            (-1e9f64..1e9).prop_map(|f| serde_json::json!(f)),
            text.prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::btree_map(text, inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The skip is sound: values the walk finds no `$` in render to YAML Go always parses, and a
        /// `$` anywhere is found.
        #[test]
        fn values_without_a_dollar_always_parse(v in arb_json()) {
            let text = v.to_string();
            let view: serde_json_borrow::Value<'_> = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(has_dollar(&view), text.contains('$'));
            if !has_dollar(&view)
                && let Some(yaml) = crate::gotemplate::yaml_out::to_yaml(&v)
            {
                prop_assert!(!yaml.contains('$'), "{}", yaml);
                prop_assert!(crate::gotemplate::parse_error(&yaml).is_none(), "{}", yaml);
            }
        }
    }
}
