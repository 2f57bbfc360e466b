//! Registry credentials: `kubernetes.io/dockerconfigjson` (and legacy `dockercfg`) pull secrets, and the
//! `WWW-Authenticate` challenges of the distribution API (RFC 7235 syntax, as registries send it).
//!
//! A [`Credential`] never prints its secret: `Debug` shows only the identity (which Secret it came from and
//! its resourceVersion), and that identity is what caches are keyed by.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use crate::reference::normalise_registry;

/// Username and password for one registry, from one pull secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
    /// `namespace/secret@resourceVersion`: names the credential in cache keys and logs without revealing it.
    pub identity: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    auth: Option<String>,
}

/// Per-registry credentials of one pull secret, keyed by normalised registry host.
#[derive(Debug, Default, Clone)]
pub struct PullSecret {
    entries: BTreeMap<String, Credential>,
}

impl PullSecret {
    /// Parses the data of a pull secret: `.dockerconfigjson` (`{"auths": {...}}`) or `.dockercfg` (the map
    /// itself). Entries that cannot be read are skipped; `None` when the data holds neither key or is not JSON.
    pub fn parse(data: &BTreeMap<String, Vec<u8>>, identity: &str) -> Option<PullSecret> {
        let auths = if let Some(json) = data.get(".dockerconfigjson") {
            serde_json::from_slice::<DockerConfig>(json).ok()?.auths
        } else {
            serde_json::from_slice::<BTreeMap<String, AuthEntry>>(data.get(".dockercfg")?).ok()?
        };
        let entries = auths
            .into_iter()
            .filter_map(|(server, entry)| {
                let (username, password) = entry.credentials()?;
                Some((
                    server_host(&server),
                    Credential {
                        username,
                        password,
                        identity: identity.to_owned(),
                    },
                ))
            })
            .collect();
        Some(PullSecret { entries })
    }

    /// The credential for `registry` (a normalised host with port).
    pub fn for_registry(&self, registry: &str) -> Option<&Credential> {
        self.entries.get(registry)
    }
}

impl AuthEntry {
    fn credentials(self) -> Option<(String, String)> {
        match (self.username, self.password) {
            (Some(u), Some(p)) if !u.is_empty() => Some((u, p)),
            _ => {
                let decoded = STANDARD.decode(self.auth?.trim()).ok()?;
                let decoded = String::from_utf8(decoded).ok()?;
                let (u, p) = decoded.split_once(':')?;
                Some((u.to_owned(), p.to_owned()))
            }
        }
    }
}

/// The credential for `registry` from the first of `secrets` that has one (the kubelet's order: the pod's
/// own pull secrets, then its ServiceAccount's).
pub fn credential_for(secrets: &[PullSecret], registry: &str) -> Option<Credential> {
    secrets
        .iter()
        .find_map(|s| s.for_registry(registry))
        .cloned()
}

/// A docker config key (`https://index.docker.io/v1/`, `host:port`, `http://host/v2/`) as a registry host.
fn server_host(server: &str) -> String {
    let rest = server
        .strip_prefix("https://")
        .or_else(|| server.strip_prefix("http://"))
        .unwrap_or(server);
    normalise_registry(rest.split('/').next().unwrap_or(rest))
}

/// One challenge from `WWW-Authenticate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Reads the first challenge a client can answer; `None` for unknown schemes or a malformed header.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, params) = header.split_once(' ').unwrap_or((header, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let params = parse_params(params)?;
    Some(Challenge::Bearer {
        realm: params.get("realm")?.clone(),
        service: params.get("service").cloned(),
        scope: params.get("scope").cloned(),
    })
}

/// `key=value` or `key="quoted, value"` pairs separated by commas; keys lowercased.
fn parse_params(s: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.push(chars.next()?.1),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &quoted[end?..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_owned(), &after[end..])
        };
        out.insert(key, value);
        rest = after.trim_start().trim_start_matches(',').trim_start();
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(key: &str, json: &str) -> BTreeMap<String, Vec<u8>> {
        [(key.to_owned(), json.as_bytes().to_vec())].into()
    }

    #[test]
    fn reads_dockerconfigjson_in_both_spellings() {
        let auth = STANDARD.encode("bob:s3cr:et");
        let json = format!(
            r#"{{"auths": {{
                "https://index.docker.io/v1/": {{"auth": "{auth}"}},
                "127.0.0.1:5000": {{"username": "alice", "password": "pw"}},
                "http://Reg.Example.com/v2/": {{"username": "", "password": "", "auth": "{auth}"}},
                "broken.io": {{"auth": "!!"}}
            }}}}"#
        );
        let s = PullSecret::parse(&data(".dockerconfigjson", &json), "ns/pull@7").unwrap();
        let hub = s.for_registry("docker.io").unwrap();
        assert_eq!(
            (hub.username.as_str(), hub.password.as_str()),
            ("bob", "s3cr:et")
        );
        assert_eq!(hub.identity, "ns/pull@7");
        assert_eq!(s.for_registry("127.0.0.1:5000").unwrap().username, "alice");
        assert_eq!(s.for_registry("reg.example.com").unwrap().username, "bob");
        assert!(s.for_registry("broken.io").is_none());
        assert!(s.for_registry("127.0.0.1:5001").is_none());
        // Debug never shows the secret.
        let shown = format!("{hub:?}");
        assert!(
            !shown.contains("s3cr") && shown.contains("ns/pull@7"),
            "{shown}"
        );
    }

    #[test]
    fn reads_legacy_dockercfg_and_rejects_junk() {
        let s = PullSecret::parse(
            &data(
                ".dockercfg",
                r#"{"quay.io": {"username": "u", "password": "p"}}"#,
            ),
            "x",
        )
        .unwrap();
        assert_eq!(s.for_registry("quay.io").unwrap().password, "p");
        assert!(PullSecret::parse(&data(".dockerconfigjson", "not json"), "x").is_none());
        assert!(PullSecret::parse(&data("token", "{}"), "x").is_none());
    }

    #[test]
    fn www_authenticate() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/nginx:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/nginx:pull".into()),
            })
        );
        // Case-insensitive scheme and keys, spaces, unquoted values, a quoted comma and escape.
        assert_eq!(
            parse_challenge(
                r#"bearer Realm=http://127.0.0.1:1/t , scope="repository:a:pull,push", service="s\"x""#
            ),
            Some(Challenge::Bearer {
                realm: "http://127.0.0.1:1/t".into(),
                service: Some("s\"x".into()),
                scope: Some("repository:a:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Basic"), Some(Challenge::Basic));
        for bad in [
            "",
            "Negotiate abc",
            "Bearer service=x",
            r#"Bearer realm="unterminated"#,
            "Bearer realm",
        ] {
            assert_eq!(parse_challenge(bad), None, "{bad:?}");
        }
    }
}
