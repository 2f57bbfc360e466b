//! A fresh namespace per test, so tests sharing the clusters never see each other's objects.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::wait::{DEFAULT_TIMEOUT, wait_for};

/// Label every fresh namespace carries, with the namespace's own name as value (1.20 has no
/// `kubernetes.io/metadata.name` yet). Webhooks registered for one test select on it.
pub const TEST_NAMESPACE_LABEL: &str = "helmop-tests/namespace";

/// Creates a namespace `<prefix>-<random>` and waits until its `default` ServiceAccount exists
/// (pods cannot be created before that). Returns its name.
pub async fn fresh_namespace(client: &Client, prefix: &str) -> anyhow::Result<String> {
    fresh_namespace_with_labels(client, prefix, &[]).await
}

/// [`fresh_namespace`] with extra labels on the namespace (e.g. helmop's opt-in label).
pub async fn fresh_namespace_with_labels(
    client: &Client,
    prefix: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<String> {
    let valid = !prefix.is_empty()
        && prefix.len() <= 50
        && prefix.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        bail!("namespace prefix {prefix:?} must be 1-50 lowercase letters, digits or '-'");
    }
    let name = format!("{}-{}", prefix.trim_end_matches('-'), unique_suffix());
    let mut all_labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    all_labels.insert(TEST_NAMESPACE_LABEL.to_owned(), name.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(all_labels),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    wait_for(
        &format!("the default ServiceAccount in {name}"),
        DEFAULT_TIMEOUT,
        || async { Ok(accounts.get_opt("default").await?.map(|_| ())) },
    )
    .await?;
    Ok(name)
}

/// 10 hex digits, different across calls and across test processes.
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    format!("{:010x}", hasher.finish() & 0xff_ffff_ffff)
}
