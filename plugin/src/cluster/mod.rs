//! Reaching clusters: the context every cluster-facing command shares ([`context::Ctx`]: the
//! upstream client and id), the downstream clusters and the clients (and, for a watcher, the
//! reads, the hashes of unchanged copies and the last listings of copies) kept for them, the trust
//! roots, and what a `kube::Error` means to a user.

pub mod api_error;
pub mod client_cache;
pub mod cluster_store;
pub mod clusters;
pub mod context;
pub mod http_client;
pub mod kept_hashes;
pub mod kept_listings;
pub mod kube_api;
pub mod lean_list;
pub mod read_cache;
pub mod roots;
pub mod upstream_id;
