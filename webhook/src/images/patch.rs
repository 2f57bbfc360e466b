//! The JSONPatch operations of the two modes. `pin` rewrites `containers[i].image`; `annotate` writes
//! `helmop.dev/image-digests` (`container=digest`, comma separated, in PodSpec order: init containers first)
//! into the pod template and sets `imagePullPolicy: Always` on the resolved containers. Both produce no
//! operation when the object already says what they would write, so the output admits with an empty patch.

use json_patch::jsonptr::{PointerBuf, Token};
use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use serde_json::{Map, Value};

use helmop_core::names::ANN_IMAGE_DIGESTS;

pub use helmop_images::podspec::{Slot, format_digests, parse_digests, slots};

fn pointer(base: &str, tokens: &[&str]) -> PointerBuf {
    let mut p = PointerBuf::parse(base).unwrap_or_default();
    for t in tokens {
        p.push_back(Token::new(*t));
    }
    p
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

/// `pin`: set each slot's image to the given value (when it differs).
pub fn pin_ops(spec_pointer: &str, images: &[(&Slot, String)]) -> Vec<PatchOperation> {
    images
        .iter()
        .filter(|(slot, image)| slot.image != *image)
        .map(|(slot, image)| {
            add(
                pointer(spec_pointer, &[slot.list, &slot.index.to_string(), "image"]),
                Value::String(image.clone()),
            )
        })
        .collect()
}

/// `annotate`: make the template annotation hold `entries` (removed when empty) and set
/// `imagePullPolicy: Always` on `pull_always`.
pub fn annotate_ops(
    metadata_pointer: &str,
    spec_pointer: &str,
    metadata: Option<&Map<String, Value>>,
    entries: &[(String, String)],
    pull_always: &[&Slot],
) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    let current = metadata
        .and_then(|m| m.get("annotations"))
        .and_then(Value::as_object)
        .and_then(|a| a.get(ANN_IMAGE_DIGESTS));
    let wanted = (!entries.is_empty()).then(|| format_digests(entries));
    match (current, wanted) {
        (Some(Value::String(c)), Some(w)) if *c == w => {}
        (None, None) => {}
        (Some(_), None) => ops.push(PatchOperation::Remove(RemoveOperation {
            path: pointer(metadata_pointer, &["annotations", ANN_IMAGE_DIGESTS]),
        })),
        (_, Some(w)) => {
            let annotation =
                Map::from_iter([(ANN_IMAGE_DIGESTS.to_owned(), Value::String(w.clone()))]);
            match metadata {
                None => ops.push(add(
                    pointer(metadata_pointer, &[]),
                    Value::Object(Map::from_iter([(
                        "annotations".to_owned(),
                        Value::Object(annotation),
                    )])),
                )),
                Some(m) if !m.get("annotations").is_some_and(Value::is_object) => ops.push(add(
                    pointer(metadata_pointer, &["annotations"]),
                    Value::Object(annotation),
                )),
                Some(_) => ops.push(add(
                    pointer(metadata_pointer, &["annotations", ANN_IMAGE_DIGESTS]),
                    Value::String(w),
                )),
            }
        }
    }
    for slot in pull_always {
        if slot.pull_policy.as_deref() != Some("Always") {
            ops.push(add(
                pointer(
                    spec_pointer,
                    &[slot.list, &slot.index.to_string(), "imagePullPolicy"],
                ),
                Value::String("Always".into()),
            ));
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn deployment(template_metadata: Value) -> Value {
        json!({"spec": {"template": {"metadata": template_metadata, "spec": {
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [{"name": "app", "image": "reg.io/app:latest"},
                           {"name": "side", "image": "reg.io/side:1", "imagePullPolicy": "Always"}],
        }}}})
    }

    fn apply(obj: &Value, ops: &[PatchOperation]) -> Value {
        let mut out = obj.clone();
        json_patch::patch(&mut out, ops).unwrap();
        out
    }

    #[test]
    fn pin_rewrites_and_is_idempotent() {
        let obj = deployment(json!({}));
        let spec = &obj["spec"]["template"]["spec"];
        let s = slots(spec);
        let pinned = format!("reg.io/app:latest@{D1}");
        let ops = pin_ops("/spec/template/spec", &[(&s[1], pinned.clone())]);
        assert_eq!(
            serde_json::to_value(&ops).unwrap(),
            json!([{"op": "add", "path": "/spec/template/spec/containers/0/image", "value": pinned}])
        );
        let out = apply(&obj, &ops);
        let again = slots(&out["spec"]["template"]["spec"]);
        assert!(pin_ops("/spec/template/spec", &[(&again[1], pinned)]).is_empty());
    }

    #[test]
    fn annotate_creates_updates_and_removes() {
        for metadata in [
            Value::Null,
            json!({"labels": {"a": "b"}}),
            json!({"annotations": {"x": "y"}}),
        ] {
            let mut obj = deployment(metadata.clone());
            if metadata.is_null() {
                obj["spec"]["template"]
                    .as_object_mut()
                    .unwrap()
                    .remove("metadata");
            }
            let s = slots(&obj["spec"]["template"]["spec"]);
            let entries = vec![
                ("init".to_owned(), D1.to_owned()),
                ("app".to_owned(), D2.to_owned()),
            ];
            let m = obj["spec"]["template"]
                .get("metadata")
                .and_then(Value::as_object);
            let ops = annotate_ops(
                "/spec/template/metadata",
                "/spec/template/spec",
                m,
                &entries,
                &[&s[0], &s[1], &s[2]],
            );
            // `side` already pulls Always: two policy ops plus the annotation.
            assert_eq!(ops.len(), 3, "{metadata}: {ops:?}");
            let out = apply(&obj, &ops);
            assert_eq!(
                out["spec"]["template"]["metadata"]["annotations"][ANN_IMAGE_DIGESTS],
                format!("init={D1},app={D2}")
            );
            assert_eq!(
                out["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
                "Always"
            );
            if metadata.get("annotations").is_some() {
                assert_eq!(out["spec"]["template"]["metadata"]["annotations"]["x"], "y");
            }
            // Idempotent, then removal when nothing is left to record.
            let s2 = slots(&out["spec"]["template"]["spec"]);
            let m2 = out["spec"]["template"]["metadata"].as_object();
            assert!(
                annotate_ops(
                    "/spec/template/metadata",
                    "/spec/template/spec",
                    m2,
                    &entries,
                    &[&s2[0], &s2[1]]
                )
                .is_empty()
            );
            let removed = apply(
                &out,
                &annotate_ops(
                    "/spec/template/metadata",
                    "/spec/template/spec",
                    m2,
                    &[],
                    &[],
                ),
            );
            assert!(
                removed["spec"]["template"]["metadata"]["annotations"]
                    .get(ANN_IMAGE_DIGESTS)
                    .is_none()
            );
        }
    }
}
