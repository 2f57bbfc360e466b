//! A watcher's inventory, kept from one run to the next: a run after nothing but edits of
//! sources plans from the inventory the run before it enumerated, instead of enumerating again.
//!
//! Why that is the same picture: what an inventory is made of (HelmOps, Clusters,
//! ClusterGroups, BundleNamespaceMappings, kubeconfig and `helmSecretName` Secrets) is watched,
//! and a change to any of it makes the next run something other than a run after source edits
//! alone ([`crate::run::focus::Focus::source_edits_only`], [`crate::run::focus::covered`]), which
//! enumerates afresh and keeps that. What is not watched (Policies, Bundles, Namespace labels,
//! the Clusters of mapped namespaces) is seen as of the last enumeration until the next run that
//! enumerates: another edit of a HelmOp or a Cluster, a retry, or the resync at the latest
//! (docs/decisions.md, "A source edit's run plans from the inventory the last run enumerated").
//!
//! Why keep it: at 10,000 Clusters an enumeration takes about a second of the run that copies an
//! edit (docs/performance.md).

use std::sync::{Mutex, PoisonError};

use crate::run::inventory::Inventory;

/// The last inventory a watcher's run enumerated, whole (every cluster, every kind).
#[derive(Debug, Default)]
pub struct KeptInventory {
    inventory: Mutex<Option<Inventory>>,
}

impl KeptInventory {
    /// The kept inventory, taken out: a run gives it back with [`KeptInventory::keep`] when it
    /// is done with it.
    pub fn take(&self) -> Option<Inventory> {
        self.inventory
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Keeps `inventory` for the next run.
    pub fn keep(&self, inventory: Inventory) {
        *self
            .inventory
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(inventory);
    }

    /// Forgets the kept inventory: the next run enumerates.
    pub fn clear(&self) {
        self.take();
    }
}
