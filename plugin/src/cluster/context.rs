//! [`Ctx`]: everything the cluster-facing commands share - the upstream client, the upstream id,
//! the default namespace, the local kubeconfig (for `--target-context`), the request timeout and
//! a counter of the writes made.
//!
//! For `--watch` (and any other long-running caller): build one `Ctx` with [`Ctx::connect`] and
//! call [`crate::run::propagate::propagate_once`] as often as needed; the write counter keeps adding
//! up across runs ([`Ctx::writes`]).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use helmop_core::plan::validate_upstream_id;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::args::KubeArgs;
use crate::cluster::client_cache::ClientCache;
use crate::cluster::read_cache::ReadCache;
use crate::cluster::{api_error, upstream_id};
use crate::error::PluginError;
use crate::identity;

/// Shared state of one command run (cheap to clone: clients and the counter are shared).
#[derive(Clone)]
pub struct Ctx {
    /// Client of the upstream (management) cluster.
    pub upstream: kube::Client,
    /// `--upstream-id`, or derived from the upstream cluster's identity once [`Ctx::identified`]
    /// ran (before: the legacy id from its CA or URL; see [`crate::cluster::upstream_id`]).
    pub upstream_id: String,
    /// Earlier ids of this same upstream: copies marked with them are ours and get the current
    /// id on their next write. The legacy id when the id was derived from the identity; empty
    /// with `--upstream-id`.
    pub upstream_aliases: Vec<String>,
    /// The upstream cluster's identity ([`identity::identity_key`]), or why it is unknown.
    pub upstream_cluster: Result<String, PluginError>,
    /// `--upstream-id` was given.
    explicit_id: bool,
    /// `-n`, else the kubeconfig context's namespace (in a pod: its own), else `default`.
    pub namespace: String,
    /// The local kubeconfig, merged from KUBECONFIG as kubectl does; `None` in a pod.
    pub kubeconfig: Option<Kubeconfig>,
    /// `--request-timeout`; zero means kube's defaults.
    pub request_timeout: Duration,
    /// `--allow-kubeconfig-namespace`: where kubeconfig Secrets may be read beyond what Fleet reads.
    pub kubeconfig_namespaces: Vec<String>,
    /// Downstream clients kept between runs ([`crate::cluster::client_cache`]).
    pub clients: Arc<ClientCache>,
    /// Kubeconfig Secrets and identities kept between runs, for a caller whose watches invalidate
    /// them (`propagate --watch`, [`crate::cluster::read_cache`]); `None`: read every time.
    pub reads: Option<Arc<ReadCache>>,
    writes: Arc<AtomicU64>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("upstream_id", &self.upstream_id)
            .field("namespace", &self.namespace)
            .field("request_timeout", &self.request_timeout)
            .field("writes", &self.writes())
            .field("clients", &self.clients.len())
            .finish_non_exhaustive()
    }
}

impl Ctx {
    /// Loads the configuration the way kubectl does (`--kubeconfig`, else KUBECONFIG merged,
    /// else `~/.kube/config`, else in-cluster) and builds the upstream client. Makes no request.
    pub async fn connect(args: &KubeArgs) -> Result<Ctx, PluginError> {
        let kubeconfig = load_kubeconfig(args.kubeconfig.as_deref())?;
        let mut config = match &kubeconfig {
            Some(kc) => {
                let options = KubeConfigOptions {
                    context: args.context.clone(),
                    ..KubeConfigOptions::default()
                };
                kube::Config::from_custom_kubeconfig(kc.clone(), &options)
                    .await
                    .map_err(|e| PluginError::Kubeconfig(kubeconfig_error(&e)))?
            }
            None => {
                if let Some(context) = &args.context {
                    return Err(PluginError::Kubeconfig(format!(
                        "--context {context} given, but there is no kubeconfig (set KUBECONFIG or --kubeconfig)"
                    )));
                }
                kube::Config::incluster().map_err(|e| {
                    PluginError::Kubeconfig(format!(
                        "no kubeconfig found (KUBECONFIG, ~/.kube/config) and not running in a pod: {e}"
                    ))
                })?
            }
        };
        let explicit_id = args.upstream_id.is_some();
        let upstream_id = match &args.upstream_id {
            Some(id) => {
                validate_upstream_id(id).map_err(|e| PluginError::Usage(e.to_string()))?;
                id.clone()
            }
            None => upstream_id::derive(&config),
        };
        let namespace = args
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        apply_request_timeout(&mut config, args.request_timeout);
        let upstream = kube::Client::try_from(config)
            .map_err(|e| PluginError::Kubeconfig(format!("cannot build a client: {e}")))?;
        Ok(Ctx {
            upstream,
            upstream_id,
            upstream_aliases: Vec::new(),
            upstream_cluster: Err(PluginError::UpstreamNotIdentified),
            explicit_id,
            namespace,
            kubeconfig,
            request_timeout: args.request_timeout,
            kubeconfig_namespaces: args.kubeconfig_namespaces.clone(),
            clients: Arc::new(ClientCache::default()),
            reads: None,
            writes: Arc::new(AtomicU64::new(0)),
        })
    }

    /// [`Ctx::connect`], then [`Ctx::identified`]: what `propagate`, `status` and `prune` use.
    pub async fn connect_identified(args: &KubeArgs) -> Result<Ctx, PluginError> {
        Ctx::connect(args).await?.identified().await
    }

    /// Reads the upstream cluster's identity (the UID of its `kube-system` namespace) and, unless
    /// `--upstream-id` was given, derives the upstream id from it, keeping the legacy id as an
    /// alias. When the namespace cannot be read (no permission), the legacy id stays in use
    /// with a warning and the identity is unknown (`prune` then refuses to run); when the
    /// cluster cannot be reached, that is the command's error.
    pub async fn identified(mut self) -> Result<Ctx, PluginError> {
        match identity::kube_system_uid(&self.upstream).await {
            Ok(Some(uid)) => {
                if !self.explicit_id {
                    let legacy = std::mem::replace(
                        &mut self.upstream_id,
                        upstream_id::derive_from_uid(&uid),
                    );
                    if legacy != self.upstream_id {
                        self.upstream_aliases = vec![legacy];
                    }
                }
                self.upstream_cluster = Ok(identity::identity_key(&uid));
            }
            Err(e) if api_error::is_unavailable(&e) => {
                return Err(api_error::upstream("reading namespace kube-system", &e));
            }
            other => {
                let why = match other {
                    Err(e) => PluginError::UpstreamIdentity {
                        reason: api_error::describe(&e),
                    },
                    Ok(_) => PluginError::UpstreamNoUid,
                };
                if !self.explicit_id {
                    tracing::warn!(
                        "{why}; using the legacy upstream id {} (set --upstream-id to be sure)",
                        self.upstream_id
                    );
                }
                self.upstream_cluster = Err(why);
            }
        }
        Ok(self)
    }

    /// Counts one write request (create, apply, patch, delete) made to any cluster.
    pub fn record_write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Write requests made so far through this context.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// A client configuration for context `name` of the local kubeconfig (`--target-context`).
    pub async fn context_config(&self, name: &str) -> Result<kube::Config, PluginError> {
        let Some(kc) = &self.kubeconfig else {
            return Err(PluginError::NoKubeconfig);
        };
        if !kc.contexts.iter().any(|c| c.name == name) {
            return Err(PluginError::UnknownContext {
                name: name.to_owned(),
            });
        }
        let options = KubeConfigOptions {
            context: Some(name.to_string()),
            ..KubeConfigOptions::default()
        };
        let mut config = kube::Config::from_custom_kubeconfig(kc.clone(), &options)
            .await
            .map_err(|e| PluginError::InvalidKubeconfig(kubeconfig_error(&e)))?;
        apply_request_timeout(&mut config, self.request_timeout);
        crate::cluster::roots::trust_system_roots(&mut config);
        Ok(config)
    }

    /// Applies `--request-timeout` to a downstream configuration.
    pub fn limit(&self, config: &mut kube::Config) {
        apply_request_timeout(config, self.request_timeout);
    }
}

/// `--kubeconfig`, else KUBECONFIG (every listed file, merged), else `~/.kube/config` when it
/// exists; `None` means "try in-cluster".
fn load_kubeconfig(explicit: Option<&Path>) -> Result<Option<Kubeconfig>, PluginError> {
    if let Some(path) = explicit {
        return Kubeconfig::read_from(path).map(Some).map_err(|e| {
            PluginError::Kubeconfig(format!("{}: {}", path.display(), kubeconfig_error(&e)))
        });
    }
    if let Some(kc) =
        Kubeconfig::from_env().map_err(|e| PluginError::Kubeconfig(kubeconfig_error(&e)))?
    {
        return Ok(Some(kc));
    }
    let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
        return Ok(None);
    };
    let default = Path::new(&home).join(".kube").join("config");
    if !default.exists() {
        return Ok(None);
    }
    Kubeconfig::read_from(&default).map(Some).map_err(|e| {
        PluginError::Kubeconfig(format!("{}: {}", default.display(), kubeconfig_error(&e)))
    })
}

/// A kubeconfig error without the parser's excerpt of the file: kubeconfigs hold credentials.
pub fn kubeconfig_error(e: &kube::config::KubeconfigError) -> String {
    use kube::config::KubeconfigError as K;
    match e {
        K::Parse(_) => "the kubeconfig is not valid YAML".into(),
        K::ReadConfig(io, path) => format!("cannot read {}: {io}", path.display()),
        // The remaining variants name contexts, clusters, users or files, never their content.
        other => other.to_string(),
    }
}

fn apply_request_timeout(config: &mut kube::Config, timeout: Duration) {
    if !timeout.is_zero() {
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
    }
}
