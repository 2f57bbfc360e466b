//! One pass of `images`: list the opted-in workloads, read their pull secrets, ask the registry once per
//! distinct tag and credential, and compare.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;

use futures::stream::{self, StreamExt};
use helmop_core::names::{ANN_IMAGE_MODE, LABEL_ROLLOUT_ON_CHANGE};
use helmop_core::rollout::opt_in_selector;
use helmop_core::workload::WorkloadKind;
use helmop_images::auth::{PullSecret, credential_for};
use helmop_images::client::{RegistryClient, ResolveError};
use helmop_images::mode::{ImageMode, effective_mode};
use helmop_images::pull_secrets::{PullSecretSource, read_pull_secrets};
use helmop_images::tags::MutableTags;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client};
use serde_json::Value;

use super::model::{Container, ImageRow, compare};
use crate::cluster::api_error;
use crate::run::workload_ref::canonical;
use crate::run::workloads::{opted_in, template_of};

/// Registry requests (and pull-secret reads) in flight at once.
const CONCURRENCY: usize = 8;

/// An opted-in workload with at least one mutable tag.
#[derive(Clone, Debug)]
pub struct Target {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    /// Its `helmop.dev/restamp` annotation.
    pub restamp: Option<String>,
    /// Of the pod template's PodSpec, only what pull secrets are read from (`imagePullSecrets`,
    /// the ServiceAccount): a poll holds every target at once, so a whole PodSpec each would make
    /// its memory grow with what tenants write into their templates.
    pull: Value,
    pub containers: Vec<Container>,
}

impl Target {
    /// `deployment/web`, as kubectl names it.
    pub fn workload(&self) -> String {
        format!("{}/{}", canonical(self.kind), self.name)
    }
}

/// What one pass found.
#[derive(Clone, Debug, Default)]
pub struct Scan {
    pub targets: Vec<Target>,
    /// One per container of `targets`, sorted by namespace, workload, container.
    pub rows: Vec<ImageRow>,
    /// Pull secrets that could not be used.
    pub warnings: Vec<String>,
}

/// Lists and resolves. `namespace` `None` means every namespace.
pub async fn scan(
    client: &Client,
    registry: &RegistryClient,
    namespace: Option<&str>,
    selector: Option<&str>,
    tags: &MutableTags,
    timeout: Duration,
) -> Result<Scan, kube::Error> {
    let targets = list(client, namespace, selector, tags).await?;
    let reads = PassReads::new(client);
    let reads = &reads;
    let secrets: Vec<(Vec<PullSecret>, Vec<String>)> = stream::iter(&targets)
        .map(|t| async move {
            let (secrets, problems) = read_pull_secrets(reads, &t.namespace, &t.pull).await;
            let warnings = problems
                .iter()
                .map(|p| format!("{} in namespace {}: {p}", t.workload(), t.namespace))
                .collect();
            (secrets, warnings)
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;

    // One request per tag and credential, however many containers run it.
    let mut keys: Vec<(String, Option<String>)> = Vec::new();
    let mut asks = Vec::new();
    for (t, (pull, _)) in targets.iter().zip(&secrets) {
        for c in &t.containers {
            let key = key_of(c, pull);
            if !keys.contains(&key) {
                keys.push(key);
                asks.push((c.tag.clone(), pull.clone()));
            }
        }
    }
    let answers: Vec<Result<String, ResolveError>> = stream::iter(asks)
        .map(|(image, pull)| async move {
            let credential = |host: &str| credential_for(&pull, host);
            let answer = tokio::time::timeout(timeout, registry.resolve(&image, credential))
                .await
                .unwrap_or(Err(ResolveError::Timeout));
            if let Err(error) = &answer {
                tracing::info!(image = %image, %error, "image tag not resolved");
            }
            answer
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let answers: HashMap<_, _> = keys.into_iter().zip(answers).collect();

    let mut rows = Vec::new();
    let mut warnings = Vec::new();
    for (t, (pull, problems)) in targets.iter().zip(secrets) {
        warnings.extend(problems);
        for c in &t.containers {
            let answer = answers
                .get(&key_of(c, &pull))
                .cloned()
                .unwrap_or(Err(ResolveError::Timeout));
            let (state, reason) = compare(c, &answer);
            rows.push(ImageRow {
                namespace: t.namespace.clone(),
                workload: t.workload(),
                container: c.name.clone(),
                image: c.image.clone(),
                pinned: c.pinned.clone(),
                current: answer.ok(),
                state,
                reason,
            });
        }
    }
    rows.sort_by(|a, b| {
        (&a.namespace, &a.workload, &a.container).cmp(&(&b.namespace, &b.workload, &b.container))
    });
    Ok(Scan {
        targets,
        rows,
        warnings,
    })
}

/// The ServiceAccounts and pull Secrets of one pass, each read once: 4,000 workloads of one
/// ServiceAccount cost one GET per pass, not 4,000. Kept for the pass only (a failed read is not
/// kept: the next workload asks again).
struct PassReads<'c> {
    client: &'c Client,
    accounts: Mutex<HashMap<(String, String), Option<ServiceAccount>>>,
    secrets: Mutex<HashMap<(String, String), Option<Secret>>>,
}

impl<'c> PassReads<'c> {
    fn new(client: &'c Client) -> PassReads<'c> {
        PassReads {
            client,
            accounts: Mutex::new(HashMap::new()),
            secrets: Mutex::new(HashMap::new()),
        }
    }
}

/// Looks `key` up in `memo`, else reads it with `read` and keeps what it found.
async fn memoized<T: Clone>(
    memo: &Mutex<HashMap<(String, String), Option<T>>>,
    key: (String, String),
    read: impl std::future::Future<Output = Result<Option<T>, kube::Error>>,
) -> Result<Option<T>, kube::Error> {
    if let Some(found) = memo.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(found);
    }
    let found = read.await?;
    if let Ok(mut m) = memo.lock() {
        m.insert(key, found.clone());
    }
    Ok(found)
}

impl PullSecretSource for PassReads<'_> {
    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Secret>, kube::Error>> {
        let key = (namespace.to_owned(), name.to_owned());
        Box::pin(memoized(
            &self.secrets,
            key,
            self.client.secret(namespace, name),
        ))
    }

    fn service_account<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ServiceAccount>, kube::Error>> {
        let key = (namespace.to_owned(), name.to_owned());
        Box::pin(memoized(
            &self.accounts,
            key,
            self.client.service_account(namespace, name),
        ))
    }
}

/// A registry answer is shared by containers asking for the same tag with the same credential.
fn key_of(c: &Container, pull: &[PullSecret]) -> (String, Option<String>) {
    (
        c.tag.to_string(),
        credential_for(pull, &c.tag.registry).map(|cred| cred.identity),
    )
}

/// The kinds `images` scans: those the webhook pins and the rollout watcher restamps, Argo
/// Rollouts included where served.
const IMAGE_KINDS: [WorkloadKind; 5] = [
    WorkloadKind::Deployment,
    WorkloadKind::StatefulSet,
    WorkloadKind::DaemonSet,
    WorkloadKind::CronJob,
    WorkloadKind::Rollout,
];

/// Workloads are listed in pages of this many (each page is decoded whole).
const PAGE: u32 = 20;

/// The opted-in workloads of `namespace` (all when `None`) with a mutable tag, skipping those whose
/// image mode (workload annotation, else namespace annotation) is `off`. Kinds the server does not serve
/// are skipped. Only opted-in workloads leave the API server ([`opt_in_selector`]: those labelled
/// `"true"` anywhere, and in each enabled namespace those not labelled `"false"`), in pages of
/// [`PAGE`]: what a poll holds is bounded by a page, whatever the cluster's other workloads hold.
async fn list(
    client: &Client,
    namespace: Option<&str>,
    selector: Option<&str>,
    tags: &MutableTags,
) -> Result<Vec<Target>, kube::Error> {
    let namespaces: BTreeMap<String, Namespace> = match namespace {
        Some(ns) => Api::<Namespace>::all(client.clone())
            .get_opt(ns)
            .await?
            .map(|n| (ns.to_owned(), n))
            .into_iter()
            .collect(),
        None => Api::<Namespace>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, n)))
            .collect(),
    };
    if namespaces.is_empty() {
        return Ok(Vec::new());
    }
    let label_of = |ns: &Namespace| {
        ns.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_ROLLOUT_ON_CHANGE))
            .cloned()
    };
    // (namespace or all, selector): one list each.
    let mut lists: Vec<(Option<String>, String)> = Vec::new();
    match namespace {
        Some(ns) => {
            let label = namespaces.get(ns).and_then(label_of);
            lists.push((Some(ns.to_owned()), opt_in_selector(label.as_deref())));
        }
        None => {
            lists.push((None, opt_in_selector(None)));
            for (name, ns) in &namespaces {
                let label = label_of(ns);
                if label.as_deref() == Some("enabled") {
                    lists.push((Some(name.clone()), opt_in_selector(label.as_deref())));
                }
            }
        }
    }
    let extra = selector.filter(|s| !s.is_empty());
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for kind in IMAGE_KINDS {
        let (group, version, kind_name) = kind.gvk();
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, kind_name),
            kind.plural(),
        );
        'lists: for (scope, selector) in &lists {
            let api: Api<DynamicObject> = match scope {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
                None => Api::all_with(client.clone(), &resource),
            };
            let selector = and_selector(selector, extra);
            let mut params = ListParams::default().labels(&selector).limit(PAGE);
            loop {
                let page = match api.list(&params).await {
                    Ok(page) => page,
                    Err(e) if api_error::is_not_found(&e) => break 'lists,
                    Err(e) => return Err(e),
                };
                for obj in page.items {
                    let (Some(ns), Some(name)) =
                        (obj.metadata.namespace.clone(), obj.metadata.name.clone())
                    else {
                        continue;
                    };
                    // A workload labelled "true" in an enabled namespace is in two lists.
                    if !seen.insert((kind, ns.clone(), name.clone())) {
                        continue;
                    }
                    let Some(namespace) = namespaces.get(&ns) else {
                        continue;
                    };
                    if let Some(t) = target(kind, ns, name, namespace, obj, tags) {
                        out.push(t);
                    }
                }
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
        }
    }
    Ok(out)
}

fn target(
    kind: WorkloadKind,
    ns: String,
    name: String,
    namespace: &Namespace,
    obj: DynamicObject,
    tags: &MutableTags,
) -> Option<Target> {
    let empty = BTreeMap::new();
    let ns_labels = namespace.metadata.labels.as_ref().unwrap_or(&empty);
    let labels = obj.metadata.labels.as_ref().unwrap_or(&empty);
    if !opted_in(ns_labels, labels) {
        return None;
    }
    let annotations = obj.metadata.annotations.as_ref().unwrap_or(&empty);
    // The webhook's rule: the namespace's annotation lowers, the workload's lowers further, neither
    // raises (a workload saying `pin` in a namespace set to `off` is off). The webhook's own
    // `--image-mode` is not known here, so the ceiling is the highest mode.
    let asked = |a: Option<&BTreeMap<String, String>>| {
        a.and_then(|a| a.get(ANN_IMAGE_MODE))
            .and_then(|m| ImageMode::parse(m))
    };
    let mode = effective_mode(
        ImageMode::Pin,
        asked(namespace.metadata.annotations.as_ref()),
        asked(Some(annotations)),
    );
    if mode == ImageMode::Off {
        return None;
    }
    let restamp = annotations.get(helmop_core::names::ANN_RESTAMP).cloned();
    let template = template_of(kind, &obj)?;
    let containers = super::model::containers(&template, tags);
    if containers.is_empty() {
        return None;
    }
    Some(Target {
        kind,
        namespace: ns,
        name,
        restamp,
        pull: pull_fields(template.spec),
        containers,
    })
}

/// Both label selectors: they AND over commas (opted in, and what `-l` selects).
fn and_selector(opt_in: &str, extra: Option<&str>) -> String {
    match extra {
        Some(extra) => format!("{opt_in},{extra}"),
        None => opt_in.to_owned(),
    }
}

/// The fields of a PodSpec pull secrets are read from.
fn pull_fields(spec: &Value) -> Value {
    let mut pull = serde_json::Map::new();
    for field in ["imagePullSecrets", "serviceAccountName", "serviceAccount"] {
        if let Some(v) = spec.get(field) {
            pull.insert(field.to_owned(), v.clone());
        }
    }
    Value::Object(pull)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    use super::*;

    fn annotated(mode: Option<&str>) -> Option<BTreeMap<String, String>> {
        mode.map(|m| BTreeMap::from([(ANN_IMAGE_MODE.to_owned(), m.to_owned())]))
    }

    /// Whether `images` looks at an opted-in Deployment on `:latest` with these annotations.
    fn scanned(namespace_mode: Option<&str>, workload_mode: Option<&str>) -> bool {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some("apps".into()),
                labels: Some(BTreeMap::from([(
                    helmop_core::names::LABEL_ROLLOUT_ON_CHANGE.to_owned(),
                    "enabled".to_owned(),
                )])),
                annotations: annotated(namespace_mode),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let mut obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "app:latest"}]}}}
        }))
        .unwrap();
        obj.metadata.annotations = annotated(workload_mode);
        target(
            WorkloadKind::Deployment,
            "apps".into(),
            "web".into(),
            &namespace,
            obj,
            &MutableTags::default(),
        )
        .is_some()
    }

    #[test]
    fn follows_the_webhooks_image_mode_rule() {
        assert!(scanned(None, None));
        assert!(scanned(Some("annotate"), Some("pin")));
        assert!(!scanned(Some("off"), None));
        assert!(!scanned(None, Some(" off")));
        // A workload cannot raise its namespace's `off`, and a value that is no mode lowers nothing.
        assert!(!scanned(Some("off"), Some("pin")));
        assert!(!scanned(Some("off"), Some("bogus")));
        assert!(scanned(Some("bogus"), None));
    }
    #[test]
    fn a_target_keeps_only_what_pull_secrets_are_read_from() {
        let spec = json!({
            "serviceAccountName": "builder",
            "imagePullSecrets": [{"name": "regcred"}],
            "containers": [{"name": "app", "image": "app:latest", "env": [{"name": "BIG", "value": "x".repeat(10_000)}]}],
            "volumes": [{"name": "v", "emptyDir": {}}],
        });
        let pull = pull_fields(&spec);
        assert_eq!(
            pull,
            json!({"serviceAccountName": "builder", "imagePullSecrets": [{"name": "regcred"}]})
        );
        assert_eq!(
            helmop_images::pull_secrets::service_account(&pull),
            "builder"
        );
        assert_eq!(pull_fields(&json!({"containers": []})), json!({}));
    }

    #[test]
    fn the_watchers_selector_narrows_the_opted_in_lists() {
        assert_eq!(
            and_selector("helmop.dev/rollout-on-change=true", Some("team=a")),
            "helmop.dev/rollout-on-change=true,team=a"
        );
        assert_eq!(
            and_selector("helmop.dev/rollout-on-change!=false", None),
            "helmop.dev/rollout-on-change!=false"
        );
    }
}
