//! A simulated fleet of distinct clusters (`fleetsim`), a counting proxy for real API servers, and the
//! `helmop-bench fleet` measurements that use them.

pub mod bench;
pub mod churn;
pub mod proxy;
pub mod route;
pub mod scenario;
pub mod sim;
pub mod store;
