//! The canonical v1 encodings (specified in docs/hash-format.md) and the keyed hashes over them.
//!
//! Every field is fixed-width or length-prefixed and every list is count-prefixed, so an
//! encoding parses back in exactly one way: two different inputs can never encode to the same
//! bytes, whatever their keys and values contain. Each encoding starts with its own domain tag,
//! so a value of one kind can never be taken for another.
//!
//! The hashes stream the encoding straight into the HMAC; the `encode_*` functions produce the
//! same bytes as a buffer, for test vectors and for anyone checking a hash by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use hmac::Mac;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use super::key::{HashKey, HmacSha256};
use crate::podrefs::{Keys, PodRef, Reads};
use crate::resource::ResourceKind;

/// Version prefix of the v1 hash strings (`v1:<hex>`): content hashes, and config hashes kept from before v2.
pub const VERSION: &str = "v1";
/// Version prefix of namespace-bound config hashes (`v2:<hex>`, see [`super::config_stamp_v2`]).
pub const VERSION_V2: &str = "v2";

pub(crate) const TAG_OBJECT: &str = "helmop.dev/v1/object";
pub(crate) const TAG_CONTENT: &str = "helmop.dev/v1/content";
pub(crate) const TAG_CONFIG: &str = "helmop.dev/v1/config";
pub(crate) const TAG_CONFIG_V2: &str = "helmop.dev/v2/config";

/// The readable content of a ConfigMap or Secret, borrowed from wherever it lives.
///
/// For a Secret every value is in `data` (its `stringData` folded in, as the API server does on
/// write); for a ConfigMap `data` holds the text values and `binary_data` the binary ones.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ObjectData<'a> {
    /// Secret `type`; `None` for a ConfigMap. Only the content hash covers it.
    pub type_: Option<&'a str>,
    pub data: BTreeMap<&'a str, &'a [u8]>,
    pub binary_data: BTreeMap<&'a str, &'a [u8]>,
}

impl<'a> From<&'a Secret> for ObjectData<'a> {
    fn from(secret: &'a Secret) -> Self {
        let mut data: BTreeMap<&str, &[u8]> = BTreeMap::new();
        for (k, v) in secret.data.iter().flatten() {
            data.insert(k, &v.0);
        }
        // stringData is write-only and overrides data on write; honour it the same way in case
        // a caller hands over an object that was never stored.
        for (k, v) in secret.string_data.iter().flatten() {
            data.insert(k, v.as_bytes());
        }
        ObjectData {
            type_: secret.type_.as_deref(),
            data,
            binary_data: BTreeMap::new(),
        }
    }
}

impl<'a> From<&'a ConfigMap> for ObjectData<'a> {
    fn from(cm: &'a ConfigMap) -> Self {
        ObjectData {
            type_: None,
            data: cm
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.as_bytes()))
                .collect(),
            binary_data: cm
                .binary_data
                .iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.0.as_slice()))
                .collect(),
        }
    }
}

impl fmt::Debug for ObjectData<'_> {
    /// Keys and value sizes only: values may be secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Sizes<'m>(&'m BTreeMap<&'m str, &'m [u8]>);
        impl fmt::Debug for Sizes<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_map()
                    .entries(
                        self.0
                            .iter()
                            .map(|(k, v)| (k, format!("<{} bytes>", v.len()))),
                    )
                    .finish()
            }
        }
        f.debug_struct("ObjectData")
            .field("type_", &self.type_)
            .field("data", &Sizes(&self.data))
            .field("binary_data", &Sizes(&self.binary_data))
            .finish()
    }
}

/// The keyed digest of what a pod observes of one object (see [`object_digest`]). Safe to
/// show: without the key it reveals nothing about the data.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectDigest(pub [u8; 32]);

impl ObjectDigest {
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for ObjectDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectDigest({})", self.to_hex())
    }
}

/// Where encoded bytes go: a buffer, or straight into the HMAC.
pub(crate) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl Sink for HmacSha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

fn put_u8(s: &mut impl Sink, b: u8) {
    s.put(&[b]);
}

fn put_count(s: &mut impl Sink, n: usize) {
    s.put(&(n as u64).to_be_bytes());
}

fn put_bytes(s: &mut impl Sink, b: &[u8]) {
    put_count(s, b.len());
    s.put(b);
}

fn put_entries<'e>(s: &mut impl Sink, entries: impl Iterator<Item = (&'e str, &'e [u8])> + Clone) {
    put_count(s, entries.clone().count());
    for (k, v) in entries {
        put_bytes(s, k.as_bytes());
        put_bytes(s, v);
    }
}

/// The v1 object encoding of what `reads` sees of `obj`. Byte for byte what earlier versions wrote
/// for a volume (`Keys::All`: tag 0, all of `data` and `binaryData`, no absent keys; `Keys::Some`:
/// tag 1, the listed keys of each map, then the listed keys found in neither); `envFrom` and key
/// refs now only see what the kubelet reads (see [`crate::podrefs::Reads`]), so their encoding
/// differs from before only where the old one covered keys no pod reads.
pub(crate) fn write_object(s: &mut impl Sink, obj: &ObjectData<'_>, reads: &Reads) {
    put_bytes(s, TAG_OBJECT.as_bytes());
    let open = reads.is_open();
    put_u8(s, if open { 0 } else { 1 });
    put_entries(
        s,
        obj.data
            .iter()
            .filter(|(k, _)| reads.reads_data(k))
            .map(|(k, v)| (*k, *v)),
    );
    put_entries(
        s,
        obj.binary_data
            .iter()
            .filter(|(k, _)| reads.reads_binary(k))
            .map(|(k, v)| (*k, *v)),
    );
    // Every named key's presence shows in the lists above; the absent ones are listed as well for
    // the closed form, as v1 always has.
    let absent: BTreeSet<&str> = if open {
        BTreeSet::new()
    } else {
        reads
            .files
            .keys()
            .chain(reads.vars.keys())
            .map(String::as_str)
            .filter(|k| {
                let found = obj.data.contains_key(k)
                    || (reads.reads_binary(k) && obj.binary_data.contains_key(k));
                !found
            })
            .collect()
    };
    put_count(s, absent.len());
    for k in absent {
        put_bytes(s, k.as_bytes());
    }
}

pub(crate) fn write_content(s: &mut impl Sink, kind: ResourceKind, obj: &ObjectData<'_>) {
    put_bytes(s, TAG_CONTENT.as_bytes());
    put_bytes(s, kind.as_str().as_bytes());
    match obj.type_ {
        None => put_u8(s, 0),
        Some(t) => {
            put_u8(s, 1);
            put_bytes(s, t.as_bytes());
        }
    }
    put_entries(s, obj.data.iter().map(|(k, v)| (*k, *v)));
    put_entries(s, obj.binary_data.iter().map(|(k, v)| (*k, *v)));
}

/// `refs` must already be normalized: sorted by (lower-case kind, name), one per object. `tag` is
/// [`TAG_CONFIG`] (v1) or [`TAG_CONFIG_V2`]: the body is the same in both formats.
pub(crate) fn write_config(s: &mut impl Sink, tag: &str, refs: &[(PodRef, Option<ObjectDigest>)]) {
    put_bytes(s, tag.as_bytes());
    put_count(s, refs.len());
    for (r, digest) in refs {
        put_bytes(s, r.resource.kind.as_str().as_bytes());
        put_bytes(s, r.resource.name.as_bytes());
        match &r.keys {
            Keys::All => put_u8(s, 0),
            Keys::Some(keys) => {
                put_u8(s, 1);
                put_count(s, keys.len());
                for k in keys {
                    put_bytes(s, k.as_bytes());
                }
            }
        }
        put_u8(s, u8::from(r.optional));
        match digest {
            None => put_u8(s, 0),
            Some(d) => {
                put_u8(s, 1);
                s.put(&d.0);
            }
        }
    }
}

fn finish(mac: HmacSha256) -> [u8; 32] {
    mac.finalize().into_bytes().into()
}

fn versioned(bytes: &[u8; 32]) -> String {
    format!("{VERSION}:{}", hex::encode(bytes))
}

/// Keyed digest of the keys of `obj` a pod can observe through `keys`: all of `data` and
/// `binaryData` for [`Keys::All`]; for [`Keys::Some`] each listed key's value, or a marker that
/// the key is absent (which differs from a present empty value).
///
/// A caller caching digests must key the cache by the object's (uid, resourceVersion) and by
/// `keys`, since the same object read through other keys digests differently.
pub fn object_digest(key: &HashKey, obj: &ObjectData<'_>, keys: &Keys) -> ObjectDigest {
    reads_digest(key, obj, &Reads::volume(keys, true))
}

/// Keyed digest of exactly what the kubelet reads of `obj` through `reads` (a pod's merged
/// references to it). The same as [`object_digest`] for reads that a volume makes.
///
/// A caller caching digests must key the cache by the object's (uid, resourceVersion) and by
/// `reads`.
pub fn reads_digest(key: &HashKey, obj: &ObjectData<'_>, reads: &Reads) -> ObjectDigest {
    let mut mac = key.mac();
    write_object(&mut mac, obj, reads);
    ObjectDigest(finish(mac))
}

/// The keys a pod requires of `obj` and does not find where it looks ([`Reads::unmet`]); optional
/// references require nothing. Sorted. A pod
/// missing one cannot start (its container, or its volume, cannot be set up), like a pod whose
/// required object is missing.
pub fn missing_keys(obj: &ObjectData<'_>, reads: &Reads) -> Vec<String> {
    reads
        .unmet(
            |k| obj.data.contains_key(k),
            |k| obj.binary_data.contains_key(k),
        )
        .into_iter()
        .filter(|(_, required, _)| *required)
        .map(|(k, _, _)| k)
        .collect()
}

/// A copy's `helmop.dev/content-hash`: `v1:` and 64 hex digits, over the kind, the `type` and
/// every key of `data` and `binaryData`.
pub fn content_hash(key: &HashKey, kind: ResourceKind, obj: &ObjectData<'_>) -> String {
    let mut mac = key.mac();
    write_content(&mut mac, kind, obj);
    versioned(&finish(mac))
}

pub(crate) fn config_hash(key: &HashKey, refs: &[(PodRef, Option<ObjectDigest>)]) -> String {
    let mut mac = key.mac();
    write_config(&mut mac, TAG_CONFIG, refs);
    versioned(&finish(mac))
}

/// The v2 config hash: keyed with the namespace's subkey ([`HashKey::namespace_key`]), so the same
/// content read the same way in two namespaces hashes differently.
pub(crate) fn config_hash_v2(
    namespace_key: &HashKey,
    refs: &[(PodRef, Option<ObjectDigest>)],
) -> String {
    let mut mac = namespace_key.mac();
    write_config(&mut mac, TAG_CONFIG_V2, refs);
    format!("{VERSION_V2}:{}", hex::encode(finish(mac)))
}

/// The exact bytes [`object_digest`] feeds the HMAC.
pub fn encode_object(obj: &ObjectData<'_>, keys: &Keys) -> Vec<u8> {
    encode_reads(obj, &Reads::volume(keys, true))
}

/// The exact bytes [`reads_digest`] feeds the HMAC.
pub fn encode_reads(obj: &ObjectData<'_>, reads: &Reads) -> Vec<u8> {
    let mut buf = Vec::new();
    write_object(&mut buf, obj, reads);
    buf
}

/// The exact bytes [`content_hash`] feeds the HMAC.
pub fn encode_content(kind: ResourceKind, obj: &ObjectData<'_>) -> Vec<u8> {
    let mut buf = Vec::new();
    write_content(&mut buf, kind, obj);
    buf
}
