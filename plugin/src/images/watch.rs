//! `images --watch`: poll the registry every interval (+-10% jitter) and restamp the workloads whose tags
//! moved, debounced by [`Rollouts`], until SIGINT/SIGTERM (then exit 0; a restamp in flight is dropped,
//! which is harmless: the next watcher restamps again). A failed poll (the cluster unreachable) is
//! reported and retried with back-off; the watcher never exits on it.
//!
//! Events, one per line (`-o json`: JSON Lines with `time` and `event`): `started`, `poll` (the rows and
//! a summary), `restamped` (or, with `--dry-run`, `would-restamp`), `not-repinned` (a restamp that did
//! not move the pin; retried), `held` (an Argo Rollout aborted or mid-canary: not restamped, looked at
//! again after a back-off), `failed`, `stopped`.
//!
//! Under `rollout --watch --images` the poll loop writes nothing itself: it hands each workload to
//! restamp to the rollout watcher's loop ([`Restamps::Handoff`]), whose roll budget, pacing,
//! breakers and holds then apply to image rollouts exactly as to config rollouts.

use std::collections::BTreeSet;
use std::time::Duration;

use helmop_core::names::ANN_RESTAMP;
use helmop_core::progress::{RollState, roll_state};
use helmop_core::workload::WorkloadKind;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::DynamicObject;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::model::{ImageRow, ImageState};
use super::pass::{Setup, SetupOptions, report, table};
use super::rollouts::{Rollouts, Verdict, WorkloadKey};
use super::scan::Target;
use crate::args::ReportFormat;
use crate::error::{ExitStatus, PluginError};
use crate::humanize::humanize;
use crate::output::report::colour_stdout;
use crate::run::workloads::{self, Workload, new_restamp_value};
use crate::watch::Signals;
use crate::watch::debounce::backoff;
use crate::watch::events::Events;

/// Longest wait between failed polls.
const MAX_POLL_BACKOFF: Duration = Duration::from_secs(300);

/// How the watcher polls and reports.
pub struct WatchOptions {
    pub interval: Duration,
    /// How long a new digest must stay the same before its workload is restamped.
    pub debounce: Duration,
    pub output: ReportFormat,
    pub dry_run: bool,
}

/// Where the restamps of a poll go.
pub enum Restamps {
    /// Written by the poll loop itself, one at a time (`images --watch`).
    Direct,
    /// Handed to the rollout watcher's loop (`rollout --watch --images`), which writes each under
    /// its roll budget, pacing, breakers and holds, like any restamp it decides; `done` brings back
    /// each workload whose restamp landed (the next poll checks it was re-pinned).
    Handoff {
        requests: mpsc::UnboundedSender<Repin>,
        done: mpsc::UnboundedReceiver<WorkloadKey>,
    },
}

/// A workload whose image tags moved, for the rollout watcher to restamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repin {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    /// Which containers moved to which digests, for the report.
    pub moved: String,
}

pub async fn run(args: WatchOptions, setup: SetupOptions<'_>) -> Result<ExitStatus, PluginError> {
    // Installed first, so a signal during start-up is not lost.
    let mut signals = Signals::install()?;
    let setup = Setup::new(setup).await?;
    let events = Events::new(args.output);
    let (_always, leading) = watch::channel(true);
    let signal = run_loop(
        &args,
        &setup,
        &events,
        leading,
        Restamps::Direct,
        signals.recv(),
    )
    .await;
    events.stopped(signal);
    Ok(ExitStatus::Ok)
}

/// The polling loop, until `stop` resolves (its value is returned). Polls and restamps only while
/// `leading` says so: `rollout --watch --images` runs it under its own leader election, and a
/// standby neither polls the registries nor writes.
pub async fn run_loop(
    args: &WatchOptions,
    setup: &Setup,
    events: &Events,
    mut leading: watch::Receiver<bool>,
    mut restamps: Restamps,
    stop: impl std::future::Future<Output = &'static str>,
) -> &'static str {
    let mut stop = std::pin::pin!(stop);
    let debounce = args.debounce;
    let mut rollouts = Rollouts::new(debounce);
    events.emit(
        "started",
        &json!({
            "scope": setup.scope(),
            "interval": humanize(args.interval),
            "debounce": humanize(debounce),
            "dryRun": args.dry_run,
        }),
        format!(
            "watching the image tags of opted-in workloads {}: polling every {}, restamping once a new digest is stable for {}{}",
            setup.scope(),
            humanize(args.interval),
            humanize(debounce),
            if args.dry_run { " (dry run: writing nothing)" } else { "" }
        ),
    );
    let mut poll = 0u64;
    let mut failures = 0u32;
    'outer: loop {
        if !*leading.borrow() {
            tokio::select! {
                signal = &mut stop => break signal,
                _ = leading.wait_for(|l| *l) => {}
            }
        }
        poll += 1;
        // Restamps the rollout watcher landed since the last poll: this poll checks they took.
        if let Restamps::Handoff { done, .. } = &mut restamps {
            while let Ok(key) = done.try_recv() {
                rollouts.restamped(&key);
            }
        }
        let scanned = tokio::select! {
            signal = &mut stop => break signal,
            scanned = setup.scan() => scanned,
        };
        let wait = match scanned {
            Ok(scan) => {
                failures = 0;
                poll_event(events, poll, &scan, args.output == ReportFormat::Wide);
                let now = Instant::now();
                for verdict in rollouts.observe(now, &scan.rows) {
                    match verdict {
                        Verdict::NotRepinned(key, retry_in) => events.emit(
                            "not-repinned",
                            &json!({"namespace": key.0, "workload": key.1, "retryIn": humanize(retry_in)}),
                            format!(
                                "{} in namespace {} is still outdated after its restamp (is the helmop webhook installed, with image mode pin or annotate?); retrying in {}",
                                key.1, key.0, humanize(retry_in)
                            ),
                        ),
                        Verdict::Restamp(key, reasons) => {
                            let Some(target) = find(&scan.targets, &key) else {
                                continue;
                            };
                            if args.dry_run {
                                events.emit(
                                    "would-restamp",
                                    &json!({"namespace": key.0, "workload": key.1, "reasons": reasons}),
                                    format!("would restamp {} in namespace {} ({})", key.1, key.0, reasons.join("; ")),
                                );
                                continue;
                            }
                            if !*leading.borrow() {
                                continue;
                            }
                            if let Restamps::Handoff { requests, .. } = &restamps {
                                let repin = Repin {
                                    kind: target.kind,
                                    namespace: target.namespace.clone(),
                                    name: target.name.clone(),
                                    moved: reasons.join("; "),
                                };
                                if requests.send(repin).is_err() {
                                    break 'outer "the watcher stopped";
                                }
                                continue;
                            }
                            if let Some(why) = busy(setup, target).await {
                                let retry_in = rollouts.failed(Instant::now(), &key);
                                events.emit(
                                    "held",
                                    &json!({"namespace": key.0, "workload": key.1, "reasons": reasons, "why": why, "retryIn": humanize(retry_in)}),
                                    format!(
                                        "not restamping {} in namespace {}: {why}; looking again in {}",
                                        key.1, key.0, humanize(retry_in)
                                    ),
                                );
                                continue;
                            }
                            let restamped = tokio::select! {
                                signal = &mut stop => break 'outer signal,
                                r = restamp(setup, target) => r,
                            };
                            match restamped {
                                Ok(value) => {
                                    rollouts.restamped(&key);
                                    setup.ctx.record_write();
                                    events.emit(
                                        "restamped",
                                        &json!({"namespace": key.0, "workload": key.1, "reasons": reasons, "restamp": value}),
                                        format!(
                                            "restamped {} in namespace {} ({}): {ANN_RESTAMP}={value}",
                                            key.1, key.0, reasons.join("; ")
                                        ),
                                    );
                                }
                                Err(e) => {
                                    let retry_in = rollouts.failed(Instant::now(), &key);
                                    events.emit(
                                        "failed",
                                        &json!({"namespace": key.0, "workload": key.1, "error": e.to_string(), "retryIn": humanize(retry_in)}),
                                        format!(
                                            "restamping {} in namespace {} failed: {e}; retrying in {}",
                                            key.1, key.0, humanize(retry_in)
                                        ),
                                    );
                                }
                            }
                        }
                    }
                }
                jittered(args.interval)
            }
            Err(e) => {
                failures += 1;
                let wait = backoff(failures, MAX_POLL_BACKOFF).max(args.interval);
                events.emit(
                    "failed",
                    &json!({"poll": poll, "error": e.to_string(), "retryIn": humanize(wait)}),
                    format!("poll {poll} failed: {e}; retrying in {}", humanize(wait)),
                );
                wait
            }
        };
        tokio::select! {
            signal = &mut stop => break signal,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

fn find<'a>(targets: &'a [Target], key: &WorkloadKey) -> Option<&'a Target> {
    targets
        .iter()
        .find(|t| t.namespace == key.0 && t.workload() == key.1)
}

/// Why an Argo Rollout must not be restamped now (`None`: go ahead, and for every other kind): an
/// aborted one would be put back on the revision it aborted, one mid-canary would restart its steps.
/// Read just before the restamp; a read that fails says so (the restamp waits for the next try).
async fn busy(setup: &Setup, target: &Target) -> Option<String> {
    if target.kind != WorkloadKind::Rollout {
        return None;
    }
    let resource = crate::run::workloads::api_resource(target.kind);
    let api: Api<DynamicObject> =
        Api::namespaced_with(setup.ctx.upstream.clone(), &target.namespace, &resource);
    let obj = match api.get_opt(&target.name).await {
        Ok(Some(obj)) => obj,
        Ok(None) => return Some("the Rollout is gone".to_owned()),
        Err(e) => {
            return Some(format!(
                "its state cannot be read ({})",
                crate::cluster::api_error::describe(&e)
            ));
        }
    };
    match roll_state(target.kind, obj.metadata.generation, &obj.data) {
        RollState::Aborted => Some(
            "the Rollout is aborted (a restamp would roll it back onto the revision it aborted)"
                .to_owned(),
        ),
        RollState::Progressing(why) => Some(format!("{why} (a restamp would restart its steps)")),
        RollState::Complete | RollState::Stalled(_) => None,
    }
}

/// Writes a new `helmop.dev/restamp` with the plugin's restamp helper; returns the value.
async fn restamp(setup: &Setup, target: &Target) -> Result<String, PluginError> {
    let value = new_restamp_value(Timestamp::now(), target.restamp.as_deref());
    let workload = Workload {
        kind: target.kind,
        namespace: target.namespace.clone(),
        name: target.name.clone(),
        reads: BTreeSet::new(),
        refs: Vec::new(),
        restamp: target.restamp.clone(),
        config_hash: None,
    };
    workloads::restamp(&setup.ctx.upstream, &workload, &value)
        .await
        .map_err(|e| {
            crate::cluster::api_error::upstream(
                &format!(
                    "restamping {} in namespace {}",
                    target.workload(),
                    target.namespace
                ),
                &e,
            )
        })?;
    Ok(value)
}

fn poll_event(events: &Events, poll: u64, scan: &super::scan::Scan, wide: bool) {
    let doc = report(scan);
    let states: Vec<String> = doc
        .summary
        .iter()
        .map(|(state, n)| format!("{n} {state}"))
        .collect();
    let mut text = format!(
        "poll {poll}: {}",
        if states.is_empty() {
            "no opted-in workloads with mutable image tags".to_owned()
        } else {
            states.join(", ")
        }
    );
    // Current rows are in the JSON; the text shows what needs attention.
    let rows: Vec<ImageRow> = scan
        .rows
        .iter()
        .filter(|r| r.state != ImageState::Current)
        .cloned()
        .collect();
    if !rows.is_empty() {
        text.push('\n');
        text.push_str(table(&rows, wide, colour_stdout()).trim_end());
    }
    for w in &scan.warnings {
        text.push_str(&format!("\nwarning: {w}"));
    }
    events.emit(
        "poll",
        &json!({"poll": poll, "summary": doc.summary, "rows": doc.rows, "warnings": doc.warnings}),
        text,
    );
}

/// `interval` +-10%, so watchers started together drift apart.
fn jittered(interval: Duration) -> Duration {
    let unit = getrandom::u32().map_or(0.5, |r| f64::from(r) / f64::from(u32::MAX));
    interval.mul_f64(0.9 + 0.2 * unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent() {
        let i = Duration::from_secs(10);
        for _ in 0..200 {
            let j = jittered(i);
            assert!(
                j >= Duration::from_secs(9) && j <= Duration::from_secs(11),
                "{j:?}"
            );
        }
    }
}
