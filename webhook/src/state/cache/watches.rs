//! The watches that fill the caches: metadata-only reflectors for Secrets, ConfigMaps and Namespaces,
//! HelmOps and Policies once their CRDs are served, each object trimmed to what the lookups read
//! before it is stored.

use super::*;

pub(super) fn strip_object_meta<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.annotations = None;
    meta.labels = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
}

pub(super) fn strip_namespace(ns: &mut PartialObjectMeta<Namespace>) {
    let meta = ns.meta_mut();
    meta.annotations = Some(helmop_annotations(meta)).filter(|a| !a.is_empty());
    meta.managed_fields = None;
    meta.owner_references = None;
}

/// Whether the API server serves `ar`: `Ok(false)` only when its group version is not served
/// (404) or does not list the resource; any other error is returned, so a flaky API server never
/// makes the webhook conclude that there are no HelmOps.
pub(super) async fn served(client: &Client, ar: &ApiResource) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(&ar.api_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == ar.plural)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Asks discovery every [`HELMOP_DISCOVERY_PERIOD`] until HelmOps are served, marking them absent
/// meanwhile, then starts their watch (which marks the cache synced after its initial list). Absent
/// is cleared before the watch starts, so from then on the guard waits for the real list.
pub(super) async fn watch_helmops_when_served(
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
pub(super) async fn watch_policies_when_served(
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

pub(super) fn strip_policy(p: &mut Policy) {
    p.metadata.managed_fields = None;
    p.metadata.annotations = None;
}

/// Counts the objects per namespace of a metadata cache into `counts`, from each event before the store applies it.
pub(super) fn counting<K>(
    counts: &NamespaceCounts,
) -> impl Fn(&watcher::Event<K>, &Store<K>) + Send + 'static
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let counts = counts.clone();
    move |event, store| counts.record(event, |obj| store.get(&ObjectRef::from_obj(obj)).is_some())
}

pub(super) fn spawn_reflector<K, const N: usize>(
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

pub(super) async fn drive<K>(
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
}
