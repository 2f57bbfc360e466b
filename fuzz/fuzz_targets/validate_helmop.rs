//! `validate_helmop` on HelmOp-shaped JSON generated from the bytes (and on the bytes themselves when they are
//! JSON): no panic, deterministic, every denial names a path or says why the whole object is wrong, and the
//! existence checks only ever see well-formed references.
#![no_main]

use helmop_core::validate::{downstream_refs, has_denials, validate_helmop};
use helmop_fuzz::helmop_like;
use libfuzzer_sys::fuzz_target;

fn check(value: &serde_json::Value) {
    let findings = validate_helmop(value);
    assert_eq!(
        findings,
        validate_helmop(value),
        "validation is not deterministic"
    );
    for f in &findings {
        assert!(
            !f.message.is_empty(),
            "finding without a message at {}",
            f.path
        );
    }
    let refs = downstream_refs(value);
    for (path, r) in &refs {
        assert!(path.starts_with("spec."), "reference path {path}");
        assert!(
            !r.name.is_empty() && r.name.len() <= 253,
            "malformed reference passed on: {r:?}"
        );
    }
    if !has_denials(&findings) {
        assert!(
            value.get("spec").is_some_and(|s| s.is_object()),
            "admitted without a spec object"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    check(&helmop_like(data));
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        check(&value);
    }
});
