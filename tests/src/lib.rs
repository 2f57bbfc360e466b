//! Test support for the end-to-end suites: a real local control plane (one upstream and two
//! downstream kube-apiservers, started once per test binary by `tests/controlplane/cp`), fresh
//! namespaces, and helpers for the objects helmop works with.
//!
//! ```no_run
//! use helmop_tests::{control_plane, fresh_namespace, UPSTREAM};
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let cp = control_plane();
//! let client = cp.cluster(UPSTREAM).client().await;
//! let ns = fresh_namespace(&client, "demo").await?;
//! # Ok(()) }
//! ```
//!
//! Helpers that talk to a cluster return `anyhow::Result` so tests can use `?`; setting up the
//! control plane itself panics with a message saying what to do (a missing prerequisite is a
//! test failure, never a skip).

mod argo;
mod binaries;
mod certs;
mod controlplane;
mod crds;
mod endpoints;
mod fleet;
pub mod images;
mod manifests;
mod namespaces;
mod node;
mod objects;
pub mod proxy;
pub mod registry;
mod wait;
mod webhook_binary;
mod webhook_server;
mod webhooks;

pub use argo::{
    ARGO_ROLLOUTS_API_VERSION, argo_rollouts_crd_path, install_argo_rollouts_crd, rollout_resource,
};
pub use binaries::{PluginProcess, is_run_for, plugin_binary, run_plugin, workspace_binary};
pub use certs::{TestCerts, WebhookClientPki, test_certs, test_certs_for, webhook_client_pki};
pub use controlplane::{
    ClusterInfo, ControlPlane, ControlPlaneOptions, DOWNSTREAM_1, DOWNSTREAM_2, NodeInfo, UPSTREAM,
    client_from_kubeconfig, control_plane, cp_script,
};
pub use endpoints::{
    Registered, deployment_manifest, hash_key_in, kubectl_apply, random_key, replica_sets, restamp,
};
pub use fleet::{
    FLEET_API_VERSION, apply_helmop, bundle_deployment_resource, bundle_namespace_mapping_resource,
    bundle_resource, cluster_group_resource, cluster_resource, controller_events, copying_helmop,
    create_cluster_group, create_fleet_object, fleet_api, fleet_crds_dir, helmop_object,
    helmop_resource, install_fleet_crd, policy_resource, propagator_events, register_fleet_cluster,
};
pub use manifests::{manifests_dir, relative_path};
pub use namespaces::{TEST_NAMESPACE_LABEL, fresh_namespace, fresh_namespace_with_labels};
pub use node::{BusyboxImage, NODE_CLUSTER, build_busybox_image, node_control_plane};
pub use objects::{
    create_config_map, create_reader, create_secret, ensure_hash_key, template_annotation,
};
pub use wait::{DEFAULT_TIMEOUT, wait_for, wait_until};
pub use webhook_binary::{WebhookBinary, metric_value};
pub use webhook_server::LocalWebhook;
pub use webhooks::{
    WebhookKind, WebhookRegistration, WebhookRule, register_webhook, unregister_webhook,
};
