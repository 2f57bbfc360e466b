//! Watch-backed lookups. Existence checks, namespace labels and the delete guard are answered from
//! reflector stores filled by long-running watches (metadata-only for Secrets, ConfigMaps and
//! Namespaces); a miss falls back to one live GET, so an object created a moment ago is still found.
//! The live reads a stamp needs are GETs, or, for several objects of one kind in a namespace the cache says holds
//! few of that kind, one metadata LIST as fresh as those GETs ([`read_plan`]). Every live read goes through
//! [`LiveGets`]: bounded in number and shared by concurrent callers asking for the same thing (see
//! [`super::coalesce`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::join_all;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{Api, ApiResource, GroupVersionKind, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::{Client, Resource};

use helmop_core::hash::ObjectData;
use helmop_core::model::Policy;
use helmop_core::names::PREFIX;
use helmop_core::resource::{ResourceKind, ResourceRef};

use super::coalesce::Coalescer;
use super::counts::NamespaceCounts;
use super::guarded::GuardedHelmOp;
use crate::metrics::Metrics;

/// Label values of `helmop_webhook_cache_objects`.
pub const CACHE_SECRETS: &str = "secrets";
pub const CACHE_CONFIGMAPS: &str = "configmaps";
pub const CACHE_NAMESPACES: &str = "namespaces";
/// `live_gets_total` kind of the image stage's ServiceAccount reads (not cached: read per admission,
/// shared by concurrent ones).
pub const LIVE_SERVICEACCOUNTS: &str = "serviceaccounts";
pub const CACHE_HELMOPS: &str = "helmops";
pub const CACHE_POLICIES: &str = "policies";
pub const CACHE_DIGESTS: &str = "digests";

/// Fleet's HelmOp, read as a dynamic object: the webhook needs only a few fields and must not drop
/// or reject fields a newer Fleet adds.
pub fn helmop_api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("fleet.cattle.io", "v1alpha1", "HelmOp"),
        "helmops",
    )
}

/// HelmOps per page of the HelmOp cache's list (kube's default is 500): a page is read whole before it is
/// decoded, and one HelmOp may be as large as the API server stores (1.5 MiB by etcd's default), so this
/// bounds a list page to about 15 MiB whatever the HelmOps carry.
pub const HELMOP_PAGE_SIZE: u32 = 10;

/// How often the webhook asks the API server again whether it serves HelmOps, while it does not.
pub const HELMOP_DISCOVERY_PERIOD: Duration = Duration::from_secs(10);

/// `uid` and `resourceVersion` of an object: together they name one version of its content.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub uid: String,
    pub resource_version: String,
}

impl Version {
    fn of(meta: &kube::api::ObjectMeta) -> Option<Version> {
        Some(Version {
            uid: meta.uid.clone()?,
            resource_version: meta.resource_version.clone()?,
        })
    }
}

// Index of each watch in `Caches::synced`.
const SYNCED_SECRETS: usize = 0;
const SYNCED_CONFIGMAPS: usize = 1;
const SYNCED_NAMESPACES: usize = 2;
const SYNCED_HELMOPS: usize = 3;

/// The reflector stores and their sync state.
#[derive(Clone)]
pub struct Caches {
    client: Client,
    secrets: Store<PartialObjectMeta<Secret>>,
    config_maps: Store<PartialObjectMeta<ConfigMap>>,
    /// Secrets and ConfigMaps per namespace in those two caches, for [`read_plan`].
    secret_counts: NamespaceCounts,
    config_map_counts: NamespaceCounts,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    helmops: Store<GuardedHelmOp>,
    /// Fleet Policies: only for admission warnings, so readiness never waits for them.
    policies: Store<Policy>,
    policies_synced: Arc<[AtomicBool; 1]>,
    live: LiveGets,
    synced: Arc<[AtomicBool; 4]>,
    /// True while discovery says the API server serves no HelmOps (no Fleet CRD): then there are no
    /// HelmOps, so the empty HelmOp cache is complete and the delete guard has nothing to protect.
    helmops_absent: Arc<AtomicBool>,
}

impl Caches {
    /// Starts the four watches on the runtime; they run (and retry with backoff) until the process ends.
    /// At most `max_live_gets` live GETs are in flight at once.
    pub fn start(client: Client, metrics: &Metrics, max_live_gets: usize) -> Caches {
        let synced: Arc<[AtomicBool; 4]> = Arc::new(Default::default());

        let (secret_counts, config_map_counts) = Default::default();
        let secrets = spawn_reflector(
            (
                Api::<PartialObjectMeta<Secret>>::all(client.clone()),
                watcher::Config::default(),
            ),
            reflector::store::Writer::default(),
            strip_object_meta,
            CACHE_SECRETS,
            metrics.clone(),
            (synced.clone(), SYNCED_SECRETS),
            counting(&secret_counts),
        );
        let config_maps = spawn_reflector(
            (
                Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
                watcher::Config::default(),
            ),
            reflector::store::Writer::default(),
            strip_object_meta,
            CACHE_CONFIGMAPS,
            metrics.clone(),
            (synced.clone(), SYNCED_CONFIGMAPS),
            counting(&config_map_counts),
        );
        let namespaces = spawn_reflector(
            (
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                watcher::Config::default(),
            ),
            reflector::store::Writer::default(),
            strip_namespace,
            CACHE_NAMESPACES,
            metrics.clone(),
            (synced.clone(), SYNCED_NAMESPACES),
            |_, _| {},
        );
        let ar = helmop_api_resource();
        let helmops_absent = Arc::new(AtomicBool::new(false));
        let writer = reflector::store::Writer::new(ar.clone());
        let helmops = writer.as_reader();
        // The HelmOp watch starts only once the API server serves HelmOps: on a cluster without Fleet's
        // CRD (every downstream cluster) a watch would fail forever and readiness would wait for it.
        tokio::spawn(watch_helmops_when_served(
            client.clone(),
            ar,
            writer,
            metrics.clone(),
            synced.clone(),
            helmops_absent.clone(),
        ));
        let policies_synced: Arc<[AtomicBool; 1]> = Arc::new(Default::default());
        let policy_writer = reflector::store::Writer::default();
        let policies = policy_writer.as_reader();
        tokio::spawn(watch_policies_when_served(
            client.clone(),
            policy_writer,
            metrics.clone(),
            policies_synced.clone(),
        ));
        Caches {
            client,
            secrets,
            config_maps,
            secret_counts,
            config_map_counts,
            namespaces,
            helmops,
            policies,
            policies_synced,
            live: LiveGets::new(max_live_gets, metrics),
            synced,
            helmops_absent,
        }
    }

    /// True once every watch has delivered its initial list (the HelmOp one counts as delivered
    /// while the API server serves no HelmOps).
    pub fn synced(&self) -> bool {
        self.synced.iter().enumerate().all(|(i, s)| {
            s.load(Ordering::Acquire) || (i == SYNCED_HELMOPS && self.helmops_absent())
        })
    }

    /// True once the HelmOp cache is complete (the delete guard needs only that one): its watch has
    /// delivered its initial list, or the API server serves no HelmOps at all.
    pub fn helmops_synced(&self) -> bool {
        self.synced[SYNCED_HELMOPS].load(Ordering::Acquire) || self.helmops_absent()
    }

    /// True while the last discovery found no HelmOp resource (and its watch has not started).
    pub fn helmops_absent(&self) -> bool {
        self.helmops_absent.load(Ordering::Acquire)
    }

    /// Live discovery confirms there are still no HelmOps: the guard asks before allowing on an absent
    /// CRD, so a CRD created since the last periodic check (and a HelmOp in it) is never missed. A
    /// failed discovery is no confirmation.
    pub async fn helmops_still_absent(&self) -> bool {
        matches!(
            served(&self.client, &helmop_api_resource()).await,
            Ok(false)
        )
    }

    /// Whether `r` exists in `namespace`: the metadata cache, else a live GET.
    pub async fn exists(&self, namespace: &str, r: &ResourceRef) -> Result<bool, kube::Error> {
        let cached = match r.kind {
            ResourceKind::Secret => self
                .secrets
                .get(&ObjectRef::new(&r.name).within(namespace))
                .is_some(),
            ResourceKind::ConfigMap => self
                .config_maps
                .get(&ObjectRef::new(&r.name).within(namespace))
                .is_some(),
        };
        if cached {
            return Ok(true);
        }
        Ok(self.live_version(namespace, r).await?.is_some())
    }

    /// The current `(uid, resourceVersion)` of `r`, read live (a small metadata-only GET) so a stamp never
    /// rests on a watch event that has not arrived yet; `None` when the object does not exist.
    pub async fn live_version(
        &self,
        namespace: &str,
        r: &ResourceRef,
    ) -> Result<Option<Version>, kube::Error> {
        let (client, ns, name, metrics) = (
            self.client.clone(),
            namespace.to_string(),
            r.name.clone(),
            self.live.metrics.clone(),
        );
        let kind = r.kind;
        let key = (kind, namespace.to_string(), r.name.clone());
        self.live
            .versions
            .run(key, move || async move {
                metrics.live_get_sent(kind_label(kind));
                let meta = match kind {
                    ResourceKind::Secret => Api::<Secret>::namespaced(client, &ns)
                        .get_metadata_opt(&name)
                        .await?
                        .map(|m| m.metadata),
                    ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client, &ns)
                        .get_metadata_opt(&name)
                        .await?
                        .map(|m| m.metadata),
                };
                Ok(meta.as_ref().and_then(Version::of))
            })
            .await
            .map_err(unshare)
    }

    /// Objects of `kind` in `namespace` as the watch cache counts them (what [`read_plan`] weighs).
    pub fn cached_in(&self, kind: ResourceKind, namespace: &str) -> usize {
        match kind {
            ResourceKind::Secret => self.secret_counts.get(namespace),
            ResourceKind::ConfigMap => self.config_map_counts.get(namespace),
        }
    }

    /// The current versions of `refs` (in their order), read live as [`Caches::live_version`] reads one: per kind,
    /// one metadata LIST of the namespace when [`read_plan`] says so, else (and for whatever a truncated LIST did
    /// not cover, or when the LIST fails) one GET per object; all at once.
    pub async fn live_versions(
        &self,
        namespace: &str,
        refs: &[&ResourceRef],
    ) -> Vec<Result<Option<Version>, kube::Error>> {
        let of_kind = |kind: ResourceKind| async move {
            let mine: Vec<(usize, &ResourceRef)> = refs
                .iter()
                .copied()
                .enumerate()
                .filter(|(_, r)| r.kind == kind)
                .collect();
            let distinct = mine.iter().map(|(_, r)| &r.name).collect::<BTreeSet<_>>();
            let listed = match read_plan(distinct.len(), self.cached_in(kind, namespace)) {
                ReadPlan::List { limit } => match self.live_list(kind, namespace, limit).await {
                    Ok(listed) => Some(listed),
                    Err(error) => {
                        tracing::debug!(namespace, kind = kind_label(kind), %error, "live LIST failed; reading each object");
                        None
                    }
                },
                ReadPlan::Gets => None,
            };
            join_all(mine.into_iter().map(|(i, r)| {
                let listed = listed.clone();
                async move {
                    let version = match listed.as_deref().and_then(|l| l.lookup(&r.name)) {
                        Some(found) => Ok(found),
                        None => self.live_version(namespace, r).await,
                    };
                    (i, version)
                }
            }))
            .await
        };
        let (secrets, config_maps) = futures::join!(
            of_kind(ResourceKind::Secret),
            of_kind(ResourceKind::ConfigMap)
        );
        let mut out: Vec<Option<Result<Option<Version>, kube::Error>>> =
            refs.iter().map(|_| None).collect();
        for (i, version) in secrets.into_iter().chain(config_maps) {
            out[i] = Some(version);
        }
        out.into_iter().map(|v| v.unwrap_or(Ok(None))).collect()
    }

    /// One metadata LIST of `kind` in `namespace`, at most `limit` objects, as fresh as a GET ([`fresh_list`]).
    async fn live_list(
        &self,
        kind: ResourceKind,
        namespace: &str,
        limit: u32,
    ) -> Result<Arc<Listed>, kube::Error> {
        let (client, ns, metrics) = (
            self.client.clone(),
            namespace.to_string(),
            self.live.metrics.clone(),
        );
        self.live
            .lists
            .run((kind, namespace.to_string()), move || async move {
                metrics.live_list_sent(kind_label(kind));
                let params = fresh_list(limit);
                let (items, list_meta) = match kind {
                    ResourceKind::Secret => {
                        let list = Api::<Secret>::namespaced(client, &ns)
                            .list_metadata(&params)
                            .await?;
                        (
                            list.items
                                .into_iter()
                                .map(|m| m.metadata)
                                .collect::<Vec<_>>(),
                            list.metadata,
                        )
                    }
                    ResourceKind::ConfigMap => {
                        let list = Api::<ConfigMap>::namespaced(client, &ns)
                            .list_metadata(&params)
                            .await?;
                        (
                            list.items.into_iter().map(|m| m.metadata).collect(),
                            list.metadata,
                        )
                    }
                };
                Ok(Arc::new(Listed {
                    versions: items
                        .iter()
                        .filter_map(|m| Some((m.name.clone()?, Version::of(m)?)))
                        .collect(),
                    complete: list_meta.continue_.as_deref().is_none_or(str::is_empty),
                }))
            })
            .await
            .map_err(unshare)
    }

    /// The whole object `r`, read live (content is never cached, only its digest); `None` when absent.
    pub async fn live_object(
        &self,
        namespace: &str,
        r: &ResourceRef,
    ) -> Result<Option<Arc<Fetched>>, kube::Error> {
        let (client, ns, name, metrics) = (
            self.client.clone(),
            namespace.to_string(),
            r.name.clone(),
            self.live.metrics.clone(),
        );
        let kind = r.kind;
        let key = (kind, namespace.to_string(), r.name.clone());
        self.live
            .objects
            .run(key, move || async move {
                metrics.live_get_sent(kind_label(kind));
                Ok(match kind {
                    ResourceKind::Secret => Api::<Secret>::namespaced(client, &ns)
                        .get_opt(&name)
                        .await?
                        .map(|s| Arc::new(Fetched::Secret(s))),
                    ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client, &ns)
                        .get_opt(&name)
                        .await?
                        .map(|c| Arc::new(Fetched::ConfigMap(c))),
                })
            })
            .await
            .map_err(unshare)
    }

    /// Labels of a namespace and whether it is being deleted: the cache, else a live GET.
    /// `None` when the namespace does not exist.
    pub async fn namespace(&self, name: &str) -> Result<Option<NamespaceInfo>, kube::Error> {
        if let Some(ns) = self.namespaces.get(&ObjectRef::new(name)) {
            return Ok(Some(NamespaceInfo::of(&ns.metadata)));
        }
        let (client, owned, metrics) = (
            self.client.clone(),
            name.to_string(),
            self.live.metrics.clone(),
        );
        self.live
            .namespaces
            .run(name.to_string(), move || async move {
                metrics.live_get_sent(CACHE_NAMESPACES);
                let live = Api::<Namespace>::all(client)
                    .get_metadata_opt(&owned)
                    .await?;
                Ok(live.map(|ns| NamespaceInfo::of(&ns.metadata)))
            })
            .await
            .map_err(unshare)
    }

    /// The Fleet Policies of `namespace`, from the watch cache; `None` until that cache is synced
    /// (no Policy CRD, or not listed yet): the caller then cannot tell.
    pub fn policies_in(&self, namespace: &str) -> Option<Vec<Policy>> {
        if !self.policies_synced[0].load(Ordering::Acquire) {
            return None;
        }
        Some(
            self.policies
                .state_filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
                .iter()
                .map(|p| Policy::clone(p))
                .collect(),
        )
    }

    /// HelmOps of `namespace` that are not being deleted, from the watch cache.
    pub fn helmops_in(&self, namespace: &str) -> Vec<Arc<GuardedHelmOp>> {
        self.helmops.state_filter(|h| {
            h.metadata.namespace.as_deref() == Some(namespace)
                && h.metadata.deletion_timestamp.is_none()
        })
    }
}

/// The image stage's reads go through the same permits, sharing and `live_gets_total` as every other
/// live read (a pod listing thousands of pull secrets once made hundreds of uncounted GETs).
impl helmop_images::pull_secrets::PullSecretSource for Caches {
    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<Secret>, kube::Error>> {
        Box::pin(async move {
            let fetched = self
                .live_object(namespace, &ResourceRef::secret(name))
                .await?;
            Ok(fetched.and_then(|f| match f.as_ref() {
                Fetched::Secret(s) => Some(s.clone()),
                Fetched::ConfigMap(_) => None,
            }))
        })
    }

    fn service_account<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<ServiceAccount>, kube::Error>> {
        Box::pin(async move {
            let (client, ns, owned, metrics) = (
                self.client.clone(),
                namespace.to_string(),
                name.to_string(),
                self.live.metrics.clone(),
            );
            self.live
                .accounts
                .run(
                    (namespace.to_string(), name.to_string()),
                    move || async move {
                        metrics.live_get_sent(LIVE_SERVICEACCOUNTS);
                        Ok(Api::<ServiceAccount>::namespaced(client, &ns)
                            .get_opt(&owned)
                            .await?
                            .map(|mut sa| {
                                // Only the pull-secret names are read; the rest is not kept.
                                sa.metadata = kube::api::ObjectMeta {
                                    name: sa.metadata.name,
                                    namespace: sa.metadata.namespace,
                                    ..Default::default()
                                };
                                sa.secrets = None;
                                Arc::new(sa)
                            }))
                    },
                )
                .await
                .map(|sa| sa.map(|sa| (*sa).clone()))
                .map_err(unshare)
        })
    }
}

impl crate::images::ImageReads for Caches {
    fn namespace_annotations<'a>(
        &'a self,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<BTreeMap<String, String>>, kube::Error>> {
        Box::pin(async move { Ok(self.namespace(name).await?.map(|ns| ns.annotations)) })
    }
}

/// Reading the versions of several objects of one kind in one namespace takes one LIST instead of one GET each
/// when there are at least two and the namespace holds at most this many objects of that kind per object read:
/// the API server reads (and decodes) every object of the namespace for a LIST, so this bounds what a LIST costs
/// to this many times what the GETs it replaces would cost, whatever else the namespace holds.
pub const LIST_SPREAD: usize = 2;

/// How the versions of the objects of one kind a stamp reads in one namespace are read live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPlan {
    /// One metadata GET per object.
    Gets,
    /// One metadata LIST of the namespace, at most `limit` objects.
    List { limit: u32 },
}

/// The plan for reading `refs` distinct objects of one kind in a namespace whose watch cache holds `in_namespace`
/// objects of that kind. The count only picks the cheaper request: a cache that lags makes the LIST bigger or the
/// GETs more numerous, never the answer older (both are fresh reads), and the LIST's `limit` caps it anyway.
pub fn read_plan(refs: usize, in_namespace: usize) -> ReadPlan {
    let limit = refs.saturating_mul(LIST_SPREAD);
    match u32::try_from(limit) {
        Ok(limit) if refs >= 2 && in_namespace <= limit as usize => ReadPlan::List { limit },
        _ => ReadPlan::Gets,
    }
}

/// The parameters of a LIST as fresh as a GET: no `resourceVersion`, so the API server answers with the latest
/// state (a quorum read of etcd; on API servers that serve consistent LISTs from their watch cache, after that
/// cache caught up with etcd), never with an older state of its cache as `resourceVersion=0` would allow.
pub fn fresh_list(limit: u32) -> ListParams {
    ListParams::default().limit(limit)
}

/// What a LIST found: each object's version by name, and whether the namespace holds nothing more (no `limit`
/// cut it short), so that an object not listed is absent.
#[derive(Debug)]
pub struct Listed {
    versions: HashMap<String, Version>,
    complete: bool,
}

impl Listed {
    /// `Some(Some(version))` listed, `Some(None)` absent, `None` unknown (the LIST was cut short).
    fn lookup(&self, name: &str) -> Option<Option<Version>> {
        match self.versions.get(name) {
            Some(version) => Some(Some(version.clone())),
            None => self.complete.then_some(None),
        }
    }
}

/// A live GET's error, shared by every caller of a coalesced GET.
type SharedError = Arc<kube::Error>;

/// One object's live GETs: (kind, namespace, name).
type ObjectKey = (ResourceKind, String, String);

/// The coalescers of every live GET, sharing one bound.
#[derive(Clone)]
struct LiveGets {
    versions: Coalescer<ObjectKey, Result<Option<Version>, SharedError>>,
    objects: Coalescer<ObjectKey, Result<Option<Arc<Fetched>>, SharedError>>,
    lists: Coalescer<(ResourceKind, String), Result<Arc<Listed>, SharedError>>,
    namespaces: Coalescer<String, Result<Option<NamespaceInfo>, SharedError>>,
    accounts: Coalescer<(String, String), Result<Option<Arc<ServiceAccount>>, SharedError>>,
    metrics: Metrics,
}

impl LiveGets {
    fn new(max: usize, metrics: &Metrics) -> LiveGets {
        let permits = Arc::new(tokio::sync::Semaphore::new(
            max.clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
        ));
        LiveGets {
            versions: Coalescer::new(permits.clone()),
            objects: Coalescer::new(permits.clone()),
            lists: Coalescer::new(permits.clone()),
            namespaces: Coalescer::new(permits.clone()),
            accounts: Coalescer::new(permits),
            metrics: metrics.clone(),
        }
    }
}

fn kind_label(kind: ResourceKind) -> &'static str {
    match kind {
        ResourceKind::Secret => CACHE_SECRETS,
        ResourceKind::ConfigMap => CACHE_CONFIGMAPS,
    }
}

/// The error of a shared GET, for one caller: the API server's status is kept as is (callers tell "not
/// found" and "forbidden" apart by it); anything else becomes its message.
fn unshare(e: SharedError) -> kube::Error {
    match Arc::try_unwrap(e) {
        Ok(e) => e,
        Err(shared) => match &*shared {
            kube::Error::Api(status) => kube::Error::Api(status.clone()),
            other => kube::Error::Service(other.to_string().into()),
        },
    }
}

/// What the opt-in decision and the delete guard read from a Namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub labels: BTreeMap<String, String>,
    /// Only helmop's own (`helmop.dev/...`), e.g. per-namespace overrides.
    pub annotations: BTreeMap<String, String>,
    pub terminating: bool,
}

impl NamespaceInfo {
    fn of(meta: &kube::api::ObjectMeta) -> NamespaceInfo {
        NamespaceInfo {
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: helmop_annotations(meta),
            terminating: meta.deletion_timestamp.is_some(),
        }
    }
}

fn helmop_annotations(meta: &kube::api::ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A ConfigMap or Secret read live, to be digested and dropped (shared by the callers of one coalesced GET).
pub enum Fetched {
    Secret(Secret),
    ConfigMap(ConfigMap),
}

impl Fetched {
    pub fn version(&self) -> Option<Version> {
        match self {
            Fetched::Secret(s) => Version::of(&s.metadata),
            Fetched::ConfigMap(c) => Version::of(&c.metadata),
        }
    }

    /// What a pod can read of it, in the form the core hash takes.
    pub fn data(&self) -> ObjectData<'_> {
        match self {
            Fetched::Secret(s) => ObjectData::from(s),
            Fetched::ConfigMap(c) => ObjectData::from(c),
        }
    }
}

// Only what the lookups read is kept: annotations can be large (and, for a Secret applied with kubectl,
// `last-applied-configuration` holds its data), managed fields are large and never needed.
fn strip_object_meta<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.annotations = None;
    meta.labels = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
}

fn strip_namespace(ns: &mut PartialObjectMeta<Namespace>) {
    let meta = ns.meta_mut();
    meta.annotations = Some(helmop_annotations(meta)).filter(|a| !a.is_empty());
    meta.managed_fields = None;
    meta.owner_references = None;
}

/// Whether the API server serves `ar`: `Ok(false)` only when its group version is not served
/// (404) or does not list the resource; any other error is returned, so a flaky API server never
/// makes the webhook conclude that there are no HelmOps.
async fn served(client: &Client, ar: &ApiResource) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(&ar.api_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == ar.plural)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Asks discovery every [`HELMOP_DISCOVERY_PERIOD`] until HelmOps are served, marking them absent
/// meanwhile, then starts their watch (which marks the cache synced after its initial list). Absent
/// is cleared before the watch starts, so from then on the guard waits for the real list.
async fn watch_helmops_when_served(
    client: Client,
    ar: ApiResource,
    writer: reflector::store::Writer<GuardedHelmOp>,
    metrics: Metrics,
    synced: Arc<[AtomicBool; 4]>,
    absent: Arc<AtomicBool>,
) {
    loop {
        match served(&client, &ar).await {
            Ok(true) => break,
            Ok(false) => {
                if !absent.swap(true, Ordering::AcqRel) {
                    tracing::info!(
                        cache = CACHE_HELMOPS,
                        "the API server serves no HelmOps (no Fleet CRD): nothing to guard until it does"
                    );
                }
            }
            Err(error) => {
                tracing::warn!(cache = CACHE_HELMOPS, %error, "HelmOp discovery failed, retrying")
            }
        }
        tokio::time::sleep(HELMOP_DISCOVERY_PERIOD).await;
    }
    if absent.swap(false, Ordering::AcqRel) {
        tracing::info!(
            cache = CACHE_HELMOPS,
            "the API server serves HelmOps now: starting their watch"
        );
    }
    spawn_reflector(
        (
            Api::<GuardedHelmOp>::all_with(client, &ar),
            watcher::Config::default().page_size(HELMOP_PAGE_SIZE),
        ),
        writer,
        |_| {},
        CACHE_HELMOPS,
        metrics,
        (synced, SYNCED_HELMOPS),
        |_, _| {},
    );
}

/// Waits (asking discovery every [`HELMOP_DISCOVERY_PERIOD`]) until Fleet's Policy kind is
/// served, then watches Policies. Older Fleets have none; then nothing is ever warned about.
async fn watch_policies_when_served(
    client: Client,
    writer: reflector::store::Writer<Policy>,
    metrics: Metrics,
    synced: Arc<[AtomicBool; 1]>,
) {
    let ar = ApiResource::erase::<Policy>(&());
    loop {
        match served(&client, &ar).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(cache = CACHE_POLICIES, %error, "Policy discovery failed, retrying")
            }
        }
        tokio::time::sleep(HELMOP_DISCOVERY_PERIOD).await;
    }
    tracing::info!(
        cache = CACHE_POLICIES,
        "the API server serves Fleet Policies: starting their watch"
    );
    spawn_reflector(
        (Api::<Policy>::all(client), watcher::Config::default()),
        writer,
        strip_policy,
        CACHE_POLICIES,
        metrics,
        (synced, 0),
        |_, _| {},
    );
}

fn strip_policy(p: &mut Policy) {
    p.metadata.managed_fields = None;
    p.metadata.annotations = None;
}

/// Counts the objects per namespace of a metadata cache into `counts`, from each event before the store applies it.
fn counting<K>(counts: &NamespaceCounts) -> impl Fn(&watcher::Event<K>, &Store<K>) + Send + 'static
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let counts = counts.clone();
    move |event, store| counts.record(event, |obj| store.get(&ObjectRef::from_obj(obj)).is_some())
}

fn spawn_reflector<K, const N: usize>(
    (api, config): (Api<K>, watcher::Config),
    writer: reflector::store::Writer<K>,
    strip: fn(&mut K),
    cache: &'static str,
    metrics: Metrics,
    (synced, index): (Arc<[AtomicBool; N]>, usize),
    before_store: impl Fn(&watcher::Event<K>, &Store<K>) + Send + 'static,
) -> Store<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    <K as Resource>::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let store = writer.as_reader();
    let ready = store.clone();
    tokio::spawn(async move {
        if ready.wait_until_ready().await.is_ok() {
            synced[index].store(true, Ordering::Release);
            tracing::info!(cache, objects = ready.len(), "cache synced");
        }
    });
    let counted = store.clone();
    let previous = store.clone();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(strip)
        .map(move |event| {
            if let Ok(event) = &event {
                before_store(event, &previous);
            }
            event
        })
        .reflect(writer);
    tokio::spawn(drive(stream, cache, move || {
        metrics.set_cache_objects(cache, i64::try_from(counted.len()).unwrap_or(i64::MAX));
    }));
    store
}

async fn drive<K>(
    stream: impl Stream<Item = watcher::Result<watcher::Event<K>>>,
    cache: &'static str,
    after: impl Fn(),
) {
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(_) => after(),
            // The watcher resumes by itself (with backoff); the store keeps serving the last state meanwhile.
            Err(error) => tracing::warn!(cache, %error, "watch failed, retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_replaces_gets_only_for_several_objects_in_a_small_namespace() {
        assert_eq!(read_plan(0, 0), ReadPlan::Gets);
        assert_eq!(
            read_plan(1, 0),
            ReadPlan::Gets,
            "one object: a GET is cheaper"
        );
        assert_eq!(read_plan(2, 4), ReadPlan::List { limit: 4 });
        assert_eq!(read_plan(8, 0), ReadPlan::List { limit: 16 });
        assert_eq!(read_plan(8, 16), ReadPlan::List { limit: 16 });
        assert_eq!(
            read_plan(8, 17),
            ReadPlan::Gets,
            "a LIST would read more than LIST_SPREAD objects per reference"
        );
        assert_eq!(read_plan(usize::MAX, 0), ReadPlan::Gets);
    }

    #[test]
    fn the_list_is_as_fresh_as_a_get() {
        // No resourceVersion (nor a match rule): the API server answers with the latest state, as for a GET.
        // `resourceVersion=0` would let it answer from a watch cache that has not seen the latest write.
        let params = fresh_list(16);
        assert_eq!(params.resource_version, None);
        assert!(params.version_match.is_none());
        assert_eq!(params.limit, Some(16));
        assert_eq!(params.continue_token, None);
    }

    #[test]
    fn an_object_missing_from_a_cut_short_list_is_unknown() {
        let version = Version {
            uid: "u".into(),
            resource_version: "7".into(),
        };
        let listed = |complete| Listed {
            versions: HashMap::from([("db".to_string(), version.clone())]),
            complete,
        };
        assert_eq!(listed(true).lookup("db"), Some(Some(version.clone())));
        assert_eq!(listed(true).lookup("other"), Some(None));
        assert_eq!(listed(false).lookup("db"), Some(Some(version.clone())));
        assert_eq!(listed(false).lookup("other"), None);
    }

    #[test]
    fn stripping_drops_annotations_but_keeps_identity() {
        let mut s = PartialObjectMeta::<Secret> {
            metadata: kube::api::ObjectMeta {
                name: Some("db".into()),
                namespace: Some("app".into()),
                uid: Some("u".into()),
                resource_version: Some("7".into()),
                annotations: Some(
                    [(
                        "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                        "{..}".to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        strip_object_meta(&mut s);
        assert_eq!(s.metadata.annotations, None);
        assert_eq!(s.metadata.name.as_deref(), Some("db"));
        assert_eq!(
            Version::of(&s.metadata),
            Some(Version {
                uid: "u".into(),
                resource_version: "7".into()
            })
        );
    }

    #[test]
    fn namespaces_keep_labels_and_only_helmop_annotations() {
        let mut ns = PartialObjectMeta::<Namespace> {
            metadata: kube::api::ObjectMeta {
                name: Some("team".into()),
                labels: Some(
                    [(
                        "helmop.dev/rollout-on-change".to_string(),
                        "enabled".to_string(),
                    )]
                    .into(),
                ),
                annotations: Some(
                    [
                        ("helmop.dev/image-mode".to_string(), "annotate".to_string()),
                        (
                            "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                            "{..}".to_string(),
                        ),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        strip_namespace(&mut ns);
        let info = NamespaceInfo::of(&ns.metadata);
        assert_eq!(
            info.labels
                .get("helmop.dev/rollout-on-change")
                .map(String::as_str),
            Some("enabled")
        );
        assert_eq!(
            info.annotations.keys().collect::<Vec<_>>(),
            ["helmop.dev/image-mode"]
        );
        assert!(!info.terminating);
    }
}
