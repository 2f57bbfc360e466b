//! The names helmop exposes: every label, annotation and well-known object name it reads or
//! writes lives here, so the webhook, the plugin and the tests can never disagree about spelling.

/// Domain prefix of everything helmop writes.
pub const PREFIX: &str = "helmop.dev/";

/// Label on every copy helmop makes; selects copies but is never enough alone to delete one.
pub const LABEL_MANAGED_BY: &str = "helmop.dev/managed-by";
/// Value of [`LABEL_MANAGED_BY`], also the server-side-apply field manager.
pub const MANAGER: &str = "kubectl-helmop";

/// Annotation on a copy: the HelmOps that want it, `upstream-id/namespace/name`, comma separated.
pub const ANN_OWNERS: &str = "helmop.dev/owners";
/// Annotation on a copy: `upstream-id/namespace/kind/name` of the source.
pub const ANN_SOURCE: &str = "helmop.dev/source";
/// Annotation on a copy: UID of the source object.
pub const ANN_SOURCE_UID: &str = "helmop.dev/source-uid";
/// Annotation on a copy: keyed hash of the whole source when copied.
pub const ANN_CONTENT_HASH: &str = "helmop.dev/content-hash";

/// Annotation on a copy (value `"true"`): a HelmOp or target with `keepResources` wanted it, so
/// when its last owner lets go it is kept (reported `Kept`) instead of deleted. Recorded on the
/// copy at write time because the HelmOp may be gone by then. An extension of the design's names.
pub const ANN_KEEP: &str = "helmop.dev/keep";
/// On a copy: the kinds of run that made it, comma-separated (`fleet`, `target-context`);
/// absent means `fleet` only (every copy made before the marker existed, and Fleet-mode ones).
pub const ANN_MADE_BY: &str = "helmop.dev/made-by";

/// Label on a Namespace (`enabled`) whose objects the delete guard protects: the webhook
/// configuration's `namespaceSelector` sends only such namespaces (Fleet's workspaces) to it.
pub const LABEL_GUARD: &str = "helmop.dev/guard";

/// Label on a Namespace (`enabled`) or a workload (`"true"`/`"false"`) opting in to hash stamping.
pub const LABEL_ROLLOUT_ON_CHANGE: &str = "helmop.dev/rollout-on-change";
/// Pod-template annotation: aggregate keyed hash of everything the pod reads.
pub const ANN_CONFIG_HASH: &str = "helmop.dev/config-hash";
/// Pod-template annotation: what went into [`ANN_CONFIG_HASH`].
pub const ANN_CONFIG_REFS: &str = "helmop.dev/config-refs";
/// Pod-template annotation: `container=digest` pairs in `annotate` image mode.
pub const ANN_IMAGE_DIGESTS: &str = "helmop.dev/image-digests";
/// Workload or Namespace annotation lowering the webhook's `--image-mode` (`pin`, `annotate`,
/// `off`): the namespace's may lower it, the workload's may lower that, neither raises.
pub const ANN_IMAGE_MODE: &str = "helmop.dev/image-mode";
/// Workload metadata annotation the plugin bumps to make the webhook re-stamp.
pub const ANN_RESTAMP: &str = "helmop.dev/restamp";
/// The entry (`repin:<time>`) the rollout watcher adds to a restamp value it writes for `--images`:
/// it is not one of the config-only entries, so the webhook resolves image tags again.
pub const RESTAMP_REPIN: &str = "repin:";
/// On a Secret or ConfigMap: a new value releases its flap breaker in the rollout watcher
/// (`kubectl helmop rollout resume`).
pub const ANN_ROLLOUT_RESUME: &str = "helmop.dev/rollout-resume";
/// `reportingController` (`reportingComponent` in core/v1) of the rollout watcher's Events, which
/// `status` and `check` read back for its holds.
pub const ROLLOUT_WATCHER_COMPONENT: &str = "helmop.dev/rollout-watcher";
/// HelmOp annotation: missing downstream resources warn instead of deny.
pub const ANN_ALLOW_MISSING: &str = "helmop.dev/allow-missing";

/// Namespace helmop installs into.
pub const SYSTEM_NAMESPACE: &str = "helmop-system";
/// Secret holding the cluster's hash key.
pub const HASH_KEY_SECRET: &str = "helmop-hash-key";
/// Data key of the hash key inside [`HASH_KEY_SECRET`].
pub const HASH_KEY_DATA_KEY: &str = "key";

/// Label on every Secret the bootstrap writes, with the value [`BOOTSTRAP_MANAGER`]; the bootstrap
/// never modifies a Secret without it.
pub const LABEL_APP_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_APP_MANAGED_BY`] on the bootstrap's Secrets.
pub const BOOTSTRAP_MANAGER: &str = "helmop-bootstrap";
/// Serving-certificate Secret annotation: the certificate's expiry (unix seconds), so renewal needs
/// no X.509 parser.
pub const ANN_NOT_AFTER: &str = "helmop.dev/not-after";
/// Serving-certificate Secret annotation: the DNS names the certificate was issued for (comma
/// separated).
pub const ANN_DNS_NAMES: &str = "helmop.dev/dns-names";
/// Serving-certificate Secret annotation: when the certificate was issued (unix seconds), which
/// decides when a replaced CA may leave `caBundle`.
pub const ANN_ISSUED_AT: &str = "helmop.dev/issued-at";

/// Label Fleet agents put on the downstream copies they make themselves; helmop never writes or prunes those.
pub const FLEET_BUNDLEDEPLOYMENT_LABEL: &str = "fleet.cattle.io/bundledeployment";
/// Label Fleet's HelmOp controller puts on the Bundle it makes from a HelmOp (value: the HelmOp's
/// name), next to the HelmOp's `spec.labels`; `BundleNamespaceMapping.bundleSelector` sees both.
pub const FLEET_HELMOP_LABEL: &str = "fleet.cattle.io/fleet-helm-name";
/// Label naming the shard whose controllers handle an object (Fleet's `pkg/sharding`
/// `ShardingRefLabel`); `propagate --watch --shard-id ID` handles the HelmOps carrying it with
/// value `ID`, and without `--shard-id` only the HelmOps without it.
pub const FLEET_SHARD_REF_LABEL: &str = "fleet.cattle.io/shard-ref";
/// Cluster label Fleet matches `clusterName` against in addition to the object name.
pub const FLEET_DISPLAY_NAME_LABEL: &str = "management.cattle.io/cluster-display-name";

/// Label and annotation prefixes never carried over from a source to a copy.
pub const RESERVED_PREFIXES: &[&str] =
    &["helmop.dev/", "kubectl.kubernetes.io/", "fleet.cattle.io/"];
