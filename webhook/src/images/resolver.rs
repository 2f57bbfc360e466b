//! [`RegistryResolver`]: which images to resolve, with which credentials, within the admission's budget, and
//! what to write back.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use helmop_core::names::{ANN_IMAGE_DIGESTS, ANN_RESTAMP};

use super::auth::{Credential, PullSecret, credential_for};
use super::cache::ExpiringCache;
use super::patch::{Slot, annotate_ops, parse_digests, pin_ops, slots};
use super::pull_secrets::read_pull_secrets;
use super::reference::ImageRef;
use super::registry::{Event, Limits, RegistryClient, RegistrySettings, ResolveError};
use super::tags::MutableTags;
use super::{ImageOutcome, ImageRequest, ImageResolver};
use crate::config::{Config, ImageMode};
use crate::metrics::Metrics;
pub use helmop_images::mode::effective_mode;

pub use helmop_core::names::ANN_IMAGE_MODE;

/// How long a resolved digest is reused. Short on purpose: CI pushes and applies seconds apart, and a
/// longer reuse would pin the digest from before the push. It still folds the admissions of one
/// `kubectl apply` of many workloads sharing an image into one registry request.
pub const POSITIVE_TTL: Duration = Duration::from_secs(3);
/// How long a definite failure (no such manifest, refused credentials, connection refused: answers that do
/// not depend on who asked or how much time it had) is remembered, so a dead registry costs one lookup, not
/// one per admission. Timeouts and busy answers are never remembered ([`ResolveError::is_definite`]).
pub const NEGATIVE_TTL: Duration = Duration::from_secs(10);
/// Bytes of the digest cache (keys and answers as weighed by `digest_weight`): 2 MiB.
pub const DIGEST_CACHE_BYTES: u64 = 2 << 20;

/// Distinct images (registry, repository, tag) one admission resolves; the rest are left as they are with
/// the usual warning.
pub const MAX_IMAGES_PER_ADMISSION: usize = 16;
/// Distinct registries one admission resolves images of (mirrors not counted: the operator lists them).
pub const MAX_REGISTRIES_PER_ADMISSION: usize = 4;
/// Lookups of one admission in flight at once, so one admission's many images cannot hold every slot.
pub const ADMISSION_CONCURRENCY: usize = 4;
/// Lookups of one admission in flight at once to one registry: a quarter of the registry's slots
/// ([`Limits::per_registry`], 8), so one admission's slow repositories cannot starve another's image there.
pub const ADMISSION_PER_REGISTRY: usize = 2;
/// Warnings of the image stage per admission; more are summed up in one.
const MAX_WARNINGS: usize = 20;

/// An annotation value as read: a mode, or what was written instead (truncated, for the warning).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Asked {
    Mode(ImageMode),
    Invalid(String),
}

impl Asked {
    fn parse(value: &str) -> Asked {
        ImageMode::parse(value)
            .map(Asked::Mode)
            .unwrap_or_else(|| Asked::Invalid(value.chars().take(64).collect()))
    }
}

/// What one digest-cache entry holds on the heap, with an allowance for the map's own overhead.
fn digest_weight(key: &DigestKey, value: &Result<String, ResolveError>) -> u32 {
    let answer = match value {
        Ok(digest) => digest.len(),
        Err(error) => error.detail().len(),
    };
    let bytes = key.registry.len()
        + key.repository.len()
        + key.tag.len()
        + key.identity.as_ref().map_or(0, String::len)
        + answer
        + 160;
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct DigestKey {
    registry: String,
    repository: String,
    tag: String,
    /// Which pull secret (by name and resourceVersion) answered, never its content.
    identity: Option<String>,
}

/// Resolves mutable tags through the registry. Shared by all admissions.
pub struct RegistryResolver {
    registry: RegistryClient,
    tags: MutableTags,
    budget: Duration,
    /// Concurrent admissions of one image share one registry request.
    digests: ExpiringCache<DigestKey, Result<String, ResolveError>>,
    outcomes: Family<OutcomeLabel, Counter>,
    dns_lookups: Counter,
    requests: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabel {
    bound: &'static str,
}

impl RegistryResolver {
    /// Reads `--registry-config` and registers `helmop_webhook_image_resolutions_total{outcome}`.
    pub fn new(
        config: &Config,
        metrics: &Metrics,
    ) -> Result<RegistryResolver, crate::error::Error> {
        Self::with_limits(config, metrics, Limits::default())
    }

    /// [`RegistryResolver::new`] with explicit process-wide bounds of registry work (tests).
    pub fn with_limits(
        config: &Config,
        metrics: &Metrics,
        limits: Limits,
    ) -> Result<RegistryResolver, crate::error::Error> {
        let mut settings = match &config.registry_config {
            Some(path) => RegistrySettings::load(path)?,
            None => RegistrySettings::default(),
        };
        if !config.registry_deny.is_empty() {
            let mut deny = settings.deny_list();
            deny.extend(config.registry_deny.iter().copied());
            settings.deny = Some(deny);
        }
        let outcomes = Family::<OutcomeLabel, Counter>::default();
        metrics.registry().register(
            "helmop_webhook_image_resolutions",
            "Image tag resolutions, by outcome (resolved, cached, not_found, unauthorized, unreachable, refused, timeout, busy, skipped, error)",
            outcomes.clone(),
        );
        let dns_lookups = Counter::default();
        metrics.registry().register(
            "helmop_webhook_registry_dns_lookups",
            "DNS lookups of registry names (at most 4 at once)",
            dns_lookups.clone(),
        );
        let requests = Counter::default();
        metrics.registry().register(
            "helmop_webhook_registry_requests",
            "HTTP requests sent to registries and token endpoints",
            requests.clone(),
        );
        let shed = Family::<BoundLabel, Counter>::default();
        metrics.registry().register(
            "helmop_webhook_registry_shed",
            "Registry requests turned away by a bound (hosts: too many registry hosts at once; body: a response over its size limit)",
            shed.clone(),
        );
        let observer = {
            let (dns_lookups, requests) = (dns_lookups.clone(), requests.clone());
            std::sync::Arc::new(move |event: Event| match event {
                Event::DnsLookup => {
                    dns_lookups.inc();
                }
                Event::Request => {
                    requests.inc();
                }
                Event::Shed(bound) => {
                    shed.get_or_create(&BoundLabel { bound }).inc();
                }
            })
        };
        Ok(RegistryResolver {
            registry: RegistryClient::with_limits(
                settings,
                "helmop-webhook",
                limits,
                Some(observer),
            )?,
            tags: MutableTags::new(&config.mutable_tags),
            budget: config.image_budget,
            digests: digest_cache(POSITIVE_TTL, NEGATIVE_TTL),
            outcomes,
            dns_lookups,
            requests,
        })
    }

    /// Overrides the cache lifetimes (tests; with `Duration::ZERO` an outcome is shared only by the admissions
    /// already waiting on it).
    pub fn with_ttls(mut self, positive: Duration, negative: Duration) -> Self {
        self.digests = digest_cache(positive, negative);
        self
    }

    /// Resolutions counted so far with this outcome.
    pub fn resolutions(&self, outcome: &'static str) -> u64 {
        self.outcomes
            .get(&OutcomeLabel { outcome })
            .map_or(0, |c| c.get())
    }

    /// DNS lookups of registry names made so far.
    pub fn dns_lookups(&self) -> u64 {
        self.dns_lookups.get()
    }

    /// HTTP requests sent to registries (and token endpoints) so far.
    pub fn registry_requests(&self) -> u64 {
        self.requests.get()
    }

    fn count(&self, outcome: &'static str) {
        self.outcomes.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// The namespace's `helmop.dev/image-mode`, read where the request says (the webhook's Namespace
    /// watch, else a counted live GET).
    async fn namespace_mode(
        &self,
        reads: &dyn super::ImageReads,
        namespace: &str,
    ) -> Option<Asked> {
        match reads.namespace_annotations(namespace).await {
            Ok(annotations) => annotations
                .and_then(|mut a| a.remove(ANN_IMAGE_MODE))
                .map(|value| Asked::parse(&value)),
            Err(error) => {
                tracing::warn!(namespace, %error, "cannot read the namespace's image mode; using --image-mode");
                None
            }
        }
    }

    /// The pull secrets of the pod and its ServiceAccount, read live. Unreadable ones become warnings.
    async fn pull_secrets(
        &self,
        reads: &dyn super::ImageReads,
        namespace: &str,
        spec: &Value,
        warnings: &mut Vec<String>,
    ) -> Vec<PullSecret> {
        let (secrets, problems) = read_pull_secrets(reads, namespace, spec).await;
        warnings.extend(problems.iter().map(|p| format!("helmop webhook: {p}")));
        secrets
    }

    async fn resolve_image(
        &self,
        image: &ImageRef,
        secrets: &[PullSecret],
        deadline: Instant,
    ) -> Result<String, ResolveError> {
        let credential = |host: &str| -> Option<Credential> { credential_for(secrets, host) };
        let key = DigestKey {
            registry: image.registry.clone(),
            repository: image.repository.clone(),
            tag: image.effective_tag().to_owned(),
            identity: credential(&image.registry).map(|c| c.identity),
        };
        // Bounded by this admission's deadline; a timeout is handed to the admissions waiting on this lookup
        // but never kept for later ones (its lifetime is zero, see `digest_cache`).
        let lookup = || async {
            tokio::time::timeout_at(deadline, self.registry.resolve(image, credential))
                .await
                .unwrap_or(Err(ResolveError::Timeout))
        };
        let (result, fresh) =
            tokio::time::timeout_at(deadline, self.digests.get_or_run(key.clone(), lookup()))
                .await
                .unwrap_or((Err(ResolveError::Timeout), true));
        // Another admission's lookup ran out of its own time, or met a busy registry: that says nothing of
        // this one, which asks itself with what is left of its own budget.
        let (result, fresh) = match result {
            Err(e) if !fresh && !e.is_definite() && Instant::now() < deadline => {
                let own = lookup().await;
                if own
                    .as_ref()
                    .map_or_else(ResolveError::is_definite, |_| true)
                {
                    self.digests.insert(key, own.clone()).await;
                }
                (own, true)
            }
            result => (result, fresh),
        };
        if !fresh {
            self.count(match &result {
                Ok(_) => "cached",
                Err(e) => e.outcome(),
            });
            return result;
        }
        self.count(match &result {
            Ok(_) => "resolved",
            Err(e) => e.outcome(),
        });
        match &result {
            Ok(digest) => tracing::debug!(image = %image, digest, "image tag resolved"),
            Err(error) => {
                tracing::info!(image = %image, error = %error.detail(), "image tag not resolved")
            }
        }
        result
    }

    async fn run(&self, request: ImageRequest<'_>) -> ImageOutcome {
        // `--image-mode off` is off: no annotation can raise it (`effective_mode`), so nothing is read.
        if request.mode == ImageMode::Off {
            return ImageOutcome::default();
        }
        let deadline = image_deadline(Instant::now(), self.budget, request.deadline);
        let object = request.object;
        let Some(spec) = object.pointer(request.template_spec_pointer) else {
            return ImageOutcome::default();
        };
        let metadata = object
            .pointer(request.template_metadata_pointer)
            .and_then(Value::as_object);
        let restamped = request
            .old_object
            .is_some_and(|old| annotation(old, ANN_RESTAMP) != annotation(object, ANN_RESTAMP));
        let repins =
            annotation(object, ANN_RESTAMP).is_some_and(helmop_core::rollout::restamp_repins);
        // A restamp that only records configuration (the rollout watcher's, propagate's), of a pod
        // spec that did not change, asks nothing of a registry: it keeps the pins, and a registry
        // that never answers cannot hold it (nor the watcher's slot) for the image budget.
        let same_spec = request
            .old_object
            .and_then(|old| old.pointer(request.template_spec_pointer))
            == Some(spec);
        if restamped && !repins && same_spec {
            return ImageOutcome::default();
        }
        let all = slots(spec);
        // Only a restamp that asks for it resolves pinned tags again.
        let restamp = restamped && repins;
        let candidates = candidates(&all, &self.tags, restamp);
        let recorded = template_annotation(metadata, ANN_IMAGE_DIGESTS);
        if candidates.is_empty() && recorded.is_none() {
            return ImageOutcome::default();
        }

        let mut warnings = Vec::new();
        let workload = annotation(object, ANN_IMAGE_MODE).map(Asked::parse);
        // A workload asking for `off` needs no namespace to decide.
        let namespace = if workload == Some(Asked::Mode(ImageMode::Off)) {
            None
        } else {
            tokio::time::timeout_at(
                deadline,
                self.namespace_mode(request.reads, request.namespace),
            )
            .await
            .unwrap_or(None)
        };
        let mut read = |asked: Option<Asked>, whose: &str| match asked? {
            Asked::Mode(mode) => Some(mode),
            Asked::Invalid(value) => {
                warnings.push(format!(
                    "helmop webhook: the {whose}'s {ANN_IMAGE_MODE}={value:?} is not pin, annotate or off; ignored"
                ));
                None
            }
        };
        let namespace = read(namespace, "namespace");
        let workload = read(workload, "workload");
        let mode = effective_mode(request.mode, namespace, workload);
        if mode == ImageMode::Off || (mode == ImageMode::Pin && candidates.is_empty()) {
            return ImageOutcome {
                ops: Vec::new(),
                warnings,
            };
        }

        let secrets = if candidates.is_empty() {
            Vec::new()
        } else {
            tokio::time::timeout_at(
                deadline,
                self.pull_secrets(request.reads, request.namespace, spec, &mut warnings),
            )
            .await
            .unwrap_or_default()
        };
        // One registry request per distinct image, however many containers run it.
        let mut index: HashMap<(&str, &str, &str), usize> = HashMap::new();
        let mut distinct: Vec<&ImageRef> = Vec::new();
        let positions: Vec<usize> = candidates
            .iter()
            .map(|c| {
                let key = (
                    c.image.registry.as_str(),
                    c.image.repository.as_str(),
                    c.image.effective_tag(),
                );
                *index.entry(key).or_insert_with(|| {
                    distinct.push(&c.image);
                    distinct.len() - 1
                })
            })
            .collect();
        let plan = admission_plan(&distinct);
        let per_registry: HashMap<&str, Semaphore> = plan
            .iter()
            .zip(&distinct)
            .filter(|(go, _)| **go)
            .map(|(_, d)| (d.registry.as_str(), Semaphore::new(ADMISSION_PER_REGISTRY)))
            .collect();
        let admission = Semaphore::new(ADMISSION_CONCURRENCY);
        let resolved = join_all(distinct.iter().zip(&plan).map(|(image, go)| {
            let (per_registry, admission, secrets) = (&per_registry, &admission, &secrets);
            async move {
                if !*go {
                    self.count("skipped");
                    return Err(ResolveError::Skipped);
                }
                // The registry's share first, so a wait for a busy registry holds no admission slot.
                let slots = async {
                    let registry = match per_registry.get(image.registry.as_str()) {
                        Some(s) => s.acquire().await.ok(),
                        None => None,
                    };
                    (registry, admission.acquire().await.ok())
                };
                let Ok(_slots) = tokio::time::timeout_at(deadline, slots).await else {
                    self.count("timeout");
                    return Err(ResolveError::Timeout);
                };
                self.resolve_image(image, secrets, deadline).await
            }
        }))
        .await;
        let results: Vec<Result<String, ResolveError>> = positions
            .iter()
            .map(|&i| {
                resolved
                    .get(i)
                    .cloned()
                    .unwrap_or(Err(ResolveError::Timeout))
            })
            .collect();
        let old_slots = request
            .old_object
            .and_then(|old| old.pointer(request.template_spec_pointer))
            .map(slots)
            .unwrap_or_default();
        let mut outcome = assemble(mode, &request, metadata, &candidates, &results, &old_slots);
        warnings.append(&mut outcome.warnings);
        if warnings.len() > MAX_WARNINGS {
            let more = warnings.len() - (MAX_WARNINGS - 1);
            warnings.truncate(MAX_WARNINGS - 1);
            warnings.push(format!(
                "helmop webhook: {more} more image warnings like these"
            ));
        }
        outcome.warnings = warnings;
        outcome
    }
}

impl ImageResolver for RegistryResolver {
    fn resolve<'a>(&'a self, request: ImageRequest<'a>) -> BoxFuture<'a, ImageOutcome> {
        Box::pin(self.run(request))
    }
}

/// Resolutions kept `positive` when they succeeded, `negative` when they failed definitely, not at all
/// otherwise; at most [`DIGEST_CACHE_BYTES`].
fn digest_cache(
    positive: Duration,
    negative: Duration,
) -> ExpiringCache<DigestKey, Result<String, ResolveError>> {
    ExpiringCache::weighed(
        DIGEST_CACHE_BYTES,
        digest_weight,
        move |result: &Result<String, ResolveError>| lifetime(result, positive, negative),
    )
}

fn lifetime(
    result: &Result<String, ResolveError>,
    positive: Duration,
    negative: Duration,
) -> Duration {
    match result {
        Ok(_) => positive,
        Err(e) if e.is_definite() => negative,
        Err(_) => Duration::ZERO,
    }
}

/// Which distinct images (in the workload's order) this admission looks up: the first
/// [`MAX_IMAGES_PER_ADMISSION`] of the first [`MAX_REGISTRIES_PER_ADMISSION`] registries.
fn admission_plan(distinct: &[&ImageRef]) -> Vec<bool> {
    let mut registries: Vec<&str> = Vec::new();
    let mut images = 0;
    distinct
        .iter()
        .map(|image| {
            if images >= MAX_IMAGES_PER_ADMISSION {
                return false;
            }
            let registry = image.registry.as_str();
            if !registries.contains(&registry) {
                if registries.len() >= MAX_REGISTRIES_PER_ADMISSION {
                    return false;
                }
                registries.push(registry);
            }
            images += 1;
            true
        })
        .collect()
}

/// The end of the image stage: its own budget from `now`, but never past the admission's deadline
/// (`stage_end`): past it nobody would see the answer, and the deadline's own answer carries no patch.
fn image_deadline(now: Instant, budget: Duration, stage_end: Option<Instant>) -> Instant {
    let own = now + budget;
    stage_end.map_or(own, |end| end.min(own))
}

/// A container whose image is to be resolved; `image` carries no digest.
#[derive(Debug)]
struct Candidate<'a> {
    slot: &'a Slot,
    image: ImageRef,
}

fn same_tag(a: &ImageRef, b: &ImageRef) -> bool {
    a.registry == b.registry
        && a.repository == b.repository
        && a.effective_tag() == b.effective_tag()
}

/// Containers with a mutable tag and no digest; with `restamp`, pinned ones with a mutable tag too (their
/// digest is dropped and the tag resolved again). Unparseable images are the API server's to reject.
fn candidates<'a>(all: &'a [Slot], tags: &MutableTags, restamp: bool) -> Vec<Candidate<'a>> {
    all.iter()
        .filter_map(|slot| {
            let mut image = ImageRef::parse(&slot.image).ok()?;
            if !tags.is_mutable(image.effective_tag()) {
                return None;
            }
            if image.digest.is_some() {
                if !(restamp && image.tag.is_some()) {
                    return None;
                }
                image.digest = None;
            }
            Some(Candidate { slot, image })
        })
        .collect()
}

/// The operations and warnings for resolved `candidates` (`results` in the same order).
fn assemble(
    mode: ImageMode,
    request: &ImageRequest<'_>,
    metadata: Option<&Map<String, Value>>,
    candidates: &[Candidate<'_>],
    results: &[Result<String, ResolveError>],
    old_slots: &[Slot],
) -> ImageOutcome {
    let mut warnings = Vec::new();
    match mode {
        ImageMode::Off => ImageOutcome::default(),
        ImageMode::Pin => {
            let mut images = Vec::new();
            for (c, result) in candidates.iter().zip(results) {
                match result {
                    Ok(digest) => images.push((c.slot, c.image.pinned(digest))),
                    Err(error) => {
                        let previous = previous_pin(old_slots, c);
                        let action = if previous.is_some() {
                            "kept the previous digest"
                        } else {
                            "left unchanged"
                        };
                        warnings.push(unresolved(c, error, action));
                        if let Some(previous) = previous {
                            images.push((c.slot, previous));
                        }
                    }
                }
            }
            ImageOutcome {
                ops: pin_ops(request.template_spec_pointer, &images),
                warnings,
            }
        }
        ImageMode::Annotate => {
            let recorded = template_annotation(metadata, ANN_IMAGE_DIGESTS)
                .map(parse_digests)
                .unwrap_or_default();
            // On UPDATE, what the stored template recorded: a replace of a manifest without the
            // annotation must not drop a digest the registry cannot confirm right now.
            let stored = request
                .old_object
                .and_then(|old| old.pointer(request.template_metadata_pointer))
                .and_then(Value::as_object);
            let stored = template_annotation(stored, ANN_IMAGE_DIGESTS)
                .map(parse_digests)
                .unwrap_or_default();
            let mut entries: Vec<(String, String)> = Vec::new();
            for (c, result) in candidates.iter().zip(results) {
                let digest = match result {
                    Ok(digest) => Some(digest.clone()),
                    Err(error) => {
                        let previous = recorded
                            .iter()
                            .find(|(name, _)| *name == c.slot.name)
                            .or_else(|| {
                                stored_runs_same_tag(old_slots, c)
                                    .then(|| stored.iter().find(|(name, _)| *name == c.slot.name))
                                    .flatten()
                            })
                            .map(|(_, d)| d.clone());
                        let action = if previous.is_some() {
                            "kept the recorded digest"
                        } else {
                            "not recorded"
                        };
                        warnings.push(unresolved(c, error, action));
                        previous
                    }
                };
                if let Some(digest) = digest
                    && !entries.iter().any(|(name, _)| *name == c.slot.name)
                {
                    entries.push((c.slot.name.clone(), digest));
                }
            }
            let pull_always: Vec<&Slot> = candidates
                .iter()
                .filter(|c| entries.iter().any(|(name, _)| *name == c.slot.name))
                .map(|c| c.slot)
                .collect();
            ImageOutcome {
                ops: annotate_ops(
                    request.template_metadata_pointer,
                    request.template_spec_pointer,
                    metadata,
                    &entries,
                    &pull_always,
                ),
                warnings,
            }
        }
    }
}

/// On an UPDATE that re-applies a bare tag while the registry cannot answer, the stored pin of the same
/// container and tag: keeping it means a registry outage never rolls a workload.
fn previous_pin(old_slots: &[Slot], c: &Candidate<'_>) -> Option<String> {
    let old = old_slots
        .iter()
        .find(|s| s.list == c.slot.list && s.name == c.slot.name)?;
    let parsed = ImageRef::parse(&old.image).ok()?;
    (parsed.digest.is_some() && parsed.name == c.image.name && same_tag(&parsed, &c.image))
        .then(|| old.image.clone())
}

/// Whether the stored template ran the same image tag in the candidate's container, so a digest it
/// recorded for that container still describes it.
fn stored_runs_same_tag(old_slots: &[Slot], c: &Candidate<'_>) -> bool {
    old_slots
        .iter()
        .find(|s| s.list == c.slot.list && s.name == c.slot.name)
        .and_then(|old| ImageRef::parse(&old.image).ok())
        .is_some_and(|old| old.name == c.image.name && same_tag(&old, &c.image))
}

fn unresolved(c: &Candidate<'_>, error: &ResolveError, action: &str) -> String {
    format!(
        "helmop webhook: image {:?} of container {:?} not resolved to a digest: {error}; {action}",
        c.slot.image, c.slot.name
    )
}

fn annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object
        .get("metadata")?
        .get("annotations")?
        .get(key)?
        .as_str()
}

fn template_annotation<'a>(metadata: Option<&'a Map<String, Value>>, key: &str) -> Option<&'a str> {
    metadata?.get("annotations")?.get(key)?.as_str()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn spec(images: &[(&str, &str)]) -> Value {
        let containers: Vec<Value> = images
            .iter()
            .map(|(n, i)| json!({"name": n, "image": i}))
            .collect();
        json!({"containers": containers})
    }

    fn object(images: &[(&str, &str)], restamp: Option<&str>) -> Value {
        let mut o =
            json!({"metadata": {"name": "d"}, "spec": {"template": {"spec": spec(images)}}});
        if let Some(r) = restamp {
            o["metadata"]["annotations"] = json!({ANN_RESTAMP: r});
        }
        o
    }

    fn request<'a>(object: &'a Value, old: Option<&'a Value>, mode: ImageMode) -> ImageRequest<'a> {
        ImageRequest {
            namespace: "ns",
            object,
            old_object: old,
            template_metadata_pointer: "/spec/template/metadata",
            template_spec_pointer: "/spec/template/spec",
            mode,
            deadline: None,
            reads: &Unreachable,
        }
    }

    /// Reads from a cluster that cannot be reached, as a client pointed where nothing listens.
    struct Unreachable;

    fn refused<T>() -> Result<T, kube::Error> {
        Err(kube::Error::Service("connection refused".into()))
    }

    impl super::super::pull_secrets::PullSecretSource for Unreachable {
        fn secret<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> futures::future::BoxFuture<
            'a,
            Result<Option<k8s_openapi::api::core::v1::Secret>, kube::Error>,
        > {
            Box::pin(async { refused() })
        }

        fn service_account<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> futures::future::BoxFuture<
            'a,
            Result<Option<k8s_openapi::api::core::v1::ServiceAccount>, kube::Error>,
        > {
            Box::pin(async { refused() })
        }
    }

    impl super::super::ImageReads for Unreachable {
        fn namespace_annotations<'a>(
            &'a self,
            _: &'a str,
        ) -> futures::future::BoxFuture<
            'a,
            Result<Option<std::collections::BTreeMap<String, String>>, kube::Error>,
        > {
            Box::pin(async { refused() })
        }
    }

    fn names(c: &[Candidate<'_>]) -> Vec<String> {
        c.iter().map(|c| c.slot.name.clone()).collect()
    }

    #[test]
    fn the_image_budget_is_the_smaller_of_its_own_and_what_is_left() {
        let now = Instant::now();
        let budget = Duration::from_secs(2);
        assert_eq!(image_deadline(now, budget, None), now + budget);
        let soon = now + Duration::from_millis(500);
        assert_eq!(image_deadline(now, budget, Some(soon)), soon);
        let later = now + Duration::from_secs(30);
        assert_eq!(image_deadline(now, budget, Some(later)), now + budget);
    }

    #[test]
    fn which_images_are_resolved() {
        let s = slots(&spec(&[
            ("bare", "reg.io/a"),
            ("latest", "reg.io/b:latest"),
            ("fixed", "reg.io/c:1.2"),
            ("main", "reg.io/d:main"),
            ("pinned", &format!("reg.io/e:latest@{D1}")),
            ("digest-only", &format!("reg.io/f@{D1}")),
            ("bad", "Not An Image"),
        ]));
        let tags = MutableTags::new(&["main".into()]);
        assert_eq!(
            names(&candidates(&s, &tags, false)),
            ["bare", "latest", "main"]
        );
        let restamped = candidates(&s, &tags, true);
        assert_eq!(names(&restamped), ["bare", "latest", "main", "pinned"]);
        assert_eq!(
            restamped[3].image.digest, None,
            "the stale digest is dropped"
        );
        assert_eq!(
            names(&candidates(&s, &MutableTags::default(), false)),
            ["bare", "latest"]
        );
    }

    #[test]
    fn an_invalid_annotation_is_kept_short_for_the_warning() {
        assert_eq!(
            Asked::parse(&"x".repeat(10_000)),
            Asked::Invalid("x".repeat(64))
        );
    }

    #[test]
    fn one_admission_resolves_a_bounded_share() {
        let images: Vec<ImageRef> = (0..40)
            .map(|i| ImageRef::parse(&format!("r{}.example.com/app{i}:latest", i % 10)).unwrap())
            .collect();
        let refs: Vec<&ImageRef> = images.iter().collect();
        let plan = admission_plan(&refs);
        let chosen: Vec<&ImageRef> = refs
            .iter()
            .zip(&plan)
            .filter(|(_, go)| **go)
            .map(|(i, _)| *i)
            .collect();
        let mut registries: Vec<&str> = chosen.iter().map(|i| i.registry.as_str()).collect();
        registries.dedup();
        registries.sort_unstable();
        registries.dedup();
        assert_eq!(registries.len(), MAX_REGISTRIES_PER_ADMISSION);
        assert_eq!(chosen.len(), MAX_IMAGES_PER_ADMISSION);
        // The first registries in the workload's order.
        assert_eq!(
            registries,
            [
                "r0.example.com",
                "r1.example.com",
                "r2.example.com",
                "r3.example.com"
            ]
        );
        let one: Vec<ImageRef> = (0..40)
            .map(|i| ImageRef::parse(&format!("reg.io/app{i}:latest")).unwrap())
            .collect();
        let one: Vec<&ImageRef> = one.iter().collect();
        assert_eq!(
            admission_plan(&one).iter().filter(|go| **go).count(),
            MAX_IMAGES_PER_ADMISSION
        );
    }

    #[test]
    fn only_definite_answers_are_remembered() {
        let (p, n) = (POSITIVE_TTL, NEGATIVE_TTL);
        assert_eq!(lifetime(&Ok(D1.to_owned()), p, n), p);
        assert_eq!(lifetime(&Err(ResolveError::NotFound), p, n), n);
        assert_eq!(
            lifetime(&Err(ResolveError::Unreachable("refused".into())), p, n),
            n
        );
        for transient in [
            ResolveError::Timeout,
            ResolveError::Busy("429".into()),
            ResolveError::Skipped,
        ] {
            assert_eq!(lifetime(&Err(transient), p, n), Duration::ZERO);
        }
        // Weighed in bytes: a long repository weighs what it holds.
        let key = |repository: String| DigestKey {
            registry: "reg.io".into(),
            repository,
            tag: "latest".into(),
            identity: None,
        };
        let small = digest_weight(&key("app".into()), &Ok(D1.to_owned()));
        let large = digest_weight(&key("a".repeat(100_000)), &Ok(D1.to_owned()));
        assert!(small < 512 && large > 100_000, "{small} {large}");
        assert!(u64::from(large) < DIGEST_CACHE_BYTES);
    }

    /// `registry` served on loopback and listed `insecure` in the registry config of a resolver whose
    /// requests read from a cluster that cannot be reached ([`Unreachable`]); the config's directory lives as long as the guard.
    async fn serve_registry(
        registry: axum::Router,
    ) -> (
        std::net::SocketAddr,
        tokio::task::JoinHandle<std::io::Result<()>>,
        tempfile::TempDir,
        RegistryResolver,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(axum::serve(listener, registry).into_future());
        let dir = tempfile::tempdir().unwrap();
        let registry_config = dir.path().join("registries.yaml");
        std::fs::write(&registry_config, format!("insecure: [\"{addr}\"]")).unwrap();
        let config = Config {
            registry_config: Some(registry_config),
            ..Config::default()
        };
        let resolver = RegistryResolver::new(&config, &Metrics::new()).unwrap();
        (addr, server, dir, resolver)
    }

    #[tokio::test]
    async fn a_config_restamp_asks_no_registry_and_a_rollout_restamp_resolves_again() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let registry = axum::Router::new().fallback(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { ([("docker-content-digest", D2)], "") }
        });
        let (addr, server, _dir, resolver) = serve_registry(registry).await;
        let pinned = format!("{addr}/app:latest@{D1}");
        let mut old = object(&[("app", &pinned)], Some("watch:2026-12-07T10:00:00Z"));
        old["metadata"]["annotations"][ANN_IMAGE_MODE] = json!("pin");
        let restamped = |value: &str| {
            let mut o = old.clone();
            o["metadata"]["annotations"][ANN_RESTAMP] = json!(value);
            o
        };
        // The rollout watcher restamps for a changed ConfigMap: the pin stays, no registry asked.
        let config = restamped("configmap/app=v1:aa,watch:2026-12-07T10:05:00Z");
        let out = resolver
            .resolve(request(&config, Some(&old), ImageMode::Pin))
            .await;
        assert!(
            !serde_json::to_value(&out.ops)
                .unwrap()
                .to_string()
                .contains(D2),
            "{:?}",
            out.ops
        );
        assert_eq!(requests.load(Ordering::SeqCst), 0);
        // Nor is an unpinned mutable tag looked up on a config restamp (a registry that never
        // answers would hold the restamp for the whole image budget).
        let mut unpinned_old = object(
            &[("app", &format!("{addr}/app:latest"))],
            Some("watch:2026-12-07T10:00:00Z"),
        );
        unpinned_old["metadata"]["annotations"][ANN_IMAGE_MODE] = json!("pin");
        let mut unpinned = unpinned_old.clone();
        unpinned["metadata"]["annotations"][ANN_RESTAMP] = json!("watch:2026-12-07T10:05:00Z");
        let out = resolver
            .resolve(request(&unpinned, Some(&unpinned_old), ImageMode::Pin))
            .await;
        assert_eq!(out, ImageOutcome::default());
        assert_eq!(requests.load(Ordering::SeqCst), 0);
        // `kubectl helmop rollout` (or an image poll) asks for the tag again.
        let rollout = restamped("rollout:2026-12-07T10:06:00Z");
        let out = resolver
            .resolve(request(&rollout, Some(&old), ImageMode::Pin))
            .await;
        let ops = serde_json::to_value(&out.ops).unwrap().to_string();
        assert!(ops.contains(D2), "{ops}");
        assert_eq!(requests.load(Ordering::SeqCst), 1);
        server.abort();
    }

    #[tokio::test]
    async fn off_is_off_whatever_the_workload_asks() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let registry = axum::Router::new().fallback(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { ([("docker-content-digest", D1)], "") }
        });
        // Never contacted: an annotated workload needs no namespace.
        let (addr, server, _dir, resolver) = serve_registry(registry).await;
        let mut obj = object(&[("app", &format!("{addr}/app:latest"))], None);
        obj["metadata"]["annotations"] = json!({ANN_IMAGE_MODE: "pin"});
        let off = resolver.resolve(request(&obj, None, ImageMode::Off)).await;
        assert_eq!(off, ImageOutcome::default());
        let annotate = resolver
            .resolve(request(&obj, None, ImageMode::Annotate))
            .await;
        let ops = serde_json::to_value(&annotate.ops).unwrap();
        assert!(
            ops.as_array()
                .unwrap()
                .iter()
                .all(|op| op["path"] != "/spec/template/spec/containers/0/image"),
            "annotate is not raised to pin: {ops}"
        );
        assert!(ops.to_string().contains(ANN_IMAGE_DIGESTS), "{ops}");
        assert_eq!(
            requests.load(Ordering::SeqCst),
            1,
            "only the annotate admission asked"
        );
        server.abort();
    }

    #[test]
    fn pin_and_failures() {
        let obj = object(
            &[("app", "reg.io/app:latest"), ("side", "reg.io/side")],
            None,
        );
        let s = slots(&obj["spec"]["template"]["spec"]);
        let c = candidates(&s, &MutableTags::default(), false);
        let results = [
            Ok(D1.to_owned()),
            Err(ResolveError::Unreachable("connection refused".into())),
        ];
        let out = assemble(
            ImageMode::Pin,
            &request(&obj, None, ImageMode::Pin),
            None,
            &c,
            &results,
            &[],
        );
        assert_eq!(
            serde_json::to_value(&out.ops).unwrap(),
            json!([{"op": "add", "path": "/spec/template/spec/containers/0/image", "value": format!("reg.io/app:latest@{D1}")}])
        );
        assert_eq!(out.warnings.len(), 1);
        assert!(
            out.warnings[0].contains("\"side\"") && out.warnings[0].contains("left unchanged"),
            "{:?}",
            out.warnings
        );

        // An UPDATE re-applying the bare tag while the registry is down keeps the stored pin.
        let old = object(
            &[
                ("app", &format!("reg.io/app:latest@{D2}")),
                ("side", "reg.io/side"),
            ],
            None,
        );
        let old_slots = slots(&old["spec"]["template"]["spec"]);
        let down = [Err(ResolveError::Timeout), Err(ResolveError::Timeout)];
        let out = assemble(
            ImageMode::Pin,
            &request(&obj, Some(&old), ImageMode::Pin),
            None,
            &c,
            &down,
            &old_slots,
        );
        assert_eq!(
            serde_json::to_value(&out.ops).unwrap(),
            json!([{"op": "add", "path": "/spec/template/spec/containers/0/image", "value": format!("reg.io/app:latest@{D2}")}])
        );
        assert!(
            out.warnings[0].contains("kept the previous digest"),
            "{:?}",
            out.warnings
        );
        // ... but not the pin of another tag.
        let other = object(&[("app", &format!("reg.io/app:v1@{D2}"))], None);
        assert_eq!(
            previous_pin(&slots(&other["spec"]["template"]["spec"]), &c[0]),
            None
        );
    }

    #[test]
    fn annotate_keeps_the_stored_digest_when_a_replace_drops_the_annotation() {
        let mut old = object(
            &[("app", "reg.io/app:latest"), ("side", "reg.io/side:1")],
            None,
        );
        old["spec"]["template"]["metadata"] =
            json!({"annotations": {ANN_IMAGE_DIGESTS: format!("app={D2},side={D2}")}});
        // The replaced manifest has no annotation, and `side` now runs another tag.
        let obj = object(
            &[("app", "reg.io/app:latest"), ("side", "reg.io/side:2")],
            None,
        );
        let tags = MutableTags::new(&["1".to_owned(), "2".to_owned()]);
        let s = slots(&obj["spec"]["template"]["spec"]);
        let c = candidates(&s, &tags, false);
        assert_eq!(names(&c), ["app", "side"]);
        let old_slots = slots(&old["spec"]["template"]["spec"]);
        let results = [Err(ResolveError::Timeout), Err(ResolveError::Timeout)];
        let out = assemble(
            ImageMode::Annotate,
            &request(&obj, Some(&old), ImageMode::Annotate),
            obj["spec"]["template"]
                .get("metadata")
                .and_then(Value::as_object),
            &c,
            &results,
            &old_slots,
        );
        let mut patched = obj.clone();
        json_patch::patch(&mut patched, &out.ops).unwrap();
        assert_eq!(
            patched["spec"]["template"]["metadata"]["annotations"][ANN_IMAGE_DIGESTS],
            format!("app={D2}"),
            "kept for the same tag only"
        );
        assert!(
            out.warnings[0].contains("kept the recorded digest"),
            "{:?}",
            out.warnings
        );
        assert!(
            out.warnings[1].contains("not recorded"),
            "{:?}",
            out.warnings
        );
    }

    #[test]
    fn annotate_keeps_recorded_digests_on_failure() {
        let mut obj = object(
            &[("app", "reg.io/app:latest"), ("side", "reg.io/side")],
            None,
        );
        obj["spec"]["template"]["metadata"] =
            json!({"annotations": {ANN_IMAGE_DIGESTS: format!("app={D2},side={D2},gone={D2}")}});
        let s = slots(&obj["spec"]["template"]["spec"]);
        let c = candidates(&s, &MutableTags::default(), false);
        let metadata = obj["spec"]["template"]["metadata"].as_object();
        let results = [Ok(D1.to_owned()), Err(ResolveError::NotFound)];
        let out = assemble(
            ImageMode::Annotate,
            &request(&obj, None, ImageMode::Annotate),
            metadata,
            &c,
            &results,
            &[],
        );
        let mut patched = obj.clone();
        json_patch::patch(&mut patched, &out.ops).unwrap();
        assert_eq!(
            patched["spec"]["template"]["metadata"]["annotations"][ANN_IMAGE_DIGESTS],
            format!("app={D1},side={D2}")
        );
        assert_eq!(
            patched["spec"]["template"]["spec"]["containers"][1]["imagePullPolicy"],
            "Always"
        );
        assert_eq!(
            patched["spec"]["template"]["spec"]["containers"][0]["image"],
            "reg.io/app:latest"
        );
        assert!(
            out.warnings[0].contains("kept the recorded digest"),
            "{:?}",
            out.warnings
        );
        // Admitting the output again with the same answers patches nothing.
        let s2 = slots(&patched["spec"]["template"]["spec"]);
        let c2 = candidates(&s2, &MutableTags::default(), false);
        let m2 = patched["spec"]["template"]["metadata"].as_object();
        let again = assemble(
            ImageMode::Annotate,
            &request(&patched, None, ImageMode::Annotate),
            m2,
            &c2,
            &[Ok(D1.to_owned()), Ok(D2.to_owned())],
            &[],
        );
        assert!(again.ops.is_empty(), "{:?}", again.ops);
    }

    #[tokio::test]
    async fn concurrent_admissions_of_one_image_make_one_registry_request() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        // `get` answers HEAD too.
        let registry = axum::Router::new().route(
            "/v2/app/manifests/latest",
            axum::routing::get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { ([("docker-content-digest", D1)], "") }
            }),
        );
        // Never contacted: resolving a tag reads nothing from the cluster.
        let (addr, server, _dir, resolver) = serve_registry(registry).await;
        let image = ImageRef::parse(&format!("{addr}/app:latest")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);

        // One task: every admission is polled (the first sends the request, the rest wait on it) before
        // the first one reads its answer.
        let digests = join_all((0..8).map(|_| resolver.resolve_image(&image, &[], deadline))).await;
        assert!(
            digests.iter().all(|d| d.as_deref() == Ok(D1)),
            "{digests:?}"
        );
        assert_eq!(requests.load(Ordering::SeqCst), 1);
        assert_eq!(
            (
                resolver.resolutions("resolved"),
                resolver.resolutions("cached")
            ),
            (1, 7)
        );
        server.abort();
    }
}
