//! The local control plane: `tests/controlplane/cp up --foreground` run as a child process.
//!
//! The child keeps our end of a pipe as its stdin and tears every cluster down when it reads
//! EOF, which happens when we close it (drop, or the `atexit` hook of the shared instance) or
//! when this process dies in any way. That is what guarantees no stray kube-apiservers.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::Deserialize;

/// Name of the management cluster in the shared control plane.
pub const UPSTREAM: &str = "upstream";
/// Names of the two downstream clusters in the shared control plane.
pub const DOWNSTREAM_1: &str = "down1";
pub const DOWNSTREAM_2: &str = "down2";

/// How long teardown may take before we stop waiting for it (the script itself escalates to
/// SIGKILL well before this).
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(90);

/// One cluster of a control plane.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterInfo {
    /// Cluster name, also its context name in the merged kubeconfig.
    pub name: String,
    /// `https://127.x.y.z:port` of its kube-apiserver.
    pub server: String,
    /// A kubeconfig for this cluster only (admin token, CA embedded), current context set.
    pub kubeconfig: PathBuf,
    /// Context name (in both the per-cluster and the merged kubeconfig).
    pub context: String,
    /// PEM file of the CA that signed the API server's certificate.
    pub ca_file: PathBuf,
}

impl ClusterInfo {
    /// A new client for this cluster. Create one per test: each `#[tokio::test]` has its own
    /// runtime, and a client must not outlive the runtime it was made in.
    pub async fn client(&self) -> kube::Client {
        match self.try_client().await {
            Ok(client) => client,
            Err(e) => panic!("cannot build a client for cluster {}: {e:#}", self.name),
        }
    }

    async fn try_client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        client_for(kubeconfig, Some(&self.context)).await
    }

    /// `kubectl --kubeconfig <this cluster's kubeconfig>`, ready for more arguments.
    ///
    /// With a discovery cache of this cluster's own, beside its kubeconfig: kubectl's default one is keyed
    /// by address, and the test clusters of one run (and of the runs before) reuse addresses, so kubectl
    /// could resolve a resource from another cluster's API and get a 404 for a list that exists.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.kubeconfig.with_extension("kubectl-cache"));
        cmd
    }

    /// Runs `kubectl ARGS` against this cluster without blocking the async runtime (a webhook under
    /// test may serve on it), feeding `stdin` when given; fails after 60 s.
    pub async fn run_kubectl(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> anyhow::Result<std::process::Output> {
        use tokio::io::AsyncWriteExt;
        let mut cmd = tokio::process::Command::from(self.kubectl());
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("running kubectl")?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).await?;
        }
        tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .with_context(|| format!("kubectl {args:?} did not finish in 60s"))?
            .context("waiting for kubectl")
    }

    /// The kubeconfig file's content, e.g. for a Fleet Cluster's kubeconfig Secret.
    pub fn kubeconfig_yaml(&self) -> String {
        read_to_string(&self.kubeconfig)
    }

    /// The API server's CA certificate (PEM).
    pub fn ca_pem(&self) -> String {
        read_to_string(&self.ca_file)
    }
}

fn read_to_string(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) => panic!("cannot read {}: {e}", path.display()),
    }
}

/// A client from kubeconfig YAML (for instance the content of a kubeconfig Secret), using its
/// current context unless `context` is given.
pub async fn client_from_kubeconfig(
    yaml: &str,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    client_for(Kubeconfig::from_yaml(yaml)?, context).await
}

async fn client_for(kubeconfig: Kubeconfig, context: Option<&str>) -> anyhow::Result<kube::Client> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
    Ok(kube::Client::try_from(config)?)
}

/// What `cp up --node` reports about the node (the `node` object of its summary JSON).
#[derive(Debug, Clone, Deserialize)]
pub struct NodeInfo {
    /// The cluster the node belongs to (the first one started).
    pub cluster: String,
    /// The Node object's name.
    pub name: String,
    /// The host's address on the pod bridge: how pods reach services on the host (a registry),
    /// and the kubelet's InternalIP.
    pub host_address: String,
    /// The bridge the pods are attached to.
    pub bridge: String,
    /// Pod addresses come from this subnet (host-local IPAM).
    pub pod_subnet: String,
    /// containerd's socket (for `ctr --address`).
    pub containerd_socket: PathBuf,
    /// containerd's registry configuration directory (`HOST:PORT/hosts.toml`).
    pub registry_config_dir: PathBuf,
    /// Registries configured at start-up (`--registry`).
    pub registries: Vec<String>,
    /// The local pod sandbox image, present in containerd (never pulled).
    pub pause_image: String,
    /// `10.0.0.1:443`: the `kubernetes` Service as pods dial it.
    pub kubernetes_service: String,
    /// Where this node keeps its pods' logs (`/var/log/pods` in the node's own mount namespace,
    /// so that two nodes on one machine never garbage-collect each other's).
    pub pod_logs_dir: PathBuf,
    /// containerd's process id: `/proc/PID/mountinfo` lists the node's mounts, which live in a
    /// mount namespace that containerd, its shims and the kubelet share.
    pub containerd_pid: u32,
}

/// Running clusters plus the harness process that owns them.
#[derive(Debug)]
pub struct ControlPlane {
    /// Working directory of the harness (kubeconfigs, logs under `logs/`, etcd data).
    pub dir: PathBuf,
    /// The clusters, in the order they were named.
    pub clusters: Vec<ClusterInfo>,
    /// The node of the first cluster, when started with [`ControlPlaneOptions::node`].
    pub node: Option<NodeInfo>,
    merged_kubeconfig: PathBuf,
    harness: Mutex<Option<Harness>>,
}

/// What `cp up` starts besides the API servers.
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneOptions {
    /// Give the first cluster a real node (containerd, CNI bridge, kubelet, kube-scheduler).
    pub node: bool,
    /// Registries (`HOST:PORT`) the node's containerd pulls from over plain http.
    pub registries: Vec<String>,
}

impl ControlPlaneOptions {
    /// Options for a control plane whose first cluster has a node.
    pub fn with_node() -> ControlPlaneOptions {
        ControlPlaneOptions {
            node: true,
            registries: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct Harness {
    child: Child,
    stdin: Option<ChildStdin>,
    // Kept open so that nothing the harness prints can fail with EPIPE.
    _stdout: BufReader<ChildStdout>,
}

#[derive(Deserialize)]
struct Summary {
    ready: bool,
    dir: PathBuf,
    kubeconfig: PathBuf,
    clusters: Vec<ClusterInfo>,
    #[serde(default)]
    node: Option<NodeInfo>,
}

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
static ATEXIT: Once = Once::new();

/// The control plane shared by every test in this test binary: clusters `upstream`, `down1`
/// and `down2`, started on first use and torn down when the process exits.
///
/// Panics (every test that asks, with the same message) when it cannot start, e.g. when the
/// kube binaries were never built: run `tests/controlplane/cp build`.
pub fn control_plane() -> &'static ControlPlane {
    let started = SHARED.get_or_init(|| {
        let cp = ControlPlane::start(&[UPSTREAM, DOWNSTREAM_1, DOWNSTREAM_2])
            .map_err(|e| format!("{e:#}"))?;
        ATEXIT.call_once(|| {
            // SAFETY: registering a plain `extern "C" fn` with no arguments is always sound.
            #[allow(unsafe_code)]
            unsafe {
                libc::atexit(shutdown_shared);
            }
        });
        Ok(cp)
    });
    match started {
        Ok(cp) => cp,
        Err(msg) => panic!("the local control plane is not available: {msg}"),
    }
}

extern "C" fn shutdown_shared() {
    if let Some(Ok(cp)) = SHARED.get() {
        cp.shutdown();
    }
}

/// `tests/controlplane/cp`, the harness script.
pub fn cp_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane/cp")
}

impl ControlPlane {
    /// Starts a private control plane with the given cluster names (the first is the current
    /// context of the merged kubeconfig). It is torn down when dropped. Use this for tests
    /// that stop clusters or otherwise disturb them; everything else shares [`control_plane`].
    pub fn start(names: &[&str]) -> anyhow::Result<ControlPlane> {
        Self::start_with(names, &ControlPlaneOptions::default())
    }

    /// [`ControlPlane::start`] with options, e.g. a node for the first cluster.
    pub fn start_with(
        names: &[&str],
        options: &ControlPlaneOptions,
    ) -> anyhow::Result<ControlPlane> {
        let dir = tempfile::Builder::new()
            .prefix("helmop-cp-")
            .tempdir()
            .context("cannot create a directory for the control plane")?
            .keep();
        // Every API server presents the process's webhook client certificate (see `webhook_client_pki`).
        let pki = crate::certs::webhook_client_pki();
        let (client_cert, client_key) = (
            dir.join("webhook-client.crt"),
            dir.join("webhook-client.key"),
        );
        std::fs::write(&client_cert, &pki.cert_pem)
            .and_then(|()| std::fs::write(&client_key, &pki.key_pem))
            .with_context(|| {
                format!(
                    "cannot write the webhook client certificate to {}",
                    dir.display()
                )
            })?;
        let log_path = dir.join("harness.log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let mut cmd = Command::new(cp_script());
        cmd.arg("up")
            .arg("--foreground")
            .arg("--names")
            .arg(names.join(","))
            .arg("--dir")
            .arg(&dir)
            .arg("--webhook-client-cert")
            .arg(&client_cert)
            .arg("--webhook-client-key")
            .arg(&client_key);
        if options.node {
            cmd.arg("--node");
        }
        for registry in &options.registries {
            cmd.arg("--registry").arg(registry);
        }
        if std::env::var_os("HELMOP_KEEP_CLUSTER_DIR").is_none() {
            cmd.arg("--remove-dir");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot run {}", cp_script().display()))?;
        let stdin = child.stdin.take();
        let mut stdout = match child.stdout.take() {
            Some(out) => BufReader::new(out),
            None => bail!("the harness has no stdout pipe"),
        };
        let mut line = String::new();
        let read = stdout.read_line(&mut line);
        if !matches!(read, Ok(n) if n > 0) {
            drop(stdin);
            let _ = child.wait();
            bail!(
                "`{} up` exited before the clusters were ready. Last lines of {}:\n{}\n\
                 If the kube binaries are missing, run `tests/controlplane/cp build` first.",
                cp_script().display(),
                log_path.display(),
                tail(&log_path, 25)
            );
        }
        let summary: Summary = serde_json::from_str(line.trim())
            .with_context(|| format!("unexpected harness output: {line}"))?;
        if !summary.ready {
            bail!("the harness reported not ready: {line}");
        }
        Ok(ControlPlane {
            dir: summary.dir,
            clusters: summary.clusters,
            node: summary.node,
            merged_kubeconfig: summary.kubeconfig,
            harness: Mutex::new(Some(Harness {
                child,
                stdin,
                _stdout: stdout,
            })),
        })
    }

    /// The cluster called `name`; panics naming the clusters there are.
    pub fn cluster(&self, name: &str) -> &ClusterInfo {
        match self.clusters.iter().find(|c| c.name == name) {
            Some(c) => c,
            None => {
                let names: Vec<&str> = self.clusters.iter().map(|c| c.name.as_str()).collect();
                panic!("no cluster {name:?} in the control plane (have {names:?})")
            }
        }
    }

    /// The node, for a control plane started with one; an error otherwise.
    pub fn node(&self) -> anyhow::Result<&NodeInfo> {
        self.node
            .as_ref()
            .with_context(|| format!("the control plane in {} has no node", self.dir.display()))
    }

    /// The upstream (management) cluster.
    pub fn upstream(&self) -> &ClusterInfo {
        self.cluster(UPSTREAM)
    }

    /// A kubeconfig with one context per cluster (named like the cluster); the first cluster is
    /// the current context.
    pub fn merged_kubeconfig(&self) -> PathBuf {
        self.merged_kubeconfig.clone()
    }

    /// Stops the kube-apiserver of one cluster (its etcd keeps the data, its address stays
    /// reserved) until [`ControlPlane::start_cluster`]. Do not use on the shared control plane:
    /// other tests run against it concurrently.
    pub fn stop_cluster(&self, name: &str) -> anyhow::Result<()> {
        self.run_script("stop-cluster", &[name]).map(drop)
    }

    /// Starts a stopped kube-apiserver again with the same flags and waits until it is ready.
    pub fn start_cluster(&self, name: &str) -> anyhow::Result<()> {
        self.run_script("start-cluster", &[name]).map(drop)
    }

    /// Starts a stopped kube-apiserver again, presenting the client certificate in `cert` and
    /// `key` (PEM files) to every admission webhook from now on: what an operator does on a
    /// control-plane node to let a webhook require the API server's certificate.
    pub fn start_cluster_with_webhook_client(
        &self,
        name: &str,
        cert: &Path,
        key: &Path,
    ) -> anyhow::Result<()> {
        let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
        self.run_script(
            "start-cluster",
            &[
                name,
                "--webhook-client-cert",
                &cert,
                "--webhook-client-key",
                &key,
            ],
        )
        .map(drop)
    }

    /// Stops the kube-controller-manager of cluster `name` (SIGTERM to the pid in its pid file,
    /// `DIR/NAME/controller-manager.pid`) and waits until it is gone, so that thousands of
    /// Deployments bring no ReplicaSets (and no CPU spent making them). Only a process that still
    /// runs that executable is signalled. Never on the shared control plane: other tests need it.
    pub fn stop_controller_manager(&self, name: &str) -> anyhow::Result<()> {
        const KCM: &str = "kube-controller-manager";
        let runs = |pid: u32| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .is_some_and(|e| e.file_name().is_some_and(|f| f == KCM))
        };
        let pid_file = self.dir.join(name).join("controller-manager.pid");
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("reading {}", pid_file.display()))?
            .trim()
            .parse()
            .with_context(|| format!("{} holds no pid", pid_file.display()))?;
        if !runs(pid) {
            bail!("pid {pid} of {} is not a {KCM}", pid_file.display());
        }
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -TERM {pid} failed");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while runs(pid) {
            if Instant::now() > deadline {
                bail!("the {KCM} of {name} (pid {pid}) did not stop within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Starts cluster `name` from an etcd snapshot of cluster `src` (`cp clone-cluster`): the
    /// same objects with the same uids, `kube-system`'s included, served by its own etcd and
    /// kube-apiserver at its own address: what two clusters restored from one backup look like.
    /// Safe on the shared control plane (the source is only read); torn down with it.
    pub fn clone_cluster(&self, src: &str, name: &str) -> anyhow::Result<ClusterInfo> {
        let line = self.run_script("clone-cluster", &[src, name])?;
        serde_json::from_str(line.trim())
            .with_context(|| format!("cp clone-cluster printed {line:?}, not a cluster entry"))
    }

    /// Runs `cp SUBCOMMAND --dir DIR ARGS...`; its stdout.
    fn run_script(&self, subcommand: &str, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(cp_script())
            .arg(subcommand)
            .arg("--dir")
            .arg(&self.dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", cp_script().display()))?;
        if !out.status.success() {
            bail!(
                "cp {subcommand} {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Tears the clusters down and waits for the harness to finish (idempotent).
    pub fn shutdown(&self) {
        let harness = match self.harness.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        let Some(mut harness) = harness else { return };
        // EOF on its stdin is the harness's signal to tear down.
        drop(harness.stdin.take());
        let deadline = Instant::now() + TEARDOWN_TIMEOUT;
        while Instant::now() < deadline {
            match harness.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        eprintln!(
            "helmop-tests: the control plane in {} did not stop within {TEARDOWN_TIMEOUT:?}",
            self.dir.display()
        );
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
