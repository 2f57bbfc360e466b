//! `kubectl helmop validate --cluster`: the real binary checks the existence of every referenced
//! Secret/ConfigMap in a live namespace of the upstream cluster, with the webhook's wording.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use helmop_tests::*;
use serde_json::Value;

const RUN: Duration = Duration::from_secs(60);

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn assert_code(&self, code: i32) {
        assert_eq!(
            self.code,
            Some(code),
            "exit code (wanted {code})\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
    }
}

impl From<Output> for Run {
    fn from(out: Output) -> Self {
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// `kubectl-helmop validate -f FILE --cluster --kubeconfig KUBECONFIG EXTRA...`.
async fn validate(file: &Path, kubeconfig: &Path, extra: &[&str]) -> Run {
    let (file, kubeconfig) = (file.display().to_string(), kubeconfig.display().to_string());
    let mut args = vec![
        "validate",
        "-f",
        &file,
        "--cluster",
        "--kubeconfig",
        &kubeconfig,
    ];
    args.extend_from_slice(extra);
    match run_plugin(&args, &[], RUN).await {
        Ok(out) => out.into(),
        Err(e) => panic!("{e:#}"),
    }
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A ConfigMap (skipped by validate) and then a HelmOp in `ns` listing Secret `db` at the root and
/// ConfigMap `app` plus Secret `db` again in a target.
fn helmop_file(ns: &str) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata: {{name: unrelated, namespace: {ns}}}
data: {{a: b}}
---
apiVersion: fleet.cattle.io/v1alpha1
kind: HelmOp
metadata:
  name: shop
  namespace: {ns}
spec:
  helm: {{repo: oci://ghcr.io/acme/charts/shop, version: 1.2.3}}
  downstreamResources:
  - {{kind: Secret, name: db}}
  targets:
  - name: prod
    clusterSelector: {{matchLabels: {{env: prod}}}}
    downstreamResources:
    - {{kind: ConfigMap, name: app}}
"
    )
}

#[tokio::test]
async fn missing_secret_is_denied_until_it_exists() {
    let cp = control_plane();
    let upstream = cp.upstream();
    let client = upstream.client().await;
    let ns = fresh_namespace(&client, "validate").await.unwrap();
    create_config_map(&client, &ns, "app", &[("k", "v")])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "shop.yaml", &helmop_file(&ns));
    let f = file.display();

    // `-n default` does not apply: the HelmOp names its own namespace.
    let run = validate(&file, &upstream.kubeconfig, &["-n", "default"]).await;
    run.assert_code(1);
    let expected = format!(
        "{f}:6: HelmOp {ns}/shop (document 2): deny: spec.downstreamResources[0]: Secret \"db\" does not \
         exist in namespace \"{ns}\"; create it first, or annotate the HelmOp helmop.dev/allow-missing=true \
         if it is created later\n"
    );
    assert!(run.stdout.contains(&expected), "{}", run.stdout);
    assert!(!run.stdout.contains("ConfigMap \"app\""), "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!(
            "{f}:1: ConfigMap {ns}/unrelated (document 1): skipped"
        )),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.ends_with(
            "1 file, 1 HelmOp: 1 denied, 0 with warnings, 0 ok; 1 skipped; 0 errors\n\
             checked on the cluster of context \"upstream\": 2 referenced objects, 1 missing\n"
        ),
        "{}",
        run.stdout
    );

    let run = validate(&file, &upstream.kubeconfig, &["-o", "json"]).await;
    run.assert_code(1);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["valid"], false);
    assert_eq!(
        report["cluster"],
        serde_json::json!({"context": "upstream", "references": 2, "missing": 1})
    );
    let findings = &report["files"][0]["documents"][1]["findings"];
    assert_eq!(findings.as_array().map(Vec::len), Some(1), "{findings}");
    assert_eq!(findings[0]["severity"], "deny");
    assert_eq!(findings[0]["path"], "spec.downstreamResources[0]");

    create_secret(&client, &ns, "db", &[("password", b"s3cret")])
        .await
        .unwrap();
    let run = validate(&file, &upstream.kubeconfig, &[]).await;
    run.assert_code(0);
    assert!(
        run.stdout
            .contains(&format!("{f}:6: HelmOp {ns}/shop (document 2): ok\n")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.ends_with(
            "checked on the cluster of context \"upstream\": 2 referenced objects, 0 missing\n"
        ),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("s3cret") && !run.stderr.contains("s3cret"));
}

#[tokio::test]
async fn allow_missing_warns_in_the_namespace_given_by_flag() {
    let cp = control_plane();
    let upstream = cp.upstream();
    let client = upstream.client().await;
    let ns = fresh_namespace(&client, "validate-allow").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // No metadata.namespace: `-n` says where the HelmOp (and so its sources) would live.
    let file = write(
        &dir,
        "later.yaml",
        "apiVersion: fleet.cattle.io/v1alpha1
kind: HelmOp
metadata:
  name: later
  annotations: {helmop.dev/allow-missing: \"true\"}
spec:
  helm: {repo: oci://ghcr.io/acme/charts/shop, version: 1.2.3}
  downstreamResources:
  - {kind: Secret, name: made-by-external-secrets}
",
    );
    let run = validate(&file, &upstream.kubeconfig, &["-n", &ns]).await;
    run.assert_code(0);
    let expected = format!(
        "{}:1: HelmOp later (document 1): warn: spec.downstreamResources[0]: Secret \
         \"made-by-external-secrets\" does not exist in namespace \"{ns}\" yet; Fleet cannot copy it until it does\n",
        file.display()
    );
    assert!(run.stdout.contains(&expected), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("1 file, 1 HelmOp: 0 denied, 1 with warnings, 0 ok"),
        "{}",
        run.stdout
    );

    // Without the annotation the same file is denied.
    let denied = std::fs::read_to_string(&file)
        .unwrap()
        .replace("\"true\"", "\"false\"");
    let file = write(&dir, "now.yaml", &denied);
    let run = validate(&file, &upstream.kubeconfig, &["-n", &ns]).await;
    run.assert_code(1);
    assert!(
        run.stdout.contains(&format!(
            "deny: spec.downstreamResources[0]: Secret \"made-by-external-secrets\" does not exist in namespace \"{ns}\";"
        )),
        "{}",
        run.stdout
    );
}

#[tokio::test]
async fn unreachable_cluster_exits_3() {
    // A port nothing listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write(
        &dir,
        "kubeconfig",
        &format!(
            "apiVersion: v1
kind: Config
clusters:
- name: gone
  cluster: {{server: \"https://127.0.0.1:{port}\", insecure-skip-tls-verify: true}}
users:
- name: someone
  user: {{token: not-a-real-token}}
contexts:
- name: gone
  context: {{cluster: gone, user: someone, namespace: apps}}
current-context: gone
"
        ),
    );
    let file = write(&dir, "shop.yaml", &helmop_file("apps"));
    let run = validate(&file, &kubeconfig, &[]).await;
    run.assert_code(3);
    assert!(
        run.stderr
            .contains("error: cannot reach the upstream cluster: looking up "),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("not-a-real-token"), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
}
