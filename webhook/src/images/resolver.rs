//! [`RegistryResolver`]: which images to resolve, with which credentials, within the admission's budget, and
//! what to write back.

use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{Map, Value};
use tokio::time::Instant;

use helmop_core::names::{ANN_IMAGE_DIGESTS, ANN_RESTAMP};

use super::auth::{Credential, PullSecret, credential_for};
use super::cache::ExpiringCache;
use super::patch::{Slot, annotate_ops, parse_digests, pin_ops, slots};
use super::pull_secrets::read_pull_secrets;
use super::reference::ImageRef;
use super::registry::{RegistryClient, RegistrySettings, ResolveError};
use super::tags::MutableTags;
use super::{ImageOutcome, ImageRequest, ImageResolver};
use crate::config::{Config, ImageMode};
use crate::metrics::Metrics;

pub use helmop_core::names::ANN_IMAGE_MODE;

/// How long a resolved digest is reused. Short on purpose: CI pushes and applies seconds apart, and a
/// longer reuse would pin the digest from before the push. It still folds the admissions of one
/// `kubectl apply` of many workloads sharing an image into one registry request.
pub const POSITIVE_TTL: Duration = Duration::from_secs(3);
/// How long a failure is remembered, so a dead registry costs one budget, not one per admission.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(10);
const DIGEST_CACHE_ENTRIES: u64 = 4096;
const NAMESPACE_TTL: Duration = Duration::from_secs(10);

/// A valid override value.
pub fn mode_override(value: &str) -> Option<ImageMode> {
    match value.trim() {
        "pin" => Some(ImageMode::Pin),
        "annotate" => Some(ImageMode::Annotate),
        "off" => Some(ImageMode::Off),
        _ => None,
    }
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
    client: kube::Client,
    registry: RegistryClient,
    tags: MutableTags,
    budget: Duration,
    /// Concurrent admissions of one image share one registry request.
    digests: ExpiringCache<DigestKey, Result<String, ResolveError>>,
    namespaces: ExpiringCache<String, Option<String>>,
    outcomes: Family<OutcomeLabel, Counter>,
}

impl RegistryResolver {
    /// Reads `--registry-config` and registers `helmop_webhook_image_resolutions_total{outcome}`.
    pub fn new(
        client: kube::Client,
        config: &Config,
        metrics: &Metrics,
    ) -> Result<RegistryResolver, crate::error::Error> {
        let settings = match &config.registry_config {
            Some(path) => RegistrySettings::load(path)?,
            None => RegistrySettings::default(),
        };
        let outcomes = Family::<OutcomeLabel, Counter>::default();
        metrics.registry().register(
            "helmop_webhook_image_resolutions",
            "Image tag resolutions, by outcome (resolved, cached, not_found, unauthorized, unreachable, refused, timeout, error)",
            outcomes.clone(),
        );
        Ok(RegistryResolver {
            client,
            registry: RegistryClient::new(settings, "helmop-webhook")?,
            tags: MutableTags::new(&config.mutable_tags),
            budget: config.image_budget,
            digests: digest_cache(POSITIVE_TTL, NEGATIVE_TTL),
            namespaces: ExpiringCache::new(DIGEST_CACHE_ENTRIES, |_| NAMESPACE_TTL),
            outcomes,
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

    fn count(&self, outcome: &'static str) {
        self.outcomes.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    async fn namespace_mode(&self, namespace: &str) -> Option<String> {
        if let Some(cached) = self.namespaces.get(&namespace.to_owned()).await {
            return cached;
        }
        let api = Api::<Namespace>::all(self.client.clone());
        match api.get_metadata_opt(namespace).await {
            Ok(ns) => {
                let mode = ns.and_then(|ns| ns.metadata.annotations?.remove(ANN_IMAGE_MODE));
                self.namespaces
                    .insert(namespace.to_owned(), mode.clone())
                    .await;
                mode
            }
            Err(error) => {
                tracing::warn!(namespace, %error, "cannot read the namespace's image mode; using --image-mode");
                None
            }
        }
    }

    /// The pull secrets of the pod and its ServiceAccount, read live. Unreadable ones become warnings.
    async fn pull_secrets(
        &self,
        namespace: &str,
        spec: &Value,
        warnings: &mut Vec<String>,
    ) -> Vec<PullSecret> {
        let (secrets, problems) = read_pull_secrets(&self.client, namespace, spec).await;
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
        // The lookup's own deadline makes a timeout an outcome that is cached like any failure; waiting on
        // another admission's lookup is bounded by this admission's deadline.
        let lookup = async {
            tokio::time::timeout_at(deadline, self.registry.resolve(image, credential))
                .await
                .unwrap_or(Err(ResolveError::Timeout))
        };
        let (result, fresh) =
            tokio::time::timeout_at(deadline, self.digests.get_or_run(key, lookup))
                .await
                .unwrap_or((Err(ResolveError::Timeout), true));
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
        let deadline = image_deadline(Instant::now(), self.budget, request.deadline);
        let object = request.object;
        let Some(spec) = object.pointer(request.template_spec_pointer) else {
            return ImageOutcome::default();
        };
        let metadata = object
            .pointer(request.template_metadata_pointer)
            .and_then(Value::as_object);
        let all = slots(spec);
        let restamp = request
            .old_object
            .is_some_and(|old| annotation(old, ANN_RESTAMP) != annotation(object, ANN_RESTAMP));
        let candidates = candidates(&all, &self.tags, restamp);
        let recorded = template_annotation(metadata, ANN_IMAGE_DIGESTS);
        if candidates.is_empty() && recorded.is_none() {
            return ImageOutcome::default();
        }

        let mut warnings = Vec::new();
        let mode = match annotation(object, ANN_IMAGE_MODE) {
            Some(value) => Some(value.to_owned()),
            None => tokio::time::timeout_at(deadline, self.namespace_mode(request.namespace))
                .await
                .unwrap_or(None),
        };
        let mode = match mode {
            None => request.mode,
            Some(value) => mode_override(&value).unwrap_or_else(|| {
                warnings.push(format!(
                    "helmop webhook: {ANN_IMAGE_MODE}={value:?} is not pin, annotate or off; using {:?}",
                    request.mode
                ));
                request.mode
            }),
        };
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
                self.pull_secrets(request.namespace, spec, &mut warnings),
            )
            .await
            .unwrap_or_default()
        };
        // One registry request per distinct image, however many containers run it.
        let mut distinct: Vec<&ImageRef> = Vec::new();
        for c in &candidates {
            if !distinct.iter().any(|d| same_tag(d, &c.image)) {
                distinct.push(&c.image);
            }
        }
        let resolved = join_all(
            distinct
                .iter()
                .map(|image| self.resolve_image(image, &secrets, deadline)),
        )
        .await;
        let results: Vec<Result<String, ResolveError>> = candidates
            .iter()
            .map(|c| {
                distinct
                    .iter()
                    .position(|d| same_tag(d, &c.image))
                    .and_then(|i| resolved.get(i).cloned())
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
        outcome.warnings = warnings;
        outcome
    }
}

impl ImageResolver for RegistryResolver {
    fn resolve<'a>(&'a self, request: ImageRequest<'a>) -> BoxFuture<'a, ImageOutcome> {
        Box::pin(self.run(request))
    }
}

/// Resolutions kept `positive` when they succeeded, `negative` when they failed.
fn digest_cache(
    positive: Duration,
    negative: Duration,
) -> ExpiringCache<DigestKey, Result<String, ResolveError>> {
    ExpiringCache::new(
        DIGEST_CACHE_ENTRIES,
        move |result: &Result<String, ResolveError>| {
            if result.is_ok() { positive } else { negative }
        },
    )
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
    fn modes() {
        assert_eq!(mode_override(" pin"), Some(ImageMode::Pin));
        assert_eq!(mode_override("annotate"), Some(ImageMode::Annotate));
        assert_eq!(mode_override("off"), Some(ImageMode::Off));
        assert_eq!(mode_override("Pin"), None);
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
        // Never contacted: resolving a tag reads nothing from the cluster.
        let kube = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
            .unwrap();
        let resolver = RegistryResolver::new(kube, &config, &Metrics::new()).unwrap();
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
