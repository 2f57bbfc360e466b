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

    /// Parses a kind the way Fleet does: ASCII case-insensitively.
    pub fn parse(s: &str) -> Option<ResourceKind> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s))
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
