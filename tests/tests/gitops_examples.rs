//! The GitOps install examples (`examples/gitops/`: Fleet, Argo CD, Flux) checked offline, so that a
//! field the tool would drop or refuse, or a directory that does not exist or does not render, fails
//! the normal test suite instead of an install:
//!
//! - every object against its tool's real CRD, vendored in `tests/fixtures/gitops-crds/`
//!   (SOURCE.md), with helmop-core's conversion of a structural schema to JSON Schema
//!   ([`helmop_core::validate::crd_schema_validator`]). Unknown fields are refused here although
//!   the API server would prune them silently: a misspelt `ignoreDifferences` would otherwise pass
//!   and do nothing;
//! - each `fleet.yaml`, which has no CRD, against the Bundle CRD's `spec`
//!   (`vendor/fleet-crds/bundles.fleet.cattle.io.yaml`), after doing what Fleet's bundle reader does
//!   with the keys only fleet.yaml has (Fleet v0.16.1 `FleetYAML`: `name` and `labels` go to the
//!   Bundle's metadata, `targetCustomizations` are appended to `targets`; `imageScans` and
//!   `overrideTargets` are not used by the examples, which is asserted);
//! - every kustomize directory an example points at exists and renders with `kubectl kustomize`,
//!   with any patches the Argo CD Applications and Flux Kustomizations add; what the tools are told
//!   to ignore covers what the rendered manifests hold (every webhook entry's caBundle); and the
//!   rendered manifests contain no Job. The bootstrap runs in the webhook's pods, so the examples
//!   handle no install Jobs (no hooks, no force, no ignore-when-missing): a Job coming back must
//!   make them be revisited.
//!
//! Each check also runs on a deliberately broken copy, which must fail, so none can pass vacuously.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use serde_json::{Value as Json, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn docs(rel: &str) -> Vec<Json> {
    let text = read(&repo().join(rel));
    helmop_core::yaml::parse_documents(text.as_bytes())
        .unwrap_or_else(|e| panic!("{rel}: {}", e.reason()))
        .into_iter()
        .map(|d| d.value)
        .filter(|v| !v.is_null())
        .collect()
}

/// `a/b/../c` as `a/c`, without touching the file system (the path may not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                assert!(out.pop(), "{} leaves the repository", path.display());
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Marks every object schema that lists its properties, and neither keeps unknown fields nor
/// describes them, as closed: a field the CRD does not declare is then an error.
fn forbid_unknown_fields(node: &mut Json) {
    let Json::Object(map) = node else { return };
    let preserves = map.get("x-kubernetes-preserve-unknown-fields") == Some(&Json::Bool(true));
    if map.contains_key("properties") && !map.contains_key("additionalProperties") && !preserves {
        map.insert("additionalProperties".into(), Json::Bool(false));
    }
    if let Some(Json::Object(props)) = map.get_mut("properties") {
        props.values_mut().for_each(forbid_unknown_fields);
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(sub) = map.get_mut(key) {
            forbid_unknown_fields(sub);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Json::Array(subs)) = map.get_mut(key) {
            subs.iter_mut().for_each(forbid_unknown_fields);
        }
    }
}

/// A vendored CRD: its group, the one served version, and that version's schema.
struct Crd {
    api_version: String,
    kind: String,
    schema: Json,
}

fn crd(rel: &str) -> Crd {
    let doc = docs(rel).into_iter().next().unwrap();
    let group = doc["spec"]["group"].as_str().unwrap();
    let versions = doc["spec"]["versions"].as_array().unwrap();
    let served: Vec<&Json> = versions.iter().filter(|v| v["served"] == true).collect();
    assert_eq!(served.len(), 1, "{rel}: expected one served version");
    let mut schema = served[0]["schema"]["openAPIV3Schema"].clone();
    // Written by the controller, never by the example.
    schema["properties"]
        .as_object_mut()
        .unwrap()
        .remove("status");
    forbid_unknown_fields(&mut schema);
    Crd {
        api_version: format!("{group}/{}", served[0]["name"].as_str().unwrap()),
        kind: doc["spec"]["names"]["kind"].as_str().unwrap().to_string(),
        schema,
    }
}

/// The schema errors of `obj` under `schema`, one line each (empty: valid).
fn errors(schema: &Json, obj: &Json) -> Vec<String> {
    let validator = helmop_core::validate::crd_schema_validator(schema).unwrap();
    validator
        .iter_errors(obj)
        .map(|e| format!("{}: {e}", e.instance_path().as_str()))
        .collect()
}

const FIXTURES: &str = "tests/fixtures/gitops-crds";

fn crds() -> Vec<Crd> {
    [
        "gitrepos.fleet.cattle.io.yaml",
        "applications.argoproj.io.yaml",
        "kustomize.toolkit.fluxcd.io_kustomizations.yaml",
        "source.toolkit.fluxcd.io_gitrepositories.yaml",
    ]
    .iter()
    .map(|f| crd(&format!("{FIXTURES}/{f}")))
    .collect()
}

/// The errors of an example object under its kind's CRD; an object no vendored CRD defines is an
/// error too.
fn object_errors(crds: &[Crd], obj: &Json) -> Vec<String> {
    let (api_version, kind) = (obj["apiVersion"].as_str(), obj["kind"].as_str());
    match crds
        .iter()
        .find(|c| Some(c.api_version.as_str()) == api_version && Some(c.kind.as_str()) == kind)
    {
        Some(c) => errors(&c.schema, obj),
        None => vec![format!("no vendored CRD for {api_version:?} {kind:?}")],
    }
}

/// The Bundle CRD's `spec` schema, closed like the others.
fn bundle_spec_schema() -> Json {
    crd("vendor/fleet-crds/bundles.fleet.cattle.io.yaml").schema["properties"]["spec"].clone()
}

/// What Fleet's bundle reader makes of a fleet.yaml's keys before the rest becomes the Bundle's
/// spec (Fleet v0.16.1 `internal/bundlereader/read.go`): `targetCustomizations` appended to
/// `targets`, `name` and `labels` moved to the Bundle's metadata.
fn fleet_yaml_as_bundle_spec(fleet_yaml: &Json) -> Json {
    let mut spec = fleet_yaml.as_object().unwrap().clone();
    for key in ["imageScans", "overrideTargets"] {
        assert!(
            !spec.contains_key(key),
            "{key}: not checked by this test; extend it before using it"
        );
    }
    spec.remove("name");
    spec.remove("labels");
    if let Some(custom) = spec.remove("targetCustomizations") {
        let targets = spec.entry("targets").or_insert_with(|| json!([]));
        match (targets.as_array_mut(), custom) {
            (Some(targets), Json::Array(custom)) => targets.extend(custom),
            // A wrong type: left where the schema reports it.
            (_, custom) => {
                spec.insert("targetCustomizations".into(), custom);
            }
        }
    }
    spec.into()
}

/// `kubectl kustomize` of `dir` (absolute), optionally through a kustomization adding `patches`
/// (as Argo CD's `source.kustomize.patches` and Flux's `spec.patches` do), as parsed documents.
fn render(dir: &Path, patches: Option<&Json>) -> Result<Vec<Json>, String> {
    if !dir.join("kustomization.yaml").is_file() {
        return Err(format!("{}: no kustomization.yaml", dir.display()));
    }
    let tmp = tempfile::tempdir().unwrap();
    let target = match patches {
        None => dir.to_path_buf(),
        Some(patches) => {
            // kustomize wants a relative path to a resource directory.
            let up = tmp.path().components().count() - 1;
            let rel = Path::new(&"../".repeat(up)).join(dir.strip_prefix("/").unwrap());
            let k = json!({
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [rel],
                "patches": patches,
            });
            std::fs::write(tmp.path().join("kustomization.yaml"), k.to_string()).unwrap();
            tmp.path().to_path_buf()
        }
    };
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&target)
        .output()
        .expect("kubectl must be on PATH (a prerequisite, see ./dev)");
    if !out.status.success() {
        return Err(format!(
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(helmop_core::yaml::parse_documents(&out.stdout)
        .map_err(|e| e.reason())?
        .into_iter()
        .map(|d| d.value)
        .filter(|v| !v.is_null())
        .collect())
}

fn of_kind<'a>(objs: &'a [Json], kind: &str) -> impl Iterator<Item = &'a Json> {
    objs.iter().filter(move |o| o["kind"] == kind)
}

fn name(obj: &Json) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// The Jobs among rendered manifests, by name. None is expected: a Job's pod template is immutable
/// and a finished Job may delete itself, which is why the bootstrap runs as the webhook's
/// initContainers and the examples carry no rules for Jobs. One appearing again needs those rules
/// back (Argo CD hooks, Flux force, Fleet ignore-when-missing), so the test stops it here.
fn jobs(rendered: &[Json]) -> Vec<String> {
    of_kind(rendered, "Job")
        .map(|j| name(j).to_string())
        .collect()
}

/// `rendered` with a Job like the install Jobs there were, for the broken case of [`jobs`].
fn with_a_job(rendered: &[Json]) -> Vec<Json> {
    let mut out = rendered.to_vec();
    out.push(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "helmop-hash-key-init", "namespace": "helmop-system"},
    }));
    out
}

/// An example's optional `patches`, as [`render`] takes them (the examples have none now; a user's
/// copy may add some, e.g. images).
fn present(patches: &Json) -> Option<&Json> {
    (!patches.is_null()).then_some(patches)
}

fn strings(v: &Json) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Fleet

const FLEET_GITREPOS: &str = "examples/gitops/fleet/gitrepos.yaml";

/// Every (bundle base, fleet.yaml) a GitRepo names, relative to the repository root.
fn fleet_bundles(gitrepo: &Json) -> Vec<(PathBuf, PathBuf)> {
    gitrepo["spec"]["bundles"]
        .as_array()
        .expect("the examples use driven scan (spec.bundles)")
        .iter()
        .map(|b| {
            let base = PathBuf::from(b["base"].as_str().unwrap());
            let options = normalize(&base.join(b["options"].as_str().unwrap()));
            (base, options)
        })
        .collect()
}

/// Every kustomize directory a fleet.yaml deploys (its default and each target customization's),
/// relative to the bundle's base.
fn fleet_kustomize_dirs(fleet_yaml: &Json) -> Vec<String> {
    let mut dirs: Vec<String> = fleet_yaml["kustomize"]["dir"]
        .as_str()
        .map(str::to_string)
        .into_iter()
        .collect();
    for t in fleet_yaml["targetCustomizations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(d) = t["kustomize"]["dir"].as_str() {
            dirs.push(d.to_string());
        }
    }
    dirs
}

/// What a fleet.yaml's comparePatches fail to cover in what its directories render: a webhook
/// entry whose caBundle has no JSON pointer.
fn fleet_uncovered(fleet_yaml: &Json, rendered: &[Json]) -> Vec<String> {
    let patches = fleet_yaml["diff"]["comparePatches"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let matching = |obj: &Json| -> Vec<&Json> {
        patches
            .iter()
            .filter(|p| {
                p["apiVersion"] == obj["apiVersion"]
                    && p["kind"] == obj["kind"]
                    && p["name"].as_str().is_none_or(|n| n == name(obj))
                    && p["namespace"]
                        .as_str()
                        .is_none_or(|n| Some(n) == obj["metadata"]["namespace"].as_str())
            })
            .collect()
    };
    let mut missing = Vec::new();
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        for obj in of_kind(rendered, kind) {
            let pointers: BTreeSet<String> = matching(obj)
                .iter()
                .flat_map(|p| strings(&p["jsonPointers"]))
                .collect();
            let entries = obj["webhooks"].as_array().map_or(0, Vec::len);
            for i in 0..entries {
                let want = format!("/webhooks/{i}/clientConfig/caBundle");
                if !pointers.contains(&want) {
                    missing.push(format!("{kind} {}: {want}", name(obj)));
                }
            }
        }
    }
    missing
}

#[test]
fn fleet_gitrepos_and_fleet_yamls_match_fleets_schemas() {
    let crds = crds();
    let bundle_spec = bundle_spec_schema();
    let gitrepos = docs(FLEET_GITREPOS);
    assert_eq!(gitrepos.len(), 2, "one GitRepo per workspace");
    let namespaces: BTreeSet<&str> = gitrepos
        .iter()
        .map(|g| g["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(namespaces, BTreeSet::from(["fleet-default", "fleet-local"]));
    for g in &gitrepos {
        assert_eq!(object_errors(&crds, g), Vec::<String>::new(), "{}", name(g));
    }
    // The management cluster is Fleet's `local` cluster: only the fleet-local GitRepo targets it.
    let local = gitrepos
        .iter()
        .find(|g| g["metadata"]["namespace"] == "fleet-local")
        .unwrap();
    assert_eq!(
        local["spec"]["targets"],
        json!([{"name": "management", "clusterName": "local"}])
    );

    let mut seen = 0;
    for g in &gitrepos {
        for (_, options) in fleet_bundles(g) {
            let fleet_yaml = docs(options.to_str().unwrap()).remove(0);
            let spec = fleet_yaml_as_bundle_spec(&fleet_yaml);
            assert_eq!(
                errors(&bundle_spec, &spec),
                Vec::<String>::new(),
                "{}",
                options.display()
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 4, "two bundles in each GitRepo");

    // Broken copies fail.
    let mut broken = local.clone();
    broken["spec"]["targets"][0]["clusterNme"] = json!("local");
    assert!(
        !object_errors(&crds, &broken).is_empty(),
        "a misspelt field"
    );
    let mut broken = local.clone();
    broken["spec"]["bundles"][0]["base"] = json!(["manifests"]);
    assert!(!object_errors(&crds, &broken).is_empty(), "a wrong type");

    let webhook = docs("examples/gitops/fleet/webhook/fleet.yaml").remove(0);
    let mut broken = webhook.clone();
    broken["diff"]["comparePatches"][0]["jsonPointer"] = json!(["/webhooks"]);
    assert!(!errors(&bundle_spec, &fleet_yaml_as_bundle_spec(&broken)).is_empty());
    // Target customizations are checked as the targets Fleet makes of them.
    let mut broken = webhook.clone();
    broken["targetCustomizations"][0]["kustomize"]["dir"] = json!(["self-signed"]);
    assert!(!errors(&bundle_spec, &fleet_yaml_as_bundle_spec(&broken)).is_empty());
    let mut broken = webhook.clone();
    broken["targetCustomizations"][0]["clusterNames"] = json!("local");
    assert!(!errors(&bundle_spec, &fleet_yaml_as_bundle_spec(&broken)).is_empty());
}

#[test]
fn fleet_bundles_render_and_their_compare_patches_cover_what_helmop_writes() {
    let root = repo();
    for g in docs(FLEET_GITREPOS) {
        for (base, options) in fleet_bundles(&g) {
            let fleet_yaml = docs(options.to_str().unwrap()).remove(0);
            let dirs = fleet_kustomize_dirs(&fleet_yaml);
            assert!(!dirs.is_empty(), "{}: no kustomize.dir", options.display());
            for dir in dirs {
                // Fleet ships only the files under the bundle's base to the agent.
                let rel = normalize(&base.join(&dir));
                assert!(rel.starts_with(&base), "{dir} leaves the bundle's base");
                let rendered = render(&root.join(&rel), None).unwrap();
                assert!(!rendered.is_empty(), "{}", rel.display());
                assert_eq!(
                    fleet_uncovered(&fleet_yaml, &rendered),
                    Vec::<String>::new(),
                    "{} with {}",
                    options.display(),
                    rel.display()
                );
                assert_eq!(
                    jobs(&rendered),
                    Vec::<String>::new(),
                    "{}: a Job; revisit the examples",
                    rel.display()
                );
            }
        }
    }
    // The management cluster gets the full install (validating entries), downstream stamping only.
    let webhook = docs("examples/gitops/fleet/webhook/fleet.yaml").remove(0);
    assert_eq!(webhook["kustomize"]["dir"], "stamping-only");
    assert_eq!(webhook["targetCustomizations"][0]["clusterName"], "local");
    let full = render(
        &root.join("manifests").join(
            webhook["targetCustomizations"][0]["kustomize"]["dir"]
                .as_str()
                .unwrap(),
        ),
        None,
    )
    .unwrap();
    let validating = of_kind(&full, "ValidatingWebhookConfiguration")
        .next()
        .unwrap();
    assert!(!validating["webhooks"].as_array().unwrap().is_empty());
    // The only batch object is the renewal CronJob, whose Jobs are its children and not in Git.
    let batch: Vec<String> = full
        .iter()
        .filter(|o| {
            o["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("batch/"))
        })
        .map(|o| format!("{} {}", o["kind"].as_str().unwrap_or_default(), name(o)))
        .collect();
    assert_eq!(batch, ["CronJob helmop-tls-renew"]);

    // Broken: a pointer dropped, a Job rendered, a directory that does not exist.
    let mut broken = webhook.clone();
    broken["diff"]["comparePatches"][0]["jsonPointers"] =
        json!(["/webhooks/0/clientConfig/caBundle"]);
    assert!(!fleet_uncovered(&broken, &full).is_empty());
    assert_eq!(jobs(&with_a_job(&full)), ["helmop-hash-key-init"]);
    assert!(render(&root.join("manifests/no-such-overlay"), None).is_err());
}

// ---------------------------------------------------------------------------------------------
// Argo CD

const ARGOCD_APPLICATIONS: &str = "examples/gitops/argocd/applications.yaml";

/// caBundle must be ignored on both webhook configurations, and the ignored values respected on sync.
fn argocd_missing(app: &Json) -> Vec<String> {
    let mut missing = Vec::new();
    let rules = app["spec"]["ignoreDifferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        let covered = rules.iter().any(|r| {
            r["group"] == "admissionregistration.k8s.io"
                && r["kind"] == kind
                && r["name"] == "helmop-webhook"
                && strings(&r["jqPathExpressions"])
                    .contains(&".webhooks[]?.clientConfig.caBundle".to_string())
        });
        if !covered {
            missing.push(format!("{kind}: caBundle not ignored"));
        }
    }
    if !strings(&app["spec"]["syncPolicy"]["syncOptions"])
        .contains(&"RespectIgnoreDifferences=true".to_string())
    {
        missing.push("syncOptions: RespectIgnoreDifferences=true".into());
    }
    missing
}

#[test]
fn argocd_applications_match_argocds_schema_and_render() {
    let crds = crds();
    let apps = docs(ARGOCD_APPLICATIONS);
    assert_eq!(apps.len(), 2, "management and one downstream cluster");
    for app in &apps {
        assert_eq!(
            object_errors(&crds, app),
            Vec::<String>::new(),
            "{}",
            name(app)
        );
        assert_eq!(argocd_missing(app), Vec::<String>::new(), "{}", name(app));
        let dir = repo().join(app["spec"]["source"]["path"].as_str().unwrap());
        let patches = present(&app["spec"]["source"]["kustomize"]["patches"]);
        let rendered = render(&dir, patches).unwrap();
        assert!(!rendered.is_empty(), "{}", name(app));
        assert_eq!(
            jobs(&rendered),
            Vec::<String>::new(),
            "{}: a Job; revisit the examples",
            name(app)
        );
    }

    let app = &apps[0];
    let mut broken = app.clone();
    broken["spec"]["ignoreDifferences"][0]["jqPathExpression"] = json!(["."]);
    assert!(
        !object_errors(&crds, &broken).is_empty(),
        "a misspelt field"
    );
    let mut broken = app.clone();
    broken["spec"]["syncPolicy"]["syncOptions"] = json!("RespectIgnoreDifferences=true");
    assert!(!object_errors(&crds, &broken).is_empty(), "a wrong type");
    let mut broken = app.clone();
    broken["spec"]["source"]
        .as_object_mut()
        .unwrap()
        .remove("repoURL");
    assert!(
        !object_errors(&crds, &broken).is_empty(),
        "a required field"
    );
    let mut broken = app.clone();
    broken["spec"]["ignoreDifferences"]
        .as_array_mut()
        .unwrap()
        .pop();
    assert!(!argocd_missing(&broken).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Flux

#[test]
fn flux_objects_match_fluxs_schemas_and_render() {
    let crds = crds();
    let sources = docs("examples/gitops/flux/gitrepository.yaml");
    let kustomizations = docs("examples/gitops/flux/kustomizations.yaml");
    assert_eq!(sources.len(), 1);
    assert_eq!(
        kustomizations.len(),
        2,
        "management and one downstream cluster"
    );
    for obj in sources.iter().chain(&kustomizations) {
        assert_eq!(
            object_errors(&crds, obj),
            Vec::<String>::new(),
            "{}",
            name(obj)
        );
    }
    for k in &kustomizations {
        assert_eq!(
            k["spec"]["sourceRef"]["name"],
            sources[0]["metadata"]["name"]
        );
        // Runtime-written fields are left to server-side apply: no apply-policy annotation that
        // would freeze the webhook configurations.
        assert!(!k.to_string().contains("kustomize.toolkit.fluxcd.io/ssa"));
        let path = k["spec"]["path"].as_str().unwrap();
        let rel = normalize(Path::new(path));
        assert!(
            rel.starts_with("examples/gitops/overlays"),
            "{path}: the GitRepository's ignore rules keep only manifests/ and the overlays"
        );
        let rendered = render(&repo().join(&rel), present(&k["spec"]["patches"])).unwrap();
        assert!(!rendered.is_empty(), "{}", name(k));
        assert_eq!(
            jobs(&rendered),
            Vec::<String>::new(),
            "{}: a Job; revisit the examples",
            name(k)
        );
    }

    let k = &kustomizations[0];
    let mut broken = k.clone();
    broken["spec"].as_object_mut().unwrap().remove("sourceRef");
    assert!(
        !object_errors(&crds, &broken).is_empty(),
        "a required field"
    );
    let mut broken = k.clone();
    broken["spec"]["prune"] = json!("yes");
    assert!(!object_errors(&crds, &broken).is_empty(), "a wrong type");
    let mut broken = sources[0].clone();
    broken["spec"]["ref"]["brnch"] = json!("main");
    assert!(
        !object_errors(&crds, &broken).is_empty(),
        "a misspelt field"
    );
    let mut broken = k.clone();
    broken["apiVersion"] = json!("kustomize.toolkit.fluxcd.io/v1beta2");
    assert!(
        !object_errors(&crds, &broken).is_empty(),
        "a version not served"
    );
}
