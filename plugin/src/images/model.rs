//! What `images` knows about one container and how it compares with the registry (pure).
//!
//! A container is listed when its tag moves: `latest` (or no tag), or a `--mutable-tags` pattern, the
//! webhook's rule. Containers pinned by digest alone (`repo@sha256:...`, no tag) are the user's pins and
//! not listed, nor are image references that do not parse (the webhook leaves them alone too).
//!
//! The pinned digest is the one in the image (`repo:tag@sha256:...`, pin mode), else the container's
//! entry in the pod template's `helmop.dev/image-digests` (annotate mode). States:
//! - `Current`: the registry's digest for the tag is the pinned one;
//! - `Outdated`: the tag has moved since the workload was stamped (a restamp rolls it);
//! - `Unpinned`: nothing recorded a digest (the webhook is not installed, its image mode is off, or the
//!   registry failed when the workload was admitted);
//! - `Unresolvable`: the registry could not say (reason given).

use helmop_core::names::ANN_IMAGE_DIGESTS;
use helmop_core::workload::PodTemplate;
use helmop_images::client::ResolveError;
use helmop_images::podspec::{parse_digests, slots};
use helmop_images::reference::ImageRef;
use helmop_images::tags::MutableTags;
use serde::Serialize;

use crate::output::report::Colour;

/// One container whose image tag is mutable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    /// The image as the pod template writes it.
    pub image: String,
    /// What to ask the registry about: the image without its digest.
    pub tag: ImageRef,
    /// The digest the workload runs, if anything recorded one.
    pub pinned: Option<String>,
}

/// The containers of `template` with a mutable tag, init containers first.
pub fn containers(template: &PodTemplate<'_>, tags: &MutableTags) -> Vec<Container> {
    let recorded = template
        .annotation(ANN_IMAGE_DIGESTS)
        .map(parse_digests)
        .unwrap_or_default();
    slots(template.spec)
        .into_iter()
        .filter_map(|slot| {
            let mut tag = ImageRef::parse(&slot.image).ok()?;
            if (tag.digest.is_some() && tag.tag.is_none()) || !tags.is_mutable(tag.effective_tag())
            {
                return None;
            }
            let pinned = tag.digest.take().or_else(|| {
                recorded
                    .iter()
                    .find(|(name, _)| *name == slot.name)
                    .map(|(_, digest)| digest.clone())
            });
            Some(Container {
                name: slot.name,
                image: slot.image,
                tag,
                pinned,
            })
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum ImageState {
    Current,
    Outdated,
    Unpinned,
    Unresolvable,
}

impl ImageState {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageState::Current => "Current",
            ImageState::Outdated => "Outdated",
            ImageState::Unpinned => "Unpinned",
            ImageState::Unresolvable => "Unresolvable",
        }
    }

    /// Green when current, yellow when a rollout would help, red when the registry did not tell.
    pub fn colour(self) -> Colour {
        match self {
            ImageState::Current => Colour::Green,
            ImageState::Outdated | ImageState::Unpinned => Colour::Yellow,
            ImageState::Unresolvable => Colour::Red,
        }
    }
}

/// One row of `images`: a container of an opted-in workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRow {
    pub namespace: String,
    /// `deployment/web`.
    pub workload: String,
    pub container: String,
    pub image: String,
    /// The digest the workload runs (pin or annotation), if recorded.
    pub pinned: Option<String>,
    /// The registry's digest for the tag now, if it answered.
    pub current: Option<String>,
    pub state: ImageState,
    /// Why, in words a user can act on (never a credential).
    pub reason: String,
}

/// Compares one container with the registry's answer for its tag.
pub fn compare(
    container: &Container,
    registry: &Result<String, ResolveError>,
) -> (ImageState, String) {
    match (registry, &container.pinned) {
        (Err(e), _) => (ImageState::Unresolvable, e.to_string()),
        (Ok(now), Some(pinned)) if now == pinned => (
            ImageState::Current,
            format!("{} still points at the pinned digest", container.tag),
        ),
        (Ok(_), Some(_)) => (
            ImageState::Outdated,
            format!(
                "{} moved since the workload was stamped; a restamp rolls it",
                container.tag
            ),
        ),
        (Ok(_), None) => (
            ImageState::Unpinned,
            "no digest recorded: is the helmop webhook installed, with image mode pin or annotate?"
                .to_owned(),
        ),
    }
}

/// `sha256:` and the first 12 hex digits, as `docker images` shows digests.
pub fn short_digest(digest: &str) -> String {
    match digest.split_once(':') {
        Some((algorithm, hex)) if hex.len() > 12 => format!("{algorithm}:{}", &hex[..12]),
        _ => digest.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use helmop_core::workload::{WorkloadKind, pod_template};
    use serde_json::{Value, json};

    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn deployment(annotations: Value, containers: Value) -> Value {
        json!({"spec": {"template": {
            "metadata": {"annotations": annotations},
            "spec": {"initContainers": [{"name": "init", "image": "reg.io/init"}], "containers": containers},
        }}})
    }

    fn listed(obj: &Value, tags: &MutableTags) -> Vec<(String, Option<String>)> {
        let t = pod_template(WorkloadKind::Deployment, obj).unwrap();
        containers(&t, tags)
            .into_iter()
            .map(|c| (c.name, c.pinned))
            .collect()
    }

    #[test]
    fn lists_mutable_tags_with_their_pins() {
        let obj = deployment(
            json!({ANN_IMAGE_DIGESTS: format!("init={D2},annotated={D1}")}),
            json!([
                {"name": "pinned", "image": format!("reg.io/app:latest@{D1}")},
                {"name": "annotated", "image": "reg.io/app"},
                {"name": "bare", "image": "reg.io/app:main"},
                {"name": "fixed", "image": "reg.io/app:1.2.3"},
                {"name": "digest-only", "image": format!("reg.io/app@{D1}")},
                {"name": "junk", "image": "Not An Image"},
            ]),
        );
        let main = MutableTags::new(&["main".into()]);
        assert_eq!(
            listed(&obj, &main),
            [
                ("init".into(), Some(D2.into())),
                ("pinned".into(), Some(D1.into())),
                ("annotated".into(), Some(D1.into())),
                ("bare".into(), None),
            ]
        );
        // Without the pattern, `main` is a fixed tag.
        assert_eq!(listed(&obj, &MutableTags::default()).len(), 3);
        // The digest is dropped from what the registry is asked about.
        let t = pod_template(WorkloadKind::Deployment, &obj).unwrap();
        let c = &containers(&t, &main)[1];
        assert_eq!(c.tag.digest, None);
        assert_eq!(c.tag.to_string(), "reg.io/app:latest");
    }

    #[test]
    fn states() {
        let obj = deployment(
            json!({}),
            json!([{"name": "a", "image": format!("reg.io/a:latest@{D1}")}]),
        );
        let t = pod_template(WorkloadKind::Deployment, &obj).unwrap();
        let mut c = containers(&t, &MutableTags::default()).remove(1);
        assert_eq!(compare(&c, &Ok(D1.into())).0, ImageState::Current);
        let (state, reason) = compare(&c, &Ok(D2.into()));
        assert_eq!(state, ImageState::Outdated);
        assert!(reason.contains("reg.io/a:latest moved"), "{reason}");
        let (state, reason) = compare(&c, &Err(ResolveError::NotFound));
        assert_eq!(state, ImageState::Unresolvable);
        assert!(reason.contains("manifest unknown"), "{reason}");
        c.pinned = None;
        assert_eq!(compare(&c, &Ok(D2.into())).0, ImageState::Unpinned);
    }

    #[test]
    fn short_digests() {
        assert_eq!(short_digest(D1), "sha256:111111111111");
        assert_eq!(short_digest("odd"), "odd");
    }
}
