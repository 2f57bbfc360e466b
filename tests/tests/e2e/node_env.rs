//! The environment of the node flows: a private control plane whose first cluster has a real node
//! (kubelet + containerd; `nodedown` is a downstream cluster without one), a registry on the node's
//! bridge address that containerd pulls from and pods reach, helmop's release images and a busybox
//! image pushed there, and helmop installed on the node cluster from its shipped manifests with
//! `kubectl apply -k` of an overlay, exactly as the manifests README tells users. Started once per
//! test binary on first use; the control plane and the registry stop when the process exits.
//!
//! Private rather than the shared node control plane: the install and removal tests of the images
//! suite install and delete helmop there, and an always-on propagator would act on every HelmOp
//! of a cluster other tests use.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Once, OnceLock};
use std::time::Duration;

use anyhow::{Context, bail};
use helmop_tests::registry::TestRegistry;
use helmop_tests::*;
use tokio::process::Command;
use tokio::sync::OnceCell;

/// Names of the two clusters of the node control plane.
const NODE_UPSTREAM: &str = "nfup";
const NODE_DOWNSTREAM: &str = "nfdown";
const INSTALL: Duration = Duration::from_secs(300);

pub struct NodeEnv {
    cp: &'static ControlPlane,
    /// `host:port` of the registry containerd pulls from, reachable from pods too.
    pub registry: String,
    /// A busybox-static image in that registry.
    pub busybox: String,
    /// The release images pushed there, `HOST:PORT/NAME:TAG`.
    webhook_image: String,
    plugin_image: String,
    dir: PathBuf,
}

static ENV: OnceCell<Result<NodeEnv, String>> = OnceCell::const_new();
static CONTROL_PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
/// The registry process, killed at exit (a `static` is never dropped).
static REGISTRY: OnceLock<(u32, PathBuf)> = OnceLock::new();
static ATEXIT: Once = Once::new();

extern "C" fn shutdown() {
    if let Some((pid, dir)) = REGISTRY.get() {
        if let Ok(pid) = i32::try_from(*pid) {
            // SAFETY: kill(2) on a child this process started; no memory is involved.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }
    if let Some(Ok(cp)) = CONTROL_PLANE.get() {
        cp.shutdown();
    }
}

/// The node environment, with helmop installed; every test that asks gets the same error when it
/// cannot be set up.
pub async fn node_env() -> anyhow::Result<&'static NodeEnv> {
    let env = ENV
        .get_or_init(|| async { NodeEnv::start().await.map_err(|e| format!("{e:#}")) })
        .await;
    match env {
        Ok(env) => Ok(env),
        Err(e) => bail!("the node environment is not available: {e}"),
    }
}

async fn run(what: &str, cmd: &mut Command, timeout: Duration) -> anyhow::Result<String> {
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .with_context(|| format!("{what} did not finish in {timeout:?}"))?
        .with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl NodeEnv {
    async fn start() -> anyhow::Result<NodeEnv> {
        let cp = tokio::task::spawn_blocking(|| {
            CONTROL_PLANE
                .get_or_init(|| {
                    ControlPlane::start_with(
                        &[NODE_UPSTREAM, NODE_DOWNSTREAM],
                        &ControlPlaneOptions::with_node(),
                    )
                    .map_err(|e| format!("{e:#}"))
                })
                .as_ref()
                .map_err(Clone::clone)
        })
        .await
        .context("starting the node control plane")?
        .map_err(anyhow::Error::msg)?;
        ATEXIT.call_once(|| {
            // SAFETY: registering a plain `extern "C" fn` with no arguments is always sound.
            #[allow(unsafe_code)]
            unsafe {
                libc::atexit(shutdown);
            }
        });
        let node = cp.node()?;
        let registry = TestRegistry::start_on(&node.host_address).await?;
        node.allow_http_registry(registry.host())?;
        let busybox = build_busybox_image(&registry, "busybox", "node-flows", "node-flows").await?;
        let images = helmop_tests::images::build_images(registry.host(), "node-flows").await?;
        let image = |name: &str| {
            images
                .iter()
                .find(|i| i.name == name)
                .map(|i| format!("{}:{}", i.repository, i.tag))
                .with_context(|| format!("containers/build built no {name}"))
        };
        let dir = cp.dir.join("node-flows");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let env = NodeEnv {
            cp,
            registry: registry.host().to_owned(),
            busybox: busybox.reference,
            webhook_image: image("helmop-webhook")?,
            plugin_image: image("kubectl-helmop")?,
            dir,
        };
        // Kept running until the process exits (see `shutdown`).
        if let Some(pid) = registry.pid() {
            let _ = REGISTRY.set((pid, registry.dir().to_path_buf()));
        }
        std::mem::forget(registry);
        env.install_webhook().await?;
        Ok(env)
    }

    pub fn cluster(&self) -> &ClusterInfo {
        self.cp.cluster(NODE_UPSTREAM)
    }

    /// The Node object's name.
    pub fn node_name(&self) -> anyhow::Result<&str> {
        Ok(self.cp.node()?.name.as_str())
    }

    /// The host's address on the pod bridge: what pods dial to reach the host.
    pub fn host_address(&self) -> anyhow::Result<&str> {
        Ok(self.cp.node()?.host_address.as_str())
    }

    pub fn downstream(&self) -> &ClusterInfo {
        self.cp.cluster(NODE_DOWNSTREAM)
    }

    /// A container command running `script` with the image's shell.
    pub fn shell(&self, script: &[&str]) -> Vec<String> {
        let mut cmd = vec!["sh".to_owned(), "-c".to_owned()];
        cmd.extend(script.iter().map(|s| (*s).to_owned()));
        cmd
    }

    /// Pushes an image of its own (busybox plus a label `helmop.dev/test=<nonce>`, so its digest is
    /// new) as `reference` with buildah; returns the digest the registry now serves for it.
    pub async fn push_variant(&self, reference: &str, nonce: &str) -> anyhow::Result<String> {
        let store = tempfile::tempdir()?;
        let buildah = |args: &[&str]| {
            let mut cmd = Command::new("buildah");
            cmd.arg("--root")
                .arg(store.path().join("root"))
                .arg("--runroot")
                .arg(store.path().join("run"))
                .arg("--storage-driver=vfs")
                .args(args);
            cmd
        };
        let long = Duration::from_secs(120);
        let container = run(
            "buildah from",
            &mut buildah(&[
                "from",
                "--tls-verify=false",
                &format!("docker://{}", self.busybox),
            ]),
            long,
        )
        .await?;
        let container = container.trim();
        let label = format!("helmop.dev/test={nonce}");
        run(
            "buildah config",
            &mut buildah(&["config", "--label", &label, container]),
            long,
        )
        .await?;
        run(
            "buildah commit",
            &mut buildah(&["commit", "--quiet", container, "variant"]),
            long,
        )
        .await?;
        let digest_file = store.path().join("digest");
        let digest_arg = format!("--digestfile={}", digest_file.display());
        run(
            "buildah push",
            &mut buildah(&[
                "push",
                "--quiet",
                "--tls-verify=false",
                &digest_arg,
                "variant",
                &format!("docker://{reference}"),
            ]),
            long,
        )
        .await?;
        run("buildah rm", &mut buildah(&["rm", container]), long).await?;
        let pushed = std::fs::read_to_string(&digest_file)
            .with_context(|| format!("reading {}", digest_file.display()))?
            .trim()
            .to_owned();
        // What the registry serves for the tag, independently of buildah.
        let inspected = run(
            "skopeo inspect",
            Command::new("skopeo").args([
                "inspect",
                "--tls-verify=false",
                &format!("docker://{reference}"),
            ]),
            long,
        )
        .await?;
        let inspected: serde_json::Value =
            serde_json::from_str(&inspected).context("skopeo inspect output")?;
        let served = inspected["Digest"].as_str().unwrap_or_default();
        if served != pushed {
            bail!("the registry serves {served} for {reference}, buildah pushed {pushed}");
        }
        Ok(pushed)
    }

    /// `kubectl ARGS` on the node cluster with a deadline of its own (for `kubectl wait` and
    /// `kubectl rollout status`, which take `--timeout`).
    async fn kubectl_long(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = Command::from(self.cluster().kubectl());
        cmd.args(args);
        run(
            &format!("kubectl {}", args.join(" ")),
            &mut cmd,
            INSTALL + Duration::from_secs(30),
        )
        .await
    }

    /// Installs the webhook as the manifests README says: `kubectl apply -k` of an overlay over
    /// `manifests/self-signed` that names the locally built image and gives the webhook a registry
    /// config trusting the node's (plain-HTTP, private-address) registry, then waits for two ready
    /// webhook pods (their initContainers made the certificate and the hash key).
    async fn install_webhook(&self) -> anyhow::Result<()> {
        // Kubernetes 1.20 does not label namespaces with their name; the webhook configurations
        // skip kube-system by that label (manifests/README.md).
        self.kubectl_long(&[
            "label",
            "ns",
            "kube-system",
            "kubernetes.io/metadata.name=kube-system",
            "--overwrite",
        ])
        .await?;
        let overlay = self.dir.join("webhook");
        std::fs::create_dir_all(&overlay)?;
        std::fs::write(
            overlay.join("registries.yaml"),
            format!("insecure: [\"{}\"]\n", self.registry),
        )?;
        let (name, tag) = split_image(&self.webhook_image)?;
        let manifests = manifests_dir();
        let mut components = String::new();
        if manifests.join("kube-1.20").is_dir() {
            components = format!(
                "components:\n  - {}\n",
                relative_path(&overlay, &manifests.join("kube-1.20"))?.display()
            );
        }
        std::fs::write(
            overlay.join("kustomization.yaml"),
            format!(
                r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base}
{components}images:
  - name: ghcr.io/helmop/helmop-webhook
    newName: {name}
    newTag: {tag}
configMapGenerator:
  - name: helmop-registries
    namespace: helmop-system
    files: [registries.yaml]
patches:
  - target: {{kind: Deployment, name: helmop-webhook}}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --registry-config=/etc/helmop/registries.yaml
      - op: add
        path: /spec/template/spec/volumes/-
        value: {{name: registries, configMap: {{name: helmop-registries}}}}
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value: {{name: registries, mountPath: /etc/helmop, readOnly: true}}
"#,
                base = relative_path(&overlay, &manifests.join("self-signed"))?.display(),
            ),
        )?;
        let dir = overlay.display().to_string();
        self.kubectl_long(&["apply", "-k", &dir]).await?;
        let timeout = format!("--timeout={}s", INSTALL.as_secs());
        self.kubectl_long(&[
            "rollout",
            "status",
            "-n",
            "helmop-system",
            "deployment/helmop-webhook",
            &timeout,
        ])
        .await?;
        Ok(())
    }

    /// `kubectl apply -k` of an overlay of `manifests/propagator` using the locally built image.
    pub async fn install_propagator(&self) -> anyhow::Result<()> {
        self.install_plugin_manifests("propagator").await.map(drop)
    }

    /// `kubectl apply -k` of an overlay of `manifests/rollout-watcher` using the locally built image;
    /// returns the overlay, for [`NodeEnv::uninstall`].
    pub async fn install_rollout_watcher(&self) -> anyhow::Result<PathBuf> {
        self.install_plugin_manifests("rollout-watcher").await
    }

    /// `kubectl apply -k` of an overlay (in `DIR/node-flows/<shipped>`) of `manifests/<shipped>`, a
    /// directory that runs the `ghcr.io/helmop/kubectl-helmop` image, pointing `images:` at the locally
    /// built one. Returns the overlay directory.
    async fn install_plugin_manifests(&self, shipped: &str) -> anyhow::Result<PathBuf> {
        let overlay = self.dir.join(shipped);
        std::fs::create_dir_all(&overlay)?;
        let (name, tag) = split_image(&self.plugin_image)?;
        let base = relative_path(&overlay, &manifests_dir().join(shipped))?;
        std::fs::write(
            overlay.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n\
                 images:\n  - name: ghcr.io/helmop/kubectl-helmop\n    newName: {name}\n    newTag: {tag}\n",
                base.display()
            ),
        )?;
        let dir = overlay.display().to_string();
        let out = self
            .cluster()
            .run_kubectl(&["apply", "-k", &dir], None)
            .await?;
        if !out.status.success() {
            bail!(
                "kubectl apply -k {dir} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(overlay)
    }

    /// `kubectl delete -k OVERLAY`, waiting until its objects are gone (the webhook stays).
    pub async fn uninstall(&self, overlay: &Path) -> anyhow::Result<()> {
        let dir = overlay.display().to_string();
        let timeout = format!("--timeout={}s", INSTALL.as_secs());
        self.kubectl_long(&["delete", "-k", &dir, "--wait=true", &timeout])
            .await
            .map(drop)
    }
}

fn split_image(image: &str) -> anyhow::Result<(&str, &str)> {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => Ok((name, tag)),
        _ => bail!("image {image} has no tag"),
    }
}
