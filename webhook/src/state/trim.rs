//! What of a HelmOp the watch cache keeps: only the fields the delete guard reads, so a HelmOp carrying
//! megabytes of `helm.values` costs the webhook a few bytes per downstream resource, not megabytes.

use serde_json::{Map, Value};

/// Keeps `spec.downstreamResources` and `spec.targets[].downstreamResources` (the shape
/// `helmop_core::validate::downstream_refs` reads; target order and count preserved) and drops everything else
/// of the object's data (`status`, `spec.helm`, ...). Metadata is not part of `data`.
pub fn trim_helmop(data: &mut Value) {
    let Some(obj) = data.as_object_mut() else {
        return;
    };
    let spec = obj.remove("spec");
    obj.retain(|key, _| key == "apiVersion" || key == "kind");
    let Some(Value::Object(mut spec)) = spec else {
        return;
    };
    let mut kept = Map::new();
    if let Some(resources) = spec.remove("downstreamResources") {
        kept.insert("downstreamResources".into(), resources);
    }
    if let Some(Value::Array(targets)) = spec.remove("targets") {
        let targets = targets
            .into_iter()
            .map(|mut target| {
                let mut t = Map::new();
                if let Some(resources) = target
                    .as_object_mut()
                    .and_then(|o| o.remove("downstreamResources"))
                {
                    t.insert("downstreamResources".into(), resources);
                }
                Value::Object(t)
            })
            .collect();
        kept.insert("targets".into(), Value::Array(targets));
    }
    obj.insert("spec".into(), Value::Object(kept));
}

#[cfg(test)]
mod tests {
    use super::*;
    use helmop_core::validate::downstream_refs;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn drops_values_and_status_keeps_references() {
        let mut h = json!({
            "apiVersion": "fleet.cattle.io/v1alpha1", "kind": "HelmOp",
            "spec": {
                "helm": {"chart": "app", "values": {"big": "x".repeat(1 << 20)}},
                "downstreamResources": [{"kind": "Secret", "name": "db"}],
                "targets": [{"clusterName": "a", "helm": {"values": {"y": 1}}},
                            {"downstreamResources": [{"kind": "ConfigMap", "name": "cfg"}]}],
            },
            "status": {"display": {"state": "Ready"}},
        });
        let before = downstream_refs(&h);
        trim_helmop(&mut h);
        assert_eq!(downstream_refs(&h), before);
        assert!(h.to_string().len() < 300, "{h}");
        assert_eq!(h["kind"], "HelmOp");
        assert!(h.get("status").is_none());
    }

    fn arb_entry() -> impl Strategy<Value = Value> {
        prop_oneof![
            (
                "[a-z]{1,5}",
                prop_oneof![
                    Just("Secret"),
                    Just("ConfigMap"),
                    Just("secret"),
                    Just("Pod")
                ]
            )
                .prop_map(|(name, kind)| json!({"kind": kind, "name": name})),
            Just(json!({"kind": "Secret"})),
            Just(json!("junk")),
        ]
    }

    proptest! {
        /// Trimming never changes what the guard reads.
        #[test]
        fn downstream_refs_survive_trimming(
            root in proptest::collection::vec(arb_entry(), 0..4),
            targets in proptest::collection::vec(proptest::option::of(proptest::collection::vec(arb_entry(), 0..3)), 0..4),
        ) {
            let targets: Vec<Value> = targets
                .into_iter()
                .map(|t| match t {
                    Some(entries) => json!({"clusterName": "c", "downstreamResources": entries, "helm": {"values": {"a": 1}}}),
                    None => json!({"clusterName": "c"}),
                })
                .collect();
            let mut h = json!({"spec": {"helm": {"values": {"v": 1}}, "downstreamResources": root, "targets": targets}});
            let before = downstream_refs(&h);
            trim_helmop(&mut h);
            prop_assert_eq!(downstream_refs(&h), before);
            prop_assert!(h["spec"].get("helm").is_none());
        }
    }
}
