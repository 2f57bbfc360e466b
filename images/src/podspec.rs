//! What a pod template says about images: its containers ([`slots`]) and the `helmop.dev/image-digests`
//! annotation of `annotate` mode (`container=digest`, comma separated, in PodSpec order).

use serde_json::Value;

use crate::reference::valid_digest;

/// One container of a PodSpec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// `initContainers` or `containers`.
    pub list: &'static str,
    pub index: usize,
    pub name: String,
    pub image: String,
    pub pull_policy: Option<String>,
}

/// The containers and init containers of `spec`, init containers first (ephemeral containers are never
/// part of a template). Containers without a name or image are skipped.
pub fn slots(spec: &Value) -> Vec<Slot> {
    ["initContainers", "containers"]
        .into_iter()
        .flat_map(|list| {
            spec.get(list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
                .filter_map(move |(index, c)| {
                    Some(Slot {
                        list,
                        index,
                        name: c.get("name")?.as_str()?.to_owned(),
                        image: c.get("image")?.as_str()?.to_owned(),
                        pull_policy: c
                            .get("imagePullPolicy")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    })
                })
        })
        .collect()
}

/// Parses an `image-digests` value; malformed pairs are dropped (the next write replaces them).
pub fn parse_digests(value: &str) -> Vec<(String, String)> {
    value
        .split(',')
        .filter_map(|pair| {
            let (name, digest) = pair.trim().split_once('=')?;
            (!name.is_empty() && valid_digest(digest)).then(|| (name.to_owned(), digest.to_owned()))
        })
        .collect()
}

pub fn format_digests(entries: &[(String, String)]) -> String {
    entries
        .iter()
        .map(|(name, digest)| format!("{name}={digest}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn slots_in_podspec_order() {
        let spec = json!({
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [{"name": "app", "image": "reg.io/app:latest"},
                           {"name": "noimage"},
                           {"name": "side", "image": "reg.io/side:1", "imagePullPolicy": "Always"}],
        });
        let s = slots(&spec);
        let names: Vec<_> = s
            .iter()
            .map(|s| (s.list, s.index, s.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("initContainers", 0, "init"),
                ("containers", 0, "app"),
                ("containers", 2, "side")
            ]
        );
        assert_eq!(s[2].pull_policy.as_deref(), Some("Always"));
        assert!(slots(&json!({"containers": "junk"})).is_empty());
    }

    #[test]
    fn digests_round_trip_and_drop_junk() {
        let entries = vec![
            ("a".to_owned(), D1.to_owned()),
            ("b".to_owned(), D2.to_owned()),
        ];
        assert_eq!(parse_digests(&format_digests(&entries)), entries);
        assert_eq!(
            parse_digests(&format!("a={D1}, =x,b=sha256:bad,c")),
            vec![("a".to_owned(), D1.to_owned())]
        );
    }
}
