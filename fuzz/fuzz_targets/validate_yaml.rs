//! The YAML input of `kubectl helmop validate`: `parse_documents` and validation of every document, on
//! arbitrary bytes. No panic, no hang (budgets hold for alias bombs and deep nesting), and every line number
//! reported lies inside the input.
#![no_main]

use helmop_core::validate::validate_helmop;
use helmop_core::yaml::parse_documents;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // YAML line breaks are LF, CRLF and a lone CR (old Mac files; editors show those as lines too).
    let lone_cr = data
        .windows(2)
        .filter(|w| w[0] == b'\r' && w[1] != b'\n')
        .count()
        + usize::from(data.last() == Some(&b'\r'));
    let lines = 1 + (data.iter().filter(|b| **b == b'\n').count() + lone_cr) as u64;
    match parse_documents(data) {
        Ok(docs) => {
            for (i, doc) in docs.iter().enumerate() {
                assert_eq!(doc.index, i);
                assert!(
                    doc.line <= lines + 1,
                    "document at line {} of {lines}",
                    doc.line
                );
                let _ = validate_helmop(&doc.value);
            }
        }
        Err(e) => {
            if let Some(line) = e.line() {
                assert!(line <= lines + 1, "error at line {line} of {lines}: {e}");
            }
            assert!(!e.to_string().is_empty());
        }
    }
});
