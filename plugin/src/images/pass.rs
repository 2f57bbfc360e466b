//! One pass of `kubectl helmop images`: connect ([`Setup`]), scan, and the report, table and exit
//! status of what the scan found. `images --watch` runs the same pass every interval.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use helmop_images::client::{RegistryClient, RegistrySettings};
use helmop_images::tags::MutableTags;
use serde::Serialize;

use super::model::{ImageRow, ImageState, short_digest};
use super::scan::{Scan, scan};
use crate::args::KubeArgs;
use crate::cluster::api_error;
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::output::report;

/// Everything one pass needs.
pub struct Setup {
    pub ctx: Ctx,
    pub registry: RegistryClient,
    pub tags: MutableTags,
    /// `None`: every namespace.
    pub namespace: Option<String>,
    /// Workloads must also match this label selector.
    pub selector: Option<String>,
    pub timeout: Duration,
}

/// What [`Setup::new`] needs from the command line.
pub struct SetupOptions<'a> {
    pub kube: &'a KubeArgs,
    pub registry_config: Option<&'a Path>,
    pub mutable_tags: &'a [String],
    pub all_namespaces: bool,
    /// `-l` of `rollout --watch --images`: only workloads it selects are looked at.
    pub selector: Option<&'a str>,
    pub registry_timeout: Duration,
}

impl Setup {
    pub async fn new(args: SetupOptions<'_>) -> Result<Setup, PluginError> {
        if args.registry_timeout.is_zero() {
            return Err(PluginError::Usage(
                "--registry-timeout must be greater than 0".into(),
            ));
        }
        let settings = match args.registry_config {
            Some(path) => RegistrySettings::load(path)
                .map_err(|e| PluginError::RegistryConfig(Arc::new(e)))?,
            None => RegistrySettings::default(),
        };
        let registry = RegistryClient::new(settings, helmop_core::names::MANAGER)
            .map_err(|e| PluginError::RegistryClient(Arc::new(e)))?;
        let ctx = Ctx::connect(args.kube).await?;
        let namespace = (!args.all_namespaces).then(|| ctx.namespace.clone());
        Ok(Setup {
            ctx,
            registry,
            tags: MutableTags::new(args.mutable_tags),
            namespace,
            selector: args.selector.map(str::to_owned),
            timeout: args.registry_timeout,
        })
    }

    /// One pass over the workloads; an API error is the command's error (unreachable: exit 3).
    pub async fn scan(&self) -> Result<Scan, PluginError> {
        scan(
            &self.ctx.upstream,
            &self.registry,
            self.namespace.as_deref(),
            self.selector.as_deref(),
            &self.tags,
            self.timeout,
        )
        .await
        .map_err(|e| api_error::upstream(&format!("listing workloads {}", self.scope()), &e))
    }

    /// `in namespace apps` / `in all namespaces`.
    pub fn scope(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "in all namespaces".to_owned(),
        }
    }
}

/// The JSON/YAML document of one pass.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImagesReport<'a> {
    pub rows: &'a [ImageRow],
    /// Rows per state.
    pub summary: std::collections::BTreeMap<&'static str, usize>,
    /// Pull secrets that could not be used.
    pub warnings: &'a [String],
}

pub fn report(scan: &Scan) -> ImagesReport<'_> {
    let mut summary = std::collections::BTreeMap::new();
    for r in &scan.rows {
        *summary.entry(r.state.as_str()).or_insert(0) += 1;
    }
    ImagesReport {
        rows: &scan.rows,
        summary,
        warnings: &scan.warnings,
    }
}

/// 0 when the registry answered for every row (Outdated and Unpinned are states, not errors), 2 when
/// some rows are Unresolvable.
pub fn exit_status(rows: &[ImageRow]) -> ExitStatus {
    if rows.iter().any(|r| r.state == ImageState::Unresolvable) {
        ExitStatus::Partial
    } else {
        ExitStatus::Ok
    }
}

/// NAMESPACE WORKLOAD CONTAINER IMAGE PINNED CURRENT STATUS, wide: full digests and REASON.
pub fn table(rows: &[ImageRow], wide: bool, colour: bool) -> String {
    let mut headers = vec![
        "NAMESPACE",
        "WORKLOAD",
        "CONTAINER",
        "IMAGE",
        "PINNED",
        "CURRENT",
        "STATUS",
    ];
    if wide {
        headers.push("REASON");
    }
    let digest = |d: &Option<String>| match d {
        Some(d) if wide => d.clone(),
        Some(d) => short_digest(d),
        None => "-".to_owned(),
    };
    let cells: Vec<(Vec<String>, Option<report::Colour>)> = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                r.namespace.clone(),
                r.workload.clone(),
                r.container.clone(),
                image_name(&r.image),
                digest(&r.pinned),
                digest(&r.current),
                r.state.as_str().to_owned(),
            ];
            if wide {
                c.push(r.reason.clone());
            } else if r.state == ImageState::Unresolvable {
                c[6] = format!("{} ({})", r.state.as_str(), r.reason);
            }
            (c, colour.then(|| r.state.colour()))
        })
        .collect();
    report::grid(&headers, &cells, 6)
}

/// The image without its digest: the PINNED column shows that.
fn image_name(image: &str) -> String {
    image
        .split_once('@')
        .map_or(image, |(name, _)| name)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn row(state: ImageState, current: Option<&str>, reason: &str) -> ImageRow {
        ImageRow {
            namespace: "apps".into(),
            workload: "deployment/web".into(),
            container: "app".into(),
            image: format!("127.0.0.1:5000/demo/app:latest@{D1}"),
            pinned: Some(D1.into()),
            current: current.map(str::to_owned),
            state,
            reason: reason.into(),
        }
    }

    #[test]
    fn table_shows_short_digests_and_why_unresolvable() {
        let rows = [
            row(ImageState::Outdated, Some(D2), "moved"),
            row(
                ImageState::Unresolvable,
                None,
                "registry unreachable (connection refused)",
            ),
        ];
        let t = table(&rows, false, false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "NAMESPACE   WORKLOAD         CONTAINER   IMAGE                            PINNED                CURRENT               STATUS"
        );
        assert_eq!(
            lines[1],
            "apps        deployment/web   app         127.0.0.1:5000/demo/app:latest   sha256:111111111111   sha256:222222222222   Outdated"
        );
        assert!(
            lines[2].ends_with(
                "-                     Unresolvable (registry unreachable (connection refused))"
            ),
            "{}",
            lines[2]
        );
        let wide = table(&rows, true, false);
        assert!(wide.contains(D2) && wide.contains("REASON") && wide.contains("moved"));
    }

    #[test]
    fn unresolvable_rows_are_a_partial_failure() {
        assert_eq!(exit_status(&[]), ExitStatus::Ok);
        assert_eq!(
            exit_status(&[
                row(ImageState::Outdated, Some(D2), ""),
                row(ImageState::Unpinned, Some(D2), "")
            ]),
            ExitStatus::Ok
        );
        assert_eq!(
            exit_status(&[row(ImageState::Unresolvable, None, "")]),
            ExitStatus::Partial
        );
    }
}
