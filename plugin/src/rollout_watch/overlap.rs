//! Watchers whose scopes nest: the narrower one stands by while a wider one leads, so one workload is
//! never restamped by two watchers (two roll budgets, two Events, two PATCHes for one change).
//!
//! Every rollout watcher that elects a leader writes its scope on its Lease: the label
//! [`LABEL`], and the annotations [`ANN_NAMESPACE`] (absent: every namespace) and [`ANN_SELECTOR`]
//! (absent: every workload). A watcher whose scope is *contained* in the scope of another Lease of
//! the same Lease namespace that is held and fresh (renewed within its lease duration, as measured on
//! this process's own clock, as the election does) writes nothing until that Lease is released or
//! goes stale; equal scopes under two Lease names (`--lease-name`) leave it to the smaller name.
//! Containment is decided on the flags alone: `-A` contains `-n apps`, and `-n apps` contains
//! `-n apps -l team=a`. Scopes that overlap without one containing the other (two different `-l`
//! selectors, `-A -l team=a` and `-n apps`) are not detected: the flags do not say which workloads
//! both select (docs/decisions.md). A watcher of every namespace and every workload is contained in
//! nothing, so it does not watch Leases at all (the shipped in-cluster watcher needs no new right).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;

use crate::watch::service::LeaseMeta;

/// On a rollout watcher's Lease: says the annotations below describe its scope.
pub const LABEL: &str = "helmop.dev/rollout-watcher";
/// The namespace it watches (absent: every namespace).
pub const ANN_NAMESPACE: &str = "helmop.dev/scope-namespace";
/// Its `-l` selector (absent: every workload).
pub const ANN_SELECTOR: &str = "helmop.dev/scope-selector";

/// What a rollout watcher watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchScope {
    pub namespace: Option<String>,
    pub selector: Option<String>,
}

impl WatchScope {
    /// Whether every workload `other` watches is one this scope watches, on the flags alone.
    pub fn contains(&self, other: &WatchScope) -> bool {
        (self.namespace.is_none() || self.namespace == other.namespace)
            && (self.selector.is_none() || self.selector == other.selector)
    }

    /// Every namespace, every workload: no other scope contains it.
    pub fn is_widest(&self) -> bool {
        self.namespace.is_none() && self.selector.is_none()
    }

    /// The Lease `default_name` of this scope, with what its leader writes on it.
    pub fn lease_meta(&self, default_name: String) -> LeaseMeta {
        let mut annotations = BTreeMap::new();
        if let Some(ns) = &self.namespace {
            annotations.insert(ANN_NAMESPACE.to_owned(), ns.clone());
        }
        if let Some(selector) = &self.selector {
            annotations.insert(ANN_SELECTOR.to_owned(), selector.clone());
        }
        LeaseMeta {
            default_name,
            labels: BTreeMap::from([(LABEL.to_owned(), "scope".to_owned())]),
            annotations,
        }
    }

    /// `all namespaces`, `namespace apps, -l team=a`.
    pub fn describe(&self) -> String {
        let mut text = match &self.namespace {
            Some(ns) => format!("namespace {ns}"),
            None => "all namespaces".to_owned(),
        };
        if let Some(selector) = &self.selector {
            text.push_str(&format!(", -l {selector}"));
        }
        text
    }
}

/// What the loop keeps of another watcher's Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseFacts {
    pub scope: WatchScope,
    /// Someone holds it (a released Lease has no holder).
    pub held: bool,
    pub version: String,
    pub duration: Duration,
}

/// The facts of a Lease written by a rollout watcher (`None` for any other Lease).
pub fn facts_of(lease: &Lease) -> Option<(String, LeaseFacts)> {
    let meta = &lease.metadata;
    meta.labels.as_ref()?.get(LABEL)?;
    let name = meta.name.clone()?;
    let annotations = meta.annotations.clone().unwrap_or_default();
    let spec = lease.spec.as_ref();
    let seconds = spec
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .unwrap_or(0);
    Some((
        name,
        LeaseFacts {
            scope: WatchScope {
                namespace: annotations.get(ANN_NAMESPACE).cloned(),
                selector: annotations.get(ANN_SELECTOR).cloned(),
            },
            held: spec
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| !h.is_empty()),
            version: meta.resource_version.clone().unwrap_or_default(),
            duration: Duration::from_secs(seconds),
        },
    ))
}

#[derive(Debug)]
struct Seen {
    facts: LeaseFacts,
    /// When this process last saw the Lease change (a renewal changes it).
    changed: Instant,
}

/// The other rollout watchers' Leases of the Lease namespace.
#[derive(Debug, Default)]
pub struct Overlaps {
    leases: HashMap<String, Seen>,
}

impl Overlaps {
    pub fn put(&mut self, name: String, facts: LeaseFacts, now: Instant) {
        let changed = match self.leases.get(&name) {
            Some(seen) if seen.facts.version == facts.version => seen.changed,
            _ => now,
        };
        self.leases.insert(name, Seen { facts, changed });
    }

    pub fn delete(&mut self, name: &str) {
        self.leases.remove(name);
    }

    /// Keeps only the Leases a new listing brought again.
    pub fn retain(&mut self, listed: &std::collections::HashSet<String>) {
        self.leases.retain(|name, _| listed.contains(name));
    }

    /// The name and scope of a held, fresh Lease (not `own_lease`) whose scope contains `own`, if
    /// any: then this watcher stands by.
    pub fn covering(
        &self,
        own_lease: &str,
        own: &WatchScope,
        now: Instant,
    ) -> Option<(&str, &WatchScope)> {
        self.leases
            .iter()
            .filter(|(name, _)| name.as_str() != own_lease)
            .filter(|(_, seen)| {
                seen.facts.held && now.saturating_duration_since(seen.changed) < seen.facts.duration
            })
            .filter(|(name, seen)| {
                let theirs = &seen.facts.scope;
                // Equal scopes under two names: the smaller name leads both.
                theirs.contains(own) && (!own.contains(theirs) || name.as_str() < own_lease)
            })
            .min_by(|a, b| a.0.cmp(b.0))
            .map(|(name, seen)| (name.as_str(), &seen.facts.scope))
    }

    /// When a Lease that covers `own` now would go stale, if nothing renews it (the loop looks again
    /// then).
    pub fn next_expiry(&self, own_lease: &str, own: &WatchScope) -> Option<Instant> {
        self.leases
            .iter()
            .filter(|(name, seen)| {
                name.as_str() != own_lease && seen.facts.held && seen.facts.scope.contains(own)
            })
            .map(|(_, seen)| seen.changed + seen.facts.duration)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(ns: Option<&str>, selector: Option<&str>) -> WatchScope {
        WatchScope {
            namespace: ns.map(str::to_owned),
            selector: selector.map(str::to_owned),
        }
    }

    fn facts(s: WatchScope, held: bool, version: &str) -> LeaseFacts {
        LeaseFacts {
            scope: s,
            held,
            version: version.to_owned(),
            duration: Duration::from_secs(15),
        }
    }

    #[test]
    fn containment_is_decided_on_the_flags() {
        let all = scope(None, None);
        let apps = scope(Some("apps"), None);
        let team = scope(Some("apps"), Some("team=a"));
        let all_team = scope(None, Some("team=a"));
        assert!(all.contains(&apps) && all.contains(&team) && all.contains(&all_team));
        assert!(apps.contains(&team) && !team.contains(&apps));
        assert!(all_team.contains(&team));
        assert!(!apps.contains(&all) && !apps.contains(&scope(Some("web"), None)));
        // Partial overlaps are not containment either way.
        assert!(!all_team.contains(&apps) && !apps.contains(&all_team));
        assert!(all.is_widest() && !apps.is_widest() && !all_team.is_widest());
    }

    #[test]
    fn a_fresh_wider_lease_covers_until_released_or_stale() {
        let t0 = Instant::now();
        let own = scope(Some("apps"), None);
        let mut o = Overlaps::default();
        o.put(
            "kubectl-helmop-rollout".into(),
            facts(scope(None, None), true, "1"),
            t0,
        );
        let covered = o.covering("kubectl-helmop-rollout-ns-apps", &own, t0);
        assert_eq!(covered.map(|c| c.0), Some("kubectl-helmop-rollout"));
        // Renewed (a new version) at t0 + 10 s: fresh until t0 + 25 s.
        o.put(
            "kubectl-helmop-rollout".into(),
            facts(scope(None, None), true, "2"),
            t0 + Duration::from_secs(10),
        );
        // The same version seen again does not renew it.
        o.put(
            "kubectl-helmop-rollout".into(),
            facts(scope(None, None), true, "2"),
            t0 + Duration::from_secs(20),
        );
        let own_lease = "kubectl-helmop-rollout-ns-apps";
        assert!(
            o.covering(own_lease, &own, t0 + Duration::from_secs(24))
                .is_some()
        );
        assert_eq!(
            o.next_expiry(own_lease, &own),
            Some(t0 + Duration::from_secs(25))
        );
        assert!(
            o.covering(own_lease, &own, t0 + Duration::from_secs(25))
                .is_none(),
            "stale"
        );
        // Released: at once.
        o.put(
            "kubectl-helmop-rollout".into(),
            facts(scope(None, None), false, "3"),
            t0 + Duration::from_secs(26),
        );
        assert!(
            o.covering(own_lease, &own, t0 + Duration::from_secs(26))
                .is_none()
        );
    }

    #[test]
    fn narrower_and_own_leases_never_cover_and_equal_scopes_pick_one() {
        let t0 = Instant::now();
        let apps = scope(Some("apps"), None);
        let mut o = Overlaps::default();
        o.put(
            "narrow".into(),
            facts(scope(Some("apps"), Some("team=a")), true, "1"),
            t0,
        );
        o.put("mine".into(), facts(apps.clone(), true, "1"), t0);
        assert!(o.covering("mine", &apps, t0).is_none());
        o.put("b-twin".into(), facts(apps.clone(), true, "1"), t0);
        assert!(
            o.covering("mine", &apps, t0).is_some(),
            "b-twin < mine leads both"
        );
        assert!(o.covering("a-first", &apps, t0).is_none());
        o.delete("b-twin");
        assert!(o.covering("mine", &apps, t0).is_none());
    }

    #[test]
    fn only_rollout_watcher_leases_are_read() {
        let mut lease = Lease::default();
        lease.metadata.name = Some("kubectl-helmop-propagate".into());
        assert!(facts_of(&lease).is_none());
        let meta = scope(Some("apps"), Some("team=a")).lease_meta("l".into());
        lease.metadata.name = Some("kubectl-helmop-rollout-ns-apps".into());
        lease.metadata.labels = Some(meta.labels);
        lease.metadata.annotations = Some(meta.annotations);
        lease.metadata.resource_version = Some("7".into());
        let (name, f) = facts_of(&lease).expect("a watcher's Lease");
        assert_eq!(name, "kubectl-helmop-rollout-ns-apps");
        assert_eq!(f.scope, scope(Some("apps"), Some("team=a")));
        assert!(!f.held, "no holder yet");
    }
}
