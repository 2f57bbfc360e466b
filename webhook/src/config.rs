//! How the webhook decides: the settings its handlers read. Filled from
//! the command line (`Cli::config`), or directly by a library user, so they live apart from clap's
//! parser.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;

use crate::error::Error;

/// What happens to a DELETE of an object a HelmOp lists (`--guard`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GuardMode {
    /// Deny the DELETE while a HelmOp lists the object.
    Enforce,
    /// Allow the DELETE with a warning naming the HelmOps.
    Warn,
}

/// What the webhook does with mutable image tags (`--image-mode`): one definition with the plugin's
/// (`helmop-images`), so both apply the same override rule.
pub use helmop_images::ImageMode;

/// A namespaced object name, `NS/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl std::str::FromStr for SecretRef {
    type Err = Error;

    fn from_str(s: &str) -> Result<SecretRef, Error> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(SecretRef {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(Error::NotNamespacedName {
                value: s.to_owned(),
            }),
        }
    }
}

/// What the handlers need to know (everything but serving and logging); the command line is one way
/// to fill it, tests and benchmarks build it directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub guard: GuardMode,
    pub image_mode: ImageMode,
    pub hash_key_secret: SecretRef,
    pub mutable_tags: Vec<String>,
    pub image_budget: Duration,
    pub registry_config: Option<PathBuf>,
    /// `--registry-deny`: ranges never connected to for unlisted registries, added to the registry config's
    /// `deny` (or its default).
    pub registry_deny: Vec<helmop_images::policy::Cidr>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            guard: GuardMode::Enforce,
            image_mode: ImageMode::Pin,
            hash_key_secret: SecretRef {
                namespace: "helmop-system".into(),
                name: "helmop-hash-key".into(),
            },
            mutable_tags: Vec::new(),
            image_budget: Duration::from_secs(2),
            registry_config: None,
            registry_deny: Vec::new(),
        }
    }
}
