//! Which workloads are stamped, and whether a stamped workload's stamp is behind what its pods would
//! read now: the one home of the opt-in rule (the webhook stamps by it, the plugin and the rollout
//! watcher report and restamp by it) and of the watcher's decision.
//!
//! The decision recomputes the stamp exactly as the webhook does on an UPDATE
//! ([`crate::hash::config_stamp_v2`]; a stored v1 stamp is never kept), so "due" means "an
//! UPDATE now would change the pod template": the workload would roll. The watcher only decides with
//! it; the webhook stays the only author of stamps (a restamp is an UPDATE it answers).

use std::collections::BTreeMap;

use crate::hash::{HashKey, Observed, config_stamp_v2};
use crate::names::LABEL_ROLLOUT_ON_CHANGE;
use crate::podrefs::PodRef;
use crate::resource::ResourceRef;

/// Distinct Secrets and ConfigMaps one workload may read and still be stamped: each is one lookup
/// per admission. Above it the webhook admits the workload without a stamp (with a warning), and
/// nothing restamps it.
pub const MAX_REFERENCES: usize = 256;

/// Why a workload is, or is not, stamped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptIn {
    /// The workload's own label `helmop.dev/rollout-on-change: "true"`.
    ByWorkload,
    /// Its namespace's label `helmop.dev/rollout-on-change: enabled`.
    ByNamespace,
    /// The workload's label is `"false"`, which overrides the namespace.
    OptedOut,
    NotOptedIn,
}

impl OptIn {
    pub fn stamps(self) -> bool {
        matches!(self, OptIn::ByWorkload | OptIn::ByNamespace)
    }
}

/// The opt-in decision. `workload` is the label on the workload's own `metadata.labels` (not on its
/// pod template: the template's labels belong to the pods and their selectors); `namespace` the
/// label on the Namespace. Any other workload value than `"true"`/`"false"` defers to the namespace.
pub fn opt_in(workload: Option<&str>, namespace: Option<&str>) -> OptIn {
    match by_workload(workload) {
        Some(decided) => decided,
        None if namespace == Some("enabled") => OptIn::ByNamespace,
        None => OptIn::NotOptedIn,
    }
}

/// The decision when the workload's own label makes it (`"true"` or `"false"`), so that a caller
/// reads the Namespace only when it has to.
pub fn by_workload(workload: Option<&str>) -> Option<OptIn> {
    match workload {
        Some("true") => Some(OptIn::ByWorkload),
        Some("false") => Some(OptIn::OptedOut),
        _ => None,
    }
}

/// [`opt_in`] on whole label maps.
pub fn opted_in(
    namespace_labels: &BTreeMap<String, String>,
    workload_labels: &BTreeMap<String, String>,
) -> bool {
    opt_in(
        workload_labels
            .get(LABEL_ROLLOUT_ON_CHANGE)
            .map(String::as_str),
        namespace_labels
            .get(LABEL_ROLLOUT_ON_CHANGE)
            .map(String::as_str),
    )
    .stamps()
}

/// Whether a `helmop.dev/restamp` value asks the webhook to resolve pinned mutable tags again: every
/// value does (`kubectl helmop rollout`, `images`, the watchers' image polls, a hand-written one)
/// but those that only record configuration, which helmop writes when what pods read changed: the
/// rollout watcher's (`watch:<time>`, `tries:...`, `seen:...`) and `propagate`'s (copy hashes `kind/name=hash`,
/// `propagate:<time>`). Those keep the pins: a ConfigMap edit must not ship the code a `:latest`
/// tag moved to meanwhile. The watcher's restamp for `--images` adds `repin:<time>`, which is not
/// one of them.
pub fn restamp_repins(value: &str) -> bool {
    let records_config = |entry: &str| {
        ["watch:", "tries:", "seen:", "propagate:"]
            .iter()
            .any(|p| entry.starts_with(p))
            || entry
                .split_once('=')
                .is_some_and(|(r, h)| r.contains('/') && !h.is_empty())
    };
    !value.split(',').all(records_config)
}

/// The label selector that lists exactly the workloads [`opt_in`] stamps in a namespace whose
/// label is `namespace` (`None`: unlabelled, or unreadable), so that lists leave the others on
/// the server: a workload labelled `"true"`, and in an enabled namespace every one not labelled
/// `"false"` (`!=` also selects workloads without the label).
pub fn opt_in_selector(namespace: Option<&str>) -> String {
    if namespace == Some("enabled") {
        format!("{LABEL_ROLLOUT_ON_CHANGE}!=false")
    } else {
        format!("{LABEL_ROLLOUT_ON_CHANGE}=true")
    }
}

/// Whether an opted-in workload must be restamped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An UPDATE now would write the stamp it has: nothing its pods read changed.
    Current,
    /// An UPDATE now would write `expected` instead of `current`: the workload would roll.
    Due {
        current: Option<String>,
        expected: String,
    },
    /// The webhook does not stamp it (the reason): restamping would change nothing.
    NotStamped(String),
    /// An UPDATE now would change the stamp, but to one with these required references absent:
    /// the new pods could not start (a Secret deleted to be created again, say), while the running
    /// ones keep what they read. Rolling waits until they exist again.
    Missing(Vec<ResourceRef>),
}

/// The decision for a pod template of `namespace` that reads `refs` and carries the stamp
/// `current`; `lookup` says what each referenced object holds now (called once per object).
///
/// A template that reads nothing is `Current` whatever it carries: the webhook drops a leftover
/// stamp on the next UPDATE anyway, and rolling pods that read nothing for it would be pointless.
pub fn decide<'a>(
    key: &HashKey,
    namespace: &str,
    refs: &[PodRef],
    current: Option<&str>,
    lookup: impl FnMut(&PodRef) -> Observed<'a>,
) -> Decision {
    if refs.is_empty() {
        return Decision::Current;
    }
    if refs.len() > MAX_REFERENCES {
        return Decision::NotStamped(format!(
            "it reads {} Secrets and ConfigMaps, more than the {MAX_REFERENCES} the webhook stamps",
            refs.len()
        ));
    }
    let stamp = config_stamp_v2(key, namespace, refs, lookup);
    if current == Some(stamp.config_hash.as_str()) {
        Decision::Current
    } else if !stamp.missing.is_empty() {
        Decision::Missing(stamp.missing)
    } else {
        Decision::Due {
            current: current.map(str::to_owned),
            expected: stamp.config_hash,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::hash::{ObjectData, config_stamp, config_stamp_v2};
    use crate::podrefs::Keys;
    use crate::test_support::labels;

    #[test]
    fn only_rollout_restamps_re_pin_images() {
        assert!(restamp_repins("rollout:2026-12-07T10:00:00Z"));
        assert!(restamp_repins("rollout:2026-12-07T10:00:00Z-1"));
        assert!(!restamp_repins("watch:2026-12-07T10:00:00Z,tries:1@0123"));
        assert!(restamp_repins(&format!(
            "watch:2026-12-07T10:00:00Z,tries:1@0123,seen:00,{}2026-12-07T10:00:00Z",
            crate::names::RESTAMP_REPIN
        )));
        assert!(!restamp_repins(
            "configmap/app=v1:aa,watch:2026-12-07T10:00:00Z"
        ));
        assert!(!restamp_repins(
            "secret/db=v1:aa,propagate:2026-12-07T10:00:00Z"
        ));
        assert!(
            restamp_repins("1"),
            "a hand-written value re-pins, as it always did"
        );
        assert!(restamp_repins(""));
        assert!(restamp_repins(
            "configmap/app=v1:aa,rollout:2026-12-07T10:00:00Z"
        ));
    }

    #[test]
    fn opt_in_rules() {
        let on = labels(&[(LABEL_ROLLOUT_ON_CHANGE, "enabled")]);
        let off = labels(&[]);
        let yes = labels(&[(LABEL_ROLLOUT_ON_CHANGE, "true")]);
        let no = labels(&[(LABEL_ROLLOUT_ON_CHANGE, "false")]);
        assert!(opted_in(&on, &off));
        assert!(!opted_in(&on, &no), "the workload's false wins");
        assert!(opted_in(&off, &yes));
        assert!(!opted_in(&off, &off));
        // `true` is the workload's value; on a namespace only `enabled` counts.
        assert!(!opted_in(&yes, &off));
        assert_eq!(opt_in(Some("maybe"), Some("enabled")), OptIn::ByNamespace);
        assert_eq!(opt_in(Some("maybe"), None), OptIn::NotOptedIn);
    }

    /// The selector's meaning as the API server applies it (`k=v`: has the label with that value;
    /// `k!=v`: has not), against the rule it stands for, over every case the rule tells apart.
    #[test]
    fn the_opt_in_selector_lists_exactly_what_the_rule_stamps() {
        let values = [None, Some("true"), Some("false"), Some("enabled"), Some("")];
        for namespace in values {
            let selector = opt_in_selector(namespace);
            let (key, value, equal) = match selector.split_once("!=") {
                Some((k, v)) => (k, v, false),
                None => match selector.split_once('=') {
                    Some((k, v)) => (k, v, true),
                    None => panic!("unexpected selector {selector}"),
                },
            };
            assert_eq!(key, LABEL_ROLLOUT_ON_CHANGE);
            for workload in values {
                let selected = (workload == Some(value)) == equal;
                let stamps = opt_in(workload, namespace).stamps();
                assert_eq!(
                    selected, stamps,
                    "namespace {namespace:?}, workload {workload:?}"
                );
            }
        }
    }

    fn key() -> HashKey {
        HashKey::new(&[7; 32]).unwrap()
    }

    fn data(value: &'static [u8]) -> ObjectData<'static> {
        ObjectData {
            type_: None,
            data: BTreeMap::from([("a", value)]),
            binary_data: BTreeMap::new(),
        }
    }

    #[test]
    fn only_true_and_false_on_the_workload_decide_without_the_namespace() {
        assert_eq!(by_workload(Some("true")), Some(OptIn::ByWorkload));
        assert_eq!(by_workload(Some("false")), Some(OptIn::OptedOut));
        for undecided in [None, Some(""), Some("enabled"), Some("True")] {
            assert_eq!(by_workload(undecided), None, "{undecided:?}");
            assert_eq!(opt_in(undecided, Some("enabled")), OptIn::ByNamespace);
        }
    }

    #[test]
    fn due_exactly_when_an_update_would_change_the_stamp() {
        let refs = vec![PodRef::new(
            ResourceRef::config_map("app"),
            Keys::All,
            false,
        )];
        let v2 = config_stamp_v2(&key(), "apps", &refs, |_| Observed::Data(data(b"1"))).config_hash;
        let lookup_1 = |_: &PodRef| Observed::Data(data(b"1"));
        assert_eq!(
            decide(&key(), "apps", &refs, Some(&v2), lookup_1),
            Decision::Current
        );
        match decide(&key(), "apps", &refs, Some(&v2), |_| {
            Observed::Data(data(b"2"))
        }) {
            Decision::Due { current, expected } => {
                assert_eq!(current.as_deref(), Some(v2.as_str()));
                assert_ne!(expected, v2);
                assert!(expected.starts_with("v2:"));
            }
            other => panic!("{other:?}"),
        }
        // Never stamped: the webhook would stamp it.
        assert!(matches!(
            decide(&key(), "apps", &refs, None, lookup_1),
            Decision::Due { current: None, .. }
        ));
        // The same stamp in another namespace is not current: stamps bind the namespace.
        assert!(matches!(
            decide(&key(), "other", &refs, Some(&v2), lookup_1),
            Decision::Due { .. }
        ));
    }

    #[test]
    fn a_stored_v1_stamp_is_due_whatever_it_matches() {
        // Keeping a v1 stamp that matched the content was an oracle (a tenant could plant another
        // namespace's v1 value and learn whether it matched): v1 is retired, a v1 workload is due.
        let refs = vec![PodRef::new(ResourceRef::secret("db"), Keys::All, false)];
        let v1 = config_stamp(&key(), &refs, |_| Observed::Data(data(b"1"))).config_hash;
        assert!(v1.starts_with("v1:"));
        for content in [b"1", b"2"] {
            assert!(matches!(
                decide(&key(), "apps", &refs, Some(&v1), |_| Observed::Data(data(
                    content
                ))),
                Decision::Due { .. }
            ));
        }
    }

    #[test]
    fn an_optional_reference_created_later_is_due() {
        let refs = vec![PodRef::new(
            ResourceRef::config_map("later"),
            Keys::All,
            true,
        )];
        let absent = config_stamp_v2(&key(), "apps", &refs, |_| Observed::Absent).config_hash;
        assert_eq!(
            decide(&key(), "apps", &refs, Some(&absent), |_| Observed::Absent),
            Decision::Current
        );
        assert!(matches!(
            decide(&key(), "apps", &refs, Some(&absent), |_| Observed::Data(
                data(b"x")
            )),
            Decision::Due { .. }
        ));
    }

    #[test]
    fn a_required_reference_gone_waits_for_it_to_come_back() {
        let db = ResourceRef::secret("db");
        let refs = vec![PodRef::new(db.clone(), Keys::All, false)];
        let v2 = config_stamp_v2(&key(), "apps", &refs, |_| Observed::Data(data(b"1"))).config_hash;
        assert_eq!(
            decide(&key(), "apps", &refs, Some(&v2), |_| Observed::Absent),
            Decision::Missing(vec![db.clone()]),
            "deleted to be recreated: rolling now would start pods that cannot start"
        );
        assert!(matches!(
            decide(&key(), "apps", &refs, Some(&v2), |_| Observed::Data(data(
                b"2"
            ))),
            Decision::Due { .. }
        ));
        // The same absence stamped at admission is current: nothing to wait for.
        let absent = config_stamp_v2(&key(), "apps", &refs, |_| Observed::Absent).config_hash;
        assert_eq!(
            decide(&key(), "apps", &refs, Some(&absent), |_| Observed::Absent),
            Decision::Current
        );
    }

    #[test]
    fn templates_that_read_nothing_or_too_much_are_left_alone() {
        assert_eq!(
            decide(&key(), "apps", &[], Some("v2:old"), |_| Observed::Absent),
            Decision::Current
        );
        let many: Vec<PodRef> = (0..=MAX_REFERENCES)
            .map(|i| PodRef::new(ResourceRef::config_map(format!("c{i}")), Keys::All, true))
            .collect();
        match decide(&key(), "apps", &many, None, |_| Observed::Absent) {
            Decision::NotStamped(why) => assert!(why.contains("257"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
