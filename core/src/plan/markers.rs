//! The markers helmop writes on a copy (label, owners, source, source uid, content hash, keep) and the builder of a copy's metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::names;
use crate::resource::{ResourceKind, ResourceRef};

/// A HelmOp that wants a copy: `upstream-id/namespace/name` in `helmop.dev/owners`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnerRef {
    pub upstream_id: String,
    pub namespace: String,
    pub name: String,
}

impl OwnerRef {
    pub fn new(upstream_id: &str, namespace: &str, name: &str) -> OwnerRef {
        OwnerRef {
            upstream_id: upstream_id.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// Reads one owners entry; `None` unless it is exactly three non-empty `/`-separated parts.
    pub fn parse(entry: &str) -> Option<OwnerRef> {
        let mut parts = entry.split('/');
        let (u, ns, name) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || [u, ns, name].iter().any(|p| p.is_empty()) {
            return None;
        }
        Some(OwnerRef::new(u, ns, name))
    }
}

impl fmt::Display for OwnerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.upstream_id, self.namespace, self.name)
    }
}

/// The source of a copy: `upstream-id/namespace/Kind/name` in `helmop.dev/source`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceRef {
    pub upstream_id: String,
    pub namespace: String,
    pub resource: ResourceRef,
}

impl SourceRef {
    pub fn new(upstream_id: &str, namespace: &str, resource: ResourceRef) -> SourceRef {
        SourceRef {
            upstream_id: upstream_id.to_string(),
            namespace: namespace.to_string(),
            resource,
        }
    }

    /// Reads a source annotation; the kind is matched case-insensitively.
    pub fn parse(s: &str) -> Option<SourceRef> {
        let mut parts = s.split('/');
        let (u, ns, kind, name) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || [u, ns, name].iter().any(|p| p.is_empty()) {
            return None;
        }
        let kind = ResourceKind::parse(kind)?;
        Some(SourceRef::new(u, ns, ResourceRef::new(kind, name)))
    }
}

impl fmt::Display for SourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.upstream_id, self.namespace, self.resource.kind, self.resource.name
        )
    }
}

/// Why an upstream id was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid upstream id {0:?}: use 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit"
)]
pub struct UpstreamIdError(pub String);

/// An upstream id is a DNS label, so it can never contain the `/` and `,` of the markers.
pub fn validate_upstream_id(id: &str) -> Result<(), UpstreamIdError> {
    let b = id.as_bytes();
    let ok_char = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let alnum = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if (1..=63).contains(&b.len()) && b.iter().all(ok_char) && alnum(b.first()) && alnum(b.last()) {
        Ok(())
    } else {
        Err(UpstreamIdError(id.to_string()))
    }
}

/// The entries of a `helmop.dev/owners` value, verbatim (entries helmop cannot read, e.g. from
/// a newer version, are kept as they are, never dropped).
pub fn parse_owners(value: &str) -> BTreeSet<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect()
}

/// `helmop.dev/owners` as written: sorted, de-duplicated, comma separated.
pub fn format_owners(owners: &BTreeSet<String>) -> String {
    owners
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(",")
}

/// The live source object upstream, as much as a copy's metadata needs (never its data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceObject {
    /// The HelmOp's namespace upstream.
    pub namespace: String,
    pub resource: ResourceRef,
    pub uid: String,
    /// [`crate::hash::content_hash`] of the source, with the upstream cluster's key.
    pub content_hash: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Labels and annotations of a copy, the metadata half of the server-side-apply body (the
/// caller adds name, namespace, `type`, `data` and `binaryData` from the source).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyMeta {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

pub(crate) fn reserved(key: &str) -> bool {
    names::RESERVED_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// The metadata of the copy of `source` wanted by `owners`: the source's labels and
/// annotations except reserved prefixes (helmop's own, `kubectl.kubernetes.io/`, and Fleet's,
/// whose bundledeployment label would make the copy look Fleet-managed), plus helmop's markers.
/// An empty `owners` omits the owners annotation (a kept copy nobody owns).
pub fn copy_meta(
    upstream_id: &str,
    source: &SourceObject,
    owners: &BTreeSet<String>,
    keep: bool,
) -> CopyMeta {
    let carry = |m: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        m.iter()
            .filter(|(k, _)| !reserved(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let mut labels = carry(&source.labels);
    labels.insert(names::LABEL_MANAGED_BY.into(), names::MANAGER.into());
    let mut annotations = carry(&source.annotations);
    let source_ref = SourceRef::new(upstream_id, &source.namespace, source.resource.clone());
    annotations.insert(names::ANN_SOURCE.into(), source_ref.to_string());
    annotations.insert(names::ANN_SOURCE_UID.into(), source.uid.clone());
    annotations.insert(names::ANN_CONTENT_HASH.into(), source.content_hash.clone());
    if !owners.is_empty() {
        annotations.insert(names::ANN_OWNERS.into(), format_owners(owners));
    }
    if keep {
        annotations.insert(names::ANN_KEEP.into(), "true".into());
    }
    CopyMeta {
        labels,
        annotations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ref_round_trip_and_rejects() {
        let o = OwnerRef::new("up1", "team", "app");
        assert_eq!(o.to_string(), "up1/team/app");
        assert_eq!(OwnerRef::parse("up1/team/app"), Some(o));
        for bad in ["", "a/b", "a/b/c/d", "a//c", "/b/c", "a/b/"] {
            assert_eq!(OwnerRef::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn source_ref_round_trip_and_rejects() {
        let s = SourceRef::new("up1", "team", ResourceRef::secret("db"));
        assert_eq!(s.to_string(), "up1/team/Secret/db");
        assert_eq!(SourceRef::parse("up1/team/Secret/db"), Some(s.clone()));
        assert_eq!(SourceRef::parse("up1/team/secret/db"), Some(s));
        for bad in [
            "up1/team/Pod/db",
            "up1/team/Secret",
            "up1/team/Secret/db/x",
            "up1//Secret/db",
        ] {
            assert_eq!(SourceRef::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn upstream_ids() {
        for ok in ["a", "up-1", "0", &"x".repeat(63)] {
            assert!(validate_upstream_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a/b", "a,b", "a.b", &"x".repeat(64)] {
            assert!(validate_upstream_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn owners_are_sorted_deduplicated_and_kept_verbatim() {
        let parsed = parse_owners(" u/b/x, u/a/y,,u/b/x,weird entry ");
        assert_eq!(format_owners(&parsed), "u/a/y,u/b/x,weird entry");
        assert!(parse_owners("").is_empty());
    }

    #[test]
    fn copy_meta_carries_unreserved_metadata_and_adds_markers() {
        let source = SourceObject {
            namespace: "team".into(),
            resource: ResourceRef::config_map("app"),
            uid: "uid-1".into(),
            content_hash: "v1:ab".into(),
            labels: BTreeMap::from([
                ("app".into(), "web".into()),
                ("fleet.cattle.io/bundledeployment".into(), "x".into()),
                ("helmop.dev/rollout-on-change".into(), "true".into()),
            ]),
            annotations: BTreeMap::from([
                ("note".into(), "hi".into()),
                (
                    "kubectl.kubernetes.io/last-applied-configuration".into(),
                    "{}".into(),
                ),
                ("helmop.dev/owners".into(), "forged".into()),
            ]),
        };
        let owners = BTreeSet::from(["up/team/b".to_string(), "up/team/a".to_string()]);
        let meta = copy_meta("up", &source, &owners, true);
        assert_eq!(
            meta.labels,
            BTreeMap::from([
                ("app".into(), "web".into()),
                ("helmop.dev/managed-by".into(), "kubectl-helmop".into()),
            ])
        );
        assert_eq!(
            meta.annotations,
            BTreeMap::from([
                ("note".into(), "hi".into()),
                ("helmop.dev/source".into(), "up/team/ConfigMap/app".into()),
                ("helmop.dev/source-uid".into(), "uid-1".into()),
                ("helmop.dev/content-hash".into(), "v1:ab".into()),
                ("helmop.dev/owners".into(), "up/team/a,up/team/b".into()),
                ("helmop.dev/keep".into(), "true".into()),
            ])
        );
        let bare = copy_meta("up", &source, &BTreeSet::new(), false);
        assert!(!bare.annotations.contains_key("helmop.dev/owners"));
        assert!(!bare.annotations.contains_key("helmop.dev/keep"));
    }
}
