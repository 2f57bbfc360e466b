//! The rollout watcher's holds, read back from its Events: a workload it holds back (a required
//! Secret or key missing, a flap breaker open, given up, unwatched, an Argo Rollout busy; see
//! docs/propagator.md, "Brakes") carries a `Warning` Event of the watcher, and a later
//! `Restamped` Event ends the hold. `status` shows them on its workload rows and `check` as one
//! finding; both read them here. Which Event is newest is decided by [`Newest`], without I/O.

use std::collections::BTreeMap;
use std::fmt;

use helmop_core::check::{HOLD_REASONS, Hold};
use helmop_core::names;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::cluster::api_error;

/// How many Events one [`read`] lists at most (pages of 500): its cost is bounded whatever
/// the namespace or cluster holds; past it, the pages read are what is known.
pub const MAX_EVENTS: usize = 5_000;

/// Events per page.
const PAGE: u32 = 500;

/// The Event that ends a hold.
const RESTAMPED: &str = "Restamped";

/// A workload as the watcher's Events name it (`involvedObject`); the kind in lower case.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkloadId {
    pub namespace: String,
    pub kind: String,
    pub name: String,
}

impl WorkloadId {
    pub fn new(namespace: &str, kind: &str, name: &str) -> WorkloadId {
        WorkloadId {
            namespace: namespace.to_owned(),
            kind: kind.to_ascii_lowercase(),
            name: name.to_owned(),
        }
    }
}

/// `namespace/kind/name`, as `check` lists held workloads.
impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.kind, self.name)
    }
}

/// Per workload, the newest Event of the rollout watcher among its hold reasons
/// ([`HOLD_REASONS`]) and `Restamped`. Events are added one at a time (a page after another), so
/// a listing is never held whole.
#[derive(Clone, Debug, Default)]
pub struct Newest {
    latest: BTreeMap<WorkloadId, (Timestamp, Hold)>,
}

impl Newest {
    /// Takes `e` into account: kept when the watcher reported it, its reason is a hold or
    /// `Restamped`, it names a workload, and it is newer than what is known of that workload. On
    /// equal times a hold wins: showing a hold that may have ended is the safer mistake.
    pub fn add(&mut self, e: &Event) {
        if e.reporting_component.as_deref() != Some(names::ROLLOUT_WATCHER_COMPONENT) {
            return;
        }
        let reason = e.reason.as_deref().unwrap_or_default();
        let hold = HOLD_REASONS.iter().any(|(r, _)| *r == reason);
        if !hold && reason != RESTAMPED {
            return;
        }
        let o = &e.involved_object;
        let (Some(ns), Some(kind), Some(name)) = (&o.namespace, &o.kind, &o.name) else {
            return;
        };
        let at = event_time(e);
        let workload = WorkloadId::new(ns, kind, name);
        let newer = match self.latest.get(&workload) {
            None => true,
            Some((known, _)) => at > *known || (at == *known && hold),
        };
        if newer {
            let note = e.message.clone().unwrap_or_default();
            let reason = reason.to_owned();
            self.latest.insert(workload, (at, Hold { reason, note }));
        }
    }

    /// The workloads whose newest such Event is a hold, with it.
    pub fn holds(self) -> BTreeMap<WorkloadId, Hold> {
        self.latest
            .into_iter()
            .filter(|(_, (_, h))| h.reason != RESTAMPED)
            .map(|(w, (_, h))| (w, h))
            .collect()
    }
}

/// When an Event last happened: the latest of its series' last observation, its `eventTime` and
/// its `lastTimestamp` (an aggregated Event keeps its first `eventTime`); the epoch without any.
fn event_time(e: &Event) -> Timestamp {
    [
        e.series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .map(|t| t.0),
        e.event_time.as_ref().map(|t| t.0),
        e.last_timestamp.as_ref().map(|t| t.0),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// What one [`read`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// The workloads held now, with their hold.
    pub held: BTreeMap<WorkloadId, Hold>,
    /// False when [`MAX_EVENTS`] were read before the listing ended: a hold may be missing.
    pub complete: bool,
}

/// The holds of the workloads in `namespace` (all namespaces with `None`), from one paged,
/// bounded listing of Events ([`MAX_EVENTS`]). `Err` says why the Events could not be listed.
pub async fn read(client: &Client, namespace: Option<&str>) -> Result<Holds, String> {
    let api: Api<Event> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut newest = Newest::default();
    let mut params = ListParams::default().limit(PAGE);
    let mut read = 0;
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| api_error::describe(&e))?;
        read += page.items.len();
        for e in &page.items {
            newest.add(e);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            None => {
                return Ok(Holds {
                    held: newest.holds(),
                    complete: true,
                });
            }
            Some(token) if read < MAX_EVENTS => params = params.continue_token(&token),
            Some(_) => {
                return Ok(Holds {
                    held: newest.holds(),
                    complete: false,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EventSeries, ObjectReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// An Event of the watcher about Deployment `name` in `apps`, at `second`.
    fn event(name: &str, reason: &str, second: i64) -> Event {
        Event {
            reporting_component: Some(names::ROLLOUT_WATCHER_COMPONENT.into()),
            reason: Some(reason.into()),
            message: Some(format!("{reason} note")),
            event_time: Some(MicroTime(at(second))),
            involved_object: ObjectReference {
                namespace: Some("apps".into()),
                kind: Some("Deployment".into()),
                name: Some(name.into()),
                ..ObjectReference::default()
            },
            ..Event::default()
        }
    }

    fn holds(events: &[Event]) -> Vec<(String, String)> {
        let mut newest = Newest::default();
        for e in events {
            newest.add(e);
        }
        newest
            .holds()
            .into_iter()
            .map(|(w, h)| (w.to_string(), h.reason))
            .collect()
    }

    #[test]
    fn the_newest_event_of_each_workload_decides_in_any_order() {
        let events = [
            event("web", "RestampHeld", 10),
            event("web", "Restamped", 20),
            event("api", "Restamped", 10),
            event("api", "RestampBreakerOpen", 20),
            event("db", "RestampIneffective", 5),
        ];
        let want = vec![
            (
                "apps/deployment/api".to_owned(),
                "RestampBreakerOpen".to_owned(),
            ),
            (
                "apps/deployment/db".to_owned(),
                "RestampIneffective".to_owned(),
            ),
        ];
        assert_eq!(holds(&events), want);
        let mut reversed = events.to_vec();
        reversed.reverse();
        assert_eq!(holds(&reversed), want);
        // Held again after a restamp.
        let again = [
            event("web", "Restamped", 20),
            event("web", "RestampHeld", 30),
        ];
        assert_eq!(
            holds(&again),
            [("apps/deployment/web".to_owned(), "RestampHeld".to_owned())]
        );
    }

    #[test]
    fn a_series_and_last_timestamp_count_as_when_it_happened() {
        // Aggregated: the hold's series was observed after the restamp.
        let mut held = event("web", "RestampHeld", 10);
        held.series = Some(EventSeries {
            count: Some(3),
            last_observed_time: Some(MicroTime(at(30))),
        });
        assert_eq!(holds(&[held, event("web", "Restamped", 20)]).len(), 1);
        // A core/v1 Event with only lastTimestamp.
        let mut old = event("web", "RestampHeld", 0);
        old.event_time = None;
        old.last_timestamp = Some(Time(at(40)));
        assert_eq!(holds(&[event("web", "Restamped", 20), old]).len(), 1);
        // Equal times: the hold is shown.
        let tie = [
            event("web", "RestampHeld", 20),
            event("web", "Restamped", 20),
        ];
        assert_eq!(holds(&tie).len(), 1);
        let mut tie = tie.to_vec();
        tie.reverse();
        assert_eq!(holds(&tie).len(), 1);
    }

    #[test]
    fn other_components_reasons_and_objects_are_ignored() {
        let mut foreign = event("web", "RestampHeld", 10);
        foreign.reporting_component = Some("kubectl-helmop".into());
        let mut unrelated = event("api", "RestampHeld", 10);
        let later_other_reason = event("api", "RolloutStarted", 20);
        let mut no_name = event("db", "RestampHeld", 10);
        no_name.involved_object.name = None;
        unrelated.involved_object.kind = Some("StatefulSet".into());
        let got = holds(&[foreign, unrelated, later_other_reason, no_name]);
        assert_eq!(
            got,
            [("apps/statefulset/api".to_owned(), "RestampHeld".to_owned())]
        );
    }

    #[test]
    fn every_hold_reason_holds_and_the_watcher_reports_as_read() {
        for (reason, _) in HOLD_REASONS {
            assert_eq!(holds(&[event("web", reason, 1)]).len(), 1, "{reason}");
        }
        // Its short names are the watcher's (`held` events, `helmop_rollout_held{reason}`).
        for (label, _) in helmop_core::check::HOLD_LABELS {
            assert!(
                HOLD_REASONS
                    .iter()
                    .any(|(r, _)| helmop_core::check::hold_label(r) == label),
                "{label}"
            );
        }
    }
}
