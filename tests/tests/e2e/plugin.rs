//! `kubectl-helmop propagate`, `status` and `prune` end to end: the real binary against the
//! shared control plane (upstream + down1 + down2, Fleet Clusters registered per test in a fresh
//! namespace) and, for stopping an API server, a private one.

mod conventions;
mod holds;
mod ownership;
mod propagate;
mod prune;
mod source_changes;
pub mod support;
mod unreachable;
