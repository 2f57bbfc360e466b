//! Throughput of helmop's keyed hashes against a raw HMAC-SHA256 over the same bytes.
//! Run with `cargo run --release -p helmop-core --example hash_throughput`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use helmop_core::hash::{HashKey, ObjectData, content_hash, object_digest};
use helmop_core::podrefs::Keys;
use helmop_core::resource::ResourceKind;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const MIB: usize = 1 << 20;

fn time(mut f: impl FnMut()) -> Duration {
    // Best of several runs: the machine is shared, the minimum is the least disturbed.
    (0..7)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..20 {
                f();
            }
            start.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn report(label: &str, raw: Duration, ours: Duration) {
    let per = |d: Duration| 20.0 * MIB as f64 / d.as_secs_f64() / MIB as f64;
    println!(
        "{label}: raw {:.0} MiB/s, helmop {:.0} MiB/s, ratio {:.3}",
        per(raw),
        per(ours),
        raw.as_secs_f64() / ours.as_secs_f64()
    );
}

fn main() {
    let key_bytes = [42u8; 32];
    let key = HashKey::new(&key_bytes).unwrap();
    let raw = |bytes: &[&[u8]]| {
        let mut mac = Hmac::<Sha256>::new_from_slice(&key_bytes).unwrap();
        for b in bytes {
            mac.update(b);
        }
        std::hint::black_box(mac.finalize().into_bytes());
    };

    let value = vec![b'x'; MIB];
    let one: ObjectData = ObjectData {
        type_: None,
        data: BTreeMap::from([("big", value.as_slice())]),
        binary_data: BTreeMap::new(),
    };
    let t_raw = time(|| raw(&[&value]));
    let t_obj = time(|| {
        std::hint::black_box(object_digest(&key, &one, &Keys::All));
    });
    let t_content = time(|| {
        std::hint::black_box(content_hash(&key, ResourceKind::ConfigMap, &one));
    });
    report("1 key of 1 MiB, object digest", t_raw, t_obj);
    report("1 key of 1 MiB, content hash ", t_raw, t_content);

    let names: Vec<String> = (0..1024).map(|i| format!("key-{i:04}")).collect();
    let many: ObjectData = ObjectData {
        type_: None,
        data: names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), &value[i * 1024..(i + 1) * 1024]))
            .collect(),
        binary_data: BTreeMap::new(),
    };
    let chunks: Vec<&[u8]> = (0..1024)
        .map(|i| &value[i * 1024..(i + 1) * 1024])
        .collect();
    let t_raw = time(|| raw(&chunks));
    let t_obj = time(|| {
        std::hint::black_box(object_digest(&key, &many, &Keys::All));
    });
    report("1024 keys of 1 KiB, object digest", t_raw, t_obj);
}
