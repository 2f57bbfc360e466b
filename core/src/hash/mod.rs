//! Keyed hashing of ConfigMap/Secret content (format in docs/hash-format.md).
//!
//! Three hashes, one key per cluster:
//! - [`object_digest`]: what a pod can observe of one object (cacheable per object);
//! - [`config_stamp_v2`]: the pod template's `config-hash` over every object it reads, bound to
//!   the namespace, plus the human-readable `config-refs` ([`config_stamp`] is the v1 form, kept
//!   for its test vectors and never written or kept by the webhook);
//! - [`content_hash`]: a copy's `content-hash` over the whole source.
//!
//! Only keyed hashes leave this module: nothing here produces an unkeyed hash of secret data.

mod encoding;
mod key;
mod refs;

use std::collections::BTreeMap;

pub use encoding::{
    ObjectData, ObjectDigest, VERSION, VERSION_V2, content_hash, encode_content, encode_object,
    encode_reads, missing_keys, object_digest, reads_digest,
};
pub use key::{HashKey, HashKeyError, NAMESPACE_KEY_TAG};
pub use refs::{
    ANNOTATIONS_LIMIT, CONFIG_REFS_LIMIT, ConfigRef, ConfigRefsError, MIN_CONFIG_REFS_BUDGET,
    RefState, bounded_config_refs, config_refs_budget, format_config_refs, parse_config_refs,
};

use crate::podrefs::PodRef;
use crate::resource::ResourceRef;

/// What the caller knows about one referenced object.
#[derive(Clone, Debug)]
pub enum Observed<'a> {
    /// The object's content.
    Data(ObjectData<'a>),
    /// A digest made earlier by [`reads_digest`] with the same key and the same [`PodRef::reads`]
    /// (e.g. from a cache keyed by uid, resourceVersion and reads).
    Digest(ObjectDigest),
    /// No such object.
    Absent,
}

/// The stamp for a pod template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// `helmop.dev/config-hash`: `v2:` (or, kept from before, `v1:`) and 64 hex digits.
    pub config_hash: String,
    /// `helmop.dev/config-refs` in full, see [`format_config_refs`]; the webhook writes
    /// [`bounded_config_refs`] of `refs`.
    pub config_refs: String,
    /// The entries of `config_refs`.
    pub refs: Vec<ConfigRef>,
    /// Required references that were absent (the pod will not start; the webhook warns).
    pub missing: Vec<ResourceRef>,
}

/// One entry per object, sorted by (lower-case kind, name), duplicates merged the way
/// [`crate::podrefs::pod_refs`] merges them. Makes the stamp independent of the caller's order.
fn normalize(refs: &[PodRef]) -> Vec<PodRef> {
    let mut merged: BTreeMap<(&'static str, &str), PodRef> = BTreeMap::new();
    for r in refs {
        merged
            .entry((r.resource.kind.lower(), r.resource.name.as_str()))
            .and_modify(|m| m.merge(r))
            .or_insert_with(|| r.clone());
    }
    merged.into_values().collect()
}

/// Stamps a pod template that reads `refs` with a v1 config hash (not bound to a namespace; see
/// [`config_stamp_v2`]); `lookup` supplies each object (called once per object, in output order).
/// The hash covers each object's kind, name, observed keys, optionality and, when present, its
/// [`object_digest`]; so pointing a pod at another object with identical content still changes the
/// hash.
pub fn config_stamp<'a>(
    key: &HashKey,
    refs: &[PodRef],
    lookup: impl FnMut(&PodRef) -> Observed<'a>,
) -> Stamp {
    let (entries, mut stamp) = observe(key, refs, lookup);
    stamp.config_hash = encoding::config_hash(key, &entries);
    stamp
}

/// Stamps a pod template of `namespace` with a v2 config hash: the v1 encoding under the tag
/// `helmop.dev/v2/config`, keyed with the namespace's subkey ([`HashKey::namespace_key`]). The same
/// content read the same way in two namespaces stamps differently, so a stamp says nothing about
/// another namespace's objects.
pub fn config_stamp_v2<'a>(
    key: &HashKey,
    namespace: &str,
    refs: &[PodRef],
    lookup: impl FnMut(&PodRef) -> Observed<'a>,
) -> Stamp {
    let (entries, mut stamp) = observe(key, refs, lookup);
    stamp.config_hash = encoding::config_hash_v2(&key.namespace_key(namespace), &entries);
    stamp
}

/// Looks every normalized reference up once: the entries the config hash covers, and the stamp
/// without its hash.
fn observe<'a>(
    key: &HashKey,
    refs: &[PodRef],
    mut lookup: impl FnMut(&PodRef) -> Observed<'a>,
) -> (Vec<(PodRef, Option<ObjectDigest>)>, Stamp) {
    let mut entries = Vec::new();
    let mut shown = Vec::new();
    let mut missing = Vec::new();
    for r in normalize(refs) {
        let digest = match lookup(&r) {
            Observed::Data(data) => Some(reads_digest(key, &data, &r.reads)),
            Observed::Digest(d) => Some(d),
            Observed::Absent => None,
        };
        let state = match (digest, r.optional) {
            (Some(_), _) => RefState::Present,
            (None, true) => RefState::AbsentOptional,
            (None, false) => {
                missing.push(r.resource.clone());
                RefState::AbsentRequired
            }
        };
        shown.push(ConfigRef {
            resource: r.resource.clone(),
            keys: r.keys.clone(),
            state,
        });
        entries.push((r, digest));
    }
    let stamp = Stamp {
        config_hash: String::new(),
        config_refs: format_config_refs(&shown),
        refs: shown,
        missing,
    };
    (entries, stamp)
}

/// The exact bytes [`config_stamp`] feeds the HMAC for `refs` and their digests (`None` =
/// absent), after the same normalization.
pub fn encode_config(refs: &[(PodRef, Option<ObjectDigest>)]) -> Vec<u8> {
    encode_config_tagged(encoding::TAG_CONFIG, refs)
}

/// The exact bytes [`config_stamp_v2`] feeds the HMAC keyed with the namespace's subkey: the same
/// as [`encode_config`] under the tag `helmop.dev/v2/config`.
pub fn encode_config_v2(refs: &[(PodRef, Option<ObjectDigest>)]) -> Vec<u8> {
    encode_config_tagged(encoding::TAG_CONFIG_V2, refs)
}

fn encode_config_tagged(tag: &str, refs: &[(PodRef, Option<ObjectDigest>)]) -> Vec<u8> {
    let digests: BTreeMap<&ResourceRef, Option<ObjectDigest>> =
        refs.iter().map(|(r, d)| (&r.resource, *d)).collect();
    let pod_refs: Vec<PodRef> = refs.iter().map(|(r, _)| r.clone()).collect();
    let entries: Vec<(PodRef, Option<ObjectDigest>)> = normalize(&pod_refs)
        .into_iter()
        .map(|r| {
            let d = digests.get(&r.resource).copied().flatten();
            (r, d)
        })
        .collect();
    let mut buf = Vec::new();
    encoding::write_config(&mut buf, tag, &entries);
    buf
}

#[cfg(test)]
mod tests;
