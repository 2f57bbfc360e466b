//! helmop's own images, built the way `./dev image` builds them (`containers/build`: buildah, offline,
//! FROM scratch) from the release binaries, pushed to a test's registry, and inspected there with skopeo:
//! what a node pulls is what the tests check.
//!
//! The release binaries are not built here (a release build is minutes): `./dev test` and `./dev image`
//! build them (`cargo build --release -p helmop-webhook -p kubectl-helmop`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::process::Command;

use crate::binaries::target_profile_dir;

/// Binaries shipped in each image (the image name is the first).
pub const WEBHOOK_IMAGE: &str = "helmop-webhook";
pub const PROPAGATOR_IMAGE: &str = "kubectl-helmop";

/// One image pushed by `containers/build`.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// `helmop-webhook` or `kubectl-helmop`.
    pub name: String,
    /// `HOST:PORT/NAME`.
    pub repository: String,
    pub tag: String,
    /// `sha256:...` of the pushed manifest.
    pub digest: String,
    /// Config and layers as stored in the registry (compressed), as `containers/build` reported it.
    pub compressed_bytes: u64,
}

impl BuiltImage {
    /// `HOST:PORT/NAME:TAG`.
    pub fn tagged(&self) -> String {
        format!("{}:{}", self.repository, self.tag)
    }

    /// `HOST:PORT/NAME@sha256:...`.
    pub fn pinned(&self) -> String {
        format!("{}@{}", self.repository, self.digest)
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `$HELMOP_RELEASE_DIR`, else `target/release/` next to this test binary's `target/debug/`.
pub fn release_dir() -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("HELMOP_RELEASE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => target_profile_dir()?
            .parent()
            .context("the target directory has no parent")?
            .join("release"),
    };
    for bin in ["helmop-webhook", "helmop-bootstrap", "kubectl-helmop"] {
        if !dir.join(bin).is_file() {
            bail!(
                "{} is missing: cargo build --release --locked -p helmop-webhook -p kubectl-helmop \
                 (./dev test and ./dev image do)",
                dir.join(bin).display()
            );
        }
    }
    Ok(dir)
}

/// Builds both images with `containers/build` and pushes them to `registry` (`HOST:PORT`, plain HTTP) under
/// `tag`; buildah's storage is a temporary directory, removed afterwards.
pub async fn build_images(registry: &str, tag: &str) -> anyhow::Result<Vec<BuiltImage>> {
    let bin_dir = release_dir()?;
    let script = repo_root().join("containers/build");
    let mut cmd = Command::new(&script);
    cmd.arg("--bin-dir")
        .arg(&bin_dir)
        .args(["--registry", registry, "--tag", tag, "--insecure"])
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(600), cmd.output())
        .await
        .context("containers/build did not finish in 10 minutes")?
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "containers/build failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut images = Vec::new();
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, reference, size] = fields[..] else {
            bail!("containers/build printed an unexpected line: {line:?}");
        };
        let (tagged, digest) = reference
            .split_once('@')
            .with_context(|| format!("no digest in {reference:?}"))?;
        let (repository, tag) = tagged
            .rsplit_once(':')
            .with_context(|| format!("no tag in {tagged:?}"))?;
        images.push(BuiltImage {
            name: name.to_owned(),
            repository: repository.to_owned(),
            tag: tag.to_owned(),
            digest: digest.to_owned(),
            compressed_bytes: size
                .parse()
                .with_context(|| format!("size {size:?} in {line:?}"))?,
        });
    }
    let names: Vec<&str> = images.iter().map(|i| i.name.as_str()).collect();
    if names != [WEBHOOK_IMAGE, PROPAGATOR_IMAGE] {
        bail!("containers/build built {names:?}, expected [{WEBHOOK_IMAGE}, {PROPAGATOR_IMAGE}]");
    }
    Ok(images)
}

/// `skopeo ARGS` against a plain-HTTP registry; stdout.
pub async fn skopeo(args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new("skopeo")
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("skopeo {args:?} did not finish in 2 minutes"))?
    .context("running skopeo (apt package skopeo; ./dev setup installs it)")?;
    if !out.status.success() {
        bail!(
            "skopeo {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// The image manifest and config of `reference`, as stored in the registry.
pub async fn inspect(reference: &str) -> anyhow::Result<(Value, Value)> {
    let image = format!("docker://{reference}");
    let manifest = skopeo(&["inspect", "--raw", "--tls-verify=false", &image]).await?;
    let config = skopeo(&["inspect", "--config", "--raw", "--tls-verify=false", &image]).await?;
    Ok((
        serde_json::from_slice(&manifest).context("image manifest")?,
        serde_json::from_slice(&config).context("image config")?,
    ))
}
