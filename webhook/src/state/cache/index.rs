//! Questions answered from the watch caches: whether an object exists, a namespace's labels, the
//! Policies of a namespace, the HelmOps that list an object. A miss where the cache cannot tell (not
//! synced, or an object created a moment ago) falls back to one live GET.

use super::*;

impl Caches {
    /// Whether `r` exists in `namespace`: the metadata cache, else a live GET.
    pub async fn exists(&self, namespace: &str, r: &ResourceRef) -> Result<bool, kube::Error> {
        if self.cached(namespace, r) {
            return Ok(true);
        }
        Ok(self.live_version(namespace, r).await?.is_some())
    }

    /// Whether the metadata cache holds `r` in `namespace`. `false` proves nothing (see [`Caches::exists`]).
    pub fn cached(&self, namespace: &str, r: &ResourceRef) -> bool {
        match r.kind {
            ResourceKind::Secret => self
                .secrets
                .get(&ObjectRef::new(&r.name).within(namespace))
                .is_some(),
            ResourceKind::ConfigMap => self
                .config_maps
                .get(&ObjectRef::new(&r.name).within(namespace))
                .is_some(),
        }
    }

    /// Objects of `kind` in `namespace` as the watch cache counts them (what [`read_plan`] weighs).
    pub fn cached_in(&self, kind: ResourceKind, namespace: &str) -> usize {
        match kind {
            ResourceKind::Secret => self.secret_counts.get(namespace),
            ResourceKind::ConfigMap => self.config_map_counts.get(namespace),
        }
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
