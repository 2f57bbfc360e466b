//! Runs the built `kubectl-helmop` on the shipped examples (`manifests/examples/`) and checks
//! every verdict: exit code, and each finding's document, severity and JSON path.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test with its message

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-helmop");

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/examples")
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run kubectl-helmop")
}

fn run_json(path: &Path) -> (i32, Value) {
    let out = run(&["validate", "-f", path.to_str().unwrap(), "-o", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{}: not JSON ({e}): {}",
            path.display(),
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code().expect("exit code"), report)
}

/// `(document, severity, path)` of every finding, in output order.
fn findings(report: &Value) -> Vec<(u64, String, String)> {
    let mut out = Vec::new();
    for file in report["files"].as_array().unwrap() {
        for doc in file["documents"].as_array().unwrap() {
            for f in doc["findings"].as_array().unwrap() {
                out.push((
                    doc["document"].as_u64().unwrap(),
                    f["severity"].as_str().unwrap().to_string(),
                    f["path"].as_str().unwrap().to_string(),
                ));
            }
        }
    }
    out
}

/// A finding as the test compares it: document index, severity, JSON path.
type Finding = (u64, String, String);

fn f(doc: u64, severity: &str, path: &str) -> Finding {
    (doc, severity.to_string(), path.to_string())
}

#[test]
fn every_example_gets_its_verdict() {
    let table: Vec<(&str, i32, Vec<Finding>)> = vec![
        ("valid/oci-chart.yaml", 0, vec![]),
        ("valid/repo-chart.yaml", 0, vec![]),
        ("valid/per-target-resources.yaml", 0, vec![]),
        ("valid/tarball-chart.json", 0, vec![]),
        (
            "valid/with-warnings.yaml",
            0,
            vec![
                f(1, "warn", "spec.downstreamResources[0].kind"),
                f(1, "warn", "spec.targets[0].downstreamResources[0]"),
                f(1, "warn", "spec.downstreamResources[1]"),
                f(1, "warn", "spec.helm.valuesFrom[0].secretKeyRef.namespace"),
            ],
        ),
        (
            "invalid/wrong-kinds.yaml",
            1,
            vec![
                f(1, "deny", "spec.downstreamResources[0].kind"),
                f(1, "deny", "spec.downstreamResources[1].kind"),
                f(1, "deny", "spec.downstreamResources[2].kind"),
                f(1, "deny", "spec.targets[0].downstreamResources[0].kind"),
            ],
        ),
        (
            "invalid/bad-names.yaml",
            1,
            vec![
                // The CRD's schema first, then helmop's rules.
                f(1, "deny", "spec.helm.releaseName"),
                f(1, "deny", "spec.namespace"),
                f(1, "deny", "spec.downstreamResources[0].name"),
                f(1, "deny", "spec.downstreamResources[1].name"),
            ],
        ),
        (
            "invalid/duplicates-and-chart.yaml",
            1,
            vec![
                f(1, "deny", "spec.helm.chart"),
                f(1, "warn", "spec.downstreamResources[1]"),
            ],
        ),
        (
            "invalid/bad-version.yaml",
            1,
            vec![
                f(1, "deny", "spec.helm.version"),
                f(2, "deny", "spec.helm.repo"),
                f(2, "deny", "spec.helm.version"),
            ],
        ),
        (
            "invalid/bad-targets.yaml",
            1,
            vec![
                f(
                    1,
                    "deny",
                    "spec.targets[0].clusterSelector.matchExpressions[0].operator",
                ),
                f(1, "warn", "spec.targets[1]"),
            ],
        ),
        (
            "invalid/wrong-types.yaml",
            1,
            vec![
                f(1, "deny", "spec.downstreamResources"),
                f(1, "deny", "spec.helm.version"),
                f(1, "deny", "spec.targets[0].clusterSelector.matchLabels.gpu"),
            ],
        ),
        (
            "invalid/crd-schema.yaml",
            1,
            vec![
                f(1, "deny", "spec.targetCustomizationMode"),
                f(1, "deny", "spec.pollingInterval"),
            ],
        ),
        (
            "invalid/missing-helm.yaml",
            1,
            vec![f(1, "deny", "spec.helm")],
        ),
        ("invalid/malformed.yaml", 1, vec![]),
    ];
    let mut covered = Vec::new();
    for (file, code, want) in &table {
        let path = examples().join(file);
        let (got_code, report) = run_json(&path);
        assert_eq!(got_code, *code, "{file}: {report:#}");
        assert_eq!(&findings(&report), want, "{file}: {report:#}");
        assert_eq!(report["valid"], *code == 0, "{file}");
        covered.push(file.to_string());
    }
    // Every shipped example has a row here.
    for dir in ["valid", "invalid"] {
        for entry in std::fs::read_dir(examples().join(dir)).unwrap() {
            let name = format!("{dir}/{}", entry.unwrap().file_name().to_string_lossy());
            assert!(covered.contains(&name), "{name} has no expected verdict");
        }
    }
}

#[test]
fn malformed_yaml_names_file_and_line() {
    let path = examples().join("invalid/malformed.yaml");
    let (_, report) = run_json(&path);
    assert_eq!(report["files"][0]["line"], 11);
    assert!(
        report["files"][0]["error"]
            .as_str()
            .unwrap()
            .starts_with("malformed YAML")
    );
    let out = run(&["validate", "-f", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("malformed.yaml:11:13: error: malformed YAML: unclosed bracket"),
        "{text}"
    );
}

#[test]
fn text_output_names_file_line_document_and_path() {
    let path = examples().join("invalid/bad-version.yaml");
    let out = run(&["validate", "-f", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    let expected = format!(
        "{}:14: HelmOp fleet-default/docs-tarball (document 2): deny: spec.helm.repo: ",
        path.display()
    );
    assert!(text.contains(&expected), "{text}");
    assert!(
        text.ends_with("1 file, 2 HelmOps: 2 denied, 0 with warnings, 0 ok; 0 skipped; 0 errors\n"),
        "{text}"
    );
}

#[test]
fn directories_are_walked_recursively() {
    let (code, report) = run_json(&examples());
    assert_eq!(code, 1);
    let files: Vec<&str> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["file"].as_str().unwrap())
        .collect();
    assert_eq!(files.len(), 14, "{files:?}");
    assert!(files.iter().all(|f| !f.ends_with(".md")));
    assert_eq!(report["summary"]["errors"], 1);

    let (code, report) = run_json(&examples().join("valid"));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["summary"]["helmops"], 5);
    assert_eq!(report["summary"]["warnings"], 1);
    assert_eq!(report["summary"]["skipped"], 3);
}

#[test]
fn stdin_and_several_files() {
    let mut child = Command::new(BIN)
        .args(["validate", "-f", "-", "-f"])
        .arg(examples().join("valid/repo-chart.yaml"))
        .args(["-o", "json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = std::fs::read(examples().join("invalid/missing-helm.yaml")).unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&input).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["files"][0]["file"], "-");
    assert_eq!(report["files"][0]["documents"][0]["status"], "denied");
    assert_eq!(report["files"][1]["documents"][0]["status"], "valid");
}

#[test]
fn unreadable_input_is_exit_1() {
    let out = run(&["validate", "-f", "/nonexistent/helmop.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("/nonexistent/helmop.yaml: error: cannot read:"),
        "{text}"
    );
}

#[test]
fn garbage_bytes_are_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.yaml");
    std::fs::write(&path, b"kind: HelmOp\nspec: \xff\xfe\x00\n").unwrap();
    let out = run(&["validate", "-f", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("garbage.yaml:2: error: not valid UTF-8"),
        "{text}"
    );
}

#[test]
fn usage_errors_exit_1_and_help_exits_0() {
    let out = run(&["validate"]);
    assert_eq!(out.status.code(), Some(1));
    let out = run(&["validate", "-f", "x", "-o", "xml"]);
    assert_eq!(out.status.code(), Some(1));
    let out = run(&["validate", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("Usage: kubectl helmop validate"), "{help}");
}

/// The plugin as kubectl runs it: `kubectl helmop ...` finds `kubectl-helmop` on PATH.
#[test]
fn runs_through_kubectl() {
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let kubectl = |args: &[&str]| {
        Command::new("kubectl")
            .args(args)
            .env("PATH", &path)
            .output()
            .expect("kubectl must be installed (the plugin is tested through it)")
    };

    let list = kubectl(&["plugin", "list"]);
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains("kubectl-helmop"),
        "kubectl plugin list: {listed}"
    );

    let valid = examples().join("valid");
    let out = kubectl(&["helmop", "validate", "-f", valid.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("5 HelmOps: 0 denied"));

    let invalid = examples().join("invalid/wrong-kinds.yaml");
    let out = kubectl(&[
        "helmop",
        "validate",
        "-f",
        invalid.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["summary"]["denied"], 1);

    let out = kubectl(&["helmop", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: kubectl helmop"));
}
