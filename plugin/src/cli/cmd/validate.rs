//! `kubectl helmop validate -f FILE|DIR|-`: the webhook's HelmOp rules, offline, and with
//! `--cluster` its existence rule against a live cluster (module `cluster`).

mod cluster;

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use helmop_core::validate::{Finding, validate_helmop};
use helmop_core::yaml::parse_documents;
use serde::Serialize;
use serde_json::Value;

use crate::args::KubeArgs;
use crate::cli::inputs::{self, Input};
use crate::error::{ExitStatus, PluginError};
use crate::output;

/// `kubectl helmop validate`'s flags.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// File, directory (searched recursively for *.yaml, *.yml, *.json) or - for stdin; repeatable
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE|DIR|-",
        required = true
    )]
    pub files: Vec<PathBuf>,

    /// Output format
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,

    /// Also check, on the cluster of the current (or --context) context, that every Secret and
    /// ConfigMap each HelmOp lists exists in the HelmOp's namespace, as the admission webhook does
    #[arg(long)]
    pub cluster: bool,

    /// Path to the kubeconfig file (default: KUBECONFIG merged as kubectl does, else
    /// ~/.kube/config, else in-cluster); with --cluster
    #[arg(long, value_name = "FILE", requires = "cluster")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context of the cluster to check against; with --cluster
    #[arg(long, value_name = "CONTEXT", requires = "cluster")]
    pub context: Option<String>,

    /// Namespace of HelmOps that name none in metadata.namespace (default: the context's
    /// namespace, else `default`); with --cluster
    #[arg(short = 'n', long, value_name = "NAMESPACE", requires = "cluster")]
    pub namespace: Option<String>,

    /// Time to wait for any single API request, e.g. 10s; 0 means kube's defaults; with --cluster
    #[arg(long, value_name = "DURATION", value_parser = crate::args::parse_duration, default_value = "0", requires = "cluster")]
    pub request_timeout: std::time::Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// One line per finding: FILE:LINE: KIND NAME (document N): SEVERITY: PATH: MESSAGE
    Text,
    /// One JSON object with every file, document and finding, and a summary
    Json,
}

const HELMOP_KIND: &str = "HelmOp";
const FLEET_API_VERSION: &str = helmop_core::model::FLEET_API_VERSION;

/// Everything `validate` found, per file and document.
#[derive(Debug, Serialize)]
pub struct Report {
    pub files: Vec<FileReport>,
    pub summary: Summary,
    /// What `--cluster` checked (absent without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<cluster::ClusterCheck>,
    /// False if any HelmOp is denied or any input could not be read or parsed.
    pub valid: bool,
}

#[derive(Debug, Serialize)]
pub struct FileReport {
    /// Path as given (or found in a directory), `-` for stdin.
    pub file: String,
    /// Why the file could not be read or parsed (then `documents` is empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// 1-based line of `error`, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// 1-based column of `error`, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<u64>,
    pub documents: Vec<DocumentReport>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DocumentReport {
    /// 1-based position of the document in its file (empty documents are not counted).
    pub document: usize,
    /// 1-based position inside a `kind: List` document.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
    /// 1-based line where the document starts (0 if unknown).
    pub line: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub status: DocumentStatus,
    /// Why a document was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub findings: Vec<Finding>,
    /// The parsed object, for checks that need more than the offline rules (`--cluster`).
    #[serde(skip)]
    pub object: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DocumentStatus {
    /// A HelmOp without denials (maybe with warnings).
    Valid,
    /// A HelmOp (or a broken document) with at least one denial.
    Denied,
    /// Not a HelmOp.
    Skipped,
}

#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub files: usize,
    pub helmops: usize,
    pub denied: usize,
    pub warnings: usize,
    pub skipped: usize,
    pub errors: usize,
}

pub fn run(args: &ValidateArgs) -> Result<ExitStatus, PluginError> {
    let inputs = inputs::collect(&args.files, &mut std::io::stdin().lock());
    let mut report = build_report(inputs);
    if args.cluster {
        report = check_cluster(&kube_args(args), report)?;
    }
    let rendered = match args.output {
        OutputFormat::Text => render_text(&report),
        OutputFormat::Json => output::json(&report)?,
    };
    output::emit(&rendered)?;
    Ok(if report.valid {
        ExitStatus::Ok
    } else {
        ExitStatus::Invalid
    })
}

fn kube_args(args: &ValidateArgs) -> KubeArgs {
    KubeArgs {
        kubeconfig: args.kubeconfig.clone(),
        context: args.context.clone(),
        namespace: args.namespace.clone(),
        request_timeout: args.request_timeout,
        upstream_id: None,
        kubeconfig_namespaces: Vec::new(),
    }
}

/// Adds the existence findings of `--cluster` to `report` and recomputes its verdict. Runs its
/// own runtime: the offline command stays synchronous.
fn check_cluster(kube: &KubeArgs, report: Report) -> Result<Report, PluginError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PluginError::Usage(format!("cannot start the async runtime: {e}")))?;
    let mut files = report.files;
    let mut docs: Vec<&mut DocumentReport> = files
        .iter_mut()
        .flat_map(|f| f.documents.iter_mut())
        .collect();
    let checked = runtime.block_on(cluster::check(kube, &mut docs))?;
    let mut report = finish(files);
    report.cluster = Some(checked);
    Ok(report)
}

/// Parses and checks every input.
pub fn build_report(inputs: Vec<Input>) -> Report {
    let files = inputs.into_iter().map(check_input).collect();
    finish(files)
}

fn check_input(input: Input) -> FileReport {
    let mut report = FileReport {
        file: input.name,
        error: None,
        line: None,
        column: None,
        documents: Vec::new(),
    };
    let bytes = match input.content {
        Ok(bytes) => bytes,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    match parse_documents(&bytes) {
        Ok(docs) => {
            for doc in docs {
                let ordinal = doc.index + 1;
                if is_list(&doc.value) {
                    let items = doc.value["items"].as_array().cloned().unwrap_or_default();
                    for (i, item) in items.into_iter().enumerate() {
                        report
                            .documents
                            .push(check_object(ordinal, Some(i + 1), doc.line, item));
                    }
                } else {
                    report
                        .documents
                        .push(check_object(ordinal, None, doc.line, doc.value));
                }
            }
        }
        Err(e) => {
            report.line = e.line();
            report.column = e.column();
            report.error = Some(e.reason());
        }
    }
    report
}

/// `apiVersion: v1, kind: List` (what `kubectl get -o yaml` prints): its items are the objects.
fn is_list(v: &Value) -> bool {
    v.get("kind").and_then(Value::as_str) == Some("List")
        && v.get("items").is_some_and(Value::is_array)
}

fn check_object(document: usize, item: Option<usize>, line: u64, object: Value) -> DocumentReport {
    let field = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    let meta = object.get("metadata").cloned().unwrap_or(Value::Null);
    let mut report = DocumentReport {
        document,
        item,
        line,
        api_version: field(&object, "apiVersion"),
        kind: field(&object, "kind"),
        namespace: field(&meta, "namespace"),
        name: field(&meta, "name"),
        status: DocumentStatus::Skipped,
        note: None,
        findings: Vec::new(),
        object: Value::Null,
    };
    if !object.is_object() {
        report.findings.push(Finding::deny(
            "",
            "this document is not a Kubernetes object (a mapping with apiVersion and kind)",
        ));
    } else if report.kind.as_deref() != Some(HELMOP_KIND) {
        report.note = Some(match &report.kind {
            Some(kind) => format!("{kind} is not a HelmOp"),
            None => "no kind: not a Kubernetes object".to_string(),
        });
    } else {
        if report.api_version.as_deref() != Some(FLEET_API_VERSION) {
            report.findings.push(Finding::deny(
                "apiVersion",
                format!(
                    "apiVersion {} is not Fleet's: use {FLEET_API_VERSION}",
                    report
                        .api_version
                        .as_deref()
                        .map_or("(missing)".to_string(), |v| format!("{v:?}"))
                ),
            ));
        }
        report.findings.extend(validate_helmop(&object));
    }
    report.object = object;
    report
}

/// Derives document statuses, the summary and the verdict from the findings.
pub fn finish(files: Vec<FileReport>) -> Report {
    let mut files = files;
    let mut summary = Summary {
        files: files.len(),
        ..Summary::default()
    };
    for file in &mut files {
        if file.error.is_some() {
            summary.errors += 1;
        }
        for doc in &mut file.documents {
            let is_helmop = doc.kind.as_deref() == Some(HELMOP_KIND);
            let denied = doc.findings.iter().any(Finding::is_deny);
            doc.status = if denied {
                DocumentStatus::Denied
            } else if is_helmop {
                DocumentStatus::Valid
            } else {
                DocumentStatus::Skipped
            };
            if is_helmop {
                summary.helmops += 1;
            }
            match doc.status {
                DocumentStatus::Denied => summary.denied += 1,
                DocumentStatus::Skipped => summary.skipped += 1,
                DocumentStatus::Valid => {
                    if !doc.findings.is_empty() {
                        summary.warnings += 1;
                    }
                }
            }
        }
    }
    let valid = summary.denied == 0 && summary.errors == 0;
    Report {
        files,
        summary,
        cluster: None,
        valid,
    }
}

/// `FILE:LINE: KIND NAME (document N): SEVERITY: PATH: MESSAGE`, one line per finding, a line per
/// skipped document or clean HelmOp, and a summary.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    for file in &report.files {
        if let Some(error) = &file.error {
            let _ = match (file.line, file.column) {
                (Some(line), Some(column)) => {
                    writeln!(out, "{}:{line}:{column}: error: {error}", file.file)
                }
                (Some(line), None) => writeln!(out, "{}:{line}: error: {error}", file.file),
                _ => writeln!(out, "{}: error: {error}", file.file),
            };
        }
        for doc in &file.documents {
            let at = format!("{}:{}: {}", file.file, doc.line, describe(doc));
            if let Some(note) = &doc.note {
                let _ = writeln!(out, "{at}: skipped: {note}");
            }
            for f in &doc.findings {
                let _ = if f.path.is_empty() {
                    writeln!(out, "{at}: {}: {}", f.severity, f.message)
                } else {
                    writeln!(out, "{at}: {}: {}: {}", f.severity, f.path, f.message)
                };
            }
            if doc.status == DocumentStatus::Valid && doc.findings.is_empty() {
                let _ = writeln!(out, "{at}: ok");
            }
        }
    }
    let s = &report.summary;
    let _ = writeln!(
        out,
        "{} {}, {} {}: {} denied, {} with warnings, {} ok; {} skipped; {} {}",
        s.files,
        plural(s.files, "file", "files"),
        s.helmops,
        plural(s.helmops, "HelmOp", "HelmOps"),
        s.denied.min(s.helmops),
        s.warnings,
        s.helmops - s.denied.min(s.helmops) - s.warnings,
        s.skipped,
        s.errors,
        plural(s.errors, "error", "errors"),
    );
    if let Some(c) = &report.cluster {
        let _ = writeln!(
            out,
            "checked on the cluster of context {:?}: {} {}, {} missing",
            c.context,
            c.references,
            plural(c.references, "referenced object", "referenced objects"),
            c.missing,
        );
    }
    out
}

fn plural(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

/// `HelmOp fleet-default/shop (document 2)`, `ConfigMap app (document 1, item 3)`.
fn describe(doc: &DocumentReport) -> String {
    let kind = doc.kind.as_deref().unwrap_or("object");
    let name = match (&doc.namespace, &doc.name) {
        (Some(ns), Some(name)) => format!(" {ns}/{name}"),
        (None, Some(name)) => format!(" {name}"),
        _ => String::new(),
    };
    let position = match doc.item {
        Some(item) => format!("document {}, item {item}", doc.document),
        None => format!("document {}", doc.document),
    };
    format!("{kind}{name} ({position})")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use helmop_core::validate::Severity;

    use super::*;

    /// Findings of one severity in a report.
    fn count(report: &Report, severity: Severity) -> usize {
        report
            .files
            .iter()
            .flat_map(|f| &f.documents)
            .flat_map(|d| &d.findings)
            .filter(|f| f.severity == severity)
            .count()
    }

    fn input(name: &str, text: &str) -> Input {
        Input {
            name: name.into(),
            content: Ok(text.as_bytes().to_vec()),
        }
    }

    const VALID: &str = "apiVersion: fleet.cattle.io/v1alpha1
kind: HelmOp
metadata: {name: ok, namespace: apps}
spec:
  helm: {repo: oci://ghcr.io/acme/app, version: 1.x}
";

    #[test]
    fn mixed_file() {
        let text = format!(
            "{VALID}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cfg}}\n---\n\
             apiVersion: fleet.cattle.io/v1alpha1\nkind: HelmOp\nmetadata: {{name: bad}}\n\
             spec:\n  helm: {{repo: 'oci://r/app', version: '*'}}\n  downstreamResources:\n  - {{kind: secret, name: db}}\n  - {{kind: Pod, name: p}}\n"
        );
        let report = build_report(vec![input("m.yaml", &text)]);
        assert!(!report.valid);
        let docs = &report.files[0].documents;
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[0].status, DocumentStatus::Valid);
        assert_eq!(docs[1].status, DocumentStatus::Skipped);
        assert_eq!(docs[1].note.as_deref(), Some("ConfigMap is not a HelmOp"));
        assert_eq!(docs[2].status, DocumentStatus::Denied);
        assert_eq!(docs[2].line, 11);
        assert_eq!(count(&report, Severity::Warn), 1);
        assert_eq!(count(&report, Severity::Deny), 1);
        let text = render_text(&report);
        assert!(
            text.contains("m.yaml:1: HelmOp apps/ok (document 1): ok\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "m.yaml:7: ConfigMap cfg (document 2): skipped: ConfigMap is not a HelmOp\n"
            ),
            "{text}"
        );
        assert!(text.contains("m.yaml:11: HelmOp bad (document 3): warn: spec.downstreamResources[0].kind: kind \"secret\" works"), "{text}");
        assert!(text.contains("m.yaml:11: HelmOp bad (document 3): deny: spec.downstreamResources[1].kind: kind \"Pod\" is not allowed: use Secret or ConfigMap\n"), "{text}");
        assert!(
            text.ends_with(
                "1 file, 2 HelmOps: 1 denied, 0 with warnings, 1 ok; 1 skipped; 0 errors\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn warnings_only_is_valid() {
        let text = VALID.replace(
            "version: 1.x}",
            "version: 1.x}\n  downstreamResources: [{kind: SECRET, name: db}]",
        );
        let report = build_report(vec![input("w.yaml", &text)]);
        assert!(report.valid);
        assert_eq!(report.summary.warnings, 1);
    }

    #[test]
    fn list_items_are_checked() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: fleet.cattle.io/v1alpha1\n  kind: HelmOp\n  metadata: {name: a}\n  spec: {}\n- {apiVersion: v1, kind: Secret, metadata: {name: s}}\n";
        let report = build_report(vec![input("l.yaml", text)]);
        let docs = &report.files[0].documents;
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].item, Some(1));
        assert_eq!(docs[0].status, DocumentStatus::Denied);
        assert!(
            render_text(&report)
                .contains("l.yaml:1: HelmOp a (document 1, item 1): deny: spec.helm: ")
        );
    }

    #[test]
    fn wrong_api_version_and_non_objects() {
        let text = "apiVersion: fleet.cattle.io/v1beta1\nkind: HelmOp\nspec: {helm: {repo: 'oci://x/y', version: '*'}}\n---\njust a string\n";
        let report = build_report(vec![input("v.yaml", text)]);
        let docs = &report.files[0].documents;
        assert_eq!(docs[0].findings[0].path, "apiVersion");
        assert_eq!(docs[1].status, DocumentStatus::Denied);
        assert!(!report.valid);
    }

    #[test]
    fn unreadable_and_malformed_inputs_are_errors() {
        let report = build_report(vec![
            Input {
                name: "gone.yaml".into(),
                content: Err(PluginError::ReadFile(Arc::new(
                    std::io::Error::from_raw_os_error(2),
                ))),
            },
            input("broken.yaml", "a: 1\nb: [\n"),
        ]);
        assert!(!report.valid);
        assert_eq!(report.summary.errors, 2);
        let text = render_text(&report);
        assert!(
            text.contains("gone.yaml: error: cannot read: No such file"),
            "{text}"
        );
        assert!(
            text.contains("broken.yaml:2:4: error: malformed YAML: "),
            "{text}"
        );
    }

    #[test]
    fn no_helmops_is_still_valid() {
        let report = build_report(vec![input(
            "c.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
        )]);
        assert!(report.valid);
        assert_eq!(report.summary.skipped, 1);
    }

    #[test]
    fn json_shape() {
        let report = build_report(vec![input("j.yaml", VALID)]);
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(v["valid"], true);
        assert_eq!(v["files"][0]["file"], "j.yaml");
        let doc = &v["files"][0]["documents"][0];
        assert_eq!(doc["document"], 1);
        assert_eq!(doc["line"], 1);
        assert_eq!(doc["apiVersion"], FLEET_API_VERSION);
        assert_eq!(doc["kind"], "HelmOp");
        assert_eq!(doc["status"], "valid");
        assert_eq!(doc["findings"], serde_json::json!([]));
        assert!(doc.get("object").is_none());
        assert_eq!(v["summary"]["helmops"], 1);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

        /// Whatever the bytes, validate reports instead of crashing, in both formats.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            let report = build_report(vec![Input { name: "fuzz".into(), content: Ok(bytes) }]);
            let _ = render_text(&report);
            let _ = serde_json::to_string(&report).unwrap();
        }

        /// YAML-looking text with HelmOp/List keys, to get past the parser more often.
        #[test]
        fn helmop_shaped_text_never_panics(
            text in "(kind: (HelmOp|List)\n|apiVersion: fleet.cattle.io/v1alpha1\n|items:\n- |spec:\n  |helm: |downstreamResources: |targets: |[-:{}\\[\\],'\" \na-z0-9]|---\n){0,60}"
        ) {
            let report = build_report(vec![Input { name: "fuzz".into(), content: Ok(text.into_bytes()) }]);
            let _ = render_text(&report);
            let _ = serde_json::to_string(&report).unwrap();
        }
    }
}
