//! A run over the downstream clusters, and what it is made of: which HelmOps and clusters it
//! covers and how it walks them ([`scope`], [`runner`], [`same_cluster`], and for a watcher's
//! run after edits, [`focus`]), what is upstream ([`inventory`], indexed by cluster in
//! [`by_cluster`] and kept between a watcher's runs in [`kept_inventory`]; [`sources`],
//! [`hash_key`]) and downstream ([`observe`], with a watcher's [`crate::cluster::kept_hashes`]),
//! how a cluster is planned and its rows made ([`plan`]), and the three runs: [`propagate`],
//! [`status`], [`prune`]. The workloads reading helmop's copies ([`workloads`], [`live_stamp`],
//! [`workload_ref`]) are read by these runs and by the watchers alike; what the rollout watcher
//! holds back of them ([`holds`]) by `status` and `check`.

pub mod by_cluster;
pub mod focus;
pub mod hash_key;
pub mod holds;
pub mod inventory;
pub mod kept_inventory;
pub mod live_stamp;
pub mod observe;
pub mod plan;
pub mod propagate;
pub mod prune;
pub mod runner;
pub mod same_cluster;
pub mod scope;
pub mod sources;
pub mod status;
pub mod workload_ref;
pub mod workloads;
