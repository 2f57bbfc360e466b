//! Reading the registry credentials a pod gets: the Secrets its PodSpec lists in `imagePullSecrets` and
//! those of its ServiceAccount (`serviceAccountName`, else `default`), read live, as the kubelet would.
//! Shared by the webhook (at admission) and the plugin (`images`), so both resolve with the same identity.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use futures::future::{BoxFuture, join_all};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::Api;
use serde_json::Value;

use crate::auth::PullSecret;

/// Why a pull secret could not be used. Never contains secret data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullSecretProblem {
    /// The ServiceAccount could not be read (its pull secrets are unknown).
    ServiceAccount { account: String, error: String },
    /// The Secret exists but holds no readable `.dockerconfigjson`/`.dockercfg`.
    Unreadable { name: String },
    /// The Secret could not be read.
    Read { name: String, error: String },
    /// More distinct pull secrets than one pod's resolution reads; the first ones were read.
    TooMany { total: usize },
}

/// Distinct pull secrets read for one pod (its own first, then its ServiceAccount's): the kubelet
/// tries every one, but no registry needs more than a few credentials, and a tenant listing thousands
/// must not turn one admission into thousands of GETs.
pub const MAX_PULL_SECRETS: usize = 16;

/// Where a pod's pull secrets, and the ServiceAccount that names more of them, are read from: the API
/// server directly (`kube::Client`, the plugin), or the webhook's bounded, counted live reads.
pub trait PullSecretSource: Send + Sync {
    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Secret>, kube::Error>>;

    fn service_account<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ServiceAccount>, kube::Error>>;
}

impl PullSecretSource for kube::Client {
    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Secret>, kube::Error>> {
        Box::pin(async move {
            Api::<Secret>::namespaced(self.clone(), namespace)
                .get_opt(name)
                .await
        })
    }

    fn service_account<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ServiceAccount>, kube::Error>> {
        Box::pin(async move {
            Api::<ServiceAccount>::namespaced(self.clone(), namespace)
                .get_opt(name)
                .await
        })
    }
}

impl fmt::Display for PullSecretProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PullSecretProblem::ServiceAccount { account, error } => write!(
                f,
                "cannot read ServiceAccount {account:?} for its image pull secrets ({error})"
            ),
            PullSecretProblem::Unreadable { name } => write!(
                f,
                "image pull secret {name:?} holds no readable .dockerconfigjson; ignored"
            ),
            PullSecretProblem::Read { name, error } => write!(
                f,
                "cannot read image pull secret {name:?} ({error}); resolving without it"
            ),
            PullSecretProblem::TooMany { total } => write!(
                f,
                "the pod has {total} image pull secrets (its own and its ServiceAccount's); only the first \
                 {MAX_PULL_SECRETS} are read"
            ),
        }
    }
}

/// The pull secrets of a pod with PodSpec `spec` in `namespace`, pod's own first. Secrets that do not
/// exist are skipped silently (the kubelet would not find them either); other trouble is a problem.
/// At most [`MAX_PULL_SECRETS`] distinct Secrets are read, through `secrets`.
pub async fn read_pull_secrets(
    source: &dyn PullSecretSource,
    namespace: &str,
    spec: &Value,
) -> (Vec<PullSecret>, Vec<PullSecretProblem>) {
    let mut problems = Vec::new();
    let mut names = secret_names(spec.get("imagePullSecrets"));
    let mut seen: HashSet<String> = names.iter().cloned().collect();
    let account = service_account(spec);
    match source.service_account(namespace, account).await {
        Ok(Some(sa)) => {
            for s in sa.image_pull_secrets.into_iter().flatten() {
                if !s.name.is_empty() && seen.insert(s.name.clone()) {
                    names.push(s.name);
                }
            }
        }
        Ok(None) => {}
        Err(error) => problems.push(PullSecretProblem::ServiceAccount {
            account: account.to_owned(),
            error: error.to_string(),
        }),
    }
    if names.len() > MAX_PULL_SECRETS {
        problems.push(PullSecretProblem::TooMany { total: names.len() });
        names.truncate(MAX_PULL_SECRETS);
    }
    let reads = names.iter().map(|name| source.secret(namespace, name));
    let mut out = Vec::new();
    for (name, result) in names.iter().zip(join_all(reads).await) {
        match result {
            Ok(Some(secret)) => {
                let identity = format!(
                    "{namespace}/{name}@{}",
                    secret.metadata.resource_version.as_deref().unwrap_or("")
                );
                let data: BTreeMap<String, Vec<u8>> = secret
                    .data
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k, v.0))
                    .collect();
                match PullSecret::parse(&data, &identity) {
                    Some(parsed) => out.push(parsed),
                    None => problems.push(PullSecretProblem::Unreadable { name: name.clone() }),
                }
            }
            Ok(None) => {}
            Err(error) => problems.push(PullSecretProblem::Read {
                name: name.clone(),
                error: error.to_string(),
            }),
        }
    }
    (out, problems)
}

/// The ServiceAccount pods of `spec` run as.
pub fn service_account(spec: &Value) -> &str {
    spec.get("serviceAccountName")
        .or_else(|| spec.get("serviceAccount"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
}

/// The names in an `imagePullSecrets` list, in order, without empties and duplicates.
pub fn secret_names(list: Option<&Value>) -> Vec<String> {
    // A set, not a scan of the names so far: 100,000 names were 9.8 s of CPU that way.
    let mut seen: HashSet<&str> = HashSet::new();
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("name")?.as_str())
        .filter(|s| !s.is_empty() && seen.insert(s))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn pull_secret_names_deduplicated() {
        let list = json!([{"name": "a"}, {"name": ""}, {"name": "b"}, {"name": "a"}, {}]);
        assert_eq!(secret_names(Some(&list)), ["a", "b"]);
        assert!(secret_names(None).is_empty());
    }

    #[test]
    fn service_account_defaults() {
        assert_eq!(service_account(&json!({})), "default");
        assert_eq!(
            service_account(&json!({"serviceAccountName": ""})),
            "default"
        );
        assert_eq!(
            service_account(&json!({"serviceAccount": "legacy"})),
            "legacy"
        );
        assert_eq!(
            service_account(&json!({"serviceAccountName": "a", "serviceAccount": "b"})),
            "a"
        );
    }

    #[test]
    fn problems_name_the_object_not_its_data() {
        let p = PullSecretProblem::Unreadable {
            name: "pull".into(),
        };
        assert_eq!(
            p.to_string(),
            "image pull secret \"pull\" holds no readable .dockerconfigjson; ignored"
        );
    }
}
