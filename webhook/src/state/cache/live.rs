//! Reads past the caches: GETs, and one metadata LIST where it costs less ([`read_plan`]), all through
//! [`LiveGets`], bounded in number and shared by concurrent callers asking for the same thing, and
//! counted in `helmop_webhook_live_gets_total`/`live_lists_total`. The image stage's ServiceAccount and
//! pull-secret reads take the same road.

use super::*;

impl Caches {
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
    pub(super) versions: HashMap<String, Version>,
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
pub(super) type SharedError = Arc<kube::Error>;

/// A ServiceAccount read live, as the image stage needs it (pull-secret names only).
pub(super) type AccountRead = Result<Option<Arc<ServiceAccount>>, SharedError>;

/// One object's live GETs: (kind, namespace, name).
pub(super) type ObjectKey = (ResourceKind, String, String);

/// The coalescers of every live GET, sharing one bound.
#[derive(Clone)]
pub(super) struct LiveGets {
    pub(super) versions: Coalescer<ObjectKey, Result<Option<Version>, SharedError>>,
    pub(super) objects: Coalescer<ObjectKey, Result<Option<Arc<Fetched>>, SharedError>>,
    pub(super) lists: Coalescer<(ResourceKind, String), Result<Arc<Listed>, SharedError>>,
    pub(super) namespaces: Coalescer<String, Result<Option<NamespaceInfo>, SharedError>>,
    pub(super) accounts: Coalescer<(String, String), AccountRead>,
    pub(super) metrics: Metrics,
}

impl LiveGets {
    pub(super) fn new(max: usize, metrics: &Metrics) -> LiveGets {
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

pub(super) fn kind_label(kind: ResourceKind) -> &'static str {
    match kind {
        ResourceKind::Secret => CACHE_SECRETS,
        ResourceKind::ConfigMap => CACHE_CONFIGMAPS,
    }
}

/// The error of a shared GET, for one caller: the API server's status is kept as is (callers tell "not
/// found" and "forbidden" apart by it); anything else becomes its message.
pub(super) fn unshare(e: SharedError) -> kube::Error {
    match Arc::try_unwrap(e) {
        Ok(e) => e,
        Err(shared) => match &*shared {
            kube::Error::Api(status) => kube::Error::Api(status.clone()),
            other => kube::Error::Service(other.to_string().into()),
        },
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
}
