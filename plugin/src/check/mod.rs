//! `kubectl helmop check`: collects facts about an install from the cluster of the current
//! context, and turns them into findings with [`helmop_core::check`] (the verdicts are pure and
//! tested there). Nothing is written: the two webhook probes are server-side dry runs, Secrets
//! are read as metadata only except the webhook's TLS Secret, whose `tls.crt` alone is looked at.

pub mod port;
pub mod rights;
pub mod tls;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::future::join_all;
use helmop_core::check::{
    self as verdicts, AccessFact, CertFact, ConfigFact, ConfigKind, Finding, LeaseFact, LeaseRole,
    MutatingProbe, OptIn, PortFact, Presence, Report, ValidatingProbe, WebhookFact,
};
use helmop_core::names;
use helmop_core::workload::WorkloadKind;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Node, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::api_error;
use crate::error::PluginError;
use crate::run::holds;
use crate::run::workloads::{KINDS, api_resource, opted_in};

/// What `check` looks at; the defaults are the shipped manifests' names.
#[derive(Clone, Debug)]
pub struct CheckOpts {
    /// Name of both webhook configurations.
    pub configuration: String,
    /// `namespace/name` of the hash-key Secret.
    pub hash_key: (String, String),
    /// Where the propagator's and the rollout watcher's Leases live.
    pub lease_namespace: String,
    /// The namespace of the dry runs; the mutating one only runs when the user named it.
    pub namespace: String,
    pub namespace_given: bool,
    /// Bound of the TLS handshake with a webhook registered by URL.
    pub handshake_timeout: Duration,
}

/// One webhook of a configuration, as far as `check` needs it.
struct Hook {
    name: String,
    target: Option<tls::Target>,
    ca_bundle: Vec<u8>,
    helmops: bool,
}

/// A configuration as read: absent, unreadable, or its webhooks.
enum Read {
    Absent,
    Unreadable(String),
    Hooks(Vec<Hook>),
}

/// Runs every check. The cluster being unreachable when the configurations are read is the
/// command's error (exit 3); later failures become findings.
pub async fn check(client: &Client, opts: &CheckOpts) -> Result<Report, PluginError> {
    let now = Timestamp::now().as_second();
    let validating = read_validating(client, &opts.configuration).await?;
    let mutating = read_mutating(client, &opts.configuration).await?;
    let mut findings = verdicts::webhook_configurations(
        &opts.configuration,
        &config_fact(&validating),
        &config_fact(&mutating),
    );

    let validating_probe = match &validating {
        Read::Hooks(hooks) if hooks.iter().any(|h| h.helmops) => {
            let ours: Vec<&str> = hooks
                .iter()
                .filter(|h| h.helmops)
                .map(|h| h.name.as_str())
                .collect();
            probe_validating(client, &opts.namespace, &ours).await
        }
        _ => ValidatingProbe::NoWebhook,
    };
    findings.push(verdicts::validating_answer(
        &opts.configuration,
        &opts.namespace,
        &validating_probe,
    ));
    let mutating_probe = match &mutating {
        Read::Hooks(hooks) if !hooks.is_empty() => {
            if opts.namespace_given {
                probe_mutating(client, &opts.namespace).await
            } else {
                MutatingProbe::NoNamespace
            }
        }
        _ => MutatingProbe::NoWebhook,
    };
    findings.push(verdicts::mutating_answer(
        &opts.configuration,
        opts.namespace_given.then_some(opts.namespace.as_str()),
        &mutating_probe,
    ));

    findings.extend(certificates(client, opts, &validating, &mutating, now).await);
    // Who else may call it: judged for the Service the configurations name (a webhook registered by
    // URL runs outside the cluster's network rules).
    let service = [&validating, &mutating]
        .into_iter()
        .find_map(|read| match read {
            Read::Hooks(hooks) => hooks.iter().find_map(|h| match &h.target {
                Some(tls::Target::Service { namespace, name }) => {
                    Some((namespace.clone(), name.clone()))
                }
                _ => None,
            }),
            _ => None,
        });
    if let Some((namespace, name)) = service {
        findings.push(verdicts::admission_port(
            &format!("{namespace}/{name}"),
            &admission_port(client, &namespace, &name).await,
        ));
    }

    let (key_ns, key_name) = &opts.hash_key;
    findings.push(verdicts::hash_key(
        &format!("{key_ns}/{key_name}"),
        &hash_key(client, key_ns, key_name).await,
    ));

    findings.extend(verdicts::opt_in(
        names::LABEL_ROLLOUT_ON_CHANGE,
        &opt_ins(client).await,
    ));

    findings.push(verdicts::rollout_holds(
        &rollout_holds(
            client,
            opts.namespace_given.then_some(opts.namespace.as_str()),
        )
        .await,
    ));

    let scope = if opts.namespace_given {
        format!("namespace {}", opts.namespace)
    } else {
        "all namespaces".to_owned()
    };
    let namespace = opts.namespace_given.then_some(opts.namespace.as_str());
    findings.extend(verdicts::access(&scope, &access(client, namespace).await));

    for (role, name) in [
        (
            LeaseRole::Propagator,
            crate::watch::leader::DEFAULT_LEASE_NAME,
        ),
        (
            LeaseRole::RolloutWatcher,
            crate::rollout_watch::DEFAULT_LEASE_NAME,
        ),
    ] {
        let fact = lease(client, &opts.lease_namespace, name).await;
        findings.push(verdicts::lease(
            role,
            &format!("{}/{name}", opts.lease_namespace),
            &fact,
            now,
        ));
    }
    // Each shard of the propagator (`--shard-id`) elects on a Lease of its own: judged like the
    // unsharded one. Found by listing, so a user without list rights sees no shard finding.
    for (name, fact) in shard_leases(client, &opts.lease_namespace).await {
        findings.push(verdicts::lease(
            LeaseRole::Propagator,
            &format!("{}/{name}", opts.lease_namespace),
            &fact,
            now,
        ));
    }
    Ok(Report::new(Some(opts.namespace.clone()), findings))
}

fn config_fact(read: &Read) -> ConfigFact {
    match read {
        Read::Absent => ConfigFact::Absent,
        Read::Unreadable(reason) => ConfigFact::Unreadable(reason.clone()),
        Read::Hooks(hooks) => ConfigFact::Present(
            hooks
                .iter()
                .map(|h| WebhookFact {
                    name: h.name.clone(),
                    ca_bundle: !h.ca_bundle.is_empty(),
                })
                .collect(),
        ),
    }
}

/// A configuration's read: a cluster that cannot be reached ends the command (exit 3).
fn read_result<T>(
    result: Result<Option<T>, kube::Error>,
    what: &str,
    hooks: impl FnOnce(T) -> Vec<Hook>,
) -> Result<Read, PluginError> {
    match result {
        Ok(Some(config)) => Ok(Read::Hooks(hooks(config))),
        Ok(None) => Ok(Read::Absent),
        Err(e) if api_error::is_unavailable(&e) => Err(api_error::upstream(what, &e)),
        Err(e) => Ok(Read::Unreadable(api_error::describe(&e))),
    }
}

async fn read_validating(client: &Client, name: &str) -> Result<Read, PluginError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    read_result(
        api.get_opt(name).await,
        &format!("reading validatingwebhookconfiguration {name}"),
        |c| {
            c.webhooks
                .unwrap_or_default()
                .into_iter()
                .map(|w| hook(w.name, &w.client_config, w.rules.as_deref()))
                .collect()
        },
    )
}

async fn read_mutating(client: &Client, name: &str) -> Result<Read, PluginError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    read_result(
        api.get_opt(name).await,
        &format!("reading mutatingwebhookconfiguration {name}"),
        |c| {
            c.webhooks
                .unwrap_or_default()
                .into_iter()
                .map(|w| hook(w.name, &w.client_config, w.rules.as_deref()))
                .collect()
        },
    )
}

fn hook(name: String, client: &WebhookClientConfig, rules: Option<&[RuleWithOperations]>) -> Hook {
    let target = match (&client.service, &client.url) {
        (Some(s), _) => Some(tls::Target::Service {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
        }),
        (None, Some(url)) => Some(tls::Target::Url(url.clone())),
        (None, None) => None,
    };
    let covers = |list: &Option<Vec<String>>, want: &str| {
        list.as_deref()
            .unwrap_or_default()
            .iter()
            .any(|v| v == want || v == "*")
    };
    let helmops = rules.unwrap_or_default().iter().any(|r| {
        covers(&r.api_groups, "fleet.cattle.io")
            && covers(&r.resources, "helmops")
            && covers(&r.operations, "CREATE")
    });
    Hook {
        name,
        target,
        ca_bundle: client
            .ca_bundle
            .as_ref()
            .map(|b: &ByteString| b.0.clone())
            .unwrap_or_default(),
        helmops,
    }
}

/// The marker of helmop's own denial: the JSON path of the first downstream resource's kind,
/// which the probe makes invalid (the CRD's schema accepts any kind string, only helmop refuses it).
const PROBE_DENIAL: &str = "spec.downstreamResources[0].kind";

/// Dry-run create of a HelmOp only helmop's webhook refuses.
async fn probe_validating(client: &Client, namespace: &str, ours: &[&str]) -> ValidatingProbe {
    let resource = ApiResource {
        group: "fleet.cattle.io".into(),
        version: "v1alpha1".into(),
        api_version: "fleet.cattle.io/v1alpha1".into(),
        kind: "HelmOp".into(),
        plural: "helmops".into(),
    };
    let object = json!({
        "apiVersion": "fleet.cattle.io/v1alpha1",
        "kind": "HelmOp",
        "metadata": {"generateName": "helmop-check-", "namespace": namespace},
        "spec": {
            "helm": {"repo": "https://charts.example.com", "chart": "helmop-check", "version": "1.0.0"},
            "downstreamResources": [{"kind": "Deployment", "name": "helmop-check"}],
        },
    });
    let Ok(object) = serde_json::from_value::<DynamicObject>(object) else {
        return ValidatingProbe::Error {
            message: "cannot build the probe".into(),
        };
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    match api.create(&dry_run(), &object).await {
        Ok(_) => ValidatingProbe::Admitted,
        Err(kube::Error::Api(status)) => {
            let message = helmop_core::text::printable(&status.message);
            if let Some(webhook) = ours
                .iter()
                .find(|w| message.contains(&format!("admission webhook \"{w}\" denied")))
                && message.contains(PROBE_DENIAL)
            {
                return ValidatingProbe::Denied {
                    webhook: (*webhook).to_owned(),
                };
            }
            if message.contains("failed calling webhook") {
                ValidatingProbe::CallFailed { message }
            } else if status.code == 404 && !message.starts_with("namespaces ") {
                ValidatingProbe::CrdAbsent
            } else if matches!(status.code, 400 | 403 | 422) && message.contains("denied") {
                ValidatingProbe::DeniedByOther { message }
            } else {
                ValidatingProbe::Error { message }
            }
        }
        Err(e) => ValidatingProbe::Error {
            message: api_error::describe(&e),
        },
    }
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        field_manager: Some(names::MANAGER.to_owned()),
    }
}

/// Dry-run create of an opted-in Deployment that reads an (optional) ConfigMap, so the webhook has
/// something to stamp. Its image carries a digest, so no registry is asked.
async fn probe_mutating(client: &Client, namespace: &str) -> MutatingProbe {
    let labels = json!({"app.kubernetes.io/name": "helmop-check"});
    let object = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "generateName": "helmop-check-",
            "namespace": namespace,
            "labels": {names::LABEL_ROLLOUT_ON_CHANGE: "true"},
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": "probe",
                    "image": format!("registry.invalid/helmop-check@sha256:{}", "0".repeat(64)),
                    "envFrom": [{"configMapRef": {"name": "helmop-check", "optional": true}}],
                }]},
            },
        },
    });
    let Ok(object) = serde_json::from_value::<DynamicObject>(object) else {
        return MutatingProbe::Error {
            message: "cannot build the probe".into(),
        };
    };
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &api_resource(WorkloadKind::Deployment),
    );
    match api.create(&dry_run(), &object).await {
        Ok(obj) => {
            let stamp = obj
                .data
                .pointer("/spec/template/metadata/annotations")
                .and_then(Value::as_object)
                .and_then(|a| a.get(names::ANN_CONFIG_HASH))
                .and_then(Value::as_str);
            match stamp {
                Some(stamp) => MutatingProbe::Stamped {
                    stamp: stamp.to_owned(),
                },
                None => MutatingProbe::NotStamped,
            }
        }
        Err(e) => MutatingProbe::Error {
            message: api_error::describe(&e),
        },
    }
}

/// One finding per configuration and distinct (target, caBundle); the same target is asked once.
async fn certificates(
    client: &Client,
    opts: &CheckOpts,
    validating: &Read,
    mutating: &Read,
    now: i64,
) -> Vec<Finding> {
    // Keyed by the configuration's position first, so validating comes before mutating.
    let mut groups: BTreeMap<(usize, String, tls::Target, Vec<u8>), Vec<String>> = BTreeMap::new();
    for (position, (kind, read)) in [
        (ConfigKind::Validating, validating),
        (ConfigKind::Mutating, mutating),
    ]
    .into_iter()
    .enumerate()
    {
        let Read::Hooks(hooks) = read else { continue };
        for h in hooks {
            // A webhook without a target or caBundle was reported with its configuration.
            let Some(target) = &h.target else { continue };
            if h.ca_bundle.is_empty() {
                continue;
            }
            groups
                .entry((
                    position,
                    format!("{}/{}", kind.as_str(), opts.configuration),
                    target.clone(),
                    h.ca_bundle.clone(),
                ))
                .or_default()
                .push(h.name.clone());
        }
    }
    let per_config: BTreeMap<&str, usize> =
        groups
            .keys()
            .fold(BTreeMap::new(), |mut m, (_, subject, ..)| {
                *m.entry(subject.as_str()).or_default() += 1;
                m
            });
    let mut fetched: BTreeMap<tls::Target, tls::Fetched> = BTreeMap::new();
    let mut out = Vec::new();
    for ((_, subject, target, ca), hooks) in &groups {
        if !fetched.contains_key(target) {
            let chain = match target {
                tls::Target::Service { namespace, name } => {
                    tls::from_secret(client, namespace, name).await
                }
                tls::Target::Url(url) => tls::from_handshake(url, opts.handshake_timeout)
                    .await
                    .map(|c| (c, url.clone()))
                    .map_err(|e| (url.clone(), e)),
            };
            fetched.insert(target.clone(), chain);
        }
        let fact = match (fetched.get(target), target.server_name()) {
            (Some(Ok((chain, source))), Some(server_name)) => {
                tls::check_chain(ca, chain, &server_name, now, source.clone())
            }
            (Some(Err((source, reason))), _) => CertFact::Unavailable {
                source: source.clone(),
                reason: reason.clone(),
            },
            _ => CertFact::Unavailable {
                source: format!("{target:?}"),
                reason: "no server name".into(),
            },
        };
        let subject = if per_config.get(subject.as_str()).copied().unwrap_or(0) > 1 {
            format!("{subject} ({})", hooks.join(", "))
        } else {
            subject.clone()
        };
        out.push(verdicts::serving_certificate(&subject, &fact, now));
    }
    out
}

/// Metadata only: the key itself is never read.
async fn hash_key(client: &Client, namespace: &str, name: &str) -> Presence {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match api.get_metadata_opt(name).await {
        Ok(Some(_)) => Presence::Present,
        Ok(None) => Presence::Absent,
        Err(e) => Presence::Unreadable(api_error::describe(&e)),
    }
}

/// Namespaces labelled `enabled`, and every workload the webhook stamps: labelled `"true"`, or
/// in such a namespace and not labelled `"false"` (metadata only).
async fn opt_ins(client: &Client) -> OptIn {
    let selector = format!("{}=enabled", names::LABEL_ROLLOUT_ON_CHANGE);
    let namespaces: Result<BTreeSet<String>, String> = Api::<Namespace>::all(client.clone())
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect()
        })
        .map_err(|e| api_error::describe(&e));
    let enabled: BTreeMap<String, String> = BTreeMap::from([(
        names::LABEL_ROLLOUT_ON_CHANGE.to_owned(),
        "enabled".to_owned(),
    )]);
    let none = BTreeMap::new();
    let mut workloads = Ok(Vec::new());
    for kind in KINDS {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource(kind));
        let list = match api.list_metadata(&ListParams::default()).await {
            Ok(list) => list,
            // Not served (batch/v1 CronJobs before Kubernetes 1.21).
            Err(e) if api_error::is_not_found(&e) => continue,
            Err(e) => {
                workloads = Err(api_error::describe(&e));
                break;
            }
        };
        if let Ok(found) = &mut workloads {
            for item in list.items {
                let (Some(ns), Some(name)) = (item.metadata.namespace, item.metadata.name) else {
                    continue;
                };
                let ns_labels = match &namespaces {
                    Ok(set) if set.contains(&ns) => &enabled,
                    _ => &none,
                };
                let labels = item.metadata.labels.unwrap_or_default();
                if opted_in(ns_labels, &labels) {
                    found.push(format!("{ns}/{}/{name}", kind.kind().to_ascii_lowercase()));
                }
            }
        }
    }
    if let Ok(found) = &mut workloads {
        found.sort();
    }
    OptIn {
        namespaces: namespaces.map(|s| s.into_iter().collect()),
        workloads,
    }
}

/// The workloads the rollout watcher holds back now, as `check` lists them (read by
/// [`holds::read`], which `status` shares).
async fn rollout_holds(
    client: &Client,
    namespace: Option<&str>,
) -> Result<Vec<verdicts::HoldFact>, String> {
    let found = holds::read(client, namespace).await?;
    Ok(found
        .held
        .into_iter()
        .map(|(workload, hold)| verdicts::HoldFact {
            workload: workload.to_string(),
            reason: hold.reason,
            note: hold.note,
        })
        .collect())
}

/// One SelfSubjectAccessReview per right of [`rights::rights`], all at once.
async fn access(client: &Client, namespace: Option<&str>) -> Vec<AccessFact> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let all = rights::rights();
    let reviews = all.iter().map(|right| {
        let api = api.clone();
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(right.verb.to_owned()),
                    group: Some(right.group.to_owned()),
                    resource: Some(right.resource.to_owned()),
                    name: right.name.map(str::to_owned),
                    namespace: match right.scope {
                        rights::Scope::Namespace => namespace.map(str::to_owned),
                        rights::Scope::Cluster => None,
                    },
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        async move {
            api.create(&PostParams::default(), &review)
                .await
                .map(|r| r.status.is_some_and(|s| s.allowed))
                .map_err(|e| api_error::describe(&e))
        }
    });
    join_all(reviews)
        .await
        .into_iter()
        .zip(all)
        .map(|(allowed, right)| AccessFact {
            command: right.command,
            right: right.describe(),
            allowed,
        })
        .collect()
}

/// The Leases of the propagator's shards in `namespace` (`kubectl-helmop-propagate-shard-*`, the
/// names [`crate::watch::leader::shard_lease_name`] gives an `-A` watcher), by name.
async fn shard_leases(client: &Client, namespace: &str) -> Vec<(String, LeaseFact)> {
    use crate::watch::leader::{DEFAULT_LEASE_NAME, SHARD_INFIX};
    let prefix = format!("{DEFAULT_LEASE_NAME}{SHARD_INFIX}");
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let Ok(list) = api.list(&Default::default()).await else {
        return Vec::new();
    };
    let mut out: Vec<(String, LeaseFact)> = list
        .items
        .into_iter()
        .filter_map(|l| {
            let name = l.metadata.name.clone()?;
            name.starts_with(&prefix).then(|| (name, lease_fact(l)))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn lease_fact(lease: Lease) -> LeaseFact {
    let spec = lease.spec.unwrap_or_default();
    LeaseFact::Present {
        holder: spec.holder_identity,
        renewed: spec
            .renew_time
            .or(spec.acquire_time)
            .map(|t| t.0.as_second()),
        duration: spec.lease_duration_seconds.map(i64::from),
    }
}

async fn lease(client: &Client, namespace: &str, name: &str) -> LeaseFact {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(None) => LeaseFact::Absent,
        Ok(Some(lease)) => lease_fact(lease),
        Err(e) => LeaseFact::Unreadable(api_error::describe(&e)),
    }
}

/// The facts behind the admission-port finding: the Service's pods (their `--client-ca` and the
/// port), the NetworkPolicies selecting them, and the nodes' pod ranges.
async fn admission_port(client: &Client, namespace: &str, name: &str) -> PortFact {
    let unknown = |what: &str, e: &kube::Error| {
        PortFact::Unknown(format!("cannot read {what}: {}", api_error::describe(e)))
    };
    let service = match Api::<Service>::namespaced(client.clone(), namespace)
        .get(name)
        .await
    {
        Ok(s) => s,
        Err(e) => return unknown(&format!("service {namespace}/{name}"), &e),
    };
    let spec = service.spec.unwrap_or_default();
    let selector = spec.selector.unwrap_or_default();
    if selector.is_empty() {
        return PortFact::Unknown(format!("service {namespace}/{name} selects no pods"));
    }
    let labels = selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods = match Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&labels))
        .await
    {
        // Pods on their way out (a rollout adding `--client-ca`) no longer serve.
        Ok(list) => list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect::<Vec<_>>(),
        Err(e) => return unknown(&format!("the pods of service {namespace}/{name}"), &e),
    };
    let Some(first) = pods.first() else {
        return PortFact::Unknown(format!("no pod of service {namespace}/{name} exists"));
    };
    fn containers(p: &Pod) -> &[k8s_openapi::api::core::v1::Container] {
        p.spec
            .as_ref()
            .map(|s| s.containers.as_slice())
            .unwrap_or_default()
    }
    let client_auth = pods.iter().all(|p| {
        containers(p).iter().any(|c| {
            c.args
                .iter()
                .chain(c.command.iter())
                .flatten()
                .any(|a| a.starts_with("--client-ca"))
        })
    });
    // The port the Service sends to, as a number and, where a container names it, a name.
    let target = spec
        .ports
        .unwrap_or_default()
        .first()
        .map(|p| p.target_port.clone().unwrap_or(IntOrString::Int(p.port)));
    let container_ports: Vec<(i32, Option<String>)> = containers(first)
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| (p.container_port, p.name.clone()))
        .collect();
    let admission = match target {
        Some(IntOrString::Int(n)) => port::AdmissionPort {
            number: n,
            name: container_ports
                .iter()
                .find(|(p, _)| *p == n)
                .and_then(|(_, name)| name.clone()),
        },
        Some(IntOrString::String(name)) => match container_ports
            .iter()
            .find(|(_, n)| n.as_deref() == Some(name.as_str()))
        {
            Some((number, _)) => port::AdmissionPort {
                number: *number,
                name: Some(name),
            },
            None => {
                return PortFact::Unknown(format!(
                    "service {namespace}/{name} sends to a port no container names"
                ));
            }
        },
        None => return PortFact::Unknown(format!("service {namespace}/{name} has no port")),
    };
    let pod_labels = first.metadata.labels.clone().unwrap_or_default();
    let policies: Vec<NetworkPolicy> =
        match Api::<NetworkPolicy>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list
                .items
                .into_iter()
                .filter(|p| port::selects(p, &pod_labels))
                .collect(),
            Err(e) => return unknown(&format!("the NetworkPolicies in {namespace}"), &e),
        };
    // Unreadable nodes leave the ranges unknown, which the verdict says; the rest still counts.
    let ranges: Option<Vec<(String, helmop_images::policy::Cidr)>> =
        Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .ok()
            .map(|nodes| {
                nodes
                    .items
                    .iter()
                    .flat_map(|n| {
                        let node = n.metadata.name.clone().unwrap_or_default();
                        let spec = n.spec.clone().unwrap_or_default();
                        let cidrs = spec
                            .pod_cidrs
                            .filter(|c| !c.is_empty())
                            .or(spec.pod_cidr.map(|c| vec![c]))
                            .unwrap_or_default();
                        cidrs
                            .into_iter()
                            .filter_map(move |c| c.parse().ok().map(|c| (node.clone(), c)))
                            .collect::<Vec<_>>()
                    })
                    .collect()
            });
    // The API server's advertised addresses, for the fix; unreadable leaves the fix without them.
    let apiserver: Vec<String> = Api::<Endpoints>::namespaced(client.clone(), "default")
        .get_opt("kubernetes")
        .await
        .ok()
        .flatten()
        .map(|e| {
            e.subsets
                .iter()
                .flatten()
                .flat_map(|s| s.addresses.iter().flatten())
                .map(|a| a.ip.clone())
                .collect()
        })
        .unwrap_or_default();
    PortFact::Known {
        client_auth,
        policies: policies
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect(),
        admits: port::admits(&policies, &admission, ranges.as_deref()),
        apiserver,
    }
}
