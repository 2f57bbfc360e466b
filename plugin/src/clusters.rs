//! Downstream clusters: from Fleet `Cluster`s on the upstream cluster (their kubeconfig Secret,
//! DESIGN section 2) or from contexts of the local kubeconfig (`--target-context`).
//!
//! A cluster whose credentials cannot be had (no Secret, no `value` key, not a kubeconfig) is
//! still a cluster: it is `Unreachable`, and the run goes on with the others.
//!
//! Several Fleet Clusters may name the same API server (registered in two namespaces): they
//! become one [`Downstream`], keyed by the server URL, so their copies are planned together and
//! one HelmOp's prune can never release another's copy on the same cluster.

use std::collections::BTreeMap;

use helmop_core::model::Cluster;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::api_error;
use crate::context::{Ctx, kubeconfig_error};

/// Data key of a Fleet kubeconfig Secret.
pub const KUBECONFIG_DATA_KEY: &str = "value";

/// One downstream cluster.
#[derive(Clone)]
pub struct Downstream {
    /// Identity in plans: the API server URL; `cluster:NS/NAME` or `context:NAME` when the
    /// credentials could not be read.
    pub key: String,
    /// What users call it: `NS/NAME` of each Fleet Cluster, or the context name.
    pub names: Vec<String>,
    /// How to reach it, or why it cannot be reached.
    pub config: Result<kube::Config, String>,
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
            .field("reachable", &self.config.is_ok())
            .finish()
    }
}

/// `NS/NAME` of a Fleet Cluster.
pub fn cluster_name(c: &Cluster) -> String {
    format!(
        "{}/{}",
        c.metadata.namespace.as_deref().unwrap_or_default(),
        c.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Resolves Fleet Clusters to downstreams. Returns the downstreams and, per input Cluster (same
/// order), the key of its downstream.
pub async fn resolve_fleet(ctx: &Ctx, clusters: &[Cluster]) -> (Vec<Downstream>, Vec<String>) {
    let mut secrets: BTreeMap<(String, String), Result<Option<Secret>, String>> = BTreeMap::new();
    let mut resolved = Vec::with_capacity(clusters.len());
    for cluster in clusters {
        let name = cluster_name(cluster);
        let config = match cluster.kubeconfig_secret() {
            None => Err("the Cluster has no spec.kubeConfigSecret".to_string()),
            Some((ns, secret_name)) => {
                let entry = secrets.entry((ns.clone(), secret_name.clone()));
                let fetched = match entry {
                    std::collections::btree_map::Entry::Occupied(o) => o.get().clone(),
                    std::collections::btree_map::Entry::Vacant(v) => {
                        let api: Api<Secret> = Api::namespaced(ctx.upstream.clone(), &ns);
                        let got = api.get_opt(&secret_name).await.map_err(|e| {
                            format!(
                                "cannot read kubeconfig Secret {ns}/{secret_name}: {}",
                                api_error::describe(&e)
                            )
                        });
                        v.insert(got).clone()
                    }
                };
                match fetched {
                    Err(e) => Err(e),
                    Ok(None) => Err(format!("kubeconfig Secret {ns}/{secret_name} not found")),
                    Ok(Some(secret)) => config_from_secret(ctx, &secret)
                        .await
                        .map_err(|e| format!("kubeconfig Secret {ns}/{secret_name}: {e}")),
                }
            }
        };
        let key = match &config {
            Ok(c) => server_key(c),
            Err(_) => format!("cluster:{name}"),
        };
        resolved.push((key, name, config));
    }
    let keys = resolved.iter().map(|(k, _, _)| k.clone()).collect();
    (merge(resolved), keys)
}

/// Resolves `--target-context` names to downstreams (in the order given, duplicates merged).
pub async fn resolve_contexts(ctx: &Ctx, contexts: &[String]) -> Vec<Downstream> {
    let mut resolved = Vec::new();
    for name in contexts {
        let config = ctx.context_config(name).await;
        let key = match &config {
            Ok(c) => server_key(c),
            Err(_) => format!("context:{name}"),
        };
        resolved.push((key, name.clone(), config));
    }
    merge(resolved)
}

/// The identity of a cluster: its API server URL, without a trailing `/`.
pub fn server_key(config: &kube::Config) -> String {
    config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string()
}

fn merge(resolved: Vec<(String, String, Result<kube::Config, String>)>) -> Vec<Downstream> {
    let mut out: Vec<Downstream> = Vec::new();
    for (key, name, config) in resolved {
        match out.iter_mut().find(|d| d.key == key) {
            Some(d) => {
                if !d.names.contains(&name) {
                    d.names.push(name);
                }
                if d.config.is_err() && config.is_ok() {
                    d.config = config;
                }
            }
            None => out.push(Downstream {
                key,
                names: vec![name],
                config,
            }),
        }
    }
    out
}

/// A client configuration from a Fleet kubeconfig Secret (data key `value`).
async fn config_from_secret(ctx: &Ctx, secret: &Secret) -> Result<kube::Config, String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_DATA_KEY))
        .ok_or_else(|| format!("no data key `{KUBECONFIG_DATA_KEY}`"))?;
    let text = std::str::from_utf8(&bytes.0)
        .map_err(|_| format!("data key `{KUBECONFIG_DATA_KEY}` is not UTF-8 text"))?;
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| kubeconfig_error(&e))?;
    check_self_contained(&kubeconfig)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| kubeconfig_error(&e))?;
    ctx.limit(&mut config);
    Ok(config)
}

/// A kubeconfig read from a Secret is data, not configuration of this machine: it must not
/// make the plugin run programs (`exec`, `auth-provider`) or read local files (paths of CAs,
/// certificates, keys, tokens). Fleet's own kubeconfig Secrets embed everything.
pub fn check_self_contained(kc: &Kubeconfig) -> Result<(), String> {
    for named in &kc.clusters {
        if let Some(c) = &named.cluster
            && c.certificate_authority.is_some()
        {
            return Err(format!(
                "cluster {:?} refers to a CA file; only embedded data is used from a Secret",
                named.name
            ));
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
            return Err(format!(
                "user {:?} uses {what}; a kubeconfig from a Secret must embed its credentials",
                named.name
            ));
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
            let err = check_self_contained(&kc).unwrap_err();
            assert!(err.contains(expect), "{err}");
        }
    }

    #[test]
    fn same_server_merges() {
        let cfg = |url: &str| kube::Config::new(url.parse().unwrap());
        let merged = merge(vec![
            (
                server_key(&cfg("https://a:6443")),
                "ns1/a".into(),
                Ok(cfg("https://a:6443")),
            ),
            (
                "cluster:ns2/a".into(),
                "ns2/a".into(),
                Err("no secret".into()),
            ),
            (
                server_key(&cfg("https://a:6443/")),
                "ns2/b".into(),
                Ok(cfg("https://a:6443")),
            ),
            (
                server_key(&cfg("https://b:6443")),
                "ns1/b".into(),
                Ok(cfg("https://b:6443")),
            ),
        ]);
        let summary: Vec<(String, String, bool)> = merged
            .iter()
            .map(|d| (d.key.clone(), d.display(), d.config.is_ok()))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    "https://a:6443".to_string(),
                    "ns1/a,ns2/b".to_string(),
                    true
                ),
                ("cluster:ns2/a".to_string(), "ns2/a".to_string(), false),
                ("https://b:6443".to_string(), "ns1/b".to_string(), true),
            ]
        );
    }
}
