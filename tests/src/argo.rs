//! Argo Rollouts: the `rollouts.argoproj.io` CRD (vendored in `tests/fixtures/argo-rollouts/`,
//! see `SOURCE.md` there), which the rollout watcher and the webhook stamp like Deployments.
//! The harness does not install it; tests that need Rollouts call
//! [`install_argo_rollouts_crd`] on each cluster they use.
//!
//! The test clusters' API servers (1.20.2 built with Go 1.19) reject a custom resource that
//! sets a string field to `""` (kubernetes/kubernetes#99804), so Rollouts in tests leave such
//! fields out; the same bug is why the vendored CRD has no `default: ""`.

use std::path::PathBuf;

use anyhow::ensure;
use kube::Client;
use kube::api::ApiResource;

/// `apiVersion` of the Rollout kind.
pub const ARGO_ROLLOUTS_API_VERSION: &str = "argoproj.io/v1alpha1";

/// The Rollout kind, as served by the vendored CRD.
pub fn rollout_resource() -> ApiResource {
    ApiResource {
        group: "argoproj.io".to_owned(),
        version: "v1alpha1".to_owned(),
        api_version: ARGO_ROLLOUTS_API_VERSION.to_owned(),
        kind: "Rollout".to_owned(),
        plural: "rollouts".to_owned(),
    }
}

/// `tests/fixtures/argo-rollouts/rollout-crd.yaml` in this crate.
pub fn argo_rollouts_crd_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/argo-rollouts/rollout-crd.yaml")
}

/// Installs the vendored `rollouts.argoproj.io` CRD on the cluster behind `client` and waits
/// (bounded by [`crate::DEFAULT_TIMEOUT`]) until it is Established and `argoproj.io/v1alpha1`
/// serves `rollouts`. Idempotent: an existing CRD of that name is left as it is, so tests of
/// one binary (which share the control plane) may all call it.
pub async fn install_argo_rollouts_crd(client: &Client) -> anyhow::Result<()> {
    let crd = crate::crds::install_crd(client, &argo_rollouts_crd_path()).await?;
    let expected = rollout_resource();
    ensure!(
        crd.spec.group == expected.group
            && crd.spec.names.plural == expected.plural
            && crd.spec.names.kind == expected.kind
            && crd
                .spec
                .versions
                .iter()
                .any(|v| v.served && v.name == expected.version),
        "{} does not define {} {}",
        argo_rollouts_crd_path().display(),
        expected.api_version,
        expected.kind
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vendored file parses as the CRD [`rollout_resource`] describes (no cluster needed).
    #[test]
    fn vendored_crd_defines_rollouts() {
        let crd = crate::crds::read_crd(&argo_rollouts_crd_path()).unwrap();
        let expected = rollout_resource();
        assert_eq!(crd.metadata.name.as_deref(), Some("rollouts.argoproj.io"));
        assert_eq!(crd.spec.group, expected.group);
        assert_eq!(crd.spec.names.kind, expected.kind);
        assert_eq!(crd.spec.names.plural, expected.plural);
        assert_eq!(crd.spec.scope, "Namespaced");
        let version = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == expected.version)
            .unwrap();
        assert!(version.served && version.storage);
        let yaml = std::fs::read_to_string(argo_rollouts_crd_path()).unwrap();
        assert!(yaml.starts_with("apiVersion: apiextensions.k8s.io/v1\n"));
        // The test clusters reject the CRD with these (SOURCE.md, "Changes from upstream").
        assert!(!yaml.contains("default: \"\""));
    }
}
