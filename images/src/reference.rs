//! Image references as a container runtime reads them: `[registry[:port]/]repository[:tag][@digest]`, with
//! Docker Hub (`docker.io`, `library/` for single-component names) as the default.

use std::fmt;

/// The registry a reference without a registry component points at.
pub const DOCKER_HUB: &str = "docker.io";
/// Where Docker Hub actually serves the distribution API.
const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// What an image without a tag runs.
pub const DEFAULT_TAG: &str = "latest";

/// One parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// The name exactly as written, without tag and digest: pinning keeps it so a human reads the same name.
    pub name: String,
    /// Normalised registry host (with port), e.g. `docker.io`, `127.0.0.1:5000`.
    pub registry: String,
    /// Normalised repository path, e.g. `library/nginx`.
    pub repository: String,
    pub tag: Option<String>,
    /// `algorithm:hex`, e.g. `sha256:...`.
    pub digest: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("empty image reference")]
    Empty,
    #[error("invalid digest {0:?} (expected sha256: and 64 lowercase hex digits)")]
    Digest(String),
    #[error("invalid tag {0:?}")]
    Tag(String),
    #[error("invalid repository {0:?} (lowercase letters, digits and separators)")]
    Repository(String),
}

impl ImageRef {
    pub fn parse(image: &str) -> Result<ImageRef, ReferenceError> {
        let image = image.trim();
        if image.is_empty() {
            return Err(ReferenceError::Empty);
        }
        let (rest, digest) = match image.split_once('@') {
            Some((rest, digest)) => {
                if !valid_digest(digest) {
                    return Err(ReferenceError::Digest(digest.to_owned()));
                }
                (rest, Some(digest.to_owned()))
            }
            None => (image, None),
        };
        // A `:` after the last `/` starts the tag; one before it belongs to a registry port.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let tag = &rest[last_slash + i + 1..];
                if !valid_tag(tag) {
                    return Err(ReferenceError::Tag(tag.to_owned()));
                }
                (&rest[..last_slash + i], Some(tag.to_owned()))
            }
            None => (rest, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (normalise_registry(first), path.to_owned())
            }
            _ => (DOCKER_HUB.to_owned(), name.to_owned()),
        };
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        if !valid_repository(&repository) {
            return Err(ReferenceError::Repository(repository));
        }
        Ok(ImageRef {
            name: name.to_owned(),
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The tag a runtime pulls: the written one, else `latest`.
    pub fn effective_tag(&self) -> &str {
        self.tag.as_deref().unwrap_or(DEFAULT_TAG)
    }

    /// The host serving the distribution API for this registry.
    pub fn api_host(&self) -> &str {
        api_host(&self.registry)
    }

    /// `name:tag@digest`: the tag stays for humans, the digest decides what runs.
    pub fn pinned(&self, digest: &str) -> String {
        format!("{}:{}@{digest}", self.name, self.effective_tag())
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}:{}",
            self.registry,
            self.repository,
            self.effective_tag()
        )
    }
}

/// The API host of a normalised registry name.
pub fn api_host(registry: &str) -> &str {
    if registry == DOCKER_HUB {
        DOCKER_HUB_API
    } else {
        registry
    }
}

/// Docker Hub goes by several names; pull secrets and configuration may use any of them.
pub fn normalise_registry(host: &str) -> String {
    let host = host.trim().trim_end_matches('/').to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            DOCKER_HUB.to_owned()
        }
        _ => host,
    }
}

pub fn valid_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn valid_tag(tag: &str) -> bool {
    let mut bytes = tag.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphanumeric() || b == b'_')
        && tag.len() <= 128
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn valid_repository(repository: &str) -> bool {
    !repository.is_empty()
        && repository.split('/').all(|component| {
            !component.is_empty()
                && component.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
                })
                && component
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphanumeric())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn parse(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap()
    }

    #[test]
    fn docker_hub_defaults() {
        let r = parse("nginx");
        assert_eq!(
            (
                r.registry.as_str(),
                r.repository.as_str(),
                r.tag.clone(),
                r.digest.clone()
            ),
            ("docker.io", "library/nginx", None, None)
        );
        assert_eq!(r.effective_tag(), "latest");
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(r.pinned(D), format!("nginx:latest@{D}"));
        let r = parse("bitnami/redis:7.2");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("docker.io", "bitnami/redis")
        );
        assert_eq!(r.tag.as_deref(), Some("7.2"));
        let r = parse("docker.io/nginx:1");
        assert_eq!(r.repository, "library/nginx");
        assert_eq!(r.name, "docker.io/nginx");
        assert_eq!(parse("index.docker.io/library/nginx").registry, "docker.io");
    }

    #[test]
    fn registries_with_ports_and_paths() {
        let r = parse("127.0.0.1:5000/demo/app:latest");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "demo/app", Some("latest"))
        );
        let r = parse("localhost:5000/app");
        assert_eq!(
            (r.registry.as_str(), r.tag.as_deref()),
            ("localhost:5000", None)
        );
        let r = parse("localhost/app");
        assert_eq!(r.registry, "localhost");
        let r = parse("ghcr.io/org/team/app:v1.2-rc_3");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("ghcr.io", "org/team/app")
        );
        assert_eq!(r.tag.as_deref(), Some("v1.2-rc_3"));
        assert_eq!(r.to_string(), "ghcr.io/org/team/app:v1.2-rc_3");
    }

    #[test]
    fn digests() {
        let r = parse(&format!("registry.example.com:8443/app:main@{D}"));
        assert_eq!(r.digest.as_deref(), Some(D));
        assert_eq!(r.tag.as_deref(), Some("main"));
        assert_eq!(r.registry, "registry.example.com:8443");
        let r = parse(&format!("app@{D}"));
        assert_eq!((r.tag.as_deref(), r.digest.as_deref()), (None, Some(D)));
        // Pinning the output again keeps the name as written.
        assert_eq!(parse(&r.pinned(D)).name, "app");
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "  ",
            "app@sha256:short",
            "app@md5:0123",
            "App",
            "reg.io/Org/app",
            "app:",
            "app:-x",
            "reg.io//app",
            &format!("app:{}", "x".repeat(129)),
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
