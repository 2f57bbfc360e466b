//! `helmop-images`: what the webhook and the plugin both need to know about container images - parsing
//! references ([`mod@reference`]), which tags move ([`tags`]), the containers and recorded digests of a pod
//! template ([`podspec`]), registry credentials ([`auth`], [`pull_secrets`]), where the client may connect ([`policy`]) and the OCI distribution client
//! that resolves a tag to a digest ([`client`]), and how much image work a workload gets ([`mode`]). One copy, so both programs agree on what a digest is.

pub mod auth;
pub mod cache;
pub mod client;
pub mod mode;
pub mod podspec;
pub mod policy;
pub mod pull_secrets;
pub mod reference;
pub mod tags;

pub use mode::ImageMode;
