//! What is downstream: the metadata of this upstream's copies on a cluster, and of every object
//! standing where a copy is wanted. Objects are listed by metadata only, in small pages, and what
//! is not this upstream's (another upstream's copies, look-alikes carrying helmop's label) is
//! dropped page by page unless it stands at a wanted place: memory follows this run's wants, not
//! what others label. Given the upstream hash key, only this upstream's copies at wanted places
//! (and, with `--adopt`, the objects to adopt there) are read whole, one by one, and their content
//! hashed in memory (drift detection, `type`, `immutable`): the data itself is dropped right there,
//! never kept, logged or printed.
//!
//! Credentials limited to some namespaces (a namespace-scoped kubeconfig) cannot list across the
//! cluster: then the namespaces of the wanted places are listed one by one, and copies elsewhere
//! are not seen (so never judged).

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};
use helmop_core::hash::{HashKey, ObjectData, content_hash};
use helmop_core::names;
use helmop_core::plan::{LiveFacts, ObservedCopy, OwnerRef, SourceRef, parse_owners};
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::targeting::namespace_gate::NamespaceFacts;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client};

use crate::cluster::kept_hashes::{Hashed, KeptHashes, LiveHash, Place, Taken};
use crate::cluster::kept_listings::KeptListings;
use crate::cluster::lean_list::metadata_page;

/// Objects per list page: metadata only, but annotations may hold up to 256 KiB per object, so
/// a page is bounded at a few MiB whatever others store.
pub const PAGE: u32 = 50;

/// How many objects are read at once.
const READS_AT_ONCE: usize = 8;

/// The copies found on one cluster.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    pub copies: Vec<ObservedCopy>,
    /// `resourceVersion` per (namespace, resource), for write preconditions.
    pub versions: BTreeMap<(String, ResourceRef), String>,
    /// What a write must know of the live objects (read only when a hash key was given).
    pub live: BTreeMap<(String, ResourceRef), LiveFacts>,
    /// The destination namespaces read while looking for objects at wanted places, as found
    /// then: a run writing there need not read them again.
    pub namespaces: BTreeMap<String, NamespaceState>,
    /// The destination namespaces of HelmOps with `allowedTargetNamespaceSelector`, with their
    /// labels: whether Fleet's agent would copy there ([`namespace_facts`]).
    pub gated: BTreeMap<String, NamespaceFacts>,
    /// The kinds that came from a kept listing, not from a list request ([`Looking::from_kept`]).
    pub kept: Vec<ResourceKind>,
}

/// A destination namespace as this run knows it: as read, or as the run left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceState {
    Absent,
    Active,
    /// Being deleted: the API server refuses new objects in it.
    Terminating,
    /// Created by this run: it was empty when made, so nothing in it can have read a copy yet.
    Created,
    /// The credentials may not read the Namespace object (namespace-scoped): its objects are
    /// tried as if it were active.
    Unreadable,
}

/// The state of `namespace` (one metadata GET).
pub async fn namespace_state(
    client: &Client,
    namespace: &str,
) -> Result<NamespaceState, kube::Error> {
    let found = match Api::<Namespace>::all(client.clone())
        .get_metadata_opt(namespace)
        .await
    {
        Err(kube::Error::Api(ae)) if ae.code == 403 => return Ok(NamespaceState::Unreadable),
        other => other?,
    };
    Ok(match found {
        None => NamespaceState::Absent,
        Some(ns) if ns.metadata.deletion_timestamp.is_some() => NamespaceState::Terminating,
        Some(_) => NamespaceState::Active,
    })
}

/// `namespace` with its labels (one metadata GET), for `allowedTargetNamespaceSelector`.
pub async fn namespace_facts(
    client: &Client,
    namespace: &str,
) -> Result<NamespaceFacts, kube::Error> {
    match Api::<Namespace>::all(client.clone())
        .get_metadata_opt(namespace)
        .await
    {
        Err(kube::Error::Api(ae)) if ae.code == 403 => Ok(NamespaceFacts::Unreadable),
        Err(e) => Err(e),
        Ok(None) => Ok(NamespaceFacts::Absent),
        Ok(Some(ns)) => Ok(NamespaceFacts::Present(
            ns.metadata.labels.unwrap_or_default(),
        )),
    }
}

impl Observation {
    pub fn get(&self, namespace: &str, resource: &ResourceRef) -> Option<&ObservedCopy> {
        self.copies
            .iter()
            .find(|o| o.namespace == namespace && &o.resource == resource)
    }

    pub fn version(&self, namespace: &str, resource: &ResourceRef) -> Option<&str> {
        self.versions
            .get(&(namespace.to_string(), resource.clone()))
            .map(String::as_str)
    }

    pub fn live(&self, namespace: &str, resource: &ResourceRef) -> Option<&LiveFacts> {
        self.live.get(&(namespace.to_string(), resource.clone()))
    }

    fn add(&mut self, cluster: &str, kind: ResourceKind, meta: ObjectMeta, live: Option<Live>) {
        // An object being deleted is not a copy any more: a run plans a new one (whose create
        // then waits for the old one to go, reported as such).
        if meta.deletion_timestamp.is_some() {
            return;
        }
        let (Some(name), Some(namespace)) = (meta.name, meta.namespace) else {
            return;
        };
        let resource = ResourceRef::new(kind, name);
        let key = (namespace.clone(), resource.clone());
        if self.versions.contains_key(&key) {
            return;
        }
        let version = meta.resource_version.unwrap_or_default();
        self.versions.insert(key.clone(), version.clone());
        let data_hash = live.as_ref().map(|l| l.hash.clone());
        if let Some(l) = live {
            self.live.insert(
                key,
                LiveFacts {
                    type_: l.type_,
                    immutable: l.immutable,
                    resource_version: version,
                    data_hash: Some(l.hash),
                },
            );
        }
        self.copies.push(ObservedCopy {
            cluster: cluster.to_string(),
            namespace,
            resource,
            uid: meta.uid.unwrap_or_default(),
            labels: meta.labels.unwrap_or_default(),
            annotations: meta.annotations.unwrap_or_default(),
            data_hash,
        });
    }
}

/// What is kept of a live object read whole: never its data.
type Live = LiveHash;

fn secret_live(key: &HashKey, s: Secret) -> (ObjectMeta, Live) {
    let live = Live {
        hash: content_hash(key, ResourceKind::Secret, &ObjectData::from(&s)),
        type_: s.type_.clone(),
        immutable: s.immutable.unwrap_or(false),
    };
    (s.metadata, live)
}

fn config_map_live(key: &HashKey, c: ConfigMap) -> (ObjectMeta, Live) {
    let live = Live {
        hash: content_hash(key, ResourceKind::ConfigMap, &ObjectData::from(&c)),
        type_: None,
        immutable: c.immutable.unwrap_or(false),
    };
    (c.metadata, live)
}

/// What one observation looks for.
pub struct Looking<'a> {
    /// The places (namespace, resource) where copies are wanted, or protected for another
    /// registration of the cluster.
    pub places: &'a BTreeSet<(String, ResourceRef)>,
    /// This upstream's ids (the current one and its aliases): an object whose source marker or
    /// owners entries carry one is this upstream's business wherever it stands.
    pub upstream_ids: &'a [String],
    /// The upstream hash key: read this upstream's copies at wanted places whole and hash them.
    pub key: Option<&'a HashKey>,
    /// `--adopt`: objects at wanted places that are not this upstream's are read whole too (the
    /// write must know their `type` and `immutable`).
    pub adopt: bool,
    /// Hashes taken by earlier runs of a watcher: a copy unchanged since is not read again.
    pub kept: Option<&'a KeptHashes>,
    /// The kinds listed: every kind, but in a run that works on some only
    /// ([`crate::run::inventory::Inventory::kinds`]); `places` holds none of the others.
    pub kinds: &'a [ResourceKind],
    /// A watcher's last listings: each listing made is kept there, and with `from_kept` a kept
    /// listing of what is looked for now stands in for a new one
    /// ([`crate::cluster::kept_listings`]).
    pub listings: Option<&'a KeptListings>,
    pub from_kept: bool,
}

impl Looking<'_> {
    /// Whether an object's markers name this upstream (a claim: the planner checks it).
    fn names_us(&self, meta: &ObjectMeta) -> bool {
        let Some(annotations) = &meta.annotations else {
            return false;
        };
        let ours = |id: &str| self.upstream_ids.iter().any(|u| u == id);
        let source = annotations
            .get(names::ANN_SOURCE)
            .and_then(|s| SourceRef::parse(s))
            .is_some_and(|s| ours(&s.upstream_id));
        source
            || annotations.get(names::ANN_OWNERS).is_some_and(|owners| {
                parse_owners(owners)
                    .iter()
                    .filter_map(|e| OwnerRef::parse(e))
                    .any(|o| ours(&o.upstream_id))
            })
    }

    /// Tells what a listing of `kind` keeps apart (the places of that kind and this upstream's
    /// ids): a listing kept for other places is not used.
    fn looking_for(&self, kind: ResourceKind) -> u64 {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let mut h = DefaultHasher::new();
        kind.hash(&mut h);
        self.upstream_ids.hash(&mut h);
        for place in self.places.iter().filter(|(_, r)| r.kind == kind) {
            place.hash(&mut h);
        }
        h.finish()
    }

    fn wanted(&self, kind: ResourceKind, meta: &ObjectMeta) -> bool {
        let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
            return false;
        };
        self.places
            .contains(&(ns.clone(), ResourceRef::new(kind, name.clone())))
    }
}

/// Observes one cluster (`cluster` is the plan's key); see the module documentation.
pub async fn observe(
    client: &Client,
    cluster: &str,
    looking: &Looking<'_>,
) -> Result<Observation, kube::Error> {
    let mut obs = Observation::default();
    let selector = format!("{}={}", names::LABEL_MANAGED_BY, names::MANAGER);
    // (kind, metadata, read whole?) of every labelled object kept (this upstream's, or at a
    // wanted place), judged once as it is listed.
    let mut listed: Vec<(ResourceKind, ObjectMeta, bool)> = Vec::new();
    for &kind in looking.kinds {
        // Only a watcher keeps listings: a one-shot run does not hash its places for them.
        let fingerprint = looking.listings.map(|l| (l, looking.looking_for(kind)));
        let kept = fingerprint
            .filter(|_| looking.from_kept)
            .and_then(|(l, looking_for)| l.get(cluster, kind, looking_for));
        // What a list request finds is kept for the next run; what came from a kept listing
        // is there already.
        let listing = fingerprint.is_some() && kept.is_none();
        let mut kept_now = Vec::new();
        let mut keep = |meta: ObjectMeta| {
            let (ours, wanted) = (looking.names_us(&meta), looking.wanted(kind, &meta));
            if ours || wanted {
                let whole = looking.key.is_some() && wanted && (looking.adopt || ours);
                if listing {
                    kept_now.push(meta.clone());
                }
                listed.push((kind, meta, whole));
            }
        };
        if let Some(objects) = kept {
            objects.into_iter().for_each(keep);
            obs.kept.push(kind);
            continue;
        }
        match list_metadata(client, kind, None, &selector, &mut keep).await {
            Err(kube::Error::Api(ae)) if ae.code == 403 => {
                // Namespace-scoped credentials: the namespaces where copies are wanted, one by one.
                let namespaces: BTreeSet<&str> =
                    looking.places.iter().map(|(ns, _)| ns.as_str()).collect();
                for ns in namespaces {
                    match list_metadata(client, kind, Some(ns), &selector, &mut keep).await {
                        // Nothing can be read there: nothing there is judged.
                        Err(kube::Error::Api(ae)) if ae.code == 403 => {}
                        other => other?,
                    }
                }
            }
            other => other?,
        }
        if let Some((listings, looking_for)) = fingerprint {
            listings.keep(cluster, kind, looking_for, kept_now);
        }
    }
    // Whole reads, each hashed and dropped: this upstream's copies at wanted places, and with
    // --adopt what stands there; everything else stays metadata.
    // A copy whose hash an earlier run took at this very resourceVersion is not read again.
    let tag = looking.key.map(key_tag);
    let kept = looking.kept.zip(tag.as_deref());
    let mut hashed = Hashed::new();
    let mut whole: Vec<(ResourceKind, ObjectMeta)> = Vec::new();
    for (kind, meta, read) in listed {
        if !read {
            obs.add(cluster, kind, meta, None);
            continue;
        }
        let found = kept.and_then(|(kept, tag)| {
            let (place, taken) = taken_of(kind, &meta, tag)?;
            let live = kept.get(cluster, &place, &taken)?;
            Some((place, taken, live))
        });
        match found {
            Some((place, taken, live)) => {
                hashed.insert(place, (taken, live.clone()));
                obs.add(cluster, kind, meta, Some(live));
            }
            None => whole.push((kind, meta)),
        }
    }
    let seen: BTreeSet<(String, ResourceRef)> = obs
        .copies
        .iter()
        .map(|o| (o.namespace.clone(), o.resource.clone()))
        .chain(whole.iter().filter_map(|(kind, m)| {
            Some((
                m.namespace.clone()?,
                ResourceRef::new(*kind, m.name.clone()?),
            ))
        }))
        .collect();
    let missing: Vec<&(String, ResourceRef)> = looking
        .places
        .iter()
        .filter(|p| !seen.contains(*p))
        .collect();
    // Nothing can stand in a namespace that does not exist: one GET of the namespace saves a GET
    // per wanted place in it (all of them on a cold cluster).
    let namespaces: BTreeSet<&str> = missing.iter().map(|(ns, _)| ns.as_str()).collect();
    for ns in namespaces {
        let state = namespace_state(client, ns).await?;
        obs.namespaces.insert(ns.to_string(), state);
    }
    // What is read: (namespace, resource, whole?).
    let mut reads: Vec<(String, ResourceRef, bool)> = whole
        .into_iter()
        .filter_map(|(kind, m)| Some((m.namespace?, ResourceRef::new(kind, m.name?), true)))
        .collect();
    reads.extend(
        missing
            .into_iter()
            .filter(|(ns, _)| obs.namespaces.get(ns) != Some(&NamespaceState::Absent))
            .map(|(ns, r)| {
                (
                    ns.clone(),
                    r.clone(),
                    looking.key.is_some() && looking.adopt,
                )
            }),
    );
    type Found = Option<(ResourceKind, ObjectMeta, Option<Live>)>;
    let found: Vec<Found> = futures::stream::iter(reads)
        .map(|(ns, resource, whole)| async move {
            let got = read(
                client,
                &ns,
                &resource,
                whole.then_some(looking.key).flatten(),
            )
            .await?;
            Ok::<_, kube::Error>(got.map(|(m, l)| (resource.kind, m, l)))
        })
        .buffer_unordered(READS_AT_ONCE)
        .try_collect()
        .await?;
    for (kind, meta, live) in found.into_iter().flatten() {
        if let (Some(live), Some(tag)) = (&live, tag.as_deref())
            && let Some((place, taken)) = taken_of(kind, &meta, tag)
        {
            hashed.insert(place, (taken, live.clone()));
        }
        obs.add(cluster, kind, meta, live);
    }
    if let Some((kept, _)) = kept {
        kept.keep(cluster, looking.kinds, hashed);
    }
    obs.copies.sort_by(|a, b| {
        (&a.namespace, a.resource.kind.lower(), &a.resource.name).cmp(&(
            &b.namespace,
            b.resource.kind.lower(),
            &b.resource.name,
        ))
    });
    Ok(obs)
}

/// Tells upstream keys apart without revealing one: the key's hash of an empty ConfigMap.
fn key_tag(key: &HashKey) -> String {
    content_hash(key, ResourceKind::ConfigMap, &ObjectData::default())
}

/// A copy whole, as the server answered a write of it (at the resourceVersion the write gave it).
pub enum Whole {
    Secret(Secret),
    ConfigMap(ConfigMap),
}

impl Whole {
    /// The kind and metadata of the object written.
    pub fn meta_mut(&mut self) -> (ResourceKind, &mut ObjectMeta) {
        match self {
            Whole::Secret(s) => (ResourceKind::Secret, &mut s.metadata),
            Whole::ConfigMap(c) => (ResourceKind::ConfigMap, &mut c.metadata),
        }
    }
}

/// What a write left, hashed with `key` as a whole read would hash it, for the watcher to keep
/// ([`KeptHashes::record`]).
pub fn written_hash(key: &HashKey, written: Whole) -> Option<(Place, Taken, LiveHash)> {
    let (kind, (meta, live)) = match written {
        Whole::Secret(s) => (ResourceKind::Secret, secret_live(key, s)),
        Whole::ConfigMap(c) => (ResourceKind::ConfigMap, config_map_live(key, c)),
    };
    let (place, taken) = taken_of(kind, &meta, &key_tag(key))?;
    Some((place, taken, live))
}

/// The place of an object, and which version of it a hash is taken of (with the key `tag`).
fn taken_of(kind: ResourceKind, meta: &ObjectMeta, tag: &str) -> Option<(Place, Taken)> {
    let place = (
        meta.namespace.clone()?,
        ResourceRef::new(kind, meta.name.clone()?),
    );
    let taken = Taken {
        uid: meta.uid.clone()?,
        resource_version: meta.resource_version.clone()?,
        key: tag.to_owned(),
    };
    Some((place, taken))
}

/// One object at a place: whole and hashed with `key`, or its metadata only.
async fn read(
    client: &Client,
    ns: &str,
    resource: &ResourceRef,
    key: Option<&HashKey>,
) -> Result<Option<(ObjectMeta, Option<Live>)>, kube::Error> {
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), ns);
    let name = &resource.name;
    Ok(match (resource.kind, key) {
        (ResourceKind::Secret, Some(key)) => secrets
            .get_opt(name)
            .await?
            .map(|s| secret_live(key, s))
            .map(|(m, l)| (m, Some(l))),
        (ResourceKind::ConfigMap, Some(key)) => config_maps
            .get_opt(name)
            .await?
            .map(|c| config_map_live(key, c))
            .map(|(m, l)| (m, Some(l))),
        (ResourceKind::Secret, None) => secrets
            .get_metadata_opt(name)
            .await?
            .map(|m| (m.metadata, None)),
        (ResourceKind::ConfigMap, None) => config_maps
            .get_metadata_opt(name)
            .await?
            .map(|m| (m.metadata, None)),
    })
}

/// Every labelled object's metadata of `kind` (in `namespace`, or all), [`PAGE`] per page,
/// following continue tokens (what is not seen cannot be judged), handed to `keep` page by page.
async fn list_metadata(
    client: &Client,
    kind: ResourceKind,
    namespace: Option<&str>,
    selector: &str,
    keep: &mut impl FnMut(ObjectMeta),
) -> Result<(), kube::Error> {
    let mut params = ListParams::default().labels(selector).limit(PAGE);
    loop {
        let (items, token) = match kind {
            ResourceKind::Secret => metadata_page::<Secret>(client, namespace, &params).await?,
            ResourceKind::ConfigMap => {
                metadata_page::<ConfigMap>(client, namespace, &params).await?
            }
        };
        items.into_iter().for_each(&mut *keep);
        match token.filter(|t| !t.is_empty()) {
            Some(t) => params = params.continue_token(&t),
            None => return Ok(()),
        }
    }
}
