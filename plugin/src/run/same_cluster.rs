//! What registrations claiming one cluster identity leave each other within a run.
//!
//! Such registrations are served one after the other ([`crate::run::runner`]), each through its own
//! credentials. When they do reach one cluster, a later one would find what an earlier one just
//! wrote; a dry run cannot know whether they do. So the rule is the same for both: a place an
//! earlier registration of the same claim wrote (or, dry, would write) this run, and a workload
//! it restamped, are left to that registration by the later ones, and the row says so. A real
//! clone (two clusters restored from one snapshot) gets its own write on the next run, when the
//! earlier registration has nothing left to do there.

use std::collections::BTreeMap;
use std::sync::Mutex;

use helmop_core::resource::ResourceRef;
use helmop_core::state::RowState;

/// A place on a cluster: (namespace, resource).
type Place = (String, ResourceRef);

/// Who restamped a workload, by (namespace, workload).
type Restamps = BTreeMap<(String, String), String>;

/// What one registration did at a place: its name and the row's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Done {
    pub by: String,
    pub state: RowState,
}

/// The run's record, per claimed identity.
#[derive(Default)]
pub struct SameCluster {
    places: Mutex<BTreeMap<String, BTreeMap<Place, Done>>>,
    workloads: Mutex<BTreeMap<String, Restamps>>,
}

impl SameCluster {
    /// What an earlier registration claiming `identity` did at `place` this run.
    pub fn place(&self, identity: Option<&str>, place: &Place) -> Option<Done> {
        let identity = identity?;
        let places = self.places.lock().unwrap_or_else(|p| p.into_inner());
        places.get(identity)?.get(place).cloned()
    }

    /// Records that `by` (claiming `identity`) wrote, or would write, at `place`.
    pub fn wrote(&self, identity: Option<&str>, place: Place, done: Done) {
        let Some(identity) = identity else { return };
        let mut places = self.places.lock().unwrap_or_else(|p| p.into_inner());
        places
            .entry(identity.to_string())
            .or_default()
            .entry(place)
            .or_insert(done);
    }

    /// The registration that restamped `workload` of `namespace` this run, if an earlier one
    /// claiming `identity` did.
    pub fn restamped_by(
        &self,
        identity: Option<&str>,
        namespace: &str,
        workload: &str,
    ) -> Option<String> {
        let identity = identity?;
        let workloads = self.workloads.lock().unwrap_or_else(|p| p.into_inner());
        workloads
            .get(identity)?
            .get(&(namespace.to_string(), workload.to_string()))
            .cloned()
    }

    /// Records that `by` (claiming `identity`) restamped, or would restamp, `workload`.
    pub fn restamped(&self, identity: Option<&str>, namespace: &str, workload: &str, by: &str) {
        let Some(identity) = identity else { return };
        let mut workloads = self.workloads.lock().unwrap_or_else(|p| p.into_inner());
        workloads
            .entry(identity.to_string())
            .or_default()
            .entry((namespace.to_string(), workload.to_string()))
            .or_insert_with(|| by.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_registration_of_a_claim_keeps_the_place() {
        let memory = SameCluster::default();
        let at = ("apps".to_string(), ResourceRef::secret("db"));
        let done = |by: &str| Done {
            by: by.into(),
            state: RowState::Created,
        };
        assert_eq!(memory.place(Some("x"), &at), None);
        memory.wrote(Some("x"), at.clone(), done("ns/a"));
        memory.wrote(Some("x"), at.clone(), done("ns/b"));
        memory.wrote(None, at.clone(), done("ns/c"));
        assert_eq!(memory.place(Some("x"), &at), Some(done("ns/a")));
        assert_eq!(memory.place(Some("y"), &at), None);
        assert_eq!(
            memory.place(None, &at),
            None,
            "an unknown identity claims nothing"
        );
        memory.restamped(Some("x"), "apps", "Deployment/web", "ns/a");
        assert_eq!(
            memory
                .restamped_by(Some("x"), "apps", "Deployment/web")
                .as_deref(),
            Some("ns/a")
        );
        assert_eq!(
            memory.restamped_by(Some("y"), "apps", "Deployment/web"),
            None
        );
    }
}
