//! The AdmissionReviews the benchmarks send, and what a right answer looks like.

use axum::body::Bytes;
use serde_json::{Value, json};

use crate::fixtures::{BIG_CONFIG_MAP, NAMESPACE, SECRETS, ref_secret};
use crate::load::Check;

fn review(
    group: &str,
    version: &str,
    kind: &str,
    resource: &str,
    name: &str,
    object: Value,
) -> Bytes {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f6a4b8e-6c9a-4c1e-9a57-1f0d6c3b2a10",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": name,
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:fleet-local:bench", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    });
    Bytes::from(review.to_string())
}

/// HelmOp CREATE listing the three Secrets and the ConfigMap, all present (answered from the caches).
pub fn validate_helmop() -> Bytes {
    let mut resources: Vec<Value> = SECRETS
        .iter()
        .map(|s| json!({"kind": "Secret", "name": s}))
        .collect();
    resources.push(json!({"kind": "ConfigMap", "name": BIG_CONFIG_MAP}));
    let helmop = json!({
        "apiVersion": "fleet.cattle.io/v1alpha1",
        "kind": "HelmOp",
        "metadata": {"name": "app", "namespace": NAMESPACE, "labels": {"team": "bench"}},
        "spec": {
            "helm": {"repo": "https://charts.example.com/stable", "chart": "app", "version": "1.2.3",
                     "values": {"replicaCount": 2, "image": {"tag": "1.2.3"}}},
            "namespace": "app",
            "downstreamResources": resources,
            "targets": [
                {"name": "prod", "clusterSelector": {"matchLabels": {"env": "prod"}}},
                {"name": "staging", "clusterGroup": "staging"},
            ],
        },
    });
    review(
        "fleet.cattle.io",
        "v1alpha1",
        "HelmOp",
        "helmops",
        "app",
        helmop,
    )
}

/// Deployment CREATE in an opted-in namespace reading the 1 MiB ConfigMap (envFrom) and three Secrets (a key,
/// envFrom, a volume). Its image has a fixed tag: the registry is not part of this measurement.
pub fn mutate_deployment() -> Bytes {
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NAMESPACE, "labels": {"app": "web"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [{
                        "name": "web",
                        "image": "registry.example.com/web:1.2.3",
                        "ports": [{"containerPort": 8080}],
                        "envFrom": [
                            {"configMapRef": {"name": BIG_CONFIG_MAP}},
                            {"secretRef": {"name": SECRETS[1]}},
                        ],
                        "env": [{"name": "DB_PASSWORD",
                                 "valueFrom": {"secretKeyRef": {"name": SECRETS[0], "key": "password"}}}],
                        "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true}],
                    }],
                    "volumes": [{"name": "tls", "secret": {"secretName": SECRETS[2]}}],
                },
            },
        },
    });
    review("apps", "v1", "Deployment", "deployments", "web", deployment)
}

/// Deployment CREATE in the opted-in namespace reading `n` small Secrets whole (`envFrom`), so a stamp needs one
/// live metadata GET per Secret and nothing else (digests cached after the first request, fixed image tag).
pub fn mutate_reading(n: usize) -> Bytes {
    let env_from: Vec<Value> = (0..n)
        .map(|i| json!({"secretRef": {"name": ref_secret(i)}}))
        .collect();
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "reader", "namespace": NAMESPACE, "labels": {"app": "reader"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "reader"}},
            "template": {
                "metadata": {"labels": {"app": "reader"}},
                "spec": {"containers": [{
                    "name": "reader",
                    "image": "registry.example.com/reader:1.2.3",
                    "envFrom": env_from,
                }]},
            },
        },
    });
    review(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "reader",
        deployment,
    )
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// Substring checks, not a JSON parse: the check runs in the load generator for every answer and must cost
// the same for the baseline and the webhook without eating the CPU they share.

/// Allowed, no warnings.
pub fn clean_allow() -> Check {
    std::sync::Arc::new(|body| {
        contains(body, b"\"allowed\":true") && !contains(body, b"\"warnings\"")
    })
}

/// Allowed with a JSONPatch, no warnings.
pub fn patched() -> Check {
    std::sync::Arc::new(|body| {
        contains(body, b"\"allowed\":true")
            && contains(body, b"\"patch\":\"")
            && !contains(body, b"\"warnings\"")
    })
}
