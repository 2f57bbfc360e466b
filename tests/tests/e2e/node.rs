//! The real node of `cp up --node`: pods scheduled by kube-scheduler, run by kubelet and
//! containerd from an image built here and pulled from a local registry, reaching their API
//! server through the `kubernetes` Service; and a teardown that leaves nothing on the host.

use std::path::Path;
use std::time::Duration;

use helmop_tests::registry::TestRegistry;
use helmop_tests::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

/// Pulling, starting and a kubelet status round trip on a loaded 2-core machine.
const POD_TIMEOUT: Duration = Duration::from_secs(120);

async fn kubectl_ok(
    cluster: &ClusterInfo,
    args: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<String> {
    let out = cluster.run_kubectl(args, stdin).await?;
    if !out.status.success() {
        anyhow::bail!(
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until the pod `name` has phase Succeeded and returns its logs.
async fn logs_of_finished_pod(
    cluster: &ClusterInfo,
    ns: &str,
    name: &str,
) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(cluster.client().await, ns);
    let phase = wait_for(&format!("pod {ns}/{name} to finish"), POD_TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get(name).await?;
            let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
            Ok(matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase))
        }
    })
    .await?;
    let logs = kubectl_ok(cluster, &["logs", "-n", ns, name], None).await?;
    assert_eq!(phase, "Succeeded", "pod {ns}/{name} failed; logs:\n{logs}");
    Ok(logs)
}

#[tokio::test]
async fn node_is_ready_without_taints() -> anyhow::Result<()> {
    let cp = node_control_plane();
    let node = cp.node()?;
    assert_eq!(node.cluster, NODE_CLUSTER);
    let nodes: Api<Node> = Api::all(cp.cluster(NODE_CLUSTER).client().await);
    let listed = nodes.list(&ListParams::default()).await?;
    let names: Vec<String> = listed
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert_eq!(
        names,
        std::slice::from_ref(&node.name),
        "exactly the one node"
    );
    let n = nodes.get(&node.name).await?;
    let status = n.status.unwrap_or_default();
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status);
    assert_eq!(ready.as_deref(), Some("True"));
    let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints.is_empty(),
        "the node lifecycle controller removed the not-ready taint: {taints:?}"
    );
    let internal: Vec<String> = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .collect();
    assert_eq!(internal, std::slice::from_ref(&node.host_address));
    // The clusters without a node have no node.
    let down: Api<Node> = Api::all(cp.cluster("nodedown").client().await);
    assert!(down.list(&ListParams::default()).await?.items.is_empty());
    Ok(())
}

#[tokio::test]
async fn deployment_from_a_locally_built_image_runs_and_logs() -> anyhow::Result<()> {
    let cp = node_control_plane();
    let node = cp.node()?;
    let cluster = cp.cluster(NODE_CLUSTER);
    let registry = TestRegistry::start_on(&node.host_address).await?;
    node.allow_http_registry(registry.host())?;
    let marker = hex::encode(&random_key()?[..8]);
    let image = build_busybox_image(&registry, "node-tests/busybox", "v1", &marker).await?;

    let client = cluster.client().await;
    let ns = fresh_namespace(&client, "node-deploy").await?;
    let manifest = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "hello", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "hello"}},
            "template": {
                "metadata": {"labels": {"app": "hello"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "hello",
                        "image": image.reference,
                        "command": ["/bin/sh", "-c", "echo \"hello from $(cat /etc/marker) on $(hostname)\"; exec sleep 3600"],
                        "readinessProbe": {"exec": {"command": ["/bin/cat", "/etc/marker"]}, "periodSeconds": 1}
                    }]
                }
            }
        }
    });
    kubectl_ok(cluster, &["apply", "-f", "-"], Some(&manifest.to_string())).await?;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait_until(
        "deployment hello to have a ready replica",
        POD_TIMEOUT,
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get("hello").await?;
                Ok(d.status.and_then(|s| s.ready_replicas).unwrap_or(0) == 1)
            }
        },
    )
    .await?;

    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let listed = pods
        .list(&ListParams::default().labels("app=hello"))
        .await?;
    let [pod] = listed.items.as_slice() else {
        anyhow::bail!("expected one pod, found {}", listed.items.len());
    };
    let spec = pod.spec.clone().unwrap_or_default();
    assert_eq!(
        spec.node_name.as_deref(),
        Some(node.name.as_str()),
        "scheduled on the node"
    );
    let status = pod.status.clone().unwrap_or_default();
    let image_id = status
        .container_statuses
        .unwrap_or_default()
        .first()
        .map(|c| c.image_id.clone())
        .unwrap_or_default();
    assert!(
        image_id.ends_with(&image.digest),
        "the running container's imageID {image_id} is the pushed digest {}",
        image.digest
    );
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let expected = format!("hello from {marker} on {pod_name}");
    wait_until("kubectl logs to show the greeting", POD_TIMEOUT, || {
        let expected = expected.clone();
        let ns = ns.clone();
        async move {
            let logs = kubectl_ok(cluster, &["logs", "-n", &ns, "deployment/hello"], None).await?;
            Ok(logs.contains(&expected))
        }
    })
    .await?;
    kubectl_ok(cluster, &["delete", "namespace", &ns, "--wait=false"], None).await?;
    Ok(())
}

#[tokio::test]
async fn pods_reach_their_api_server_and_the_downstream_ones() -> anyhow::Result<()> {
    let cp = node_control_plane();
    let node = cp.node()?;
    let cluster = cp.cluster(NODE_CLUSTER);
    let downstream = cp.cluster("nodedown");
    let registry = TestRegistry::start_on(&node.host_address).await?;
    node.allow_http_registry(registry.host())?;
    let image = build_busybox_image(
        &registry,
        "node-tests/wget",
        "v1",
        &hex::encode(&random_key()?[..8]),
    )
    .await?;

    let client = cluster.client().await;
    let ns = fresh_namespace(&client, "node-api").await?;
    // In-cluster configuration exactly as client libraries read it: the Service env vars and the
    // mounted token. Anonymous requests are refused (--anonymous-auth=false), so a /version body
    // proves the token was accepted. The downstream server is only reached, not authenticated
    // to: its 401 proves TLS to it from the pod works.
    let script = format!(
        "set -e; \
         echo \"service=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT\"; \
         token=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token); \
         wget -q -O- --header \"Authorization: Bearer $token\" \
           https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version; echo; \
         wget -q -O- {downstream}/version 2>&1 || true",
        downstream = downstream.server
    );
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "in-cluster", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "probe", "image": image.reference, "command": ["/bin/sh", "-c", script]}]
        }
    });
    kubectl_ok(cluster, &["apply", "-f", "-"], Some(&manifest.to_string())).await?;
    let logs = logs_of_finished_pod(cluster, &ns, "in-cluster").await?;
    assert!(logs.contains("service=10.0.0.1:443"), "logs:\n{logs}");
    assert!(
        logs.contains("\"gitVersion\": \"v1.20.2\""),
        "logs:\n{logs}"
    );
    assert!(
        logs.contains("401 Unauthorized"),
        "the downstream API server answered; logs:\n{logs}"
    );
    kubectl_ok(cluster, &["delete", "namespace", &ns, "--wait=false"], None).await?;
    Ok(())
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(raw) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(format!("{name}: {cmd}"));
            }
        }
    }
    found
}

/// Mount points under `dir` as the process `pid` sees them (`"self"` for this process).
fn mounts_under(pid: &str, dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn teardown_leaves_no_process_netns_bridge_or_mount() -> anyhow::Result<()> {
    let cp = ControlPlane::start_with(&["solo"], &ControlPlaneOptions::with_node())?;
    let node = cp.node()?.clone();
    let cluster = cp.cluster("solo").clone();
    let dir = cp.dir.clone();
    let client = cluster.client().await;
    let ns = fresh_namespace(&client, "node-teardown").await?;
    // The pause image is already in containerd: a running pod without any registry.
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sleeper", "namespace": ns},
        "spec": {"containers": [{"name": "pause", "image": node.pause_image, "imagePullPolicy": "Never"}]}
    });
    kubectl_ok(&cluster, &["apply", "-f", "-"], Some(&manifest.to_string())).await?;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    wait_until("pod sleeper to run", POD_TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("sleeper").await?;
            Ok(pod.status.and_then(|s| s.phase).as_deref() == Some("Running"))
        }
    })
    .await?;
    let uid = pods.get("sleeper").await?.metadata.uid.unwrap_or_default();
    let log_name = format!("{ns}_sleeper_{uid}");
    let log_dir = node.pod_logs_dir.join(&log_name);
    // The phase can say Running a moment before the directory is visible here; it must appear.
    let wanted = format!(
        "the kubelet to keep the pod's logs in {}",
        log_dir.display()
    );
    wait_until(&wanted, POD_TIMEOUT, || {
        let log_dir = log_dir.clone();
        async move { Ok(log_dir.exists()) }
    })
    .await?;

    // What the running pod put on the host.
    let containers = node.ctr(&["containers", "ls", "-q"]).await?;
    let mut netns = Vec::new();
    for id in containers.lines().filter(|l| !l.is_empty()) {
        let info: serde_json::Value =
            serde_json::from_str(&node.ctr(&["containers", "info", id]).await?)?;
        if let Some(namespaces) = info["Spec"]["linux"]["namespaces"].as_array() {
            for n in namespaces {
                if n["type"] == "network"
                    && let Some(path) = n["path"].as_str()
                    && !path.is_empty()
                {
                    netns.push(path.to_owned());
                }
            }
        }
    }
    assert!(!netns.is_empty(), "the pod sandbox has a network namespace");
    // The node's mounts and pod logs are its own: another kubelet on this machine (one
    // garbage-collects every /var/log/pods entry it does not run, once a minute) cannot see them.
    let node_pid = node.containerd_pid.to_string();
    assert!(
        !mounts_under(&node_pid, &dir).is_empty(),
        "the running pod has mounts under {} in the node's mount namespace",
        dir.display()
    );
    let host_mounts = mounts_under("self", &dir);
    assert!(
        host_mounts.is_empty(),
        "the node's mounts reached the host: {host_mounts:#?}"
    );
    let host_log_dir = Path::new("/var/log/pods").join(&log_name);
    assert!(
        !host_log_dir.exists(),
        "the pod's logs are in the host's {} instead of the node's own directory",
        host_log_dir.display()
    );
    let bridge = Path::new("/sys/class/net").join(&node.bridge);
    assert!(bridge.exists());
    let socket = node.containerd_socket.to_string_lossy().into_owned();
    assert!(
        !processes_mentioning(&socket).is_empty(),
        "shims run with -address {socket}"
    );
    let dir_text = dir.to_string_lossy().into_owned();

    drop(cp);

    let left = processes_mentioning(&dir_text);
    assert!(left.is_empty(), "processes left behind: {left:#?}");
    for path in &netns {
        assert!(
            !Path::new(path).exists(),
            "network namespace {path} left behind"
        );
    }
    assert!(!bridge.exists(), "bridge {} left behind", node.bridge);
    // The pod logs lived under the control plane's directory, removed with it.
    if std::env::var_os("HELMOP_KEEP_CLUSTER_DIR").is_none() {
        assert!(
            !log_dir.exists(),
            "pod log directory {} left behind",
            log_dir.display()
        );
    }
    let mounts = mounts_under("self", &dir);
    assert!(mounts.is_empty(), "mounts left behind: {mounts:#?}");
    let rules = std::process::Command::new("iptables-save").output()?;
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert!(
        !rules.contains(&node.bridge),
        "iptables rules for {} left behind",
        node.bridge
    );
    Ok(())
}
