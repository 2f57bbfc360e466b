#!/usr/bin/env bash
# The README demo (`./dev demo`): a local control plane whose upstream cluster has a real node
# (kubelet, containerd), helmop installed on it from its manifests (`kubectl apply -k` of an overlay
# naming the images `./dev image` pushed), two downstream clusters (API servers only, their stamping
# webhook a host process registered by url), Fleet Clusters and a ClusterGroup, a rejected and an
# accepted HelmOp, `kubectl helmop propagate` and `status`, and a Deployment on the node that rolls
# (new pods, new value in their logs) when the source ConfigMap changes upstream, and again when its
# own ConfigMap is edited with plain kubectl (the rollout watcher, installed from its manifests).
#
#   tests/demo.sh DIR         run the demo with its state in DIR (a previous run there is stopped first)
#   tests/demo.sh --down DIR  stop the demo's webhooks and clusters, node included (`./dev down`)
#
# Needs what `./dev setup` installs and builds (kubectl, openssl, jq, curl, ss, buildah, skopeo,
# busybox-static, the control-plane and node binaries of `tests/controlplane/cp build`) and what
# `./dev image` makes: the release binaries and both images in the registry HELMOP_REGISTRY
# (default 127.0.0.1:5000). Root (the node).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CP="$REPO/tests/controlplane/cp"
# The release binaries `./dev image` built (the same ones the images ship).
BIN="${CARGO_TARGET_DIR:-$REPO/target}/release"
REGISTRY="${HELMOP_REGISTRY:-127.0.0.1:5000}"
CLUSTERS=(upstream down1 down2)
# Upstream: Fleet's default workspace holds the Clusters, the HelmOp and its sources (Fleet
# targets only Clusters in the HelmOp's own namespace). Downstream: where the copies go.
FLEET_NS=fleet-default
APP_NS=demo
WAIT=120 # seconds any single wait may take (pulls and pod starts on a busy machine)

if [[ -t 1 && -z ${NO_COLOR:-} ]]; then
  BOLD=$'\033[1m' CYAN=$'\033[1;36m' DIM=$'\033[2m' RESET=$'\033[0m'
else
  BOLD='' CYAN='' DIM='' RESET=''
fi

T0=$SECONDS
section() { printf '\n%s=== %s ===%s %s[%ss]%s\n' "$CYAN" "$*" "$RESET" "$DIM" "$((SECONDS - T0))" "$RESET"; }
note() { printf '%s%s%s\n' "$DIM" "$*" "$RESET"; }
die() {
  printf 'demo: error: %s\n' "$*" >&2
  exit 1
}
# "$@" as a user would type it: arguments with shell-special characters single-quoted.
quoted() {
  local a out=''
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then out+=" $a"; else out+=" '${a//\'/\'\\\'\'}'"; fi
  done
  printf '%s' "${out# }"
}
# Prints a command the way a user would type it, then runs it.
run() {
  printf '%s$ %s%s\n' "$BOLD" "$(quoted "$@")" "$RESET"
  "$@"
}
# Like `run`, for a command that must fail with exit code $1.
run_expect_fail() {
  local want=$1 rc=0
  shift
  printf '%s$ %s%s\n' "$BOLD" "$(quoted "$@")" "$RESET"
  "$@" || rc=$?
  [[ $rc -eq $want ]] || die "expected exit code $want from: $* (got $rc)"
  note "(exit code $rc, as expected)"
}

usage() {
  sed -n '9,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# --- the webhook processes -------------------------------------------------------------------

# Start time of a process (field 22 of /proc/PID/stat), to recognise it again: a pid alone may
# have been recycled by the time we stop it.
proc_start() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  # shellcheck disable=SC2086 # split on purpose: the fields after the command name
  set -- $stat
  printf '%s\n' "${20}"
}

# True while process $1 runs (a zombie has finished: only its parent has not looked yet).
alive() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}

# Stops the webhooks a demo in $1 started (pid files), each only if it is still the process we
# started: its process group gets SIGTERM, then SIGKILL after 10 s.
stop_webhooks() {
  local dir=$1 f pid started deadline
  for f in "$dir"/webhooks/*.pid; do
    [[ -e $f ]] || continue
    read -r pid started <"$f" || true
    if [[ $pid =~ ^[0-9]+$ && -n $started && "$(proc_start "$pid" 2>/dev/null)" == "$started" ]]; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 10))
      while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
      kill -KILL -- "-$pid" 2>/dev/null || true
      echo "stopped webhook $(basename "$f" .pid) (pid $pid)" >&2
    fi
    rm -f "$f"
  done
}

down() {
  local dir=$1
  [[ -d $dir ]] || return 0
  stop_webhooks "$dir"
  "$CP" down --dir "$dir"
}

if [[ ${1:-} == --down ]]; then
  [[ $# -eq 2 ]] || usage
  down "$2"
  exit 0
fi
[[ $# -eq 1 && $1 != -* ]] || usage
mkdir -p "$1"
DIR="$(cd "$1" && pwd)"

# A free TCP port on 127.0.0.1 in $PORT (not one handed out before in this run).
USED_PORTS=" "
free_port() {
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$((20000 + RANDOM % 20000))
    [[ $USED_PORTS == *" $p "* ]] && continue
    if [[ -z $(ss -Htln "sport = :$p") ]]; then
      USED_PORTS+="$p "
      PORT=$p
      return 0
    fi
  done
  die "no free port found on 127.0.0.1"
}

# Polls "$@" once a second until it succeeds or $WAIT seconds pass.
wait_for() {
  local what=$1 deadline=$((SECONDS + WAIT))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${WAIT}s waiting for $what"
    sleep 0.5
  done
}

# A serving certificate for 127.0.0.1 signed by a throwaway CA: DIR/webhooks/{ca,tls}.{crt,key}.
make_certs() {
  local d=$DIR/webhooks
  (
    umask 077
    openssl ecparam -name prime256v1 -genkey -noout -out "$d/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$d/ca.key" -subj /CN=helmop-demo-ca -days 30 -out "$d/ca.crt" 2>/dev/null
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout "$d/tls.key" -subj /CN=127.0.0.1 -out "$d/tls.csr" 2>/dev/null
    printf '%s\n' 'subjectAltName=IP:127.0.0.1,DNS:localhost' 'basicConstraints=CA:FALSE' \
      'keyUsage=critical,digitalSignature' 'extendedKeyUsage=serverAuth' >"$d/tls.ext"
    openssl x509 -req -in "$d/tls.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
      -days 30 -extfile "$d/tls.ext" -out "$d/tls.crt" 2>/dev/null
  )
}

# Starts helmop-webhook for cluster $1 (its own kubeconfig) on two free ports, waits until it is
# ready (caches synced), and registers it on that cluster by url with the CA as caBundle.
start_webhook() {
  local name=$1 d=$DIR/webhooks port admin pid started deadline
  free_port
  port=$PORT
  free_port
  admin=$PORT
  # setsid: its own process group, so stopping it never touches anything else; the shell
  # writes its pid before exec'ing the webhook, so the pid file names the webhook itself.
  # shellcheck disable=SC2016 # expanded by the inner shell
  KUBECONFIG="$DIR/$name.kubeconfig" setsid bash -c 'echo "$$" >"$0"; exec "$@"' "$d/$name.pid.tmp" \
    "$BIN/helmop-webhook" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    --tls-cert "$d/tls.crt" --tls-key "$d/tls.key" --log-format text \
    </dev/null >"$d/$name.log" 2>&1 &
  deadline=$((SECONDS + 10))
  until [[ -s $d/$name.pid.tmp ]]; do
    ((SECONDS < deadline)) || die "helmop-webhook for $name did not start (log: $d/$name.log)"
    sleep 0.05
  done
  pid=$(<"$d/$name.pid.tmp")
  started=$(proc_start "$pid") || die "helmop-webhook for $name exited at once: $(tail -5 "$d/$name.log")"
  echo "$pid $started" >"$d/$name.pid"
  rm -f "$d/$name.pid.tmp"
  deadline=$((SECONDS + WAIT))
  until curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$admin/readyz"; do
    alive "$pid" || die "helmop-webhook for $name exited; last lines of $d/$name.log:
$(tail -15 "$d/$name.log")"
    ((SECONDS < deadline)) || die "helmop-webhook for $name not ready after ${WAIT}s (log: $d/$name.log)"
    sleep 0.2
  done
  # The shipped configurations (manifests/base/webhooks.yaml) with the Service swapped for this
  # process's url and the demo CA.
  kubectl --context "$name" create --dry-run=client -o json -f "$REPO/manifests/base/webhooks.yaml" |
    jq -s --arg base "https://127.0.0.1:$port" --arg ca "$(base64 -w0 <"$d/ca.crt")" \
      '{apiVersion: "v1", kind: "List", items: [.[] | if .kind == "List" then .items[] else . end
        | .webhooks[] |= (.clientConfig = {url: ($base + .clientConfig.service.path), caBundle: $ca})]}' |
    kubectl --context "$name" apply -f - >/dev/null
  printf '  %-8s helmop-webhook pid %-7s https://127.0.0.1:%s  (admin http://127.0.0.1:%s, log %s)\n' \
    "$name" "$pid" "$port" "$admin" "${d#"$DIR"/}/$name.log"
}

# --- the demo --------------------------------------------------------------------------------

on_exit() {
  local rc=$?
  ((rc == 0)) || printf '\ndemo: failed (exit %s); what runs is left for a look (logs in %s): stop it with ./dev down\n' \
    "$rc" "$DIR" >&2
}
trap on_exit EXIT

((EUID == 0)) || die "the demo starts a real node (bridge, iptables, containerd): run it as root"
for b in kubectl-helmop helmop-webhook helmop-bootstrap; do
  [[ -x $BIN/$b ]] || die "$BIN/$b is missing: run ./dev image (or ./dev demo, which does) first"
done
curl -fsS -o /dev/null "http://$REGISTRY/v2/" || die "no registry answers at $REGISTRY: run ./dev image first"
# kubectl runs plugins it finds on PATH as `kubectl-<name>`.
export PATH="$BIN:$PATH"
VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml")"
APP_IMAGE="$REGISTRY/helmop-demo-app:1"
started=$SECONDS

section "An application image for the node: busybox (FROM scratch), pushed to $REGISTRY"
down "$DIR"
rm -rf "$DIR/app-image"
mkdir -p "$DIR/app-image/rootfs/bin"
cp /bin/busybox "$DIR/app-image/rootfs/bin/busybox"
for applet in sh echo sleep; do ln -s busybox "$DIR/app-image/rootfs/bin/$applet"; done
bah=(buildah --storage-driver vfs --root "$DIR/app-image/storage" --runroot "$DIR/app-image/run")
ctr=$("${bah[@]}" from scratch)
# One layer from a tar owned by root (buildah unpacks a local tar it adds).
tar -C "$DIR/app-image/rootfs" --owner=0 --group=0 -cf "$DIR/app-image/layer.tar" .
"${bah[@]}" add "$ctr" "$DIR/app-image/layer.tar" / >/dev/null
"${bah[@]}" config --cmd /bin/sh --env PATH=/bin "$ctr"
"${bah[@]}" commit --quiet --rm "$ctr" localhost/helmop-demo-app:1 >/dev/null
"${bah[@]}" push --quiet --tls-verify=false localhost/helmop-demo-app:1 "docker://$APP_IMAGE"
rm -rf "$DIR/app-image"
note "$APP_IMAGE: Debian's static busybox, nothing else"
run skopeo list-tags --tls-verify=false "docker://$REGISTRY/helmop-webhook"

section "Starting the local control plane in $DIR (upstream with a real node; down1, down2: API servers only)"
"$CP" up --dir "$DIR" --clusters 3 --names "$(
  IFS=,
  echo "${CLUSTERS[*]}"
)" --node --registry "$REGISTRY" >/dev/null
export KUBECONFIG="$DIR/kubeconfig"
run kubectl config get-contexts
run kubectl get nodes -o wide

section "Installing helmop on upstream from its manifests (kubectl apply -k, README \"Install on a real cluster\")"
# Kubernetes >= 1.21 sets this label itself; the shipped namespaceSelector excludes kube-system by
# it, so on this 1.20 control plane it is set by hand (manifests/README.md).
run kubectl label --overwrite namespace kube-system kubernetes.io/metadata.name=kube-system
mkdir -p "$DIR/install" "$DIR/webhooks" "$DIR/manifests"
# kustomize wants relative paths to other kustomizations.
cat >"$DIR/install/kustomization.yaml" <<EOF
# The shipped self-signed install with the rollout watcher, the 1.20 component, and the images
# ./dev image pushed.
resources:
  - $(realpath --relative-to="$DIR/install" "$REPO/manifests/self-signed")
  - $(realpath --relative-to="$DIR/install" "$REPO/manifests/rollout-watcher")
components:
  - $(realpath --relative-to="$DIR/install" "$REPO/manifests/kube-1.20")
images:
  - {name: ghcr.io/helmop/helmop-webhook, newName: $REGISTRY/helmop-webhook, newTag: $VERSION}
  - {name: ghcr.io/helmop/kubectl-helmop, newName: $REGISTRY/kubectl-helmop, newTag: $VERSION}
EOF
run cat "$DIR/install/kustomization.yaml"
run kubectl apply -k "$DIR/install"
run kubectl -n helmop-system rollout status deployment/helmop-webhook --timeout="${WAIT}s"
run kubectl -n helmop-system rollout status deployment/helmop-rollout-watcher --timeout="${WAIT}s"
run kubectl -n helmop-system get pods -o wide

section "Downstream clusters: the stamping webhook as a host process each (no node to run its pods)"
note "(down1 and down2 have no node: helmop-webhook runs here on the host, registered on each cluster by url"
note " with the shipped webhook configurations; on a real cluster: kubectl apply -k manifests/stamping-only)"
make_certs
for name in down1 down2; do
  kubectl --context "$name" create namespace helmop-system >/dev/null
  for ns in kube-system helmop-system; do
    kubectl --context "$name" label --overwrite namespace "$ns" "kubernetes.io/metadata.name=$ns" >/dev/null
  done
  # The keyed-hash key: 32 random bytes in helmop-system/helmop-hash-key (never overwritten).
  out=$(KUBECONFIG="$DIR/$name.kubeconfig" "$BIN/helmop-bootstrap" hash-key --log-format text 2>&1) ||
    die "helmop-bootstrap hash-key failed on $name: $out"
  start_webhook "$name"
done

section "Upstream: sources, Fleet Clusters and a ClusterGroup in namespace $FLEET_NS"
kubectl create namespace "$FLEET_NS" >/dev/null
# A Fleet workspace: the shipped delete guard only sees namespaces labelled like this (manifests/README.md).
run kubectl label namespace "$FLEET_NS" helmop.dev/guard=enabled
run kubectl -n "$FLEET_NS" create secret generic db-credentials --from-literal=password=hunter2 --from-literal=user=web
run kubectl -n "$FLEET_NS" create configmap app-config --from-literal=LOG_LEVEL=info --from-literal=FEATURE_X=on
note "(upstream is also a Fleet Cluster, as Fleet's own \"local\" cluster is: the node's pods read copies too)"
for cluster in upstream:prod down1:prod down2:staging; do
  name=${cluster%%:*} env=${cluster#*:}
  # Fleet reads a registered cluster's credentials from a Secret (key `value`); here the
  # harness's own kubeconfig for that cluster, which works from this host (all on loopback).
  kubectl -n "$FLEET_NS" create secret generic "$name-kubeconfig" --from-file=value="$DIR/$name.kubeconfig" >/dev/null
  kubectl apply -f - >/dev/null <<EOF
apiVersion: fleet.cattle.io/v1alpha1
kind: Cluster
metadata: {name: $name, namespace: $FLEET_NS, labels: {env: $env}}
spec: {kubeConfigSecret: $name-kubeconfig}
EOF
done
kubectl apply -f - >/dev/null <<EOF
apiVersion: fleet.cattle.io/v1alpha1
kind: ClusterGroup
metadata: {name: staging, namespace: $FLEET_NS}
spec: {selector: {matchLabels: {env: staging}}}
EOF
run kubectl -n "$FLEET_NS" get clusters.fleet.cattle.io,clustergroups.fleet.cattle.io --show-labels

section "An invalid HelmOp is rejected at admission (by the webhook pods, through their Service)"
cat >"$DIR/manifests/web-broken.yaml" <<EOF
# A typo in the Secret's name, and a kind Fleet cannot copy.
apiVersion: fleet.cattle.io/v1alpha1
kind: HelmOp
metadata: {name: web-broken, namespace: $FLEET_NS}
spec:
  helm: {repo: oci://registry.example.com/charts/web, version: 1.4.2}
  namespace: $APP_NS
  downstreamResources:
  - {kind: Secret, name: db-credentails}
  - {kind: Deployment, name: web}
EOF
sed -n '2,$p' "$DIR/manifests/web-broken.yaml"
note "Checked before applying (offline rules plus, with --cluster, existence upstream):"
run_expect_fail 1 kubectl helmop validate -f "$DIR/manifests/web-broken.yaml" --cluster
note "And what the API server says when it is applied anyway:"
run_expect_fail 1 kubectl apply -f "$DIR/manifests/web-broken.yaml"

section "A valid HelmOp: root and per-target downstream resources"
cat >"$DIR/manifests/web.yaml" <<EOF
# Every targeted cluster gets the database credentials; prod clusters also get the app config.
# (Fleet itself is not installed here: nothing deploys the chart; helmop copies the resources.)
apiVersion: fleet.cattle.io/v1alpha1
kind: HelmOp
metadata: {name: web, namespace: $FLEET_NS}
spec:
  helm: {repo: oci://registry.example.com/charts/web, version: 1.4.2}
  namespace: $APP_NS
  downstreamResources:
  - {kind: Secret, name: db-credentials}
  targets:
  - name: prod
    clusterSelector: {matchLabels: {env: prod}}
    downstreamResources:
    - {kind: ConfigMap, name: app-config}
  - name: staging
    clusterGroup: staging
EOF
sed -n '3,$p' "$DIR/manifests/web.yaml"
run kubectl apply -f "$DIR/manifests/web.yaml"

section "kubectl helmop propagate -A"
run kubectl helmop propagate -A
section "kubectl helmop status -A"
run kubectl helmop status -A
run kubectl --context down2 -n "$APP_NS" get secrets,configmaps -l helmop.dev/managed-by=kubectl-helmop

section "On the node: an opted-in Deployment that reads the copies"
cat >"$DIR/manifests/web-app.yaml" <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $APP_NS
  labels: {helmop.dev/rollout-on-change: enabled}
---
# The application's own settings, next to it (not copied by helmop): edited in place below.
apiVersion: v1
kind: ConfigMap
metadata: {name: web-settings, namespace: $APP_NS}
data: {GREETING: hello}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: $APP_NS}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      # sleep as PID 1 ignores SIGTERM: do not wait the default 30 s for old pods to go.
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: $APP_IMAGE
        # Prints the ConfigMap's values it started with (never the password), then idles.
        command: [sh, -c, 'echo "LOG_LEVEL=\$LOG_LEVEL FEATURE_X=\$FEATURE_X GREETING=\$GREETING"; exec sleep 86400']
        env:
        - name: DB_PASSWORD
          valueFrom: {secretKeyRef: {name: db-credentials, key: password}}
        envFrom:
        - configMapRef: {name: app-config}
        - configMapRef: {name: web-settings}
EOF
sed -n '1,$p' "$DIR/manifests/web-app.yaml"
run kubectl apply -f "$DIR/manifests/web-app.yaml"
run kubectl -n "$APP_NS" rollout status deployment/web --timeout="${WAIT}s"
both_started() { (($(kubectl -n "$APP_NS" logs -l app=web | grep -c 'LOG_LEVEL=') == 2)); }
wait_for "both pods of web to print their settings" both_started
stamp() {
  kubectl -n "$APP_NS" get deployment web \
    -o jsonpath='{.spec.template.metadata.annotations.helmop\.dev/config-hash}'
}
show_stamp() {
  printf '%s$ kubectl -n %s get deployment web -o yaml | grep helmop.dev/config%s\n' \
    "$BOLD" "$APP_NS" "$RESET"
  kubectl -n "$APP_NS" get deployment web -o json |
    jq -r '.spec.template.metadata.annotations // {} | to_entries[]
           | select(.key | startswith("helmop.dev/config")) | "    \(.key): \(.value)"'
}
show_stamp
first_stamp=$(stamp)
[[ -n $first_stamp ]] || die "the Deployment on the node has no helmop.dev/config-hash (stamped by the webhook pods)"
run kubectl -n "$APP_NS" get pods -l app=web -o wide
first_pods=$(kubectl -n "$APP_NS" get pods -l app=web -o jsonpath='{.items[*].metadata.name}')
run kubectl -n "$APP_NS" logs -l app=web --prefix

section "The source ConfigMap changes upstream"
run kubectl -n "$FLEET_NS" patch configmap app-config -p '{"data":{"LOG_LEVEL":"debug"}}'
run kubectl helmop status -A
note "(Stale: the copies' content hash no longer matches the source)"
run kubectl helmop propagate -A
show_stamp
[[ $(stamp) != "$first_stamp" ]] || die "the stamp on the Deployment did not change after propagate"
run kubectl -n "$APP_NS" rollout status deployment/web --timeout="${WAIT}s"
# Until the old pods are gone (terminating pods are still listed for their grace period).
only_new_pods() {
  local p
  for p in $(kubectl -n "$APP_NS" get pods -l app=web -o jsonpath='{.items[*].metadata.name}'); do
    [[ " $first_pods " != *" $p "* ]] || return 1
  done
}
wait_for "the old pods of web to be gone" only_new_pods
both_print_debug() { (($(kubectl -n "$APP_NS" logs -l app=web | grep -c 'LOG_LEVEL=debug') == 2)); }
wait_for "both new pods to print LOG_LEVEL=debug" both_print_debug
run kubectl -n "$APP_NS" get pods -l app=web -o wide
run kubectl -n "$APP_NS" logs -l app=web --prefix
run kubectl helmop status -A

section "A plain kubectl edit rolls the pods: no helmop command typed"
note "(the rollout watcher on the node sees the ConfigMap change and asks the webhook to restamp its readers)"
second_stamp=$(stamp)
second_pods=$(kubectl -n "$APP_NS" get pods -l app=web -o jsonpath='{.items[*].metadata.name}')
run kubectl -n "$APP_NS" patch configmap web-settings --type merge -p '{"data":{"GREETING":"bonjour"}}'
restamped() { [[ $(stamp) != "$second_stamp" ]]; }
wait_for "the rollout watcher to restamp web" restamped
show_stamp
run kubectl -n "$APP_NS" rollout status deployment/web --timeout="${WAIT}s"
only_newer_pods() {
  local p
  for p in $(kubectl -n "$APP_NS" get pods -l app=web -o jsonpath='{.items[*].metadata.name}'); do
    [[ " $second_pods " != *" $p "* ]] || return 1
  done
}
wait_for "the previous pods of web to be gone" only_newer_pods
both_print_bonjour() { (($(kubectl -n "$APP_NS" logs -l app=web | grep -c 'GREETING=bonjour') == 2)); }
wait_for "both new pods to print GREETING=bonjour" both_print_bonjour
run kubectl -n "$APP_NS" logs -l app=web --prefix
run kubectl -n "$APP_NS" get events --field-selector reason=Restamped
run kubectl -n helmop-system logs deployment/helmop-rollout-watcher --tail=5

section "Done in $((SECONDS - started))s (after the build)"
cat <<EOF
The clusters keep running. Point kubectl at them with:

  export KUBECONFIG=$DIR/kubeconfig
  export PATH=$BIN:\$PATH     # so that \`kubectl helmop\` finds the plugin
  kubectl config get-contexts  # upstream (current, with the node), down1, down2
  kubectl -n helmop-system get pods            # helmop's webhook and rollout watcher on the node
  kubectl -n $APP_NS get deployment,replicasets,pods
  kubectl helmop status -A -o wide

Manifests used: $DIR/manifests/ and $DIR/install/   Downstream webhook logs: $DIR/webhooks/
Cluster and node logs: $DIR/logs/
Tear everything down (node, clusters, host webhooks, local registry) with:

  ./dev down
EOF
