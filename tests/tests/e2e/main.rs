//! End-to-end tests against real local kube-apiservers: one control plane (clusters
//! `upstream`, `down1`, `down2`) is started per test binary by `helmop_tests::control_plane()`
//! and torn down when the binary exits. Build the binaries once with
//! `tests/controlplane/cp build`; see tests/controlplane/README.md.

mod check;
mod controlplane;
mod copies;
mod failure_isolation;
mod faults;
mod fleet_parity;
mod hostile_images;
mod identity;
mod identity_claims;
mod images;
mod images_build;
mod images_cmd;
mod install;
mod isolation;
mod node;
mod node_env;
mod node_flows;
mod plugin;
mod plugin_rollout;
mod plugin_watch;
mod propagator_service;
mod recreate;
mod rollout_load;
mod rollout_watch;
mod safety;
mod security;
mod shards;
mod stamping;
mod tenants;
mod validate;
mod webhook;
