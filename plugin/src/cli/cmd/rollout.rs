//! `kubectl helmop rollout KIND/NAME`: restamp one workload now and say whether its stamp changed.
//!
//! A new `helmop.dev/restamp` value on the workload's metadata is an UPDATE the admission webhook
//! sees; it recomputes the pod template's `helmop.dev/config-hash` from what the pods read right
//! now. If that differs from the stored stamp, the template changes and the workload rolls; if not,
//! nothing rolls (the pods already run with the current configuration). The stamp is read from the
//! object the API server returns, i.e. after every mutating webhook ran.

use clap::Args;
use helmop_core::names;
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::workload::WorkloadKind;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde::Serialize;
use serde_json::json;

use crate::args::{KubeArgs, ReportFormat};
use crate::cluster::api_error;
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::output;
use crate::run::workload_ref::{self, WorkloadRef};
use crate::run::workloads::{api_resource, config_hash_of, new_restamp_value, opted_in};

#[derive(Debug, Args)]
pub struct RolloutArgs {
    /// The workload: deployment/NAME, statefulset/NAME, daemonset/NAME, replicaset/NAME,
    /// job/NAME, cronjob/NAME or rollout/NAME (kubectl's short names work too: deploy, sts, ds)
    #[arg(value_name = "KIND/NAME", value_parser = workload_ref::parse, required_unless_present_any = ["watch", "resume"], conflicts_with_all = ["watch", "resume"])]
    pub target: Option<WorkloadRef>,

    /// Release the flap breaker of a Secret or ConfigMap (secret/NAME, configmap/NAME, cm/NAME):
    /// sets its `helmop.dev/rollout-resume` to the time now, and the rollout watcher decides its
    /// readers again, through the roll budget
    #[arg(long, value_name = "KIND/NAME", value_parser = parse_source, conflicts_with = "watch")]
    pub resume: Option<ResourceRef>,

    /// Send the restamp as a server-side dry run: the webhook computes the stamp, nothing is
    /// stored. With --watch: report what would be restamped, write nothing
    #[arg(long)]
    pub dry_run: bool,

    #[command(flatten)]
    pub watch: crate::rollout_watch::RolloutWatchArgs,

    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t = ReportFormat::Table)]
    pub output: ReportFormat,

    #[command(flatten)]
    pub kube: KubeArgs,
}

/// What `rollout` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutReport {
    /// `deployment/web`.
    pub workload: String,
    pub namespace: String,
    /// Whether the webhook stamps this workload (`None`: the namespace's label could not be read).
    pub opted_in: Option<bool>,
    /// The `helmop.dev/restamp` value written.
    pub restamp: String,
    /// The pod template's `helmop.dev/config-hash` before and after.
    pub previous_stamp: Option<String>,
    pub stamp: Option<String>,
    pub stamp_changed: bool,
    pub dry_run: bool,
    pub message: String,
}

pub async fn run(args: &RolloutArgs) -> Result<ExitStatus, PluginError> {
    let ctx = Ctx::connect(&args.kube).await?;
    if let Some(source) = &args.resume {
        let report = resume(&ctx.upstream, &ctx.namespace, source, args.dry_run).await?;
        let text = match args.output {
            ReportFormat::Json => output::json(&report)?,
            ReportFormat::Yaml => serde_saphyr::to_string(&report)
                .map_err(|e| PluginError::Usage(format!("cannot encode YAML: {e}")))?,
            ReportFormat::Table | ReportFormat::Wide => format!("{}\n", report.message),
        };
        output::emit(&text)?;
        return Ok(ExitStatus::Ok);
    }
    let Some(target) = &args.target else {
        return crate::rollout_watch::run(&ctx, &args.kube, &args.watch, args.output, args.dry_run)
            .await;
    };
    let report = restamp(&ctx.upstream, &ctx.namespace, target, args.dry_run).await?;
    let text = match args.output {
        ReportFormat::Json => output::json(&report)?,
        ReportFormat::Yaml => serde_saphyr::to_string(&report)
            .map_err(|e| PluginError::Usage(format!("cannot encode YAML: {e}")))?,
        ReportFormat::Table | ReportFormat::Wide => {
            text(&report, args.output == ReportFormat::Wide)
        }
    };
    output::emit(&text)?;
    Ok(ExitStatus::Ok)
}

/// `secret/NAME` or `configmap/NAME` (`cm/NAME` too).
fn parse_source(text: &str) -> Result<ResourceRef, String> {
    let (kind, name) = text
        .split_once('/')
        .filter(|(_, n)| !n.is_empty() && !n.contains('/'))
        .ok_or_else(|| format!("expected secret/NAME or configmap/NAME, not {text:?}"))?;
    let kind = match kind.to_ascii_lowercase().as_str() {
        "secret" | "secrets" => ResourceKind::Secret,
        "configmap" | "configmaps" | "cm" => ResourceKind::ConfigMap,
        other => return Err(format!("{other:?} is not secret or configmap")),
    };
    Ok(ResourceRef::new(kind, name.to_owned()))
}

/// What `rollout --resume` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeReport {
    /// `secret/db`.
    pub source: String,
    pub namespace: String,
    /// The `helmop.dev/rollout-resume` value written.
    pub resume: String,
    pub dry_run: bool,
    pub message: String,
}

/// Sets the source's `helmop.dev/rollout-resume` to now: a new value closes its flap breaker.
pub async fn resume(
    client: &Client,
    namespace: &str,
    source: &ResourceRef,
    dry_run: bool,
) -> Result<ResumeReport, PluginError> {
    let what = format!("{source} in namespace {namespace}");
    let value = Timestamp::now().to_string();
    let patch = json!({"metadata": {"annotations": {names::ANN_ROLLOUT_RESUME: value}}});
    let params = PatchParams {
        field_manager: Some(names::MANAGER.to_owned()),
        dry_run,
        ..PatchParams::default()
    };
    let result = match source.kind {
        ResourceKind::Secret => Api::<Secret>::namespaced(client.clone(), namespace)
            .patch(&source.name, &params, &Patch::Merge(&patch))
            .await
            .map(|_| ()),
        ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .patch(&source.name, &params, &Patch::Merge(&patch))
            .await
            .map(|_| ()),
    };
    match result {
        Ok(()) => {}
        Err(e) if api_error::is_not_found(&e) => {
            return Err(PluginError::Usage(format!("{what} not found")));
        }
        Err(e) => return Err(api_error::upstream(&format!("resuming {what}"), &e)),
    }
    let done = if dry_run {
        "would be released"
    } else {
        "released"
    };
    Ok(ResumeReport {
        source: source.to_string(),
        namespace: namespace.to_owned(),
        resume: value,
        dry_run,
        message: format!(
            "{what}: the flap breaker {done} ({}); the rollout watcher decides its readers again, through the roll budget",
            names::ANN_ROLLOUT_RESUME
        ),
    })
}

/// Reads the workload, writes a new restamp value and compares the stamps.
pub async fn restamp(
    client: &Client,
    namespace: &str,
    target: &WorkloadRef,
    dry_run: bool,
) -> Result<RolloutReport, PluginError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &api_resource(target.kind));
    let what = format!("{target} in namespace {namespace}");
    let before = match api.get_opt(&target.name).await {
        Ok(Some(obj)) => obj,
        Ok(None) => {
            return Err(PluginError::Usage(format!("{what} not found")));
        }
        Err(e) => return Err(api_error::upstream(&format!("reading {what}"), &e)),
    };
    let previous_stamp = config_hash_of(target.kind, &before);
    let previous_restamp = annotation(&before, names::ANN_RESTAMP);
    let opted_in = opt_in(client, namespace, &before).await;
    let value = new_restamp_value(Timestamp::now(), previous_restamp.as_deref());
    let patch = json!({"metadata": {"annotations": {names::ANN_RESTAMP: value}}});
    let params = PatchParams {
        field_manager: Some(names::MANAGER.to_owned()),
        dry_run,
        ..PatchParams::default()
    };
    let after = api
        .patch(&target.name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|e| api_error::upstream(&format!("restamping {what}"), &e))?;
    let stamp = config_hash_of(target.kind, &after);
    let stamp_changed = stamp != previous_stamp;
    let message = message(target.kind, opted_in, &previous_stamp, &stamp, dry_run);
    Ok(RolloutReport {
        workload: target.to_string(),
        namespace: namespace.to_owned(),
        opted_in,
        restamp: value,
        previous_stamp,
        stamp,
        stamp_changed,
        dry_run,
        message,
    })
}

fn message(
    kind: WorkloadKind,
    opted_in: Option<bool>,
    before: &Option<String>,
    after: &Option<String>,
    dry_run: bool,
) -> String {
    if after.is_some() && before != after {
        let changed = if dry_run { "would change" } else { "changed" };
        let rolls = match kind {
            WorkloadKind::ReplicaSet => "; a ReplicaSet does not replace its pods by itself",
            WorkloadKind::Job | WorkloadKind::CronJob => "; new Jobs and pods use it",
            _ => "; the pods roll",
        };
        return format!("stamp {changed}{rolls}");
    }
    match (before, opted_in) {
        (Some(_), _) if after.is_some() => {
            "stamp unchanged: nothing the pods read changed since the last stamp".to_owned()
        }
        (Some(_), _) => "a webhook removed the stamp".to_owned(),
        (None, Some(false)) => format!(
            "not opted in (label {} on the workload or its namespace), so nothing stamps it",
            names::LABEL_ROLLOUT_ON_CHANGE
        ),
        (None, _) => "no stamp: is the helmop webhook registered on this cluster?".to_owned(),
    }
}

fn text(r: &RolloutReport, wide: bool) -> String {
    let dry = if r.dry_run { " (server dry run)" } else { "" };
    let mut out = format!(
        "{} restamped in namespace {}{dry}: {}\n",
        r.workload, r.namespace, r.message
    );
    if wide || r.stamp_changed {
        let show = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".to_owned());
        out.push_str(&format!(
            "  {}: {} -> {}\n",
            names::ANN_CONFIG_HASH,
            show(&r.previous_stamp),
            show(&r.stamp)
        ));
    }
    if wide {
        out.push_str(&format!("  {}: {}\n", names::ANN_RESTAMP, r.restamp));
    }
    out
}

async fn opt_in(client: &Client, namespace: &str, obj: &DynamicObject) -> Option<bool> {
    let labels = obj.metadata.labels.clone().unwrap_or_default();
    if let Some(decided) = helmop_core::rollout::by_workload(
        labels
            .get(names::LABEL_ROLLOUT_ON_CHANGE)
            .map(String::as_str),
    ) {
        return Some(decided.stamps());
    }
    match Api::<Namespace>::all(client.clone()).get(namespace).await {
        Ok(ns) => Some(opted_in(&ns.metadata.labels.unwrap_or_default(), &labels)),
        Err(e) => {
            tracing::debug!(namespace, error = %api_error::describe(&e), "cannot read the namespace's opt-in label");
            None
        }
    }
}

fn annotation(obj: &DynamicObject, key: &str) -> Option<String> {
    obj.metadata.annotations.as_ref()?.get(key).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_takes_a_secret_or_a_config_map() {
        assert_eq!(parse_source("secret/db"), Ok(ResourceRef::secret("db")));
        assert_eq!(parse_source("cm/app"), Ok(ResourceRef::config_map("app")));
        assert!(
            parse_source("deployment/web")
                .unwrap_err()
                .contains("not secret or configmap")
        );
        assert!(parse_source("secret/").is_err() && parse_source("db").is_err());
    }

    #[test]
    fn messages_say_what_happens() {
        let a = Some("v1:aa".to_owned());
        let b = Some("v1:bb".to_owned());
        let d = WorkloadKind::Deployment;
        assert_eq!(
            message(d, Some(true), &a, &b, false),
            "stamp changed; the pods roll"
        );
        assert_eq!(
            message(d, Some(true), &a, &b, true),
            "stamp would change; the pods roll"
        );
        assert_eq!(
            message(d, Some(true), &None, &b, false),
            "stamp changed; the pods roll"
        );
        assert_eq!(
            message(d, Some(true), &a, &None, false),
            "a webhook removed the stamp"
        );
        assert!(message(d, Some(true), &a, &a, false).starts_with("stamp unchanged"));
        assert!(message(d, Some(false), &None, &None, false).starts_with("not opted in"));
        assert!(message(d, Some(true), &None, &None, false).contains("webhook registered"));
        assert!(message(d, None, &None, &None, false).contains("webhook registered"));
        assert!(
            message(WorkloadKind::ReplicaSet, Some(true), &a, &b, false)
                .contains("does not replace its pods")
        );
    }

    #[test]
    fn text_shows_stamps_when_they_change() {
        let r = RolloutReport {
            workload: "deployment/web".into(),
            namespace: "apps".into(),
            opted_in: Some(true),
            restamp: "rollout:x".into(),
            previous_stamp: Some("v1:aa".into()),
            stamp: Some("v1:bb".into()),
            stamp_changed: true,
            dry_run: false,
            message: "stamp changed; the pods roll".into(),
        };
        assert_eq!(
            text(&r, false),
            "deployment/web restamped in namespace apps: stamp changed; the pods roll\n  helmop.dev/config-hash: v1:aa -> v1:bb\n"
        );
        assert!(text(&r, true).contains("helmop.dev/restamp: rollout:x"));
    }
}
