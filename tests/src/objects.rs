//! Plain Kubernetes objects tests need as HelmOp sources.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
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

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    }
}
