//! The node of a control plane started with `cp up --node` (containerd, a CNI bridge, kubelet
//! and kube-scheduler for the first cluster), and test images for it built offline with buildah.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Once, OnceLock};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::Command;

use crate::controlplane::{ControlPlane, ControlPlaneOptions, NodeInfo};
use crate::registry::TestRegistry;

/// Name of the cluster that has the node in [`node_control_plane`].
pub const NODE_CLUSTER: &str = "nodeup";

impl NodeInfo {
    /// Lets containerd pull from `host` (`ADDR:PORT`) over plain http. containerd reads the
    /// file at every pull, so this works on a running node.
    pub fn allow_http_registry(&self, host: &str) -> anyhow::Result<()> {
        let dir = self.registry_config_dir.join(host);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let toml = format!(
            "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
        let file = dir.join("hosts.toml");
        std::fs::write(&file, toml).with_context(|| format!("cannot write {}", file.display()))
    }

    /// `ctr --address <socket> -n k8s.io ARGS`: the node's containerd as the kubelet sees it.
    pub async fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = run(
            Command::new("ctr")
                .arg("--address")
                .arg(&self.containerd_socket)
                .args(["-n", "k8s.io"])
                .args(args),
            Duration::from_secs(30),
        )
        .await?;
        Ok(out)
    }
}

static SHARED_NODE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
static NODE_ATEXIT: Once = Once::new();

/// A control plane shared by the node tests of this test binary: cluster [`NODE_CLUSTER`] with a
/// node, plus `nodedown` (a downstream cluster its pods can reach). Started on first use, torn
/// down when the process exits. Separate from [`crate::control_plane`], which has no node.
pub fn node_control_plane() -> &'static ControlPlane {
    let started = SHARED_NODE.get_or_init(|| {
        let cp = ControlPlane::start_with(
            &[NODE_CLUSTER, "nodedown"],
            &ControlPlaneOptions::with_node(),
        )
        .map_err(|e| format!("{e:#}"))?;
        NODE_ATEXIT.call_once(|| {
            // SAFETY: registering a plain `extern "C" fn` with no arguments is always sound.
            #[allow(unsafe_code)]
            unsafe {
                libc::atexit(shutdown_shared_node);
            }
        });
        Ok(cp)
    });
    match started {
        Ok(cp) => cp,
        Err(msg) => panic!("the local control plane with a node is not available: {msg}"),
    }
}

extern "C" fn shutdown_shared_node() {
    if let Some(Ok(cp)) = SHARED_NODE.get() {
        cp.shutdown();
    }
}

/// An image pushed to a registry: `reference` is `HOST/REPO:TAG`, `digest` its manifest digest.
#[derive(Debug, Clone)]
pub struct BusyboxImage {
    pub reference: String,
    pub digest: String,
}

/// Busybox applets linked in the image (`/bin/NAME` -> `/bin/busybox`); `ssl_client` is what
/// busybox's `wget` runs for https.
const APPLETS: [&str; 9] = [
    "sh",
    "wget",
    "ssl_client",
    "cat",
    "echo",
    "sleep",
    "env",
    "ls",
    "hostname",
];

/// Builds `FROM scratch` + Debian's static busybox (`/bin/busybox` and a few applet links,
/// command `/bin/sh`) with buildah in a private vfs store, and pushes it as `REPO:TAG` to
/// `registry`. `marker` goes into `/etc/marker` so that different markers give different digests.
pub async fn build_busybox_image(
    registry: &TestRegistry,
    repo: &str,
    tag: &str,
    marker: &str,
) -> anyhow::Result<BusyboxImage> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("/bin/busybox is missing: install the Debian package busybox-static");
    }
    let work = tempfile::Builder::new()
        .prefix("helmop-image-")
        .tempdir()
        .context("cannot create a directory for the image build")?;
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin"))?;
    std::fs::create_dir_all(rootfs.join("etc"))?;
    std::fs::copy(busybox, rootfs.join("bin/busybox")).context("copying /bin/busybox")?;
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))
            .with_context(|| format!("linking /bin/{applet}"))?;
    }
    std::fs::write(rootfs.join("etc/marker"), format!("{marker}\n"))?;
    let layer = work.path().join("layer.tar");
    run(
        Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .args(["--owner=0", "--group=0", "-cf"])
            .arg(&layer)
            .arg("."),
        Duration::from_secs(30),
    )
    .await?;

    let store = work.path();
    let buildah = |args: &[&str]| {
        let mut cmd = Command::new("buildah");
        cmd.args(["--storage-driver", "vfs", "--root"])
            .arg(store.join("storage"))
            .arg("--runroot")
            .arg(store.join("run"))
            .args(args);
        cmd
    };
    let timeout = Duration::from_secs(120);
    let container = run(&mut buildah(&["from", "scratch"]), timeout).await?;
    let container = container.trim().to_owned();
    let layer_arg = layer.to_string_lossy().into_owned();
    run(&mut buildah(&["add", &container, &layer_arg, "/"]), timeout).await?;
    run(
        &mut buildah(&[
            "config",
            "--cmd",
            "/bin/sh",
            "--env",
            "PATH=/bin",
            &container,
        ]),
        timeout,
    )
    .await?;
    let name = format!("localhost/{repo}:{tag}");
    run(
        &mut buildah(&["commit", "--rm", &container, &name]),
        timeout,
    )
    .await?;
    let reference = format!("{}:{tag}", registry.repository(repo));
    let digest_file = work.path().join("digest");
    let digest_arg = digest_file.to_string_lossy().into_owned();
    run(
        &mut buildah(&[
            "push",
            "--tls-verify=false",
            "--digestfile",
            &digest_arg,
            &name,
            &format!("docker://{reference}"),
        ]),
        timeout,
    )
    .await?;
    let digest = std::fs::read_to_string(&digest_file)
        .with_context(|| format!("buildah wrote no {}", digest_file.display()))?
        .trim()
        .to_owned();
    if !digest.starts_with("sha256:") {
        bail!("unexpected digest from buildah push: {digest:?}");
    }
    Ok(BusyboxImage { reference, digest })
}

/// Runs `cmd` to completion with a deadline; its stdout on success, its stderr in the error.
async fn run(cmd: &mut Command, timeout: Duration) -> anyhow::Result<String> {
    let shown = format!("{:?}", cmd.as_std());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .with_context(|| format!("{shown} did not finish in {timeout:?}"))?
        .with_context(|| format!("cannot run {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
