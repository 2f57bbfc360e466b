//! The worked example of docs/hash-format.md, pinned.
//!
//! The expected digests below were produced by OpenSSL 3.0
//! (`xxd -r -p <<<"$ENCODING" | openssl dgst -sha256 -mac HMAC -macopt hexkey:$KEY`), not by
//! this crate. `openssl_agrees` re-checks them against a local `openssl` when one is installed.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test with its message

use std::io::Write;
use std::process::{Command, Stdio};

use helmop_core::hash::{
    HashKey, ObjectData, Observed, config_stamp, content_hash, encode_config, encode_content,
    encode_object, encode_reads, object_digest,
};
use helmop_core::podrefs::{Keys, PodRef, pod_refs_from_value};
use helmop_core::resource::{ResourceKind, ResourceRef};

const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

const APP_ENCODING: &str = "000000000000001468656c6d6f702e6465762f76312f6f626a656374000000000000000001\
00000000000000094c4f475f4c4556454c0000000000000005646562756700000000000000000000000000000000";
const APP_DIGEST: &str = "3fc6db5c3301909e802b4ddb0f3553770a30c471be37d48cd8e8296a99227540";

const DB_ENCODING: &str = "000000000000001468656c6d6f702e6465762f76312f6f626a656374010000000000000001\
000000000000000870617373776f7264000000000000000768756e7465723200000000000000000000000000000000";
const DB_DIGEST: &str = "6f771cda30e930a9ebb1c8c4dcbb408406b05b5c2fa0bce3a60d9a5e30f3942f";

const CONFIG_ENCODING: &str = "000000000000001468656c6d6f702e6465762f76312f636f6e666967000000000000\
00030000000000000009436f6e6669674d617000000000000000036170700000013fc6db5c3301909e802b4ddb0f355377\
0a30c471be37d48cd8e8296a9922754000000000000000065365637265740000000000000002646201000000000000000100\
0000000000000870617373776f726400016f771cda30e930a9ebb1c8c4dcbb408406b05b5c2fa0bce3a60d9a5e30f3942f00\
000000000000065365637265740000000000000003746c73000100";
const CONFIG_HASH: &str = "v1:35b763016dd14bae083bebe673e1302dda4a8404d980b5cb2c66bde81e41cb61";
const CONFIG_REFS: &str = "configmap/app,secret/db[password],secret/tls?";

const CONTENT_ENCODING: &str = "000000000000001568656c6d6f702e6465762f76312f636f6e74656e74000000000000\
00065365637265740100000000000000064f70617175650000000000000002000000000000000870617373776f726400000000\
0000000768756e74657232000000000000000475736572000000000000000561646d696e0000000000000000";
const CONTENT_HASH: &str = "v1:55c48a98c5a2f020059b8a279951b7f0905de03705ca81c17647ebfdfd5c064b";

fn key() -> HashKey {
    HashKey::new(&hex::decode(KEY_HEX).unwrap()).unwrap()
}

fn app() -> ObjectData<'static> {
    ObjectData {
        type_: None,
        data: [("LOG_LEVEL", b"debug".as_slice())].into(),
        binary_data: Default::default(),
    }
}

fn db() -> ObjectData<'static> {
    ObjectData {
        type_: Some("Opaque"),
        data: [
            ("password", b"hunter2".as_slice()),
            ("user", b"admin".as_slice()),
        ]
        .into(),
        binary_data: Default::default(),
    }
}

fn refs() -> Vec<PodRef> {
    vec![
        PodRef::new(ResourceRef::config_map("app"), Keys::All, false),
        PodRef::new(ResourceRef::secret("db"), Keys::one("password"), false),
        PodRef::new(ResourceRef::secret("tls"), Keys::All, true),
    ]
}

#[test]
fn documented_example() {
    let k = key();
    assert_eq!(hex::encode(encode_object(&app(), &Keys::All)), APP_ENCODING);
    assert_eq!(object_digest(&k, &app(), &Keys::All).to_hex(), APP_DIGEST);
    let password = Keys::one("password");
    assert_eq!(hex::encode(encode_object(&db(), &password)), DB_ENCODING);
    assert_eq!(object_digest(&k, &db(), &password).to_hex(), DB_DIGEST);

    let digests = [
        Some(object_digest(&k, &app(), &Keys::All)),
        Some(object_digest(&k, &db(), &password)),
        None,
    ];
    let with_digests: Vec<_> = refs().into_iter().zip(digests).collect();
    assert_eq!(hex::encode(encode_config(&with_digests)), CONFIG_ENCODING);

    let stamp = config_stamp(&k, &refs(), |r| match r.resource.name.as_str() {
        "app" => Observed::Data(app()),
        "db" => Observed::Data(db()),
        _ => Observed::Absent,
    });
    assert_eq!(stamp.config_hash, CONFIG_HASH);
    assert_eq!(stamp.config_refs, CONFIG_REFS);
    assert!(stamp.missing.is_empty());

    assert_eq!(
        hex::encode(encode_content(ResourceKind::Secret, &db())),
        CONTENT_ENCODING
    );
    assert_eq!(content_hash(&k, ResourceKind::Secret, &db()), CONTENT_HASH);
}

/// The same example read from the pod spec docs/hash-format.md describes ("Worked example"),
/// through the kubelet's rules (envFrom reads every key of `data`, a key ref `data[key]`): the
/// documented stamp stays.
#[test]
fn documented_example_from_the_pod_spec() {
    let spec = serde_json::json!({
        "volumes": [{"name": "tls", "secret": {"secretName": "tls", "optional": true}}],
        "containers": [{
            "name": "app",
            "envFrom": [{"configMapRef": {"name": "app"}}],
            "env": [{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}],
        }],
    });
    let refs = pod_refs_from_value(&spec).unwrap();
    let k = key();
    let app_reads = &refs[0].reads;
    assert_eq!(hex::encode(encode_reads(&app(), app_reads)), APP_ENCODING);
    assert_eq!(
        hex::encode(encode_reads(&db(), &refs[1].reads)),
        DB_ENCODING
    );
    let stamp = config_stamp(&k, &refs, |r| match r.resource.name.as_str() {
        "app" => Observed::Data(app()),
        "db" => Observed::Data(db()),
        _ => Observed::Absent,
    });
    assert_eq!(stamp.config_hash, CONFIG_HASH);
    assert_eq!(stamp.config_refs, CONFIG_REFS);
}

fn openssl_hmac(encoding_hex: &str) -> Option<String> {
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-mac", "HMAC", "-macopt"])
        .arg(format!("hexkey:{KEY_HEX}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take()?;
    stdin
        .write_all(&hex::decode(encoding_hex).unwrap())
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    // `SHA2-256(stdin)= <hex>` (OpenSSL 3) or `HMAC-SHA256(stdin)= <hex>` (1.1).
    let text = String::from_utf8(out.stdout).unwrap();
    Some(text.trim().rsplit(' ').next().unwrap().to_string())
}

#[test]
fn openssl_agrees() {
    let cases = [
        (APP_ENCODING, APP_DIGEST.to_string()),
        (DB_ENCODING, DB_DIGEST.to_string()),
        (
            CONFIG_ENCODING,
            CONFIG_HASH.trim_start_matches("v1:").to_string(),
        ),
        (
            CONTENT_ENCODING,
            CONTENT_HASH.trim_start_matches("v1:").to_string(),
        ),
    ];
    for (encoding, want) in cases {
        let Some(got) = openssl_hmac(encoding) else {
            eprintln!("openssl not installed: relying on the pinned vectors");
            return;
        };
        assert_eq!(got, want);
    }
}
