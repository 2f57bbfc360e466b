//! Image digests. The workload handler calls [`ImageResolver::resolve`] after the config stamp and
//! merges what it returns. [`RegistryResolver`] resolves mutable tags through the registry; [`NoImages`]
//! changes nothing (tests of the other stages).
//!
//! The mode is `--image-mode`, lowered (never raised) by the namespace's annotation `helmop.dev/image-mode`
//! and then by the workload's ([`effective_mode`]): with `off` nothing reaches a registry, with `annotate`
//! nothing is pinned. Registry trouble never denies: the image stays as it is (on an UPDATE that re-applies a
//! bare tag over a pinned image, the previous pin is kept so nothing rolls by accident) and a warning says why.

pub mod patch;
mod resolver;

// The parsing, credentials and registry client are shared with the plugin (crate `helmop-images`).
pub use helmop_images::client as registry;
pub use helmop_images::{auth, cache, pull_secrets, reference, tags};

use futures::future::BoxFuture;
use json_patch::PatchOperation;
use serde_json::Value;

use crate::config::ImageMode;

pub use resolver::{
    ADMISSION_CONCURRENCY, ADMISSION_PER_REGISTRY, ANN_IMAGE_MODE, DIGEST_CACHE_BYTES,
    MAX_IMAGES_PER_ADMISSION, MAX_REGISTRIES_PER_ADMISSION, RegistryResolver, effective_mode,
};

/// What the resolver gets to look at for one admitted workload.
#[derive(Clone, Copy)]
pub struct ImageRequest<'a> {
    /// Namespace of the workload (pull secrets and the ServiceAccount live there).
    pub namespace: &'a str,
    /// The workload as it will be stored once the config stamp is applied: any operation returned must be
    /// valid against this document (so `metadata.annotations` of the pod template may already exist).
    pub object: &'a Value,
    /// The previous version on UPDATE, to tell a re-applied `repo:latest` from an untouched pinned image.
    pub old_object: Option<&'a Value>,
    /// JSON pointer to the pod template's `metadata` (e.g. `/spec/template/metadata`).
    pub template_metadata_pointer: &'a str,
    /// JSON pointer to the pod template's PodSpec (e.g. `/spec/template/spec`).
    pub template_spec_pointer: &'a str,
    /// The configured mode; a per-namespace/workload override is the resolver's to read from `object`.
    pub mode: ImageMode,
    /// When the image stage must be done at the latest (what is left of the admission's deadline);
    /// the resolver stops at the earlier of this and its own budget.
    pub deadline: Option<tokio::time::Instant>,
    /// Where the namespace, the ServiceAccount and the pull secrets are read: the webhook's caches and
    /// bounded, counted live reads.
    pub reads: &'a dyn ImageReads,
}

/// What the image stage reads from the API server, through the same bounded, counted path as every
/// other read of an admission ([`crate::state::cache::Caches`]).
pub trait ImageReads: pull_secrets::PullSecretSource {
    /// helmop's annotations of a namespace (its `helmop.dev/image-mode`); `None` when it does not
    /// exist.
    fn namespace_annotations<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<std::collections::BTreeMap<String, String>>, kube::Error>>;
}

impl std::fmt::Debug for ImageRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageRequest")
            .field("namespace", &self.namespace)
            .field("mode", &self.mode)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

/// JSONPatch operations (applied after the config stamp's) and warnings for the response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImageOutcome {
    pub ops: Vec<PatchOperation>,
    pub warnings: Vec<String>,
}

/// Resolves mutable image tags of one workload. Must never fail an admission: problems become warnings.
pub trait ImageResolver: Send + Sync {
    fn resolve<'a>(&'a self, request: ImageRequest<'a>) -> BoxFuture<'a, ImageOutcome>;
}

/// Leaves every image as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoImages;

impl ImageResolver for NoImages {
    fn resolve<'a>(&'a self, _request: ImageRequest<'a>) -> BoxFuture<'a, ImageOutcome> {
        Box::pin(std::future::ready(ImageOutcome::default()))
    }
}
