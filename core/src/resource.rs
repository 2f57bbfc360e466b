//! The kinds of object a HelmOp may list as `downstreamResources`, and a reference to one.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An object kind Fleet copies downstream. Fleet compares kinds case-insensitively; the
/// canonical spelling is what the Kubernetes API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ResourceKind {
    Secret,
    ConfigMap,
}

impl ResourceKind {
    /// Every kind, in canonical order.
    pub const ALL: [ResourceKind; 2] = [ResourceKind::Secret, ResourceKind::ConfigMap];

    /// Parses a kind the way Fleet does: `strings.ToLower(kind)` compared with `secret` and
    /// `configmap` (rancher/fleet v0.16 `helmdeployer/install.go`, the agent's bundle deployment
    /// controller), so a kind Go lower-cases to one of those is that kind, `CONFIGMAP` as much as
    /// `Conf\u{130}gMap`.
    pub fn parse(s: &str) -> Option<ResourceKind> {
        // ASCII lower-cases alike in Go and here, without a copy (every admission parses its kinds).
        if s.is_ascii() {
            return Self::ALL
                .into_iter()
                .find(|k| k.lower().eq_ignore_ascii_case(s));
        }
        let lower = go_to_lower(s);
        Self::ALL.into_iter().find(|k| k.lower() == lower)
    }

    /// The canonical spelling (`Secret`, `ConfigMap`).
    pub fn as_str(&self) -> &'static str {
        match self {
            ResourceKind::Secret => "Secret",
            ResourceKind::ConfigMap => "ConfigMap",
        }
    }

    /// The lower-case spelling Fleet de-duplicates on and helmop prints in refs (`secret`, `configmap`).
    pub fn lower(&self) -> &'static str {
        match self {
            ResourceKind::Secret => "secret",
            ResourceKind::ConfigMap => "configmap",
        }
    }
}

/// Go's `strings.ToLower`: every character mapped on its own by Unicode's simple lower-case
/// mapping. Rust's `str::to_lowercase` differs in two ways Fleet's verdicts depend on: it maps
/// U+0130 (capital I with dot) to two characters where Go maps it to `i`, and it lower-cases a
/// final capital sigma to `ς` where Go gives `σ`.
pub fn go_to_lower(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\u{130}' => 'i',
            c => {
                // Outside U+0130, a character's full lower-case mapping is one character: its
                // simple mapping.
                let mut lower = c.to_lowercase();
                match (lower.next(), lower.next()) {
                    (Some(l), None) => l,
                    _ => c,
                }
            }
        })
        .collect()
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Secret or ConfigMap by name (the namespace is implied by context).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ResourceRef {
    pub kind: ResourceKind,
    pub name: String,
}

impl ResourceRef {
    pub fn new(kind: ResourceKind, name: impl Into<String>) -> Self {
        ResourceRef {
            kind,
            name: name.into(),
        }
    }

    pub fn secret(name: impl Into<String>) -> Self {
        Self::new(ResourceKind::Secret, name)
    }

    pub fn config_map(name: impl Into<String>) -> Self {
        Self::new(ResourceKind::ConfigMap, name)
    }
}

impl fmt::Display for ResourceRef {
    /// `secret/name`, `configmap/name`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind.lower(), self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_is_case_insensitive() {
        assert_eq!(ResourceKind::parse("Secret"), Some(ResourceKind::Secret));
        assert_eq!(ResourceKind::parse("secret"), Some(ResourceKind::Secret));
        assert_eq!(ResourceKind::parse("SECRET"), Some(ResourceKind::Secret));
        assert_eq!(
            ResourceKind::parse("configmap"),
            Some(ResourceKind::ConfigMap)
        );
        assert_eq!(
            ResourceKind::parse("ConfigMap"),
            Some(ResourceKind::ConfigMap)
        );
        assert_eq!(ResourceKind::parse("Deployment"), None);
        assert_eq!(ResourceKind::parse(""), None);
        assert_eq!(ResourceKind::parse("Secrets"), None);
        assert_eq!(ResourceKind::parse("config-map"), None);
    }

    #[test]
    fn kinds_are_lower_cased_as_go_does() {
        assert_eq!(
            ResourceKind::parse("Conf\u{130}gMap"),
            Some(ResourceKind::ConfigMap)
        );
        assert_eq!(
            ResourceKind::parse("CONF\u{130}GMAP"),
            Some(ResourceKind::ConfigMap)
        );
        // U+017F (long s) is already lower case; Go leaves it alone.
        assert_eq!(ResourceKind::parse("\u{17F}ecret"), None);
        assert_eq!(go_to_lower("CONF\u{130}GMAP"), "configmap");
        assert_eq!("\u{130}".to_lowercase(), "i\u{307}", "where Rust differs");
        // Go maps every sigma to σ; Rust's str::to_lowercase ends a word with ς.
        assert_eq!(
            go_to_lower("\u{3A3}\u{391}\u{3A3}"),
            "\u{3C3}\u{3B1}\u{3C3}"
        );
        assert_eq!(go_to_lower("\u{212A}ind"), "kind", "Kelvin sign");
        assert_eq!(go_to_lower("Secret"), "secret");
        assert_eq!(go_to_lower(""), "");
    }

    #[test]
    fn spellings() {
        assert_eq!(ResourceKind::Secret.as_str(), "Secret");
        assert_eq!(ResourceKind::ConfigMap.as_str(), "ConfigMap");
        assert_eq!(ResourceKind::Secret.lower(), "secret");
        assert_eq!(ResourceKind::ConfigMap.lower(), "configmap");
        assert_eq!(ResourceRef::secret("db").to_string(), "secret/db");
        assert_eq!(ResourceRef::config_map("app").to_string(), "configmap/app");
    }

    #[test]
    fn serde_uses_canonical_names() {
        assert_eq!(
            serde_json::to_string(&ResourceKind::ConfigMap).unwrap(),
            "\"ConfigMap\""
        );
        let r: ResourceRef = serde_json::from_str(r#"{"kind":"Secret","name":"x"}"#).unwrap();
        assert_eq!(r, ResourceRef::secret("x"));
    }
}
