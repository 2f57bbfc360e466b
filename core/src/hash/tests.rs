use std::collections::{BTreeMap, BTreeSet};

use hmac::Mac;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use proptest::prelude::*;

use super::key::HmacSha256;
use super::*;
use crate::podrefs::{Keys, Reads};
use crate::resource::ResourceKind;

fn key(byte: u8) -> HashKey {
    HashKey::new(&[byte; 32]).unwrap()
}

fn obj<'a>(data: &[(&'a str, &'a str)], binary: &[(&'a str, &'a str)]) -> ObjectData<'a> {
    ObjectData {
        type_: None,
        data: data.iter().map(|(k, v)| (*k, v.as_bytes())).collect(),
        binary_data: binary.iter().map(|(k, v)| (*k, v.as_bytes())).collect(),
    }
}

fn some(keys: &[&str]) -> Keys {
    Keys::Some(keys.iter().map(|k| k.to_string()).collect())
}

fn digest(o: &ObjectData<'_>, keys: &Keys) -> ObjectDigest {
    object_digest(&key(1), o, keys)
}

fn raw_hmac(key_bytes: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key_bytes).unwrap();
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Reads an object encoding back (mode, data, binaryData, absent keys); succeeding on every
/// encoding, with nothing left over, proves the encoding is injective.
fn decode_object(mut b: &[u8]) -> (u8, Entries, Entries, Vec<Vec<u8>>) {
    fn take<'x>(b: &mut &'x [u8], n: usize) -> &'x [u8] {
        let (head, tail) = b.split_at(n);
        *b = tail;
        head
    }
    fn count(b: &mut &[u8]) -> usize {
        u64::from_be_bytes(take(b, 8).try_into().unwrap()) as usize
    }
    fn bytes(b: &mut &[u8]) -> Vec<u8> {
        let n = count(b);
        take(b, n).to_vec()
    }
    fn entries(b: &mut &[u8]) -> Entries {
        (0..count(b)).map(|_| (bytes(b), bytes(b))).collect()
    }
    assert_eq!(bytes(&mut b), b"helmop.dev/v1/object");
    let mode = take(&mut b, 1)[0];
    let data = entries(&mut b);
    let binary = entries(&mut b);
    let absent = (0..count(&mut b)).map(|_| bytes(&mut b)).collect();
    assert!(b.is_empty(), "trailing bytes");
    (mode, data, binary, absent)
}

#[test]
fn streaming_equals_hmac_of_the_encoding() {
    let o = obj(&[("a", "1"), ("b", "")], &[("bin", "\u{0}\u{1}")]);
    for keys in [Keys::All, some(&["a", "zz"])] {
        let want = raw_hmac(&[1; 32], &encode_object(&o, &keys));
        assert_eq!(digest(&o, &keys).0, want);
    }
    let want = raw_hmac(&[1; 32], &encode_content(ResourceKind::Secret, &o));
    assert_eq!(
        content_hash(&key(1), ResourceKind::Secret, &o),
        format!("v1:{}", hex::encode(want))
    );
}

#[test]
fn delimiter_confusions_do_not_collide() {
    let pairs = [
        (
            obj(&[("a", "1;b=2")], &[]),
            obj(&[("a", "1"), ("b", "2")], &[]),
        ),
        (
            obj(&[("a", "1,b:2")], &[]),
            obj(&[("a", "1"), ("b", "2")], &[]),
        ),
        (obj(&[("ab", "c")], &[]), obj(&[("a", "bc")], &[])),
        (obj(&[("a", "")], &[]), obj(&[], &[])),
        (obj(&[("a", "1")], &[]), obj(&[], &[("a", "1")])),
        (
            obj(&[("a", "1")], &[("b", "2")]),
            obj(&[("a", "1"), ("b", "2")], &[]),
        ),
    ];
    for (x, y) in &pairs {
        assert_ne!(
            encode_object(x, &Keys::All),
            encode_object(y, &Keys::All),
            "{x:?} {y:?}"
        );
        assert_ne!(digest(x, &Keys::All), digest(y, &Keys::All));
        assert_ne!(
            content_hash(&key(1), ResourceKind::ConfigMap, x),
            content_hash(&key(1), ResourceKind::ConfigMap, y)
        );
    }
}

#[test]
fn absent_key_differs_from_empty_value() {
    let empty = obj(&[("password", "")], &[]);
    let absent = obj(&[], &[]);
    let keys = some(&["password"]);
    assert_ne!(digest(&empty, &keys), digest(&absent, &keys));
    let (_, data, _, missing) = decode_object(&encode_object(&absent, &keys));
    assert!(data.is_empty());
    assert_eq!(missing, vec![b"password".to_vec()]);
}

#[test]
fn only_observed_keys_count() {
    let keys = some(&["a"]);
    let before = obj(&[("a", "1"), ("b", "2")], &[]);
    let other_changed = obj(&[("a", "1"), ("b", "3")], &[]);
    let added = obj(&[("a", "1"), ("b", "2"), ("c", "")], &[]);
    let read_changed = obj(&[("a", "9"), ("b", "2")], &[]);
    assert_eq!(digest(&before, &keys), digest(&other_changed, &keys));
    assert_eq!(digest(&before, &keys), digest(&added, &keys));
    assert_ne!(digest(&before, &keys), digest(&read_changed, &keys));
    // Through envFrom every key is visible, including a new one.
    assert_ne!(digest(&before, &Keys::All), digest(&added, &Keys::All));
    assert_ne!(
        digest(&before, &Keys::All),
        digest(&other_changed, &Keys::All)
    );
    // The same content read all vs one key digests differently.
    let single = obj(&[("a", "1")], &[]);
    assert_ne!(digest(&single, &Keys::All), digest(&single, &keys));
}

#[test]
fn content_hash_covers_type_and_kind_but_is_versioned() {
    let k = key(1);
    let mut o = obj(&[("a", "1")], &[]);
    let opaque = {
        o.type_ = Some("Opaque");
        content_hash(&k, ResourceKind::Secret, &o)
    };
    o.type_ = Some("kubernetes.io/tls");
    let tls = content_hash(&k, ResourceKind::Secret, &o);
    o.type_ = None;
    let untyped = content_hash(&k, ResourceKind::Secret, &o);
    let as_cm = content_hash(&k, ResourceKind::ConfigMap, &o);
    let all = [&opaque, &tls, &untyped, &as_cm];
    let distinct: BTreeSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), 4);
    for h in all {
        assert!(h.starts_with("v1:") && h.len() == 67, "{h}");
    }
}

#[test]
fn secret_and_configmap_conversions() {
    let secret = Secret {
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            ("a".to_string(), ByteString(b"old".to_vec())),
            ("b".to_string(), ByteString(b"2".to_vec())),
        ])),
        string_data: Some(BTreeMap::from([("a".to_string(), "new".to_string())])),
        ..Default::default()
    };
    let o = ObjectData::from(&secret);
    assert_eq!(o.type_, Some("Opaque"));
    assert_eq!(o.data.get("a"), Some(&b"new".as_slice()));
    assert_eq!(o.data.get("b"), Some(&b"2".as_slice()));
    assert!(o.binary_data.is_empty());

    let cm = ConfigMap {
        data: Some(BTreeMap::from([("t".to_string(), "text".to_string())])),
        binary_data: Some(BTreeMap::from([(
            "b".to_string(),
            ByteString(vec![0, 255]),
        )])),
        ..Default::default()
    };
    let o = ObjectData::from(&cm);
    assert_eq!(o.type_, None);
    assert_eq!(o.data.get("t"), Some(&b"text".as_slice()));
    assert_eq!(o.binary_data.get("b"), Some(&[0u8, 255].as_slice()));
}

#[test]
fn debug_never_shows_values() {
    let o = obj(&[("password", "hunter2")], &[("blob", "s3cr3t")]);
    let shown = format!("{o:?}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("s3cr3t"),
        "{shown}"
    );
    assert!(
        shown.contains("password") && shown.contains("<7 bytes>"),
        "{shown}"
    );
}

fn cm_ref(name: &str, keys: Keys, optional: bool) -> PodRef {
    PodRef::new(ResourceRef::config_map(name), keys, optional)
}

fn secret_ref(name: &str, keys: Keys, optional: bool) -> PodRef {
    PodRef::new(ResourceRef::secret(name), keys, optional)
}

#[test]
fn stamp_lists_refs_and_reports_missing() {
    let app = obj(&[("LOG_LEVEL", "debug")], &[]);
    let db = obj(&[("password", "hunter2"), ("user", "admin")], &[]);
    let refs = vec![
        secret_ref("tls", Keys::All, true),
        secret_ref("db", some(&["password"]), false),
        secret_ref("gone", Keys::All, false),
        cm_ref("app", Keys::All, false),
    ];
    let stamp = config_stamp(&key(1), &refs, |r| match r.resource.name.as_str() {
        "app" => Observed::Data(app.clone()),
        "db" => Observed::Data(db.clone()),
        _ => Observed::Absent,
    });
    assert_eq!(
        stamp.config_refs,
        "configmap/app,secret/db[password],secret/gone!,secret/tls?"
    );
    assert_eq!(stamp.missing, vec![ResourceRef::secret("gone")]);
    assert!(stamp.config_hash.starts_with("v1:") && stamp.config_hash.len() == 67);
}

#[test]
fn stamp_changes_with_refs_not_just_content() {
    let same = obj(&[("k", "v")], &[]);
    let stamp_for = |refs: Vec<PodRef>| {
        config_stamp(&key(1), &refs, |_| Observed::Data(same.clone())).config_hash
    };
    let a = stamp_for(vec![cm_ref("a", Keys::All, false)]);
    let b = stamp_for(vec![cm_ref("b", Keys::All, false)]);
    let a_secret = stamp_for(vec![secret_ref("a", Keys::All, false)]);
    let a_key = stamp_for(vec![cm_ref("a", some(&["k"]), false)]);
    let a_optional = stamp_for(vec![cm_ref("a", Keys::All, true)]);
    let distinct: BTreeSet<_> = [&a, &b, &a_secret, &a_key, &a_optional]
        .into_iter()
        .collect();
    assert_eq!(distinct.len(), 5);
}

#[test]
fn absent_is_not_empty_in_the_stamp() {
    let refs = vec![cm_ref("a", Keys::All, true)];
    let absent = config_stamp(&key(1), &refs, |_| Observed::Absent);
    let empty = config_stamp(&key(1), &refs, |_| Observed::Data(ObjectData::default()));
    assert_ne!(absent.config_hash, empty.config_hash);
    assert_eq!(absent.config_refs, "configmap/a?");
    assert_eq!(empty.config_refs, "configmap/a");
    assert!(absent.missing.is_empty());
}

#[test]
fn cached_digest_gives_the_same_stamp() {
    let o = obj(&[("k", "v")], &[]);
    let refs = vec![cm_ref("a", some(&["k"]), false)];
    let from_data = config_stamp(&key(1), &refs, |_| Observed::Data(o.clone()));
    let d = object_digest(&key(1), &o, &some(&["k"]));
    let from_digest = config_stamp(&key(1), &refs, |_| Observed::Digest(d));
    assert_eq!(from_data, from_digest);
}

#[test]
fn duplicate_refs_merge_like_podrefs() {
    let o = obj(&[("a", "1"), ("b", "2")], &[]);
    let split = vec![
        cm_ref("x", some(&["a"]), true),
        cm_ref("x", some(&["b"]), false),
    ];
    let merged = vec![cm_ref("x", some(&["a", "b"]), false)];
    let s1 = config_stamp(&key(1), &split, |_| Observed::Data(o.clone()));
    let s2 = config_stamp(&key(1), &merged, |_| Observed::Data(o.clone()));
    assert_eq!(s1, s2);
    assert_eq!(s1.config_refs, "configmap/x[a,b]");
}

#[test]
fn empty_stamp_is_well_defined() {
    let s = config_stamp(&key(1), &[], |_| Observed::Absent);
    assert_eq!(s.config_refs, "");
    assert!(s.missing.is_empty());
    assert_eq!(
        s.config_hash,
        format!(
            "v1:{}",
            hex::encode(raw_hmac(&[1; 32], &encode_config(&[])))
        )
    );
}

// ---- property tests ----

/// Short strings over an alphabet rich in the delimiters a naive scheme would use, so that
/// near-collisions are common.
fn tricky() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[ab1;=,:\\[\\]\u{0}]{0,4}").unwrap()
}

fn map() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(tricky(), tricky(), 0..4)
}

fn borrowed<'a>(
    data: &'a BTreeMap<String, String>,
    bin: &'a BTreeMap<String, String>,
) -> ObjectData<'a> {
    ObjectData {
        type_: None,
        data: data
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect(),
        binary_data: bin
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect(),
    }
}

fn keys_strategy() -> impl Strategy<Value = Keys> {
    prop_oneof![
        Just(Keys::All),
        proptest::collection::btree_set(tricky(), 0..4).prop_map(Keys::Some),
    ]
}

fn owned(entries: &[(Vec<u8>, Vec<u8>)]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    entries.iter().cloned().collect()
}

proptest! {
    #[test]
    fn encoding_decodes_back_to_exactly_the_observed_view(
        data in map(), bin in map(), keys in keys_strategy()
    ) {
        let o = borrowed(&data, &bin);
        let (mode, d, b, absent) = decode_object(&encode_object(&o, &keys));
        let pick = |m: &BTreeMap<String, String>| -> BTreeMap<Vec<u8>, Vec<u8>> {
            m.iter()
                .filter(|(k, _)| match &keys { Keys::All => true, Keys::Some(s) => s.contains(*k) })
                .map(|(k, v)| (k.clone().into_bytes(), v.clone().into_bytes()))
                .collect()
        };
        prop_assert_eq!(owned(&d), pick(&data));
        prop_assert_eq!(owned(&b), pick(&bin));
        match &keys {
            Keys::All => {
                prop_assert_eq!(mode, 0);
                prop_assert!(absent.is_empty());
            }
            Keys::Some(s) => {
                prop_assert_eq!(mode, 1);
                let want: Vec<Vec<u8>> = s
                    .iter()
                    .filter(|k| !data.contains_key(*k) && !bin.contains_key(*k))
                    .map(|k| k.clone().into_bytes())
                    .collect();
                prop_assert_eq!(absent, want);
            }
        }
    }

    #[test]
    fn distinct_inputs_never_collide(
        d1 in map(), b1 in map(), d2 in map(), b2 in map()
    ) {
        prop_assume!((&d1, &b1) != (&d2, &b2));
        let (x, y) = (borrowed(&d1, &b1), borrowed(&d2, &b2));
        prop_assert_ne!(encode_object(&x, &Keys::All), encode_object(&y, &Keys::All));
        prop_assert_ne!(digest(&x, &Keys::All), digest(&y, &Keys::All));
        prop_assert_ne!(
            encode_content(ResourceKind::ConfigMap, &x),
            encode_content(ResourceKind::ConfigMap, &y)
        );
    }

    #[test]
    fn key_value_boundary_shifts_never_collide(k in "[a-z;=]{1,6}", v in "[a-z;=]{0,6}", cut in 0usize..6) {
        let cut = cut % k.len();
        prop_assume!(cut > 0);
        let (head, tail) = k.split_at(cut);
        let shifted_value = format!("{tail}{v}");
        let one = [(k.as_str(), v.as_str())];
        let two = [(head, shifted_value.as_str())];
        prop_assert_ne!(digest(&obj(&one, &[]), &Keys::All), digest(&obj(&two, &[]), &Keys::All));
        // And moving the key between data and binaryData always shows.
        prop_assert_ne!(digest(&obj(&one, &[]), &Keys::All), digest(&obj(&[], &one), &Keys::All));
    }

    #[test]
    fn insertion_order_does_not_matter(
        entries in proptest::collection::vec((tricky(), tricky()), 0..6),
        seed in any::<u64>()
    ) {
        // Deduplicate keys first: a later duplicate would legitimately win.
        let unique: BTreeMap<String, String> = entries.into_iter().collect();
        let mut shuffled: Vec<(String, String)> = unique.clone().into_iter().collect();
        let n = shuffled.len();
        if n > 1 {
            let mut s = seed;
            for i in (1..n).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (s >> 33) as usize % (i + 1));
            }
        }
        let cm_in_order = ConfigMap { data: Some(unique.clone().into_iter().collect()), ..Default::default() };
        let mut map_shuffled = BTreeMap::new();
        for (k, v) in shuffled.iter().rev() {
            map_shuffled.insert(k.clone(), v.clone());
        }
        let cm_shuffled = ConfigMap { data: Some(map_shuffled), ..Default::default() };
        let h1 = content_hash(&key(1), ResourceKind::ConfigMap, &ObjectData::from(&cm_in_order));
        let h2 = content_hash(&key(1), ResourceKind::ConfigMap, &ObjectData::from(&cm_shuffled));
        prop_assert_eq!(h1, h2);

        // The order of the pod's references does not matter either.
        let refs: Vec<PodRef> = unique.keys().enumerate()
            .map(|(i, name)| if i % 2 == 0 {
                secret_ref(name, Keys::All, false)
            } else {
                cm_ref(name, Keys::All, true)
            })
            .collect();
        let mut reversed = refs.clone();
        reversed.reverse();
        let o = ObjectData::from(&cm_in_order);
        let s1 = config_stamp(&key(1), &refs, |_| Observed::Data(o.clone()));
        let s2 = config_stamp(&key(1), &reversed, |_| Observed::Data(o.clone()));
        prop_assert_eq!(s1, s2);
    }

    #[test]
    fn key_sensitivity(
        k1 in proptest::collection::vec(any::<u8>(), 32..64),
        k2 in proptest::collection::vec(any::<u8>(), 32..64),
        data in map()
    ) {
        prop_assume!(k1 != k2);
        let o = borrowed(&data, &data);
        let (h1, h2) = (HashKey::new(&k1).unwrap(), HashKey::new(&k2).unwrap());
        prop_assert_ne!(object_digest(&h1, &o, &Keys::All), object_digest(&h2, &o, &Keys::All));
        prop_assert_ne!(
            content_hash(&h1, ResourceKind::Secret, &o),
            content_hash(&h2, ResourceKind::Secret, &o)
        );
        let refs = [cm_ref("x", Keys::All, false)];
        prop_assert_ne!(
            config_stamp(&h1, &refs, |_| Observed::Data(o.clone())).config_hash,
            config_stamp(&h2, &refs, |_| Observed::Data(o.clone())).config_hash
        );
    }

    #[test]
    fn requested_key_absent_vs_present_empty(k in tricky(), other in map()) {
        let mut with_empty = other.clone();
        with_empty.insert(k.clone(), String::new());
        let mut without = other.clone();
        without.remove(&k);
        let none = BTreeMap::new();
        let keys = Keys::Some(BTreeSet::from([k.clone()]));
        prop_assert_ne!(
            digest(&borrowed(&with_empty, &none), &keys),
            digest(&borrowed(&without, &none), &keys)
        );
    }

    #[test]
    fn config_refs_round_trip(
        entries in proptest::collection::btree_map(
            (prop_oneof![Just(ResourceKind::Secret), Just(ResourceKind::ConfigMap)], "[a-z0-9.,\\[\\]%?!-]{1,8}"),
            (keys_strategy(), 0u8..3),
            0..5
        )
    ) {
        let refs: Vec<ConfigRef> = entries
            .into_iter()
            .filter(|(_, (keys, _))| match keys {
                // Tokens are non-empty by grammar; empty keys are not valid Kubernetes keys.
                Keys::Some(s) => !s.contains(""),
                Keys::All => true,
            })
            .map(|((kind, name), (keys, state))| ConfigRef {
                resource: ResourceRef::new(kind, name),
                keys,
                state: [RefState::Present, RefState::AbsentOptional, RefState::AbsentRequired][state as usize],
            })
            .collect();
        let s = format_config_refs(&refs);
        prop_assert_eq!(parse_config_refs(&s).unwrap(), refs);
    }

    #[test]
    fn config_refs_parser_never_panics(s in "\\PC{0,40}") {
        let _ = parse_config_refs(&s);
    }
}

fn env_reads(prefixes: &[&str]) -> Reads {
    Reads {
        env_prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
        ..Reads::default()
    }
}

fn var_reads(keys: &[&str]) -> Reads {
    Reads {
        vars: keys.iter().map(|k| (k.to_string(), true)).collect(),
        ..Reads::default()
    }
}

#[test]
fn env_from_digests_what_a_whole_volume_did_when_the_kubelet_reads_it_all() {
    // No binaryData: the stamp of an existing envFrom workload stays, whatever its keys are
    // (a 1.30+ kubelet imports every key of data, `1st-line` included) and whatever the prefixes.
    let o = obj(
        &[
            ("GREETING", "hello"),
            ("log.level", "debug"),
            ("1st-line", "x"),
        ],
        &[],
    );
    assert_eq!(
        encode_reads(&o, &env_reads(&[""])),
        encode_object(&o, &Keys::All)
    );
    for prefixes in [&["", "X_"][..], &["1_"], &["my app:"]] {
        assert_eq!(
            reads_digest(&key(1), &o, &env_reads(prefixes)),
            digest(&o, &Keys::All),
            "{prefixes:?}"
        );
    }
}

#[test]
fn env_from_ignores_binary_data_and_reads_every_data_key() {
    let reads = env_reads(&[""]);
    let base = reads_digest(&key(1), &obj(&[("A", "1")], &[]), &reads);
    // binaryData is never imported.
    assert_eq!(
        reads_digest(&key(1), &obj(&[("A", "1")], &[("blob", "x")]), &reads),
        base
    );
    // Every key of data is: also those a 1.20-1.29 kubelet skips (they fail the strict rule with
    // the prefix), so changing, adding or removing one restamps there without the pods seeing it.
    for seen in [
        obj(&[("A", "1"), ("1st", "x")], &[]),
        obj(&[("A", "1"), ("a/b", "x"), ("..x", "y")], &[]),
    ] {
        assert_ne!(reads_digest(&key(1), &seen, &reads), base, "{seen:?}");
    }
    assert_ne!(
        reads_digest(&key(1), &obj(&[("A", "1"), ("1st", "x")], &[]), &reads),
        reads_digest(&key(1), &obj(&[("A", "1"), ("1st", "y")], &[]), &reads)
    );
    // The prefix changes nothing: the same keys are read under any.
    let with_digit = obj(&[("A", "1"), ("1st", "x")], &[]);
    assert_eq!(
        reads_digest(&key(1), &with_digit, &env_reads(&["", "P_"])),
        reads_digest(&key(1), &with_digit, &reads)
    );
    // A change of a key it reads.
    assert_ne!(
        reads_digest(&key(1), &obj(&[("A", "2")], &[]), &reads),
        base
    );
}

#[test]
fn a_key_ref_reads_data_only() {
    let reads = var_reads(&["k"]);
    // A key only in binaryData is absent for a key ref: hashed as absent, whatever its value.
    let binary_only = obj(&[], &[("k", "v")]);
    let absent = obj(&[], &[]);
    assert_eq!(
        reads_digest(&key(1), &binary_only, &reads),
        reads_digest(&key(1), &absent, &reads)
    );
    assert_eq!(
        reads_digest(&key(1), &obj(&[], &[("k", "w")]), &reads),
        reads_digest(&key(1), &absent, &reads)
    );
    // A key in data: the same bytes as before (a volume item reading that key).
    let present = obj(&[("k", "v"), ("other", "x")], &[("blob", "b")]);
    assert_eq!(
        encode_reads(&present, &reads),
        encode_object(&present, &some(&["k"]))
    );
    assert_eq!(
        encode_reads(&absent, &reads),
        encode_object(&absent, &some(&["k"]))
    );
}

fn refs_of(n: usize, keys: usize, key_len: usize) -> Vec<ConfigRef> {
    (0..n)
        .map(|i| ConfigRef {
            resource: ResourceRef::config_map(format!("cm-{i}")),
            keys: Keys::Some(
                (0..keys)
                    .map(|k| format!("{k:0>width$}", width = key_len))
                    .collect(),
            ),
            state: if i % 2 == 0 {
                RefState::Present
            } else {
                RefState::AbsentRequired
            },
        })
        .collect()
}

#[test]
fn config_refs_are_summarised_beyond_the_budget() {
    let small = refs_of(2, 2, 3);
    assert_eq!(
        bounded_config_refs(&small, 1024),
        format_config_refs(&small)
    );
    // 1,150 key references with long keys (the case): far beyond the limit in full.
    let big = refs_of(1, 1150, 250);
    let full = format_config_refs(&big);
    assert!(full.len() > ANNOTATIONS_LIMIT);
    let cut = bounded_config_refs(&big, CONFIG_REFS_LIMIT);
    assert!(cut.len() <= CONFIG_REFS_LIMIT, "{}", cut.len());
    assert!(cut.starts_with("configmap/cm-0["), "{cut}");
    let shown = cut.matches(',').count();
    assert!(cut.ends_with(&format!(",+{}]", 1150 - shown)), "{cut}");
    assert!(parse_config_refs(&cut).is_err());
    // Many objects: whole entries first, then the count of those left out.
    let many = refs_of(2000, 0, 0);
    let cut = bounded_config_refs(&many, 1000);
    assert!(cut.len() <= 1000);
    let shown = cut
        .split(',')
        .filter(|e| e.starts_with("configmap/"))
        .count();
    assert!(cut.ends_with(&format!(",+{}", 2000 - shown)), "{cut}");
    // The smallest budget still says something true.
    assert_eq!(bounded_config_refs(&many, MIN_CONFIG_REFS_BUDGET), "+2000");
}

#[test]
fn the_budget_keeps_all_annotations_within_the_limit() {
    assert_eq!(config_refs_budget(0, 67), Some(CONFIG_REFS_LIMIT));
    let others = ANNOTATIONS_LIMIT - 1000;
    let stamp = "helmop.dev/config-hash".len() + 67 + "helmop.dev/config-refs".len();
    assert_eq!(config_refs_budget(others, 67), Some(1000 - stamp));
    assert_eq!(config_refs_budget(ANNOTATIONS_LIMIT - stamp - 10, 67), None);
    assert_eq!(config_refs_budget(ANNOTATIONS_LIMIT + 1, 67), None);
}

proptest! {
    #[test]
    fn bounded_config_refs_fit_and_keep_a_prefix(
        n in 0usize..40,
        keys in 0usize..30,
        key_len in 1usize..40,
        limit in MIN_CONFIG_REFS_BUDGET..3000,
    ) {
        let refs = refs_of(n, keys, key_len);
        let full = format_config_refs(&refs);
        let cut = bounded_config_refs(&refs, limit);
        prop_assert!(cut.len() <= limit);
        if full.len() <= limit {
            prop_assert_eq!(cut, full);
        } else {
            // Everything before the first `+` is shown exactly as in full.
            let shown = cut.split('+').next().unwrap_or_default();
            prop_assert!(full.starts_with(shown.trim_end_matches(['[', ','])), "{} vs {}", cut, full);
        }
    }
}

// ---- v2: namespace-bound config hashes and the migration from v1 ----

/// The worked example of docs/hash-format.md: key 00..1f; ConfigMap `app` through `envFrom`, key `password` of
/// Secret `db`, optional Secret `tls` absent.
fn worked_example() -> (
    HashKey,
    Vec<PodRef>,
    ObjectData<'static>,
    ObjectData<'static>,
) {
    let bytes: Vec<u8> = (0u8..32).collect();
    let refs = vec![
        cm_ref("app", Keys::All, false),
        secret_ref("db", some(&["password"]), false),
        secret_ref("tls", Keys::All, true),
    ];
    (
        HashKey::new(&bytes).unwrap(),
        refs,
        obj(&[("LOG_LEVEL", "debug")], &[]),
        obj(&[("password", "hunter2"), ("user", "admin")], &[]),
    )
}

fn worked_lookup<'a>(
    app: &'a ObjectData<'a>,
    db: &'a ObjectData<'a>,
) -> impl FnMut(&PodRef) -> Observed<'a> {
    move |r| match r.resource.name.as_str() {
        "app" => Observed::Data(app.clone()),
        "db" => Observed::Data(db.clone()),
        _ => Observed::Absent,
    }
}

const WORKED_V1: &str = "v1:35b763016dd14bae083bebe673e1302dda4a8404d980b5cb2c66bde81e41cb61";
/// `HMAC(key, "helmop.dev/v2/namespace" 00 "team")`, the subkey of namespace `team`.
const TEAM_SUBKEY: &str = "8bfc981f3c4cf456268d455227877a4b4364516ffece859ab991134a8c4398e4";
const WORKED_V2_TEAM: &str = "v2:986bf888ad65352ef0ba4b9b48950c179d29ae38e52b719521cf930ced7e8172";

#[test]
fn v2_test_vectors_match_an_independent_hmac() {
    let (k, refs, app, db) = worked_example();
    let key_bytes: Vec<u8> = (0u8..32).collect();
    let subkey = raw_hmac(&key_bytes, b"helmop.dev/v2/namespace\0team");
    assert_eq!(hex::encode(subkey), TEAM_SUBKEY);
    let v1 = config_stamp(&k, &refs, worked_lookup(&app, &db));
    assert_eq!(v1.config_hash, WORKED_V1, "the v1 vector still holds");
    let v2 = config_stamp_v2(&k, "team", &refs, worked_lookup(&app, &db));
    assert_eq!(v2.config_hash, WORKED_V2_TEAM);
    assert_eq!(v2.config_refs, v1.config_refs);
    // The same bytes as v1 but for the tag, keyed with the subkey.
    let digests: Vec<(PodRef, Option<ObjectDigest>)> = refs
        .iter()
        .map(|r| {
            let d = match r.resource.name.as_str() {
                "app" => Some(reads_digest(&k, &app, &r.reads)),
                "db" => Some(reads_digest(&k, &db, &r.reads)),
                _ => None,
            };
            (r.clone(), d)
        })
        .collect();
    let bytes = encode_config_v2(&digests);
    assert_eq!(&bytes[8..28], b"helmop.dev/v2/config");
    assert_eq!(bytes[28..], encode_config(&digests)[28..]);
    assert_eq!(
        v2.config_hash,
        format!("v2:{}", hex::encode(raw_hmac(&subkey, &bytes)))
    );
}

#[test]
fn v2_binds_the_namespace() {
    let (k, refs, app, db) = worked_example();
    let team = config_stamp_v2(&k, "team", &refs, worked_lookup(&app, &db));
    let other = config_stamp_v2(&k, "other", &refs, worked_lookup(&app, &db));
    assert_ne!(team.config_hash, other.config_hash);
    assert!(team.config_hash.starts_with("v2:") && team.config_hash.len() == 67);
    // The NUL ends the tag: no namespace can be mistaken for another through the tag's bytes.
    assert_ne!(
        config_stamp_v2(&k, "", &refs, worked_lookup(&app, &db)).config_hash,
        team.config_hash
    );
    // Deterministic, and still keyed: another cluster key gives another stamp.
    assert_eq!(
        config_stamp_v2(&k, "team", &refs, worked_lookup(&app, &db)),
        team
    );
    assert_ne!(
        config_stamp_v2(&key(9), "team", &refs, worked_lookup(&app, &db)).config_hash,
        team.config_hash
    );
}

proptest! {
    #[test]
    fn v2_differs_across_namespaces_and_from_v1(
        a in "[a-z0-9-]{1,20}", b in "[a-z0-9-]{1,20}", value in tricky(),
    ) {
        let o = obj(&[("k", value.as_str())], &[]);
        let refs = vec![cm_ref("c", Keys::All, false)];
        let in_a = config_stamp_v2(&key(1), &a, &refs, |_| Observed::Data(o.clone()));
        let in_b = config_stamp_v2(&key(1), &b, &refs, |_| Observed::Data(o.clone()));
        prop_assert_eq!(in_a.config_hash == in_b.config_hash, a == b);
        let v1 = config_stamp(&key(1), &refs, |_| Observed::Data(o.clone()));
        prop_assert_ne!(&in_a.config_hash[3..], &v1.config_hash[3..]);
    }
}

#[test]
fn missing_keys_are_the_required_ones_the_pod_does_not_find() {
    let mut reads = Reads::default();
    reads.vars.insert("password".into(), true);
    reads.vars.insert("optional".into(), false);
    reads.vars.insert("bin".into(), true);
    reads.files.insert("cert".into(), true);
    let o = obj(&[("user", "u")], &[("cert", "c"), ("bin", "b")]);
    // A key ref looks in data only; a volume item finds binaryData too.
    assert_eq!(missing_keys(&o, &reads), vec!["bin", "password"]);
    let full = obj(&[("password", "p"), ("bin", "b")], &[("cert", "c")]);
    assert!(missing_keys(&full, &reads).is_empty());
}
