//! Downstream clusters: from Fleet `Cluster`s on the upstream cluster (their kubeconfig Secret,
//! key `value`) or from contexts of the local kubeconfig (`--target-context`).
//!
//! A cluster whose credentials cannot be had (no Secret, no `value` key, not a kubeconfig) is
//! still a cluster: it is `Unreachable`, and the run goes on with the others.
//!
//! A cluster is identified by what it is, not by how it is reached: the UID of its
//! `kube-system` namespace ([`crate::identity`]). Entries reaching one physical cluster (Fleet
//! Clusters in two namespaces, two URLs of one API server, a context and a Cluster) become one
//! [`Downstream`], so their copies are planned together with the union of what they want, and
//! no entry's prune or status can take another entry's copy for an orphan. An entry whose
//! cluster cannot be identified (no credentials, no answer, `kube-system` unreadable) is
//! `Unreachable`: nothing is planned on a guess (docs/cluster-identity.md).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use helmop_core::model::Cluster;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::api_error;
use crate::client_cache::ClientKey;
use crate::context::{Ctx, kubeconfig_error};
use crate::error::PluginError;
use crate::identity::{identity_key, kube_system_uid};

/// Data key of a Fleet kubeconfig Secret.
pub const KUBECONFIG_DATA_KEY: &str = "value";

/// One downstream cluster.
#[derive(Clone)]
pub struct Downstream {
    /// Identity in plans: [`identity_key`] of the cluster; `cluster:NS/NAME` or
    /// `context:NAME` when it could not be identified (then `config` is an error).
    pub key: String,
    /// What users call it: `NS/NAME` of each Fleet Cluster, or the context name.
    pub names: Vec<String>,
    /// A client to reach it (kept between runs, [`crate::client_cache`]), or why it cannot be
    /// reached.
    pub client: Result<kube::Client, PluginError>,
}

impl Downstream {
    /// The name shown in reports.
    pub fn display(&self) -> String {
        self.names.join(",")
    }
}

impl std::fmt::Debug for Downstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Downstream")
            .field("key", &self.key)
            .field("names", &self.names)
            .field("reachable", &self.client.is_ok())
            .finish()
    }
}

/// How identities are read: as many clusters at once, each within its deadline, as the run
/// itself (`--concurrency`, `--cluster-timeout`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub concurrency: usize,
    pub timeout: Duration,
}

/// The identity key of the cluster `client` reaches, or why it cannot be had.
async fn identify(client: &kube::Client, timeout: Duration) -> Result<String, PluginError> {
    match tokio::time::timeout(timeout, kube_system_uid(client)).await {
        Err(_) => Err(PluginError::ClusterTimeout { timeout }),
        Ok(Err(e)) => Err(PluginError::Unidentified {
            reason: api_error::describe(&e),
        }),
        Ok(Ok(None)) => Err(PluginError::NoClusterUid),
        Ok(Ok(Some(uid))) => Ok(identity_key(&uid)),
    }
}

/// An entry with its client: its name, its key should it stay unidentified, its client.
type Entry = (String, String, Result<kube::Client, PluginError>);

/// Identifies every entry (bounded, each within its deadline); returns `(key, name, client)`
/// in the order given. An entry that cannot be identified keeps its own key and becomes
/// unreachable with the reason.
async fn identify_all(entries: Vec<Entry>, limits: Limits) -> Vec<Entry> {
    futures::stream::iter(entries)
        .map(|(name, own_key, client)| async move {
            match client {
                Err(e) => (own_key, name, Err(e)),
                Ok(client) => match identify(&client, limits.timeout).await {
                    Ok(key) => (key, name, Ok(client)),
                    Err(why) => (own_key, name, Err(why)),
                },
            }
        })
        .buffered(limits.concurrency.max(1))
        .collect()
        .await
}

/// A client for `config`, kept under `key` for the next runs.
fn build_client(
    ctx: &Ctx,
    key: ClientKey,
    config: kube::Config,
) -> Result<kube::Client, PluginError> {
    let client = kube::Client::try_from(config).map_err(|e| PluginError::BuildClient {
        reason: e.to_string(),
    })?;
    ctx.clients.insert(key, client.clone());
    Ok(client)
}

/// `NS/NAME` of a Fleet Cluster.
pub fn cluster_name(c: &Cluster) -> String {
    format!(
        "{}/{}",
        c.metadata.namespace.as_deref().unwrap_or_default(),
        c.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The kubeconfig Secret `(namespace, name)` of a Cluster, or why it is not read.
fn kubeconfig_secret_of(ctx: &Ctx, cluster: &Cluster) -> Result<(String, String), PluginError> {
    match cluster.kubeconfig_secret() {
        None => Err(PluginError::NoKubeconfigSecret),
        Some((namespace, name))
            if !cluster.fleet_reads_kubeconfig_from(&namespace)
                && !ctx.kubeconfig_namespaces.contains(&namespace) =>
        {
            Err(PluginError::KubeconfigNamespace { namespace, name })
        }
        Some(secret) => Ok(secret),
    }
}

/// Resolves Fleet Clusters to downstreams. Returns the downstreams and, per input Cluster (same
/// order), the key of its downstream.
pub async fn resolve_fleet(
    ctx: &Ctx,
    clusters: &[Cluster],
    limits: Limits,
) -> (Vec<Downstream>, Vec<String>) {
    // Each kubeconfig Secret once, as many at a time as clusters are worked on: read one by
    // one, a fleet of 1000 Clusters waited for 1000 round trips before every run.
    let wanted: BTreeSet<(String, String)> = clusters
        .iter()
        .filter_map(|c| kubeconfig_secret_of(ctx, c).ok())
        .collect();
    let secrets: BTreeMap<(String, String), Result<Option<Secret>, PluginError>> =
        futures::stream::iter(wanted)
            .map(|(ns, secret_name)| async move {
                let api: Api<Secret> = Api::namespaced(ctx.upstream.clone(), &ns);
                let got = api.get_opt(&secret_name).await.map_err(|e| {
                    PluginError::ReadKubeconfigSecret {
                        namespace: ns.clone(),
                        name: secret_name.clone(),
                        reason: api_error::describe(&e),
                    }
                });
                ((ns, secret_name), got)
            })
            .buffer_unordered(limits.concurrency.max(1))
            .collect()
            .await;
    let mut entries = Vec::with_capacity(clusters.len());
    for cluster in clusters {
        let name = cluster_name(cluster);
        let client = match kubeconfig_secret_of(ctx, cluster) {
            Err(e) => Err(e),
            Ok((namespace, name)) => match secrets.get(&(namespace.clone(), name.clone())) {
                None => Err(PluginError::KubeconfigSecretAbsent {
                    namespace,
                    name,
                    looked_up: false,
                }),
                Some(Err(e)) => Err(e.clone()),
                Some(Ok(None)) => Err(PluginError::KubeconfigSecretAbsent {
                    namespace,
                    name,
                    looked_up: true,
                }),
                Some(Ok(Some(secret))) => client_from_secret(ctx, secret).await.map_err(|e| {
                    PluginError::BadKubeconfigSecret {
                        namespace,
                        name,
                        problem: Box::new(e),
                    }
                }),
            },
        };
        entries.push((name.clone(), format!("cluster:{name}"), client));
    }
    let resolved = identify_all(entries, limits).await;
    let keys = resolved.iter().map(|(k, _, _)| k.clone()).collect();
    (merge(resolved), keys)
}

/// Resolves `--target-context` names to downstreams (in the order given, entries reaching one
/// cluster merged).
pub async fn resolve_contexts(ctx: &Ctx, contexts: &[String], limits: Limits) -> Vec<Downstream> {
    let mut entries = Vec::new();
    for name in contexts {
        let key = ClientKey::Context(name.clone());
        let client = match ctx.clients.get(&key) {
            Some(client) => Ok(client),
            None => match ctx.context_config(name).await {
                Ok(config) => build_client(ctx, key, config),
                Err(e) => Err(e),
            },
        };
        entries.push((name.clone(), format!("context:{name}"), client));
    }
    merge(identify_all(entries, limits).await)
}

/// One downstream per key, in order of first appearance; the first reachable configuration
/// of an entry is the one used.
fn merge(resolved: Vec<Entry>) -> Vec<Downstream> {
    let mut out: Vec<Downstream> = Vec::new();
    for (key, name, client) in resolved {
        match out.iter_mut().find(|d| d.key == key) {
            Some(d) => {
                if !d.names.contains(&name) {
                    d.names.push(name);
                }
                if d.client.is_err() && client.is_ok() {
                    d.client = client;
                }
            }
            None => out.push(Downstream {
                key,
                names: vec![name],
                client,
            }),
        }
    }
    out
}

/// A client from a Fleet kubeconfig Secret (data key `value`): the one kept from an earlier run
/// for the same bytes, else a new one.
async fn client_from_secret(ctx: &Ctx, secret: &Secret) -> Result<kube::Client, PluginError> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_DATA_KEY))
        .ok_or(PluginError::NoKubeconfigKey {
            key: KUBECONFIG_DATA_KEY,
        })?;
    let key = ClientKey::Kubeconfig(bytes.0.clone());
    if let Some(client) = ctx.clients.get(&key) {
        return Ok(client);
    }
    let text = std::str::from_utf8(&bytes.0).map_err(|_| PluginError::KubeconfigNotText {
        key: KUBECONFIG_DATA_KEY,
    })?;
    let kubeconfig = Kubeconfig::from_yaml(text)
        .map_err(|e| PluginError::InvalidKubeconfig(kubeconfig_error(&e)))?;
    check_self_contained(&kubeconfig)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| PluginError::InvalidKubeconfig(kubeconfig_error(&e)))?;
    ctx.limit(&mut config);
    crate::roots::trust_system_roots(&mut config);
    build_client(ctx, key, config)
}

/// A kubeconfig read from a Secret is data, not configuration of this machine: it must not
/// make the plugin run programs (`exec`, `auth-provider`) or read local files (paths of CAs,
/// certificates, keys, tokens). Fleet's own kubeconfig Secrets embed everything.
pub fn check_self_contained(kc: &Kubeconfig) -> Result<(), PluginError> {
    for named in &kc.clusters {
        if let Some(c) = &named.cluster
            && c.certificate_authority.is_some()
        {
            return Err(PluginError::KubeconfigCaFile {
                cluster: named.name.clone(),
            });
        }
    }
    for named in &kc.auth_infos {
        let Some(a) = &named.auth_info else { continue };
        let what = if a.exec.is_some() {
            Some("an exec plugin")
        } else if a.auth_provider.is_some() {
            Some("an auth provider")
        } else if a.token_file.is_some() || a.client_certificate.is_some() || a.client_key.is_some()
        {
            Some("a local file")
        } else {
            None
        };
        if let Some(what) = what {
            return Err(PluginError::KubeconfigLocalCredentials {
                user: named.name.clone(),
                what,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::is_identity_key;

    const EMBEDDED: &str = r#"
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.0.0.1:6443/", certificate-authority-data: ""}
users:
- name: u
  user: {token: abc}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"#;

    #[test]
    fn embedded_kubeconfigs_are_accepted() {
        let kc = Kubeconfig::from_yaml(EMBEDDED).unwrap();
        assert!(check_self_contained(&kc).is_ok());
    }

    #[test]
    fn exec_and_file_references_are_refused() {
        for (needle, replacement, expect) in [
            (
                "{token: abc}",
                "{exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}}",
                "exec plugin",
            ),
            ("{token: abc}", "{tokenFile: /etc/shadow}", "local file"),
            (
                "{token: abc}",
                "{client-certificate: /tmp/c, client-key: /tmp/k}",
                "local file",
            ),
            (
                "{token: abc}",
                "{auth-provider: {name: gcp}}",
                "auth provider",
            ),
            (
                "certificate-authority-data: \"\"",
                "certificate-authority: /etc/ca",
                "CA file",
            ),
        ] {
            let yaml = EMBEDDED.replace(needle, replacement);
            let kc = Kubeconfig::from_yaml(&yaml).unwrap();
            let err = check_self_contained(&kc).unwrap_err().to_string();
            assert!(err.contains(expect), "{err}");
        }
    }

    fn client(url: &str) -> kube::Client {
        kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap()
    }

    #[tokio::test]
    async fn entries_of_one_identity_merge() {
        let cfg = client;
        let a = identity_key("uid-a");
        let merged = merge(vec![
            (a.clone(), "ns1/a".into(), Ok(cfg("https://10.0.0.1:6443"))),
            (
                "cluster:ns2/a".into(),
                "ns2/a".into(),
                Err(PluginError::NoKubeconfigSecret),
            ),
            (a.clone(), "ns2/b".into(), Ok(cfg("https://localhost:6443"))),
            (
                identity_key("uid-b"),
                "ns1/b".into(),
                Ok(cfg("https://b:6443")),
            ),
            (a.clone(), "ns1/a".into(), Ok(cfg("https://10.0.0.1:6443"))),
        ]);
        let summary: Vec<(String, String, bool)> = merged
            .iter()
            .map(|d| (d.key.clone(), d.display(), d.client.is_ok()))
            .collect();
        assert_eq!(
            summary,
            [
                (a.clone(), "ns1/a,ns2/b".to_string(), true),
                ("cluster:ns2/a".to_string(), "ns2/a".to_string(), false),
                (identity_key("uid-b"), "ns1/b".to_string(), true),
            ]
        );
        assert!(is_identity_key(&a));
        assert!(!is_identity_key("cluster:ns2/a"));
        assert!(!is_identity_key("context:kube-system:x"));
    }

    #[tokio::test]
    async fn an_entry_that_cannot_be_identified_is_unreachable_with_the_reason() {
        let limits = Limits {
            concurrency: 2,
            timeout: Duration::from_secs(5),
        };
        // Nothing listens on port 1 of the loopback address.
        let entries = vec![
            (
                "ns/down".to_string(),
                "cluster:ns/down".to_string(),
                Ok(client("https://127.0.0.1:1")),
            ),
            (
                "ns/nocreds".to_string(),
                "cluster:ns/nocreds".to_string(),
                Err(PluginError::KubeconfigSecretAbsent {
                    namespace: "ns".into(),
                    name: "k".into(),
                    looked_up: true,
                }),
            ),
        ];
        let out = identify_all(entries, limits).await;
        assert_eq!(out[0].0, "cluster:ns/down");
        let why = out[0]
            .2
            .as_ref()
            .err()
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(why.starts_with("cannot identify the cluster"), "{why}");
        assert_eq!(out[1].0, "cluster:ns/nocreds");
        assert_eq!(
            out[1].2.as_ref().err().map(ToString::to_string).as_deref(),
            Some("kubeconfig Secret ns/k not found")
        );
    }
}
