//! Enumeration on the upstream cluster: the selected HelmOps, the downstream clusters, and which
//! copies each HelmOp wants where (core targeting). Any listing error is returned as an error, so
//! nothing downstream is planned from a partial picture; a HelmOp whose targets cannot be
//! evaluated (an invalid selector) is a [`Problem`] that marks the enumeration incomplete.
//!
//! Wants are never scoped (docs/cluster-identity.md): for `prune`, every HelmOp of the
//! namespace is enumerated whatever HELMOP names (only the deletion set is scoped); with
//! `--target-context`, the Fleet Clusters reaching the same clusters as the contexts add their
//! wants too, since copies are planned per physical cluster, not per way of reaching it.

use std::collections::BTreeSet;

use helmop_core::model::{Cluster, ClusterGroup, HelmOp};
use helmop_core::names;
use helmop_core::plan::{DesiredCopy, HelmOpKey, ObservedCopy, OwnerRef, Scope, parse_owners};
use helmop_core::targeting::{TargetMatch, cluster_options, match_cluster};
use kube::Api;
use kube::api::ListParams;
use serde::Serialize;

use crate::api_error;
use crate::clusters::{self, Downstream, Limits};
use crate::context::Ctx;
use crate::error::PluginError;

/// Which HelmOps a command works on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// `HELMOP` (in `-n`/the context's namespace).
    One { namespace: String, name: String },
    /// Every HelmOp of one namespace (no name, no `-A`).
    Namespace(String),
    /// `-A`.
    All,
}

impl Selection {
    /// From a command line: `name` and `-A` are exclusive (clap enforces it).
    pub fn new(name: Option<&str>, all_namespaces: bool, namespace: &str) -> Selection {
        match (name, all_namespaces) {
            (_, true) => Selection::All,
            (Some(name), false) => Selection::One {
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            (None, false) => Selection::Namespace(namespace.to_string()),
        }
    }

    fn namespace(&self) -> Option<&str> {
        match self {
            Selection::One { namespace, .. } | Selection::Namespace(namespace) => Some(namespace),
            Selection::All => None,
        }
    }
}

/// A HelmOp whose targets could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub helmop: String,
    pub message: String,
}

/// What the upstream cluster says should exist downstream.
#[derive(Debug)]
pub struct Inventory {
    pub selection: Selection,
    pub helmops: Vec<HelmOp>,
    pub downstreams: Vec<Downstream>,
    pub desired: Vec<DesiredCopy>,
    pub problems: Vec<Problem>,
}

impl Inventory {
    /// HelmOps, Clusters, ClusterGroups and every HelmOp's targets were all enumerated.
    /// (Listing errors never get this far: [`enumerate`] fails instead.)
    pub fn complete(&self) -> bool {
        self.problems.is_empty()
    }

    /// Namespaces of the selected HelmOps (where their sources live).
    pub fn helmop_namespaces(&self) -> BTreeSet<String> {
        self.helmops
            .iter()
            .filter_map(|h| h.metadata.namespace.clone())
            .collect()
    }

    /// Whose ownership a run may release on a cluster where `observed` was found. For one
    /// namespace this includes owners in that namespace whose HelmOp no longer exists (every
    /// HelmOp there was listed, so they are known to be gone).
    pub fn scope(&self, upstream_id: &str, observed: &[ObservedCopy]) -> Scope {
        let listed = || -> BTreeSet<HelmOpKey> { self.helmops.iter().filter_map(key_of).collect() };
        match &self.selection {
            Selection::All => Scope::All,
            Selection::One { namespace, name } => {
                Scope::HelmOps(BTreeSet::from([HelmOpKey::new(namespace, name)]))
            }
            Selection::Namespace(ns) => {
                let mut keys = listed();
                for o in observed {
                    let Some(owners) = o.annotations.get(names::ANN_OWNERS) else {
                        continue;
                    };
                    for entry in parse_owners(owners) {
                        if let Some(owner) = OwnerRef::parse(&entry)
                            && owner.upstream_id == upstream_id
                            && &owner.namespace == ns
                        {
                            keys.insert(HelmOpKey::new(&owner.namespace, &owner.name));
                        }
                    }
                }
                Scope::HelmOps(keys)
            }
        }
    }
}

/// `namespace/name` of a HelmOp.
pub fn key_of(h: &HelmOp) -> Option<HelmOpKey> {
    Some(HelmOpKey::new(
        h.metadata.namespace.as_deref()?,
        h.metadata.name.as_deref()?,
    ))
}

/// Lists the selected HelmOps and the clusters, and computes the desired copies.
/// `for_prune`: the wants of every HelmOp of the namespace count, whatever HELMOP names (and a
/// named HelmOp that no longer exists is no error); with `--target-context`, failing to list
/// the Fleet Clusters aborts instead of planning without their wants.
pub async fn enumerate(
    ctx: &Ctx,
    selection: &Selection,
    target_contexts: &[String],
    for_prune: bool,
    limits: Limits,
) -> Result<Inventory, PluginError> {
    // Clients of clusters this enumeration no longer reaches go with their connections.
    ctx.clients.sweep();
    let listing = match selection {
        Selection::One { namespace, .. } if for_prune => Selection::Namespace(namespace.clone()),
        other => other.clone(),
    };
    let helmops = list_helmops(ctx, &listing, for_prune).await?;
    let (downstreams, desired, problems) = if target_contexts.is_empty() {
        let (clusters, groups) = list_fleet(ctx, selection.namespace(), false).await?;
        let (downstreams, keys) = clusters::resolve_fleet(ctx, &clusters, limits).await;
        let (desired, problems) = desired_fleet(&helmops, &clusters, &keys, &groups);
        (downstreams, desired, problems)
    } else {
        let downstreams = clusters::resolve_contexts(ctx, target_contexts, limits).await;
        let (mut desired, mut problems) = desired_contexts(&helmops, &downstreams);
        let fleet = match list_fleet(ctx, selection.namespace(), true).await {
            Ok(fleet) => Some(fleet),
            Err(e) if !for_prune => {
                tracing::warn!("{e}; planning without the wants of Fleet Clusters");
                None
            }
            Err(e) => return Err(e),
        };
        if let Some((clusters, groups)) = fleet {
            let (_, keys) = clusters::resolve_fleet(ctx, &clusters, limits).await;
            let (fleet_desired, fleet_problems) =
                desired_fleet(&helmops, &clusters, &keys, &groups);
            // Wants on the contexts' clusters, and those of Clusters that could not be
            // identified (prune keeps what they want everywhere).
            desired.extend(fleet_desired.into_iter().filter(|d| {
                !clusters::is_identity_key(&d.cluster)
                    || downstreams.iter().any(|ds| ds.key == d.cluster)
            }));
            for p in fleet_problems {
                if !problems.iter().any(|q| q.helmop == p.helmop) {
                    problems.push(p);
                }
            }
        }
        (downstreams, desired, problems)
    };
    Ok(Inventory {
        selection: selection.clone(),
        helmops,
        downstreams,
        desired,
        problems,
    })
}

/// The Fleet Clusters and ClusterGroups of `namespace` (all for `None`). With `optional`
/// (`--target-context`, where Fleet need not be installed) a kind that is not served means
/// none.
async fn list_fleet(
    ctx: &Ctx,
    namespace: Option<&str>,
    optional: bool,
) -> Result<(Vec<Cluster>, Vec<ClusterGroup>), PluginError> {
    let clusters: Vec<Cluster> = match list(ctx, namespace, "Clusters").await {
        Err(ListError::NoSuchKind(_)) if optional => return Ok((Vec::new(), Vec::new())),
        other => other?,
    };
    let groups: Vec<ClusterGroup> = match list(ctx, namespace, "ClusterGroups").await {
        Err(ListError::NoSuchKind(_)) if optional => Vec::new(),
        other => other?,
    };
    Ok((clusters, groups))
}

/// A listing that failed: the kind is not served (its CRD is not installed), or otherwise.
enum ListError {
    NoSuchKind(PluginError),
    Other(PluginError),
}

impl From<ListError> for PluginError {
    fn from(e: ListError) -> PluginError {
        match e {
            ListError::NoSuchKind(e) | ListError::Other(e) => e,
        }
    }
}

async fn list_helmops(
    ctx: &Ctx,
    selection: &Selection,
    missing_ok: bool,
) -> Result<Vec<HelmOp>, PluginError> {
    match selection {
        Selection::One { namespace, name } => {
            let api: Api<HelmOp> = Api::namespaced(ctx.upstream.clone(), namespace);
            let found = api.get_opt(name).await.map_err(|e| {
                api_error::upstream(&format!("reading HelmOp {namespace}/{name}"), &e)
            })?;
            match found {
                Some(h) => Ok(vec![h]),
                None if missing_ok => Ok(Vec::new()),
                None => Err(PluginError::Upstream(format!(
                    "HelmOp {namespace}/{name} not found"
                ))),
            }
        }
        _ => Ok(list(ctx, selection.namespace(), "HelmOps").await?),
    }
}

/// Every object of a Fleet kind in `namespace` (all namespaces for `None`), page by page.
async fn list<K>(ctx: &Ctx, namespace: Option<&str>, what: &str) -> Result<Vec<K>, ListError>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = match namespace {
        Some(ns) => Api::namespaced(ctx.upstream.clone(), ns),
        None => Api::all(ctx.upstream.clone()),
    };
    let where_ = namespace.map_or("in all namespaces".to_string(), |ns| format!("in {ns}"));
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.map_err(|e| {
            let error = api_error::upstream(&format!("listing {what} {where_}"), &e);
            if api_error::is_not_found(&e) && out.is_empty() {
                ListError::NoSuchKind(error)
            } else {
                ListError::Other(error)
            }
        })?;
        let token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
        out.extend(page.items);
        match token {
            Some(t) => params = params.continue_token(&t),
            None => return Ok(out),
        }
    }
}

/// Desired copies from Fleet targeting: each HelmOp against the Clusters of its namespace.
/// `keys[i]` is the downstream key of `clusters[i]`.
pub fn desired_fleet(
    helmops: &[HelmOp],
    clusters: &[Cluster],
    keys: &[String],
    groups: &[ClusterGroup],
) -> (Vec<DesiredCopy>, Vec<Problem>) {
    let mut desired = Vec::new();
    let mut problems = Vec::new();
    for helmop in helmops {
        let Some(key) = key_of(helmop) else { continue };
        let mut wanted = Vec::new();
        let mut failed = None;
        for (cluster, cluster_key) in clusters.iter().zip(keys) {
            if cluster.metadata.namespace.as_deref() != Some(key.namespace.as_str()) {
                continue;
            }
            match match_cluster(helmop, cluster, groups) {
                Ok(m) => wanted.extend(wants(&key, helmop, &m, cluster_key)),
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        match failed {
            Some(message) => problems.push(Problem {
                helmop: key.to_string(),
                message: format!("targets cannot be evaluated: {message}"),
            }),
            None => desired.extend(wanted),
        }
    }
    (desired, problems)
}

/// Desired copies for `--target-context`: every HelmOp targets every context, with the options
/// of the first target whose `clusterName` is the context's name (honouring its `doNotDeploy`),
/// else the HelmOp's root options.
pub fn desired_contexts(
    helmops: &[HelmOp],
    downstreams: &[Downstream],
) -> (Vec<DesiredCopy>, Vec<Problem>) {
    let mut desired = Vec::new();
    let mut problems = Vec::new();
    for helmop in helmops {
        let Some(key) = key_of(helmop) else { continue };
        let mut wanted = Vec::new();
        let mut failed = None;
        'contexts: for downstream in downstreams {
            for name in &downstream.names {
                let synthetic = Cluster::new(&key.namespace, name, &[]);
                let m = match match_cluster(helmop, &synthetic, &[]) {
                    Ok(TargetMatch::NoMatch) => TargetMatch::Matched { target_index: None },
                    Ok(m) => m,
                    Err(e) => {
                        failed = Some(e.to_string());
                        break 'contexts;
                    }
                };
                wanted.extend(wants(&key, helmop, &m, &downstream.key));
            }
        }
        match failed {
            Some(message) => problems.push(Problem {
                helmop: key.to_string(),
                message: format!("targets cannot be evaluated: {message}"),
            }),
            None => desired.extend(wanted),
        }
    }
    (desired, problems)
}

fn wants(key: &HelmOpKey, helmop: &HelmOp, m: &TargetMatch, cluster: &str) -> Vec<DesiredCopy> {
    let Some(options) = cluster_options(helmop, m) else {
        return Vec::new();
    };
    options
        .resources
        .into_iter()
        .map(|resource| DesiredCopy {
            cluster: cluster.to_string(),
            namespace: options.namespace.clone(),
            helmop: key.clone(),
            resource,
            keep: options.keep_resources,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use helmop_core::model::{BundleTarget, DownstreamResource, HelmOpSpec};
    use helmop_core::resource::ResourceRef;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    fn helmop(ns: &str, name: &str, spec: HelmOpSpec) -> HelmOp {
        HelmOp::new(ns, name, spec)
    }

    fn selector(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([(k.to_string(), v.to_string())])),
            ..LabelSelector::default()
        }
    }

    fn summary(desired: &[DesiredCopy]) -> Vec<String> {
        desired
            .iter()
            .map(|d| {
                format!(
                    "{} {} {} {}{}",
                    d.helmop,
                    d.cluster,
                    d.namespace,
                    d.resource,
                    if d.keep { " keep" } else { "" }
                )
            })
            .collect()
    }

    #[test]
    fn fleet_targets_by_label_and_group_with_per_target_resources() {
        let spec = HelmOpSpec {
            default_namespace: Some("apps".into()),
            downstream_resources: Some(vec![DownstreamResource::new("Secret", "db")]),
            targets: Some(vec![
                BundleTarget {
                    cluster_selector: Some(selector("env", "prod")),
                    namespace: Some("prod-apps".into()),
                    downstream_resources: Some(vec![DownstreamResource::new("configmap", "prod")]),
                    keep_resources: Some(true),
                    ..BundleTarget::default()
                },
                BundleTarget {
                    cluster_group: Some("edge".into()),
                    ..BundleTarget::default()
                },
            ]),
            ..HelmOpSpec::default()
        };
        let ops = [helmop("fleet", "app", spec)];
        let clusters = [
            Cluster::new("fleet", "c1", &[("env", "prod")]),
            Cluster::new("fleet", "c2", &[("tier", "edge")]),
            Cluster::new("fleet", "c3", &[]),
            Cluster::new("other", "c4", &[("env", "prod")]),
        ];
        let keys = ["k1", "k2", "k3", "k4"].map(String::from);
        let groups = [ClusterGroup::new(
            "fleet",
            "edge",
            &[],
            Some(selector("tier", "edge")),
        )];
        let (desired, problems) = desired_fleet(&ops, &clusters, &keys, &groups);
        assert!(problems.is_empty());
        assert_eq!(
            summary(&desired),
            [
                "fleet/app k1 prod-apps secret/db keep",
                "fleet/app k1 prod-apps configmap/prod keep",
                "fleet/app k2 apps secret/db",
            ]
        );
    }

    #[test]
    fn invalid_selector_is_a_problem_not_an_empty_target() {
        let bad = LabelSelector {
            match_labels: Some(BTreeMap::from([("in valid".to_string(), "x".to_string())])),
            ..LabelSelector::default()
        };
        let spec = HelmOpSpec {
            downstream_resources: Some(vec![DownstreamResource::new("Secret", "db")]),
            targets: Some(vec![BundleTarget {
                cluster_selector: Some(bad),
                ..BundleTarget::default()
            }]),
            ..HelmOpSpec::default()
        };
        let ops = [helmop("fleet", "app", spec)];
        let clusters = [Cluster::new("fleet", "c1", &[])];
        let (desired, problems) = desired_fleet(&ops, &clusters, &["k1".into()], &[]);
        assert!(desired.is_empty());
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].helmop, "fleet/app");
    }

    #[test]
    fn contexts_use_root_options_or_the_named_target() {
        let spec = HelmOpSpec {
            namespace: None,
            default_namespace: Some("apps".into()),
            downstream_resources: Some(vec![DownstreamResource::new("Secret", "db")]),
            targets: Some(vec![
                BundleTarget {
                    cluster_name: Some("east".into()),
                    default_namespace: Some("east-apps".into()),
                    ..BundleTarget::default()
                },
                BundleTarget {
                    cluster_name: Some("west".into()),
                    do_not_deploy: Some(true),
                    ..BundleTarget::default()
                },
            ]),
            ..HelmOpSpec::default()
        };
        let ops = [helmop("team", "app", spec)];
        let ds = |key: &str, name: &str| Downstream {
            key: key.into(),
            names: vec![name.into()],
            client: Err("unused".into()),
        };
        let downstreams = [
            ds("https://e", "east"),
            ds("https://w", "west"),
            ds("https://n", "north"),
        ];
        let (desired, problems) = desired_contexts(&ops, &downstreams);
        assert!(problems.is_empty());
        assert_eq!(
            summary(&desired),
            [
                "team/app https://e east-apps secret/db",
                "team/app https://n apps secret/db"
            ]
        );
    }

    #[test]
    fn namespace_scope_adds_owners_of_deleted_helmops() {
        let inv = Inventory {
            selection: Selection::Namespace("team".into()),
            helmops: vec![helmop("team", "live", HelmOpSpec::default())],
            downstreams: Vec::new(),
            desired: Vec::new(),
            problems: Vec::new(),
        };
        let copy = ObservedCopy {
            cluster: "c".into(),
            namespace: "apps".into(),
            resource: ResourceRef::secret("db"),
            uid: "u".into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::from([(
                names::ANN_OWNERS.to_string(),
                "up-1/team/gone,up-2/team/theirs,up-1/other/elsewhere".to_string(),
            )]),
            data_hash: None,
        };
        assert_eq!(
            inv.scope("up-1", &[copy]),
            Scope::HelmOps(BTreeSet::from([
                HelmOpKey::new("team", "gone"),
                HelmOpKey::new("team", "live"),
            ]))
        );
        let all = Inventory {
            selection: Selection::All,
            ..inv
        };
        assert_eq!(all.scope("up-1", &[]), Scope::All);
    }
}
