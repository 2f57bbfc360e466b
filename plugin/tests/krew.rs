//! plugin/krew.yaml is a krew-release-bot template: render it the way the bot does and check the
//! result against krew's manifest rules and this crate's binaries.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

const TAG: &str = "v0.1.0";
const FAKE_SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// `{{ .TagName }}` becomes the tag; a line `{{addURIAndSha "URL" .TagName }}` becomes `uri:` and
/// `sha256:` lines at its indentation (what krew-release-bot does with the real archive's hash).
fn render(template: &str) -> String {
    let mut out = String::new();
    for line in template.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("{{addURIAndSha \"") {
            let indent = &line[..line.len() - trimmed.len()];
            let url = rest
                .split_once("\" .TagName }}")
                .map(|(u, _)| u)
                .unwrap_or_else(|| panic!("malformed addURIAndSha line: {line}"));
            let url = url.replace("{{ .TagName }}", TAG);
            out.push_str(&format!("{indent}uri: {url}\n{indent}sha256: {FAKE_SHA}\n"));
        } else {
            out.push_str(&line.replace("{{ .TagName }}", TAG));
            out.push('\n');
        }
    }
    out
}

fn manifest() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("krew.yaml");
    let template = std::fs::read_to_string(&path).expect("read plugin/krew.yaml");
    let rendered = render(&template);
    assert!(
        !rendered.contains("{{"),
        "unrendered template left:\n{rendered}"
    );
    serde_saphyr::from_str(&rendered).unwrap_or_else(|e| panic!("{e}\n{rendered}"))
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{pointer} missing or not a string"))
}

#[test]
fn renders_to_a_valid_krew_manifest() {
    let m = manifest();
    assert_eq!(
        str_at(&m, "/apiVersion"),
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(str_at(&m, "/kind"), "Plugin");
    // The plugin name is what follows `kubectl-` in the binary.
    assert_eq!(str_at(&m, "/metadata/name"), "helmop");
    assert_eq!(str_at(&m, "/spec/version"), TAG);
    assert!(str_at(&m, "/spec/homepage").starts_with("https://"));
    let short = str_at(&m, "/spec/shortDescription");
    assert!(!short.is_empty() && short.len() <= 50, "{short:?}");
    assert!(!str_at(&m, "/spec/description").trim().is_empty());
    assert!(str_at(&m, "/spec/caveats").contains("kubectl_complete-helmop"));

    let platforms = m
        .pointer("/spec/platforms")
        .and_then(Value::as_array)
        .expect("spec.platforms");
    let mut seen = BTreeSet::new();
    for p in platforms {
        let os = str_at(p, "/selector/matchLabels/os");
        let arch = str_at(p, "/selector/matchLabels/arch");
        assert!(
            seen.insert((os.to_owned(), arch.to_owned())),
            "{os}/{arch} twice"
        );
        let uri = str_at(p, "/uri");
        assert!(uri.starts_with("https://"), "{uri}");
        assert!(
            uri.contains(TAG) && uri.contains(os) && uri.contains(arch),
            "{uri}"
        );
        let sha = str_at(p, "/sha256");
        assert!(sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(str_at(p, "/bin"), "kubectl-helmop");
        let files: BTreeSet<&str> = p
            .pointer("/files")
            .and_then(Value::as_array)
            .expect("files")
            .iter()
            .map(|f| str_at(f, "/from"))
            .collect();
        assert_eq!(
            files,
            BTreeSet::from(["kubectl-helmop", "kubectl_complete-helmop", "LICENSE"]),
            "{os}/{arch}"
        );
    }
    for os in ["linux", "darwin"] {
        for arch in ["amd64", "arm64"] {
            assert!(
                seen.contains(&(os.to_owned(), arch.to_owned())),
                "{os}/{arch} missing"
            );
        }
    }
}

#[test]
fn the_archived_binaries_are_this_crates_binaries() {
    let cargo = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .expect("read Cargo.toml");
    for bin in ["kubectl-helmop", "kubectl_complete-helmop"] {
        assert!(
            cargo.contains(&format!("name = \"{bin}\"")),
            "no [[bin]] {bin} in plugin/Cargo.toml"
        );
    }
}
