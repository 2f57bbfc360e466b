//! Plain Kubernetes objects tests need as HelmOp sources.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// Creates an Opaque Secret with the given data.
pub async fn create_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    data: &[(&str, &[u8])],
) -> anyhow::Result<Secret> {
    let secret = Secret {
        metadata: meta(namespace, name),
        type_: Some("Opaque".to_owned()),
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("creating Secret {namespace}/{name}"))
}

/// Creates a ConfigMap with the given string data.
pub async fn create_config_map(
    client: &Client,
    namespace: &str,
    name: &str,
    data: &[(&str, &str)],
) -> anyhow::Result<ConfigMap> {
    let config_map = ConfigMap {
        metadata: meta(namespace, name),
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &config_map)
        .await
        .with_context(|| format!("creating ConfigMap {namespace}/{name}"))
}

/// Secret `helmop-system/helmop-hash-key` as an install creates it, kept when it exists already
/// (other tests on the cluster may rely on it); returns the key.
pub async fn ensure_hash_key(client: &Client) -> anyhow::Result<Vec<u8>> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt("helmop-system").await?.is_none() {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some("helmop-system".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).context("creating namespace helmop-system"),
        }
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "helmop-system");
    let key_of = |s: Secret| {
        s.data
            .and_then(|d| d.get("key").map(|k| k.0.clone()))
            .unwrap_or_default()
    };
    if let Some(existing) = secrets.get_opt("helmop-hash-key").await? {
        return Ok(key_of(existing));
    }
    let mut key = vec![0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut key)?;
    match create_secret(client, "helmop-system", "helmop-hash-key", &[("key", &key)]).await {
        Ok(_) => Ok(key),
        // Another test created it in the meantime.
        Err(e) if matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 409) => {
            Ok(key_of(secrets.get("helmop-hash-key").await?))
        }
        Err(e) => Err(e),
    }
}

/// An annotation of a Deployment's pod template.
pub fn template_annotation(d: &Deployment, key: &str) -> Option<String> {
    d.spec
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
        .cloned()
}

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    }
}

/// Creates Deployment `web` in `namespace`, opted in to rollouts
/// (`helmop.dev/rollout-on-change`), with no replicas, whose container requires Secret `secret` and
/// ConfigMap `config_map` (`envFrom`).
pub async fn create_reader(
    client: &Client,
    namespace: &str,
    secret: &str,
    config_map: &str,
) -> anyhow::Result<Deployment> {
    let web: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": namespace,
                     "labels": {"helmop.dev/rollout-on-change": "true"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "web", "image": "registry.invalid/web:1",
                    "envFrom": [{"secretRef": {"name": secret}}, {"configMapRef": {"name": config_map}}],
                }]},
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &web)
        .await
        .with_context(|| format!("creating Deployment {namespace}/web"))
}
