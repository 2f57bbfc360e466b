//! helmop's domain logic. Everything here is pure: no network, no filesystem, no clock.
//! The webhook and the plugin do the I/O and call into these functions.

pub mod check;
pub mod fleet_copy;
pub mod goregex;
pub mod gotemplate;
pub mod hash;
pub mod mapping;
pub mod model;
pub mod name_rules;
pub mod names;
pub mod plan;
pub mod podrefs;
pub mod progress;
pub mod resource;
pub mod rollout;
pub mod selector;
pub mod sharding;
pub mod state;
pub mod targeting;
pub mod text;
pub mod validate;
pub mod workload;
pub mod yaml;

/// What several modules' unit tests build their inputs with.
#[cfg(test)]
pub(crate) mod test_support {
    use std::collections::BTreeMap;

    /// A label (or annotation) map from pairs.
    pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}
