//! Kubernetes name rules (apimachinery `validation.IsDNS1123Subdomain`, `IsDNS1123Label`,
//! `IsQualifiedName`, `IsValidLabelValue`). Each returns `None` when valid, else a short reason.

/// Max length of a DNS-1123 subdomain (object names of Secrets and ConfigMaps).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// Max length of a DNS-1123 label (namespace names).
pub const DNS1123_LABEL_MAX: usize = 63;

fn is_lower_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// One dot-separated part of a DNS-1123 subdomain: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn is_dns_label_chars(s: &str) -> bool {
    let mut chars = s.chars();
    let (Some(first), Some(last)) = (chars.next(), s.chars().last()) else {
        return false;
    };
    is_lower_alnum(first)
        && is_lower_alnum(last)
        && s.chars().all(|c| is_lower_alnum(c) || c == '-')
}

/// `None` if `s` is a valid DNS-1123 subdomain (what Secret/ConfigMap names must be).
pub fn dns1123_subdomain_error(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("must not be empty".into());
    }
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Some(format!(
            "must be at most {DNS1123_SUBDOMAIN_MAX} characters (has {})",
            s.len()
        ));
    }
    if s.split('.').all(is_dns_label_chars) {
        None
    } else {
        Some(
            "must consist of lower case letters, digits, '-' and '.', and start and end with a letter or digit"
                .into(),
        )
    }
}

/// `None` if `s` is a valid DNS-1123 label (what namespace names must be).
pub fn dns1123_label_error(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("must not be empty".into());
    }
    if s.len() > DNS1123_LABEL_MAX {
        return Some(format!(
            "must be at most {DNS1123_LABEL_MAX} characters (has {})",
            s.len()
        ));
    }
    if is_dns_label_chars(s) {
        None
    } else {
        Some(
            "must consist of lower case letters, digits and '-', and start and end with a letter or digit"
                .into(),
        )
    }
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    dns1123_subdomain_error(s).is_none()
}

pub fn is_dns1123_label(s: &str) -> bool {
    dns1123_label_error(s).is_none()
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, the shape of label names and values.
fn is_label_chars(s: &str) -> bool {
    let (Some(first), Some(last)) = (s.chars().next(), s.chars().last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

const LABEL_CHARS_RULE: &str =
    "must consist of letters, digits, '-', '_' and '.', and start and end with a letter or digit";

/// `None` if `s` is a valid qualified name (a label key: `[prefix/]name`).
pub fn qualified_name_error(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Some("prefix part must not be empty".into());
            }
            if let Some(problem) = dns1123_subdomain_error(prefix) {
                return Some(format!("prefix part {problem}"));
            }
            *name
        }
        _ => return Some("must be a name with an optional DNS subdomain prefix and '/'".into()),
    };
    if name.is_empty() {
        return Some("name part must not be empty".into());
    }
    if name.len() > DNS1123_LABEL_MAX {
        return Some(format!(
            "name part must be at most {DNS1123_LABEL_MAX} characters"
        ));
    }
    if !is_label_chars(name) {
        return Some(format!("name part {LABEL_CHARS_RULE}"));
    }
    None
}

/// `None` if `s` is a valid label value (may be empty).
pub fn label_value_error(s: &str) -> Option<String> {
    if s.is_empty() {
        return None;
    }
    if s.len() > DNS1123_LABEL_MAX {
        return Some(format!("must be at most {DNS1123_LABEL_MAX} characters"));
    }
    if !is_label_chars(s) {
        return Some(LABEL_CHARS_RULE.into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains() {
        for ok in [
            "a",
            "db",
            "my-secret",
            "a.b.c",
            "0abc",
            "x".repeat(253).as_str(),
        ] {
            assert!(is_dns1123_subdomain(ok), "{ok:?} should be valid");
        }
        for bad in [
            "",
            "A",
            "My-Secret",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a_b",
            "a/b",
            "ä",
            "a b",
            "x".repeat(254).as_str(),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?} should be invalid");
        }
        assert!(
            dns1123_subdomain_error(&"x".repeat(254))
                .unwrap()
                .contains("253")
        );
    }

    #[test]
    fn labels() {
        assert!(is_dns1123_label("kube-system"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label(&"x".repeat(64)));
        assert!(is_dns1123_label(&"x".repeat(63)));
        assert!(!is_dns1123_label(""));
    }

    #[test]
    fn qualified_names() {
        for ok in [
            "env",
            "Env_1.x",
            "management.cattle.io/cluster-display-name",
            "a/b",
        ] {
            assert!(qualified_name_error(ok).is_none(), "{ok:?}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "a/b/c",
            "-a",
            "a-",
            "UP.per/x",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(qualified_name_error(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn label_values() {
        for ok in ["", "prod", "Prod_1.0", &"x".repeat(63)] {
            assert!(label_value_error(ok).is_none(), "{ok:?}");
        }
        for bad in ["-prod", "prod-", "a b", "a/b", &"x".repeat(64)] {
            assert!(label_value_error(bad).is_some(), "{bad:?}");
        }
    }
}
