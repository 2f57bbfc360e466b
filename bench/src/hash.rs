//! `helmop-bench hash`: throughput of helmop's keyed hashes against a raw HMAC-SHA256 over the same value bytes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use helmop_core::hash::{
    HashKey, ObjectData, content_hash, encode_content, encode_object, object_digest,
};
use helmop_core::podrefs::Keys;
use helmop_core::resource::ResourceKind;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const MIB: usize = 1 << 20;

/// One row: the same bytes hashed raw and by helmop.
#[derive(Debug, Clone)]
pub struct HashRow {
    pub label: String,
    pub bytes: usize,
    pub raw: Duration,
    pub helmop: Duration,
    /// Length of helmop's canonical encoding of the same input (values plus names, lengths, tags).
    pub encoded_bytes: usize,
    /// Raw HMAC-SHA256 over that encoding in one piece: what the encoding itself costs is the gap between
    /// `raw` and this; what the implementation costs is the gap between this and `helmop`.
    pub raw_encoded: Duration,
}

impl HashRow {
    pub fn raw_mib_s(&self) -> f64 {
        self.bytes as f64 / MIB as f64 / self.raw.as_secs_f64()
    }
    pub fn helmop_mib_s(&self) -> f64 {
        self.bytes as f64 / MIB as f64 / self.helmop.as_secs_f64()
    }
    /// helmop throughput / raw throughput (both in value bytes per second).
    pub fn ratio(&self) -> f64 {
        self.raw.as_secs_f64() / self.helmop.as_secs_f64()
    }
    /// helmop against a raw HMAC over helmop's own encoded stream.
    pub fn ratio_encoded(&self) -> f64 {
        self.raw_encoded.as_secs_f64() / self.helmop.as_secs_f64()
    }
}

/// Time per call: best of `rounds` rounds of `iterations` calls (the machine is shared: the minimum is the
/// least disturbed measurement). The two contenders alternate round by round so drift hits both.
pub(crate) fn race(
    rounds: usize,
    iterations: usize,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
) -> (Duration, Duration) {
    let mut best = (Duration::MAX, Duration::MAX);
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..iterations {
            a();
        }
        best.0 = best.0.min(start.elapsed() / iterations as u32);
        let start = Instant::now();
        for _ in 0..iterations {
            b();
        }
        best.1 = best.1.min(start.elapsed() / iterations as u32);
    }
    best
}

fn raw_hmac(key: &[u8], parts: &[&[u8]]) {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return;
    };
    for p in parts {
        mac.update(p);
    }
    std::hint::black_box(mac.finalize().into_bytes());
}

/// Runs the hash scenarios. `rounds` trades time for stability (7 is a few seconds).
pub fn run(rounds: usize) -> anyhow::Result<Vec<HashRow>> {
    let key_bytes = [42u8; 32];
    let key = HashKey::new(&key_bytes)?;
    let value = vec![b'x'; MIB];
    let mut rows = Vec::new();

    let one = ObjectData {
        type_: None,
        data: BTreeMap::from([("big", value.as_slice())]),
        binary_data: BTreeMap::new(),
    };
    let (raw, ours) = race(
        rounds,
        20,
        || raw_hmac(&key_bytes, &[&value]),
        || {
            std::hint::black_box(object_digest(&key, &one, &Keys::All));
        },
    );
    let encoded = encode_object(&one, &Keys::All);
    let (raw_encoded, _) = race(rounds, 20, || raw_hmac(&key_bytes, &[&encoded]), || {});
    rows.push(HashRow {
        label: "1 key of 1 MiB, pod-template digest".into(),
        bytes: MIB,
        raw,
        helmop: ours,
        encoded_bytes: encoded.len(),
        raw_encoded,
    });
    let (raw, ours) = race(
        rounds,
        20,
        || raw_hmac(&key_bytes, &[&value]),
        || {
            std::hint::black_box(content_hash(&key, ResourceKind::ConfigMap, &one));
        },
    );
    let encoded = encode_content(ResourceKind::ConfigMap, &one);
    let (raw_encoded, _) = race(rounds, 20, || raw_hmac(&key_bytes, &[&encoded]), || {});
    rows.push(HashRow {
        label: "1 key of 1 MiB, copy content-hash".into(),
        bytes: MIB,
        raw,
        helmop: ours,
        encoded_bytes: encoded.len(),
        raw_encoded,
    });

    for (count, size) in [(1024usize, 1024usize), (4096, 64)] {
        let names: Vec<String> = (0..count).map(|i| format!("key-{i:05}")).collect();
        let chunks: Vec<&[u8]> = (0..count)
            .map(|i| &value[i * size..(i + 1) * size])
            .collect();
        let many = ObjectData {
            type_: None,
            data: names
                .iter()
                .zip(&chunks)
                .map(|(n, c)| (n.as_str(), *c))
                .collect(),
            binary_data: BTreeMap::new(),
        };
        let (raw, ours) = race(
            rounds,
            20,
            || raw_hmac(&key_bytes, &chunks),
            || {
                std::hint::black_box(object_digest(&key, &many, &Keys::All));
            },
        );
        let encoded = encode_object(&many, &Keys::All);
        let (raw_encoded, _) = race(rounds, 20, || raw_hmac(&key_bytes, &[&encoded]), || {});
        rows.push(HashRow {
            label: format!("{count} keys of {size} B, pod-template digest"),
            bytes: count * size,
            raw,
            helmop: ours,
            encoded_bytes: encoded.len(),
            raw_encoded,
        });
    }
    Ok(rows)
}

pub fn table(rows: &[HashRow]) -> String {
    let mut out = String::from(
        "| input (value bytes) | raw HMAC-SHA256 over the values, MiB/s | helmop, MiB/s of values | ratio (goal >= 0.8) | encoded bytes | raw HMAC over helmop's encoding, MiB/s of values | helmop / that |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.3} | {} | {:.0} | {:.3} |\n",
            r.label,
            r.raw_mib_s(),
            r.helmop_mib_s(),
            r.ratio(),
            r.encoded_bytes,
            r.bytes as f64 / MIB as f64 / r.raw_encoded.as_secs_f64(),
            r.ratio_encoded()
        ));
    }
    out
}
