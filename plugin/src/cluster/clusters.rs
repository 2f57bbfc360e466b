//! Downstream clusters: from Fleet `Cluster`s on the upstream cluster (their kubeconfig Secret,
//! key `value`) or from contexts of the local kubeconfig (`--target-context`).
//!
//! A cluster whose credentials cannot be had (no Secret, no `value` key, not a kubeconfig) is
//! still a cluster: it is `Unreachable`, and the run goes on with the others.
//!
//! Every registration (a Fleet Cluster, a context) is its own [`Downstream`]: its copies travel
//! through its own credentials to its own endpoint, whatever the endpoint says it is. The
//! identity an endpoint claims (the UID of its `kube-system` namespace, [`crate::identity`]) is
//! not a secret, and two clusters restored from one etcd snapshot share it; so it may only make
//! helmop more careful: registrations that claim one identity (or whose identity cannot be
//! read) protect each other's copies from prune and are reported as aliases, but never send
//! copies through one another (docs/cluster-identity.md).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use helmop_core::model::Cluster;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::cluster::api_error;
use crate::cluster::client_cache::ClientKey;
use crate::cluster::context::{Ctx, kubeconfig_error};
use crate::cluster::http_client;
use crate::cluster::read_cache::ReadCache;
use crate::error::PluginError;
use crate::identity::{identity_key, kube_system_uid};

/// Data key of a Fleet kubeconfig Secret.
pub const KUBECONFIG_DATA_KEY: &str = "value";

/// One downstream registration.
#[derive(Clone)]
pub struct Downstream {
    /// Its key in plans: `cluster:NS/NAME` or `context:NAME`.
    pub key: String,
    /// What users call it: `NS/NAME` of the Fleet Cluster, or the context name.
    pub name: String,
    /// The identity its endpoint claims ([`identity_key`]), `None` when it could not be read
    /// (no right to get `kube-system`, say): then it may be any cluster.
    pub identity: Option<String>,
    /// A client to reach it (kept between runs, [`crate::cluster::client_cache`]), or why it cannot be
    /// reached.
    pub client: Result<kube::Client, PluginError>,
}

impl Downstream {
    /// The name shown in reports.
    pub fn display(&self) -> String {
        self.name.clone()
    }
}

impl std::fmt::Debug for Downstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Downstream")
            .field("key", &self.key)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("reachable", &self.client.is_ok())
            .finish()
    }
}

/// Whether registrations claiming identities `a` and `b` may reach one cluster: the same claim,
/// or either unknown (a claim is never proof that two are different either).
pub fn may_be_same(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// The plan key of the Fleet Cluster `NS/NAME`.
pub fn fleet_key(name: &str) -> String {
    format!("cluster:{name}")
}

/// How many clusters a run works on at once, and each one's deadline (`--concurrency`,
/// `--cluster-timeout`); identities are read within the same limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub concurrency: usize,
    pub timeout: Duration,
}

/// What reading an endpoint's identity gave.
enum Identified {
    /// The identity it claims.
    Claimed(String),
    /// It answers but does not say (`kube-system` forbidden or absent): served, identity unknown.
    Unknown(PluginError),
    /// It cannot be worked on (no answer, no connection, credentials refused).
    Unreachable(PluginError),
}

/// The identity key `client`'s endpoint claims, within `timeout`.
async fn identify(client: &kube::Client, timeout: Duration) -> Identified {
    match tokio::time::timeout(timeout, kube_system_uid(client)).await {
        Err(_) => Identified::Unreachable(PluginError::ClusterTimeout { timeout }),
        Ok(Err(e)) => {
            let why = PluginError::Unidentified {
                reason: api_error::describe(&e),
            };
            match e {
                kube::Error::Api(ae) if ae.code == 403 || ae.code == 404 => {
                    Identified::Unknown(why)
                }
                _ => Identified::Unreachable(why),
            }
        }
        Ok(Ok(None)) => Identified::Unknown(PluginError::NoClusterUid),
        Ok(Ok(Some(uid))) => Identified::Claimed(identity_key(&uid)),
    }
}

/// A registration with its client: its name, its plan key, its client and what the client was
/// built from.
type Entry = (
    String,
    String,
    Result<(kube::Client, ClientKey), PluginError>,
);

/// Reads every entry's identity (bounded, each within its deadline) and makes it a
/// [`Downstream`], in the order given, each key once. An entry whose endpoint cannot be reached
/// is unreachable with the reason; one that answers without saying who it is is served with an
/// unknown identity.
async fn identify_all(
    reads: Option<&ReadCache>,
    entries: Vec<Entry>,
    limits: Limits,
) -> Vec<Downstream> {
    let mut seen = BTreeSet::new();
    let entries: Vec<Entry> = entries
        .into_iter()
        .filter(|(_, key, _)| seen.insert(key.clone()))
        .collect();
    let out: Vec<Downstream> = futures::stream::iter(entries)
        .map(|(name, key, client)| async move {
            let (identity, client) = match client {
                Err(e) => (None, Err(e)),
                Ok((client, built_from)) => match identify_kept(reads, &client, built_from, limits).await {
                    Identified::Claimed(id) => (Some(id), Ok(client)),
                    Identified::Unknown(why) => {
                        tracing::info!(cluster = %name, reason = %why, "identity unknown: served through its own credentials, its wants protect every cluster's copies");
                        (None, Ok(client))
                    }
                    Identified::Unreachable(why) => (None, Err(why)),
                },
            };
            Downstream {
                key,
                name,
                identity,
                client,
            }
        })
        .buffered(limits.concurrency.max(1))
        .collect()
        .await;
    report_aliases(&out);
    out
}

/// [`identify`], or the identity this client claimed in an earlier run of a watcher
/// ([`ReadCache`]); a claimed one is kept for the next.
async fn identify_kept(
    reads: Option<&ReadCache>,
    client: &kube::Client,
    built_from: ClientKey,
    limits: Limits,
) -> Identified {
    let Some(reads) = reads else {
        return identify(client, limits.timeout).await;
    };
    if let Some(id) = reads.identity(&built_from) {
        return Identified::Claimed(id);
    }
    let epoch = reads.epoch();
    let identified = identify(client, limits.timeout).await;
    if let Identified::Claimed(id) = &identified {
        reads.store_identity(built_from, id.clone(), epoch);
    }
    identified
}

/// Registrations claiming one identity are reported: an alias of one cluster (two URLs, two
/// Fleet Clusters), a restored clone, or an endpoint impersonating another cluster. Each is
/// still served through its own credentials only.
fn report_aliases(downstreams: &[Downstream]) {
    let mut by_identity: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for d in downstreams.iter().filter(|d| d.client.is_ok()) {
        if let Some(id) = &d.identity {
            by_identity.entry(id).or_default().push(&d.name);
        }
    }
    for names in by_identity.values().filter(|n| n.len() > 1) {
        tracing::warn!(
            clusters = %names.join(", "),
            "these registrations claim one cluster identity (kube-system uid): each gets only its own copies, through its own credentials, and none prunes what another wants"
        );
    }
}

/// A client for `config`, kept under `key` for the next runs (and returned with it).
fn build_client(
    ctx: &Ctx,
    key: ClientKey,
    config: kube::Config,
) -> Result<(kube::Client, ClientKey), PluginError> {
    let client = http_client::downstream_client(config).map_err(|e| PluginError::BuildClient {
        reason: e.to_string(),
    })?;
    ctx.clients.insert(key.clone(), client.clone());
    Ok((client, key))
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
pub fn kubeconfig_secret_of(ctx: &Ctx, cluster: &Cluster) -> Result<(String, String), PluginError> {
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

/// Resolves Fleet Clusters to downstreams, one per Cluster, in the order given.
pub async fn resolve_fleet(ctx: &Ctx, clusters: &[Cluster], limits: Limits) -> Vec<Downstream> {
    // Each kubeconfig Secret once, as many at a time as clusters are worked on: read one by
    // one, a fleet of 1000 Clusters waited for 1000 round trips before every run.
    let wanted: BTreeSet<(String, String)> = clusters
        .iter()
        .filter_map(|c| kubeconfig_secret_of(ctx, c).ok())
        .collect();
    let secrets: BTreeMap<(String, String), Result<Option<Secret>, PluginError>> =
        futures::stream::iter(wanted)
            .map(|(ns, secret_name)| async move {
                let got = kubeconfig_secret(ctx, &ns, &secret_name).await;
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
        let key = fleet_key(&name);
        entries.push((name, key, client));
    }
    identify_all(ctx.reads.as_deref(), entries, limits).await
}

/// The kubeconfig Secret `namespace/name` upstream (`None`: absent), or the one a watcher kept.
async fn kubeconfig_secret(
    ctx: &Ctx,
    namespace: &str,
    name: &str,
) -> Result<Option<Secret>, PluginError> {
    if let Some(kept) = ctx.reads.as_ref().and_then(|r| r.secret(namespace, name)) {
        return Ok(kept);
    }
    let epoch = ctx.reads.as_ref().map(|r| r.epoch());
    let api: Api<Secret> = Api::namespaced(ctx.upstream.clone(), namespace);
    let got = api
        .get_opt(name)
        .await
        .map_err(|e| PluginError::ReadKubeconfigSecret {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            reason: api_error::describe(&e),
        })?;
    if let (Some(reads), Some(epoch)) = (&ctx.reads, epoch) {
        reads.store_secret(namespace, name, got.clone(), epoch);
    }
    Ok(got)
}

/// Resolves `--target-context` names to downstreams (in the order given, each name once).
pub async fn resolve_contexts(ctx: &Ctx, contexts: &[String], limits: Limits) -> Vec<Downstream> {
    let mut entries = Vec::new();
    for name in contexts {
        let key = ClientKey::Context(name.clone());
        let client = match ctx.clients.get(&key) {
            Some(client) => Ok((client, key)),
            None => match ctx.context_config(name).await {
                Ok(config) => build_client(ctx, key, config),
                Err(e) => Err(e),
            },
        };
        entries.push((name.clone(), format!("context:{name}"), client));
    }
    identify_all(ctx.reads.as_deref(), entries, limits).await
}

/// A client from a Fleet kubeconfig Secret (data key `value`): the one kept from an earlier run
/// for the same bytes, else a new one; with the key it is kept under.
async fn client_from_secret(
    ctx: &Ctx,
    secret: &Secret,
) -> Result<(kube::Client, ClientKey), PluginError> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_DATA_KEY))
        .ok_or(PluginError::NoKubeconfigKey {
            key: KUBECONFIG_DATA_KEY,
        })?;
    let key = ClientKey::Kubeconfig(bytes.0.clone());
    if let Some(client) = ctx.clients.get(&key) {
        return Ok((client, key));
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
    crate::cluster::roots::trust_system_roots(&mut config);
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

    #[test]
    fn claims_only_ever_widen_what_may_be_one_cluster() {
        let (a, b) = (identity_key("uid-a"), identity_key("uid-b"));
        assert!(may_be_same(Some(&a), Some(&a)));
        assert!(!may_be_same(Some(&a), Some(&b)));
        assert!(may_be_same(None, Some(&b)));
        assert!(may_be_same(Some(&a), None));
        assert!(may_be_same(None, None));
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
                Ok((
                    client("https://127.0.0.1:1"),
                    ClientKey::Context("down".into()),
                )),
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
        let out = identify_all(None, entries, limits).await;
        assert_eq!(out[0].key, "cluster:ns/down");
        let why = out[0]
            .client
            .as_ref()
            .err()
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(why.starts_with("cannot identify the cluster"), "{why}");
        assert_eq!(out[0].identity, None);
        assert_eq!(out[1].key, "cluster:ns/nocreds");
        assert_eq!(
            out[1]
                .client
                .as_ref()
                .err()
                .map(ToString::to_string)
                .as_deref(),
            Some("kubeconfig Secret ns/k not found")
        );
    }
}
