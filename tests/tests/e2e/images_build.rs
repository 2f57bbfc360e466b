//! helmop's images as `./dev image` builds them: pushed to a real registry, then checked there (what a
//! node pulls): each binary runs inside its image (buildah, chroot isolation), the image runs as uid/gid
//! 65532, holds no shell and nothing but the binaries, their shared libraries, a CA bundle and
//! passwd/group, carries the OCI labels, and stays under 20 MiB compressed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use helmop_tests::images::{BuiltImage, build_images, inspect, skopeo};
use helmop_tests::registry::TestRegistry;
use tokio::process::Command;

const SIZE_GOAL: u64 = 20 * 1024 * 1024;

/// `buildah` with its own vfs storage under `storage`.
fn buildah(storage: &Path) -> Command {
    let mut cmd = Command::new("buildah");
    cmd.arg("--storage-driver=vfs")
        .arg("--root")
        .arg(storage.join("root"))
        .arg("--runroot")
        .arg(storage.join("run"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn output(mut cmd: Command, what: &str) -> anyhow::Result<std::process::Output> {
    tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .with_context(|| format!("{what} did not finish in 3 minutes"))?
        .with_context(|| format!("running {what}"))
}

/// Runs `argv` inside a container of `image` (pulled from the registry) with chroot isolation, as the
/// image's user; returns (success, stdout+stderr).
async fn run_in(
    storage: &Path,
    image: &BuiltImage,
    argv: &[&str],
) -> anyhow::Result<(bool, String)> {
    let mut from = buildah(storage);
    from.args(["from", "--quiet", "--tls-verify=false"])
        .arg(format!("docker://{}", image.pinned()));
    let out = output(from, "buildah from").await?;
    ensure!(
        out.status.success(),
        "buildah from {}: {}",
        image.pinned(),
        String::from_utf8_lossy(&out.stderr)
    );
    let container = String::from_utf8(out.stdout)?.trim().to_owned();
    let mut run = buildah(storage);
    run.args(["run", "--isolation=chroot", &container, "--"])
        .args(argv);
    let out = output(run, "buildah run").await?;
    let mut rm = buildah(storage);
    rm.args(["rm", &container]);
    output(rm, "buildah rm").await?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

/// Every path in the image's layers, as `tar` lists them (no leading `./` or `/`).
async fn files(image: &BuiltImage, dir: &Path) -> anyhow::Result<Vec<String>> {
    let copy = dir.join(&image.name);
    skopeo(&[
        "--insecure-policy",
        "copy",
        "--quiet",
        "--src-tls-verify=false",
        &format!("docker://{}", image.pinned()),
        &format!("dir:{}", copy.display()),
    ])
    .await?;
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(copy.join("manifest.json"))?)?;
    let mut paths = Vec::new();
    for layer in manifest["layers"].as_array().context("no layers")? {
        let digest = layer["digest"].as_str().context("layer without digest")?;
        let blob = copy.join(digest.trim_start_matches("sha256:"));
        let mut tar = Command::new("tar");
        tar.arg("-tzf").arg(&blob).kill_on_drop(true);
        let out = output(tar, "tar -tzf").await?;
        ensure!(
            out.status.success(),
            "tar -tzf {}: {}",
            blob.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        paths.extend(
            String::from_utf8(out.stdout)?
                .lines()
                .map(|l| {
                    l.trim_start_matches("./")
                        .trim_start_matches('/')
                        .to_owned()
                })
                .filter(|l| !l.is_empty()),
        );
    }
    Ok(paths)
}

fn git_head() -> anyhow::Result<String> {
    let out = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
        .output()
        .context("running git")?;
    ensure!(out.status.success(), "git rev-parse HEAD failed");
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

#[tokio::test]
async fn images_run_as_nonroot_without_a_shell_and_stay_small() -> anyhow::Result<()> {
    let registry = TestRegistry::start().await?;
    let started = std::time::Instant::now();
    let images = build_images(registry.host(), "e2e").await?;
    eprintln!("containers/build took {:?}", started.elapsed());
    let version = env!("CARGO_PKG_VERSION");
    let head = git_head()?;
    let storage = tempfile::tempdir()?;

    for image in &images {
        let who = &image.name;
        let (manifest, config) = inspect(&image.pinned()).await?;

        // Size from the registry's manifest, independently of what containers/build printed.
        let layers = manifest["layers"].as_array().context("no layers")?;
        let size: u64 = layers
            .iter()
            .chain([&manifest["config"]])
            .map(|d| d["size"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(size, image.compressed_bytes, "{who}: size");
        eprintln!(
            "{who}: {size} bytes compressed ({:.1} MiB)",
            size as f64 / 1048576.0
        );
        assert!(size < SIZE_GOAL, "{who}: {size} bytes is over 20 MiB");
        for layer in layers {
            assert!(
                layer["mediaType"]
                    .as_str()
                    .is_some_and(|m| m.ends_with("+gzip")),
                "{who}: uncompressed layer {layer}"
            );
        }

        let c = &config["config"];
        assert_eq!(c["User"], "65532:65532", "{who}: user");
        let labels = &c["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], version, "{who}");
        let revision = labels["org.opencontainers.image.revision"]
            .as_str()
            .unwrap_or("");
        assert!(
            revision.trim_end_matches("-dirty") == head,
            "{who}: revision {revision:?}, HEAD {head}"
        );
        let source = labels["org.opencontainers.image.source"]
            .as_str()
            .unwrap_or("");
        assert!(source.starts_with("https://"), "{who}: source {source:?}");
        assert_eq!(
            labels["org.opencontainers.image.title"],
            image.name.as_str()
        );

        // Nothing but the binaries, their libraries, the CA bundle and passwd/group.
        let binaries: &[&str] = if image.name == "helmop-webhook" {
            &["helmop-webhook", "helmop-bootstrap"]
        } else {
            &["kubectl-helmop"]
        };
        let paths = files(image, storage.path()).await?;
        for path in &paths {
            if path.ends_with('/') {
                continue;
            }
            let file = Path::new(path)
                .file_name()
                .and_then(|f| f.to_str())
                .unwrap_or("");
            let allowed = binaries
                .iter()
                .any(|b| path == &format!("usr/local/bin/{b}"))
                || [
                    "etc/passwd",
                    "etc/group",
                    "etc/ssl/certs/ca-certificates.crt",
                ]
                .contains(&path.as_str())
                || ((path.starts_with("lib/")
                    || path.starts_with("lib64/")
                    || path.starts_with("usr/lib"))
                    && file.contains(".so"));
            assert!(allowed, "{who}: unexpected file {path} in {paths:?}");
        }
        for b in binaries {
            assert!(
                paths.contains(&format!("usr/local/bin/{b}")),
                "{who}: {b} missing from {paths:?}"
            );
        }
        assert!(
            !paths
                .iter()
                .any(|p| p.ends_with("/sh") || p.ends_with("busybox")),
            "{who}: a shell in {paths:?}"
        );

        // Each binary runs in the image, as the image's user, with only what the image holds.
        for b in binaries {
            let (ok, out) = run_in(storage.path(), image, &[b, "--version"]).await?;
            assert!(ok, "{who}: {b} --version failed inside the image: {out}");
            assert!(out.contains(version), "{who}: {b} --version: {out}");
        }
        let (ok, out) = run_in(storage.path(), image, &["/bin/sh", "-c", "true"]).await?;
        assert!(!ok, "{who}: /bin/sh ran: {out}");
    }
    if images.len() != 2 {
        bail!("expected two images, got {images:?}");
    }
    Ok(())
}
