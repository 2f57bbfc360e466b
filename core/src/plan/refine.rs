//! What a planned write can really do on the API server, decided before anything is written so
//! that `--dry-run` prints what the real run then does: Kubernetes refuses to change a Secret's
//! `type` in place, and refuses any change to the data of an object marked `immutable`. Such an
//! update of helmop's own copy becomes a [`ActionKind::Recreate`] (delete with uid and
//! resourceVersion preconditions, then create); of an object helmop does not own (an `--adopt`)
//! it becomes a `Conflict` that says what to do.

use super::{Action, ActionKind, ConflictReason, RecreateReason, UpdateReason};
use crate::names;

/// What the caller read from the live object at the copy's place (never its data).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveFacts {
    /// The Secret's `type` (`None` for ConfigMaps).
    pub type_: Option<String>,
    pub immutable: bool,
    pub resource_version: String,
    /// The live content hash (as [`super::ObservedCopy::data_hash`]); `None` when unknown.
    pub data_hash: Option<String>,
}

/// Turns an `Update` that cannot be done in place into `Recreate` or `Conflict`; every other
/// action is returned as it is. `source_type` is the source Secret's `type` (`None` for a
/// ConfigMap); an absent Secret type means `Opaque`, as the API server defaults it.
pub fn refine(action: Action, live: Option<&LiveFacts>, source_type: Option<&str>) -> Action {
    let Some(live) = live else {
        return action;
    };
    let ActionKind::Update {
        source,
        uid,
        meta,
        reasons,
    } = &action.kind
    else {
        return action;
    };
    let secret_type = |t: Option<&str>| t.unwrap_or("Opaque").to_string();
    let is_secret = action.resource.kind == crate::resource::ResourceKind::Secret;
    let type_changed = is_secret && secret_type(live.type_.as_deref()) != secret_type(source_type);
    let new_content = meta.annotations.get(names::ANN_CONTENT_HASH);
    let data_changes = live.data_hash.is_none() || live.data_hash.as_ref() != new_content;
    let why = if type_changed {
        RecreateReason::TypeChanged
    } else if live.immutable && data_changes {
        RecreateReason::Immutable
    } else {
        return action;
    };
    let kind = if reasons.contains(&UpdateReason::Adopted) {
        ActionKind::Conflict(ConflictReason::CannotUpdate { why })
    } else {
        ActionKind::Recreate {
            source: source.clone(),
            uid: uid.clone(),
            resource_version: live.resource_version.clone(),
            meta: meta.clone(),
            reasons: reasons.clone(),
            why,
        }
    };
    Action { kind, ..action }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::plan::{CopyMeta, HelmOpKey, SourceRef};
    use crate::resource::ResourceRef;

    fn update(resource: ResourceRef, reasons: Vec<UpdateReason>) -> Action {
        let meta = CopyMeta {
            labels: BTreeMap::new(),
            annotations: BTreeMap::from([(names::ANN_CONTENT_HASH.into(), "v1:new".into())]),
        };
        Action {
            cluster: "c".into(),
            namespace: "apps".into(),
            resource: resource.clone(),
            helmops: vec![HelmOpKey::new("team", "app")],
            kind: ActionKind::Update {
                source: SourceRef::new("up", "team", resource),
                uid: "uid-1".into(),
                meta,
                reasons,
            },
        }
    }

    fn live(type_: Option<&str>, immutable: bool, hash: Option<&str>) -> LiveFacts {
        LiveFacts {
            type_: type_.map(str::to_string),
            immutable,
            resource_version: "7".into(),
            data_hash: hash.map(str::to_string),
        }
    }

    #[test]
    fn a_type_change_recreates_our_copy_with_preconditions() {
        let a = update(
            ResourceRef::secret("db"),
            vec![UpdateReason::ContentChanged],
        );
        let out = refine(
            a,
            Some(&live(Some("Opaque"), false, Some("v1:old"))),
            Some("kubernetes.io/basic-auth"),
        );
        match &out.kind {
            ActionKind::Recreate {
                uid,
                resource_version,
                why,
                ..
            } => {
                assert_eq!((uid.as_str(), resource_version.as_str()), ("uid-1", "7"));
                assert_eq!(*why, RecreateReason::TypeChanged);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(out.kind.name(), "Recreate");
        assert!(out.reason().contains("type changed"), "{}", out.reason());
    }

    #[test]
    fn an_absent_type_is_opaque() {
        let a = update(
            ResourceRef::secret("db"),
            vec![UpdateReason::ContentChanged],
        );
        let out = refine(a.clone(), Some(&live(Some("Opaque"), false, None)), None);
        assert_eq!(out, a);
    }

    #[test]
    fn immutable_copies_are_recreated_only_when_their_data_changes() {
        let a = update(
            ResourceRef::config_map("cfg"),
            vec![UpdateReason::ContentChanged],
        );
        let out = refine(a.clone(), Some(&live(None, true, Some("v1:old"))), None);
        assert!(matches!(
            out.kind,
            ActionKind::Recreate {
                why: RecreateReason::Immutable,
                ..
            }
        ));
        let markers_only = update(
            ResourceRef::config_map("cfg"),
            vec![UpdateReason::MarkersChanged],
        );
        let out = refine(
            markers_only.clone(),
            Some(&live(None, true, Some("v1:new"))),
            None,
        );
        assert_eq!(
            out, markers_only,
            "metadata of an immutable object can change"
        );
        let unknown = refine(a, Some(&live(None, true, None)), None);
        assert_eq!(
            unknown.kind.name(),
            "Recreate",
            "unknown content counts as a change"
        );
    }

    #[test]
    fn an_adopted_object_is_never_deleted() {
        let a = update(ResourceRef::secret("db"), vec![UpdateReason::Adopted]);
        let out = refine(a, Some(&live(Some("Opaque"), true, Some("v1:x"))), None);
        assert_eq!(
            out.kind,
            ActionKind::Conflict(ConflictReason::CannotUpdate {
                why: RecreateReason::Immutable
            })
        );
        assert!(out.reason().contains("delete it"), "{}", out.reason());
    }

    proptest::proptest! {
        // Whatever the live object looks like: only an Update ever changes, an object being
        // adopted is never planned for deletion, and a Recreate carries the observed uid and
        // resourceVersion as preconditions.
        #[test]
        fn refine_never_deletes_what_helmop_does_not_own(
            adopted in proptest::bool::ANY,
            secret in proptest::bool::ANY,
            immutable in proptest::bool::ANY,
            live_type in proptest::option::of("[a-z]{1,3}"),
            source_type in proptest::option::of("[a-z]{1,3}"),
            hash in proptest::option::of(proptest::sample::select(vec!["v1:new", "v1:old"])),
        ) {
            let resource = if secret { ResourceRef::secret("db") } else { ResourceRef::config_map("db") };
            let reasons = if adopted { vec![UpdateReason::Adopted] } else { vec![UpdateReason::ContentChanged] };
            let a = update(resource, reasons);
            let facts = live(live_type.as_deref(), immutable, hash);
            let out = refine(a.clone(), Some(&facts), source_type.as_deref());
            match &out.kind {
                ActionKind::Recreate { uid, resource_version, .. } => {
                    proptest::prop_assert!(!adopted);
                    proptest::prop_assert_eq!(uid.as_str(), "uid-1");
                    proptest::prop_assert_eq!(resource_version.as_str(), "7");
                }
                ActionKind::Conflict(_) => proptest::prop_assert!(adopted),
                _ => proptest::prop_assert_eq!(&out, &a),
            }
        }
    }

    #[test]
    fn other_actions_pass_through() {
        let mut a = update(ResourceRef::secret("db"), vec![]);
        a.kind = ActionKind::Unchanged;
        assert_eq!(
            refine(a.clone(), Some(&live(Some("x"), true, None)), None),
            a
        );
        let u = update(
            ResourceRef::secret("db"),
            vec![UpdateReason::ContentChanged],
        );
        assert_eq!(refine(u.clone(), None, Some("x")), u);
    }
}
