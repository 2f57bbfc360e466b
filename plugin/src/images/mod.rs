//! `kubectl helmop images`: the mutable image tags of opted-in workloads, the digest each runs and the
//! registry's digest for the tag now ([`model`], [`scan`]); with `--watch`, restamping the workloads whose
//! tags moved, once per burst of pushes ([`rollouts`], [`watch`]). Registry access, credentials and
//! digest parsing are the webhook's own code (crate `helmop-images`), so both agree on every digest.

pub mod model;
pub mod pass;
pub mod rollouts;
pub mod scan;
pub mod watch;
