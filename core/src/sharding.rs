//! Which HelmOps a shard handles, exactly as Fleet's controllers decide (`pkg/sharding` in Fleet
//! v0.16.1, `ShouldProcess` and `FilterByShardID`): a shard with an ID handles the objects whose
//! [`FLEET_SHARD_REF_LABEL`] equals that ID; the unsharded (default) controller handles only the
//! objects without that label, whatever its value (an empty value included, which no shard then
//! handles, as in Fleet).
//!
//! A third case is helmop's own: a one-shot `propagate` run at a terminal speaks for every HelmOp
//! it lists ([`Shard::Every`]), sharded or not.

use std::collections::BTreeMap;

use crate::name_rules::label_value_error;
use crate::names::FLEET_SHARD_REF_LABEL;

/// The HelmOps one process handles.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Shard {
    /// Every HelmOp, labelled or not (one-shot commands).
    #[default]
    Every,
    /// Fleet's unsharded controller: the HelmOps without [`FLEET_SHARD_REF_LABEL`]
    /// (`propagate --watch` without `--shard-id`).
    Unlabelled,
    /// `--shard-id ID`: the HelmOps labelled [`FLEET_SHARD_REF_LABEL`]`: ID`.
    Id(String),
}

impl Shard {
    /// Fleet's `ShouldProcess` for an object with these labels.
    pub fn handles(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let label = labels.and_then(|l| l.get(FLEET_SHARD_REF_LABEL));
        match self {
            Shard::Every => true,
            Shard::Unlabelled => label.is_none(),
            Shard::Id(id) => label == Some(id),
        }
    }

    /// The label selector a list or watch of what this shard handles uses; `None` for every object.
    pub fn label_selector(&self) -> Option<String> {
        match self {
            Shard::Every => None,
            Shard::Unlabelled => Some(format!("!{FLEET_SHARD_REF_LABEL}")),
            Shard::Id(id) => Some(format!("{FLEET_SHARD_REF_LABEL}={id}")),
        }
    }

    /// The shard's ID, `None` for the other two.
    pub fn id(&self) -> Option<&str> {
        match self {
            Shard::Id(id) => Some(id),
            Shard::Every | Shard::Unlabelled => None,
        }
    }

    /// Words for messages: `shard "a"`, `the unsharded HelmOps`, `every HelmOp`.
    pub fn describe(&self) -> String {
        match self {
            Shard::Every => "every HelmOp, sharded or not".to_owned(),
            Shard::Unlabelled => format!("the HelmOps without {FLEET_SHARD_REF_LABEL}"),
            Shard::Id(id) => format!("the HelmOps labelled {FLEET_SHARD_REF_LABEL}={id}"),
        }
    }
}

/// A `--shard-id`: a label value (Fleet compares it with one) and not empty (an empty ID is Fleet's
/// unsharded controller, which is `propagate --watch` without the flag).
pub fn parse_shard_id(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err(format!(
            "must not be empty (leave --shard-id out to handle the HelmOps without {FLEET_SHARD_REF_LABEL})"
        ));
    }
    match label_value_error(s) {
        Some(e) => Err(format!("{s:?} is no label value: {e}")),
        None => Ok(s.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::labels;

    /// The cases of Fleet's `ShouldProcess` (pkg/sharding/sharding.go, v0.16.1): no labels at all,
    /// labels without the key, the key with the shard's value, another value, an empty value.
    #[test]
    fn shards_decide_as_fleets_should_process() {
        let a = Shard::Id("a".into());
        // (labels, handled by the unsharded controller, handled by shard a)
        let cases = [
            (None, true, false),
            (Some(labels(&[("team", "x")])), true, false),
            (Some(labels(&[(FLEET_SHARD_REF_LABEL, "a")])), false, true),
            (Some(labels(&[(FLEET_SHARD_REF_LABEL, "b")])), false, false),
            // The label is there: not the unsharded controller's, and no ID is empty.
            (Some(labels(&[(FLEET_SHARD_REF_LABEL, "")])), false, false),
        ];
        for (l, unlabelled, shard_a) in cases {
            assert_eq!(Shard::Unlabelled.handles(l.as_ref()), unlabelled, "{l:?}");
            assert_eq!(a.handles(l.as_ref()), shard_a, "{l:?}");
            assert!(Shard::Every.handles(l.as_ref()), "{l:?}");
        }
    }

    #[test]
    fn selectors_select_what_handles_accepts() {
        assert_eq!(Shard::Every.label_selector(), None);
        assert_eq!(
            Shard::Unlabelled.label_selector().as_deref(),
            Some("!fleet.cattle.io/shard-ref")
        );
        assert_eq!(
            Shard::Id("shard-1".into()).label_selector().as_deref(),
            Some("fleet.cattle.io/shard-ref=shard-1")
        );
    }

    #[test]
    fn shard_ids_are_label_values() {
        assert_eq!(parse_shard_id("shard0"), Ok("shard0".into()));
        assert_eq!(parse_shard_id("Shard_A.1"), Ok("Shard_A.1".into()));
        for bad in ["", "-a", "a b", "a/b", &"x".repeat(64)] {
            let e = parse_shard_id(bad).expect_err(bad);
            assert!(!e.is_empty(), "{bad}");
        }
        assert!(
            parse_shard_id("")
                .expect_err("empty")
                .contains("leave --shard-id out")
        );
    }
}
