//! A real OCI registry for the image-digest tests: Debian's `docker-registry` on 127.0.0.1 (started by
//! `tests/registry/serve`, optionally with htpasswd basic auth), and images built by hand as OCI image
//! layouts (layer tarball, config blob, manifest, optional multi-arch index, `index.json`) and pushed with
//! `skopeo copy`. The digests a test expects are computed here from the bytes written, never hard-coded.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::process::{Child, Command};

use crate::wait::wait_until;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("registry/serve")
}

fn free_port(addr: &str) -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind((addr, 0))
        .with_context(|| format!("cannot bind a port on {addr}"))?;
    Ok(listener.local_addr()?.port())
}

/// A running registry; killed when dropped.
pub struct TestRegistry {
    child: Option<Child>,
    host: String,
    credentials: Option<(String, String)>,
    _dir: tempfile::TempDir,
}

impl TestRegistry {
    /// An open registry (anyone may pull and push).
    pub async fn start() -> anyhow::Result<TestRegistry> {
        Self::start_inner("127.0.0.1", None).await
    }

    /// An open registry listening on `addr` instead of loopback, e.g. a node's `host_address`,
    /// which both the node's containerd and its pods reach.
    pub async fn start_on(addr: &str) -> anyhow::Result<TestRegistry> {
        Self::start_inner(addr, None).await
    }

    /// A registry requiring HTTP basic auth with this user and password.
    pub async fn start_with_basic_auth(user: &str, password: &str) -> anyhow::Result<TestRegistry> {
        Self::start_inner("127.0.0.1", Some((user.to_owned(), password.to_owned()))).await
    }

    async fn start_inner(
        addr: &str,
        credentials: Option<(String, String)>,
    ) -> anyhow::Result<TestRegistry> {
        let dir = tempfile::tempdir()?;
        let port = free_port(addr)?;
        let mut cmd = Command::new(script());
        cmd.arg(dir.path())
            .arg(port.to_string())
            .env("HELMOP_REGISTRY_ADDR", addr);
        if let Some((user, password)) = &credentials {
            cmd.arg(user).arg(password);
        }
        // The registry logs every 404 of skopeo's blob probes at error level: keep that out of test output.
        let log = std::fs::File::create(dir.path().join("registry.log"))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running {}", script().display()))?;
        let mut registry = TestRegistry {
            child: Some(child),
            host: format!("{addr}:{port}"),
            credentials,
            _dir: dir,
        };
        let host = registry.host.clone();
        let started = wait_until(
            "the test registry to listen",
            Duration::from_secs(20),
            || {
                let host = host.clone();
                async move { Ok(tokio::net::TcpStream::connect(&host).await.is_ok()) }
            },
        )
        .await;
        if let Err(e) = started {
            if let Some(child) = registry.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!(
                    "the test registry exited ({status}); is docker-registry installed (./dev setup)?"
                );
            }
            return Err(e);
        }
        Ok(registry)
    }

    /// The registry's process id while it runs, for exit hooks of registries kept for a whole test
    /// binary (where no runtime is left to drop them).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Its storage and configuration directory (removed when the registry is dropped).
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// `ADDR:PORT` (`127.0.0.1:PORT` unless started with [`TestRegistry::start_on`]).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// `HOST/REPO`.
    pub fn repository(&self, repo: &str) -> String {
        format!("{}/{repo}", self.host)
    }

    /// Pushes `image` as `REPO:TAG` with skopeo (every platform of a multi-arch index).
    pub async fn push(&self, image: &OciImage, repo: &str, tag: &str) -> anyhow::Result<()> {
        let mut cmd = Command::new("skopeo");
        cmd.args([
            "--insecure-policy",
            "copy",
            "--quiet",
            "--all",
            "--preserve-digests",
        ])
        .arg("--dest-tls-verify=false");
        if let Some((user, password)) = &self.credentials {
            cmd.arg(format!("--dest-creds={user}:{password}"));
        }
        cmd.arg(format!("oci:{}:{}", image.dir.path().display(), image.tag))
            .arg(format!("docker://{}/{repo}:{tag}", self.host))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .context("skopeo copy did not finish in 60s")?
            .context("running skopeo (apt package skopeo; ./dev setup installs it)")?;
        if !out.status.success() {
            bail!(
                "skopeo copy failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Stops the registry (nothing listens on its port afterwards).
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().await?;
        }
        let host = self.host.clone();
        wait_until(
            "the test registry to stop listening",
            Duration::from_secs(10),
            || {
                let host = host.clone();
                async move { Ok(tokio::net::TcpStream::connect(&host).await.is_err()) }
            },
        )
        .await
    }
}

/// An OCI image layout on disk, ready for `skopeo copy oci:DIR:TAG`.
pub struct OciImage {
    dir: tempfile::TempDir,
    tag: String,
    /// What a tag pushed from this layout points at: the manifest digest, or the index digest for a
    /// multi-arch image.
    pub digest: String,
    /// Per-platform manifest digests of a multi-arch image (empty for a single manifest).
    pub platform_digests: Vec<String>,
}

impl OciImage {
    /// A single-platform (linux/amd64) image whose one layer holds `/content` = `content`: different
    /// contents give different digests.
    pub fn single(content: &str) -> anyhow::Result<OciImage> {
        let dir = tempfile::tempdir()?;
        let (manifest, size) = write_manifest(dir.path(), content, "amd64")?;
        write_layout(dir.path(), OCI_MANIFEST, &manifest, size, "v")?;
        Ok(OciImage {
            dir,
            tag: "v".into(),
            digest: manifest,
            platform_digests: Vec::new(),
        })
    }

    /// A multi-arch image: an OCI index over linux/amd64 and linux/arm64 manifests.
    pub fn multi_arch(content: &str) -> anyhow::Result<OciImage> {
        let dir = tempfile::tempdir()?;
        let mut entries = Vec::new();
        let mut platform_digests = Vec::new();
        for arch in ["amd64", "arm64"] {
            let (digest, size) = write_manifest(dir.path(), &format!("{content}/{arch}"), arch)?;
            entries.push(
                json!({"mediaType": OCI_MANIFEST, "digest": digest, "size": size,
                                "platform": {"architecture": arch, "os": "linux"}}),
            );
            platform_digests.push(digest);
        }
        let index = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries});
        let (digest, size) = write_blob(dir.path(), &serde_json::to_vec(&index)?)?;
        write_layout(dir.path(), OCI_INDEX, &digest, size, "v")?;
        Ok(OciImage {
            dir,
            tag: "v".into(),
            digest,
            platform_digests,
        })
    }
}

fn write_blob(dir: &Path, bytes: &[u8]) -> anyhow::Result<(String, usize)> {
    let hex = hex::encode(Sha256::digest(bytes));
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    std::fs::write(blobs.join(&hex), bytes)?;
    Ok((format!("sha256:{hex}"), bytes.len()))
}

fn write_manifest(dir: &Path, content: &str, arch: &str) -> anyhow::Result<(String, usize)> {
    let layer = tar_with_one_file("content", content.as_bytes());
    let (layer_digest, layer_size) = write_blob(dir, &layer)?;
    let config = json!({
        "architecture": arch,
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let (config_digest, config_size) = write_blob(dir, &serde_json::to_vec(&config)?)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": OCI_LAYER, "digest": layer_digest, "size": layer_size}],
    });
    write_blob(dir, &serde_json::to_vec(&manifest)?)
}

fn write_layout(
    dir: &Path,
    media_type: &str,
    digest: &str,
    size: usize,
    tag: &str,
) -> anyhow::Result<()> {
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let index: Value = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": media_type, "digest": digest, "size": size,
        "annotations": {"org.opencontainers.image.ref.name": tag},
    }]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    Ok(())
}

/// A POSIX ustar archive holding one regular file.
fn tar_with_one_file(name: &str, data: &[u8]) -> Vec<u8> {
    let mut header = [0u8; 512];
    let put = |header: &mut [u8; 512], at: usize, value: &[u8]| {
        header[at..at + value.len()].copy_from_slice(value);
    };
    put(&mut header, 0, name.as_bytes());
    put(&mut header, 100, b"0000644\0");
    put(&mut header, 108, b"0000000\0");
    put(&mut header, 116, b"0000000\0");
    put(
        &mut header,
        124,
        format!("{:011o}\0", data.len()).as_bytes(),
    );
    put(&mut header, 136, b"00000000000\0");
    put(&mut header, 148, b"        ");
    put(&mut header, 156, b"0");
    put(&mut header, 257, b"ustar\0");
    put(&mut header, 263, b"00");
    let checksum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    put(&mut header, 148, format!("{checksum:06o}\0 ").as_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// A loopback TCP listener that accepts connections and never answers (a hung registry): only a
/// client's own deadline ends its wait. The connections are held until the value is dropped.
pub struct BlackHole {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    task: tokio::task::JoinHandle<()>,
}

impl BlackHole {
    pub async fn start() -> anyhow::Result<BlackHole> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let task = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        Ok(BlackHole { addr, task })
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_is_well_formed() {
        let t = tar_with_one_file("content", b"hello");
        assert_eq!(t.len(), 512 + 512 + 1024);
        assert_eq!(&t[257..263], b"ustar\0");
        let mut copy = t[..512].to_vec();
        copy[148..156].copy_from_slice(b"        ");
        let sum: u32 = copy.iter().map(|&b| u32::from(b)).sum();
        assert_eq!(
            std::str::from_utf8(&t[148..154]).unwrap(),
            format!("{sum:06o}")
        );
        assert_eq!(&t[512..517], b"hello");
    }

    #[test]
    fn layouts_differ_by_content_and_index_is_not_a_platform() {
        let a = OciImage::single("v1").unwrap();
        let b = OciImage::single("v2").unwrap();
        assert_ne!(a.digest, b.digest);
        assert_eq!(
            OciImage::single("v1").unwrap().digest,
            a.digest,
            "deterministic"
        );
        let m = OciImage::multi_arch("v1").unwrap();
        assert_eq!(m.platform_digests.len(), 2);
        assert!(!m.platform_digests.contains(&m.digest));
        let index: Value =
            serde_json::from_slice(&std::fs::read(m.dir.path().join("index.json")).unwrap())
                .unwrap();
        assert_eq!(index["manifests"][0]["digest"], m.digest.as_str());
    }
}
