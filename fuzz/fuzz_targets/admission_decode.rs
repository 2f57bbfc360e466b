//! `admission::decode` on arbitrary bytes, and `encode` of verdicts built from what was decoded: no panic, errors
//! short and without quoted values, responses that are valid AdmissionReviews echoing the uid.
#![no_main]

use helmop_webhook::admission::{decode, encode};
use helmop_webhook::verdict::Verdict;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Err(e) => {
            let message = e.to_string();
            // Bounded whatever the input size: the version message quotes at most 64 characters of each of
            // two names (Debug-escaped, so up to ~10 bytes a character); nothing else quotes input.
            assert!(message.len() < 2048, "error of {} bytes", message.len());
        }
        Ok(req) => {
            let verdicts = [
                Verdict::allow(),
                Verdict::allow_with_warnings(vec![req.name.clone()]),
                Verdict::Deny {
                    message: req.name.clone(),
                    code: 403,
                    warnings: vec![req.uid.clone()],
                },
                Verdict::Deny {
                    message: String::new(),
                    code: 0,
                    warnings: Vec::new(),
                },
            ];
            for verdict in &verdicts {
                for mutating in [false, true] {
                    let (body, sent) = encode(&req.uid, verdict, mutating);
                    let review: serde_json::Value =
                        serde_json::from_slice(&body).expect("encode emits JSON");
                    assert_eq!(review["response"]["uid"], req.uid.as_str());
                    assert_eq!(review["response"]["allowed"], sent.allowed);
                    assert_eq!(sent.allowed, matches!(verdict, Verdict::Allow { .. }));
                    if !sent.allowed {
                        let code = review["response"]["status"]["code"]
                            .as_u64()
                            .expect("a status code");
                        assert!((400..600).contains(&code), "denial code {code}");
                    }
                }
            }
        }
    }
});
