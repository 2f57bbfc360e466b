//! `validate --cluster`: the webhook's existence rule, checked against a live cluster before
//! anything is applied. Every Secret/ConfigMap a HelmOp lists must exist in the HelmOp's
//! namespace; [`helmop_core::validate::missing_reference_finding`] words the finding exactly
//! as the webhook does. Only object metadata is read (never Secret data).

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, stream};
use helmop_core::model::{HelmOp, Policy};
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::validate::fleet::{FleetFacts, helm_secret_to_check, rejection};
use helmop_core::validate::{allows_missing, downstream_refs, missing_reference_finding};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::ListParams;
use serde::Serialize;

use super::{DocumentReport, HELMOP_KIND};
use crate::args::KubeArgs;
use crate::cluster::api_error;
use crate::cluster::context::Ctx;
use crate::error::PluginError;

/// At most this many lookups in flight (a directory of HelmOps may list hundreds of objects).
const CONCURRENCY: usize = 16;

/// What the existence check looked at, for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterCheck {
    /// The kubeconfig context used (`in-cluster` in a pod).
    pub context: String,
    /// Distinct objects looked up.
    pub references: usize,
    /// How many of them do not exist.
    pub missing: usize,
}

/// One object to look up: its namespace and reference.
type Lookup = (String, ResourceRef);

/// Looks up every object the HelmOps among `docs` list and appends a finding for each entry
/// whose object is missing. Errors when the cluster cannot be reached (exit 3) or refuses a
/// lookup (exit 1): then nothing can be said about existence.
pub async fn check(
    kube: &KubeArgs,
    docs: &mut [&mut DocumentReport],
) -> Result<ClusterCheck, PluginError> {
    let ctx = Ctx::connect(kube).await?;
    let context = context_name(&ctx, kube);
    let wanted = wanted(docs, &ctx.namespace);
    let lookups: BTreeSet<&Lookup> = wanted.iter().flat_map(|w| &w.entries).collect();
    let exists = look_up(&ctx.upstream, lookups.into_iter().cloned().collect()).await?;
    let missing = exists.values().filter(|found| !**found).count();
    fleet_findings(&ctx.upstream, docs, &wanted).await?;
    for (doc, w) in docs.iter_mut().zip(&wanted) {
        for ((namespace, reference), path) in w.entries.iter().zip(&w.paths) {
            if exists.get(&(namespace.clone(), reference.clone())) == Some(&false) {
                doc.findings.push(missing_reference_finding(
                    path,
                    reference,
                    namespace,
                    w.allow_missing,
                ));
            }
        }
    }
    Ok(ClusterCheck {
        context,
        references: exists.len(),
        missing,
    })
}

/// The Fleet checks that depend on other objects (core `validate::fleet`): a Policy of the
/// HelmOp's namespace forbids it, or its `helmSecretName` Secret does not exist. Warnings, as
/// at admission. Namespaces without the Policy kind have no Policies.
async fn fleet_findings(
    client: &kube::Client,
    docs: &mut [&mut DocumentReport],
    wanted: &[Wanted],
) -> Result<(), PluginError> {
    let mut policies: BTreeMap<String, Vec<Policy>> = BTreeMap::new();
    let mut checks = Vec::new();
    for (i, (doc, w)) in docs.iter().zip(wanted).enumerate() {
        let Some(namespace) = &w.namespace else {
            continue;
        };
        let Ok(op) = serde_json::from_value::<HelmOp>(doc.object.clone()) else {
            continue;
        };
        if !policies.contains_key(namespace) {
            let listed = match Api::<Policy>::namespaced(client.clone(), namespace)
                .list(&ListParams::default())
                .await
            {
                Ok(list) => list.items,
                Err(e) if api_error::is_not_found(&e) => Vec::new(),
                Err(e) => {
                    return Err(api_error::upstream(
                        &format!("listing Fleet Policies in {namespace}"),
                        &e,
                    ));
                }
            };
            policies.insert(namespace.clone(), listed);
        }
        let in_ns = policies.get(namespace).map_or(&[][..], Vec::as_slice);
        let secret = helm_secret_to_check(&op, in_ns);
        checks.push((i, namespace.clone(), op, secret));
    }
    let lookups: Vec<Lookup> = checks
        .iter()
        .filter_map(|(_, ns, _, secret)| Some((ns.clone(), ResourceRef::secret(secret.as_ref()?))))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let exists = look_up(client, lookups).await?;
    for (i, namespace, op, _) in checks {
        let found = |name: &str| {
            exists.get(&(namespace.clone(), ResourceRef::secret(name))) != Some(&false)
        };
        let facts = FleetFacts {
            policies: policies.get(&namespace).map_or(&[][..], Vec::as_slice),
            foreign_bundle: false,
            secret_exists: &found,
        };
        // Spec rules are among the offline findings already.
        if let Some(finding) = rejection(&op, &facts)
            .map(|r| r.admission_finding())
            .filter(|f| !f.is_deny())
            && let Some(doc) = docs.get_mut(i)
        {
            doc.findings.push(finding);
        }
    }
    Ok(())
}

/// The entries of one document to check (empty for anything but a HelmOp).
#[derive(Debug, Default)]
struct Wanted {
    /// The HelmOp's namespace (`None` for anything but a HelmOp).
    namespace: Option<String>,
    entries: Vec<Lookup>,
    /// JSON path of each entry, parallel to `entries`.
    paths: Vec<String>,
    allow_missing: bool,
}

/// Per document: what to look up. A HelmOp without `metadata.namespace` lives in
/// `default_namespace` (`-n`, else the context's), as `kubectl apply` would put it.
fn wanted(docs: &[&mut DocumentReport], default_namespace: &str) -> Vec<Wanted> {
    docs.iter()
        .map(|doc| {
            if doc.kind.as_deref() != Some(HELMOP_KIND) || !doc.object.is_object() {
                return Wanted::default();
            }
            let namespace = doc
                .namespace
                .clone()
                .filter(|ns| !ns.is_empty())
                .unwrap_or_else(|| default_namespace.to_string());
            let (paths, refs): (Vec<String>, Vec<ResourceRef>) =
                downstream_refs(&doc.object).into_iter().unzip();
            Wanted {
                namespace: Some(namespace.clone()),
                entries: refs.into_iter().map(|r| (namespace.clone(), r)).collect(),
                paths,
                allow_missing: allows_missing(&doc.object),
            }
        })
        .collect()
}

/// Whether each object exists, looked up concurrently. An unreachable cluster wins over a
/// refusal when both happen, since it is what the user must fix first.
async fn look_up(
    client: &kube::Client,
    lookups: Vec<Lookup>,
) -> Result<BTreeMap<Lookup, bool>, PluginError> {
    let results: Vec<(Lookup, Result<bool, kube::Error>)> = stream::iter(lookups)
        .map(|(namespace, reference)| async move {
            let found = exists(client, &namespace, &reference).await;
            ((namespace, reference), found)
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut exists = BTreeMap::new();
    let mut refused = None;
    for ((namespace, reference), result) in results {
        match result {
            Ok(found) => {
                exists.insert((namespace, reference), found);
            }
            Err(e) => {
                let what = format!(
                    "looking up {} {namespace}/{}",
                    reference.kind, reference.name
                );
                match api_error::upstream(&what, &e) {
                    unreachable @ PluginError::UpstreamUnreachable(_) => return Err(unreachable),
                    other => refused = refused.or(Some(other)),
                }
            }
        }
    }
    match refused {
        Some(e) => Err(e),
        None => Ok(exists),
    }
}

async fn exists(
    client: &kube::Client,
    namespace: &str,
    reference: &ResourceRef,
) -> Result<bool, kube::Error> {
    let name = reference.name.as_str();
    Ok(match reference.kind {
        ResourceKind::Secret => Api::<Secret>::namespaced(client.clone(), namespace)
            .get_metadata_opt(name)
            .await?
            .is_some(),
        ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_metadata_opt(name)
            .await?
            .is_some(),
    })
}

/// `--context`, else the kubeconfig's current context, else `in-cluster`.
fn context_name(ctx: &Ctx, kube: &KubeArgs) -> String {
    kube.context
        .clone()
        .or_else(|| ctx.kubeconfig.as_ref()?.current_context.clone())
        .unwrap_or_else(|| "in-cluster".to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cli::cmd::validate::DocumentStatus;

    fn doc(kind: &str, namespace: Option<&str>, object: serde_json::Value) -> DocumentReport {
        DocumentReport {
            document: 1,
            item: None,
            line: 1,
            api_version: None,
            kind: Some(kind.into()),
            namespace: namespace.map(str::to_string),
            name: None,
            status: DocumentStatus::Skipped,
            note: None,
            findings: Vec::new(),
            object,
        }
    }

    #[test]
    fn helmops_are_looked_up_in_their_own_or_the_default_namespace() {
        let spec = json!({"spec": {
            "downstreamResources": [{"kind": "Secret", "name": "db"}, {"kind": "Pod", "name": "x"}],
            "targets": [{"downstreamResources": [{"kind": "configmap", "name": "app"}]}],
        }});
        let mut allowed = spec.clone();
        allowed["metadata"] = json!({"annotations": {"helmop.dev/allow-missing": "true"}});
        let mut a = doc("HelmOp", Some("team"), spec.clone());
        let mut b = doc("HelmOp", None, allowed);
        let mut c = doc("ConfigMap", Some("team"), spec);
        let docs = [&mut a, &mut b, &mut c];
        let w = wanted(&docs, "fallback");
        assert_eq!(
            w[0].entries,
            [
                ("team".to_string(), ResourceRef::secret("db")),
                ("team".to_string(), ResourceRef::config_map("app")),
            ]
        );
        assert_eq!(
            w[0].paths,
            [
                "spec.downstreamResources[0]",
                "spec.targets[0].downstreamResources[0]"
            ]
        );
        assert!(!w[0].allow_missing);
        assert_eq!(w[1].entries[0].0, "fallback");
        assert!(w[1].allow_missing);
        assert!(w[2].entries.is_empty());
    }
}
