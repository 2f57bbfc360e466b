//! The OCI distribution client: what a tag points at, as a digest.
//!
//! `HEAD /v2/<repo>/manifests/<tag>` with every manifest and index media type in `Accept`, so the registry
//! answers with the digest of what the tag names (for a multi-arch image that is the index, never one
//! platform's manifest), read from `Docker-Content-Digest`; a `GET` and the SHA-256 of the body when the
//! header is missing or HEAD is not served. Authentication follows the registry's `WWW-Authenticate`
//! challenge: Basic with the pull secret's credential, or a Bearer token from the challenge's realm.
//!
//! Where requests may go is [`crate::policy`]'s decision: listed registries through `trusted`, everything else
//! through `open`, whose DNS resolver drops every non-public address at connect time (so a name cannot be
//! re-pointed between a check and the connection).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::auth::{Challenge, Credential, parse_challenge};
use crate::cache::{ExpiringCache, RegistryLimiter};
use crate::policy;
use crate::reference::{ImageRef, api_host, normalise_registry, valid_digest};

/// Media types of everything a tag can point at: OCI manifest and index, Docker v2 manifest and list.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// Manifests are small; anything larger is not one.
const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Requests in flight to one registry host.
const PER_REGISTRY_CONCURRENCY: usize = 8;
const TOKEN_CACHE_ENTRIES: u64 = 1024;

/// `--registry-config FILE`: YAML (or JSON) such as
/// `{insecure: ["127.0.0.1:5000"], mirrors: {"docker.io": ["mirror.example.com"]}}`.
///
/// A registry named anywhere here is trusted at whatever address it resolves to (private and loopback
/// included); others only at public addresses (see [`crate::policy`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// Hosts (with port) spoken to over plain HTTP.
    #[serde(default)]
    pub insecure: Vec<String>,
    /// Registry host -> mirrors tried in order before it.
    #[serde(default)]
    pub mirrors: BTreeMap<String, Vec<String>>,
    /// Optional allow-list: when not empty, images of other registries are not resolved.
    #[serde(default)]
    pub registries: Vec<String>,
    /// Hosts (`host` or `host:port`) besides a registry's own that may serve its token realm.
    #[serde(default)]
    pub realms: Vec<String>,
}

/// Why the registry client cannot be set up (`--registry-config`, the HTTP clients): at startup, for the operator.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    // Boxed: the parser's error is large, and these are rare.
    #[error("{0}")]
    Parse(#[source] Box<serde_saphyr::Error>),
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Invalid {
        path: PathBuf,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("cannot build the registry client: {0}")]
    Build(#[source] reqwest::Error),
}

impl RegistrySettings {
    pub fn parse(text: &str) -> Result<RegistrySettings, SetupError> {
        Self::parse_yaml(text).map_err(|e| SetupError::Parse(Box::new(e)))
    }

    fn parse_yaml(text: &str) -> Result<RegistrySettings, serde_saphyr::Error> {
        if text.trim().is_empty() {
            return Ok(RegistrySettings::default());
        }
        let raw: RegistrySettings = serde_saphyr::from_str(text)?;
        Ok(RegistrySettings {
            insecure: raw.insecure.iter().map(|h| normalise_registry(h)).collect(),
            registries: raw
                .registries
                .iter()
                .map(|h| normalise_registry(h))
                .collect(),
            realms: raw
                .realms
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
            mirrors: raw
                .mirrors
                .into_iter()
                .map(|(host, mirrors)| {
                    (
                        normalise_registry(&host),
                        mirrors.iter().map(|m| normalise_registry(m)).collect(),
                    )
                })
                .collect(),
        })
    }

    pub fn load(path: &Path) -> Result<RegistrySettings, SetupError> {
        let text = std::fs::read_to_string(path).map_err(|source| SetupError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse_yaml(&text).map_err(|source| SetupError::Invalid {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }

    fn scheme(&self, host: &str) -> &'static str {
        if self.insecure.iter().any(|h| h == host) {
            "http"
        } else {
            "https"
        }
    }

    /// Whether images of `registry` may be resolved at all (the optional allow-list).
    pub fn permits(&self, registry: &str) -> bool {
        self.registries.is_empty() || self.registries.iter().any(|r| r == registry)
    }

    /// The `host:port` of every registry the config names: these may resolve to non-public addresses.
    fn listed_authorities(&self) -> Vec<String> {
        let names = self
            .insecure
            .iter()
            .chain(&self.registries)
            .chain(self.mirrors.keys())
            .chain(self.mirrors.values().flatten());
        names
            .filter_map(|name| policy::registry_authority(api_host(name), self.scheme(name)))
            .collect()
    }

    /// Registry names to try for `registry`, mirrors first.
    fn endpoints<'a>(&'a self, registry: &'a str) -> impl Iterator<Item = &'a str> {
        self.mirrors
            .get(registry)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .chain(std::iter::once(registry))
    }
}

/// Why a tag could not be resolved. Messages never contain credentials or tokens, and (being shown to whoever
/// applied the workload) no status codes, addresses or connection errors that would turn the resolver into a
/// port scanner: those are in [`ResolveError::detail`], for the operator's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("manifest unknown (no such repository or tag)")]
    NotFound,
    /// The detail is one of a few fixed phrases, safe to show.
    #[error("authentication failed ({0})")]
    Unauthorized(String),
    #[error("registry unreachable")]
    Unreachable(String),
    #[error("unexpected answer from the registry")]
    Protocol(String),
    /// The registry policy forbids the request (allow-list, address, redirect or token realm).
    #[error("not allowed by the registry policy")]
    Refused(String),
    #[error("time budget exhausted")]
    Timeout,
}

impl ResolveError {
    /// A short machine-readable name (the webhook's metric label `outcome`, the plugin's JSON `reason`).
    pub fn outcome(&self) -> &'static str {
        match self {
            ResolveError::NotFound => "not_found",
            ResolveError::Unauthorized(_) => "unauthorized",
            ResolveError::Unreachable(_) => "unreachable",
            ResolveError::Protocol(_) => "error",
            ResolveError::Refused(_) => "refused",
            ResolveError::Timeout => "timeout",
        }
    }

    /// The message with what happened on the wire, for logs only.
    pub fn detail(&self) -> String {
        match self {
            ResolveError::Unreachable(d) | ResolveError::Protocol(d) | ResolveError::Refused(d) => {
                format!("{self}: {d}")
            }
            _ => self.to_string(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TokenKey {
    host: String,
    scope: String,
    identity: Option<String>,
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// Resolves names for requests to registries the config does not list: public addresses only, checked on
/// the addresses actually connected to.
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| policy::is_public(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err("no public address (non-public ones need the registry listed in the registry config)".into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Talks to registries; one per process, shared by all its resolutions.
pub struct RegistryClient {
    /// For registries the config lists (any address).
    trusted: reqwest::Client,
    /// For everything else (public addresses only, no proxy: a proxy would resolve names where the
    /// address rule cannot see them).
    open: reqwest::Client,
    listed: Vec<String>,
    insecure: Vec<String>,
    settings: RegistrySettings,
    /// A token and how long its registry said it lasts.
    tokens: ExpiringCache<TokenKey, (String, Duration)>,
    limiter: RegistryLimiter,
}

impl RegistryClient {
    /// `product` names the program in the `User-Agent` (`helmop-webhook`, `kubectl-helmop`).
    pub fn new(settings: RegistrySettings, product: &str) -> Result<RegistryClient, SetupError> {
        let builder = || {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                // A backstop: callers bound a whole resolution by their own budget.
                .timeout(Duration::from_secs(10))
                .user_agent(format!("{product}/{}", env!("CARGO_PKG_VERSION")))
                .redirect(reqwest::redirect::Policy::custom(|attempt| {
                    let same_host = attempt
                        .previous()
                        .last()
                        .is_some_and(|from| policy::redirect_allowed(from, attempt.url()));
                    if same_host && attempt.previous().len() < 5 {
                        attempt.follow()
                    } else {
                        attempt.stop()
                    }
                }))
        };
        let trusted = builder().build().map_err(SetupError::Build)?;
        let open = builder()
            .no_proxy()
            .dns_resolver(Arc::new(PublicOnly))
            .build()
            .map_err(SetupError::Build)?;
        let insecure = settings
            .insecure
            .iter()
            .filter_map(|h| policy::registry_authority(h, "http"))
            .collect();
        Ok(RegistryClient {
            trusted,
            open,
            listed: settings.listed_authorities(),
            insecure,
            settings,
            tokens: ExpiringCache::new(TOKEN_CACHE_ENTRIES, |(_, ttl): &(String, Duration)| *ttl),
            limiter: RegistryLimiter::new(PER_REGISTRY_CONCURRENCY),
        })
    }

    /// The digest `image`'s tag points at, trying configured mirrors first. `credential` picks the pull
    /// secret entry for a registry host.
    pub async fn resolve(
        &self,
        image: &ImageRef,
        credential: impl Fn(&str) -> Option<Credential>,
    ) -> Result<String, ResolveError> {
        if !self.settings.permits(&image.registry) {
            return Err(ResolveError::Refused(
                "registry not in the allow-list".into(),
            ));
        }
        let mut last = ResolveError::Unreachable("no endpoint".into());
        for endpoint in self.settings.endpoints(&image.registry) {
            let cred = credential(endpoint);
            match self.resolve_at(endpoint, image, cred.as_ref()).await {
                Ok(digest) => return Ok(digest),
                Err(error) => {
                    tracing::debug!(registry = endpoint, image = %image, error = %error.detail(), "registry endpoint failed");
                    last = error;
                }
            }
        }
        Err(last)
    }

    async fn resolve_at(
        &self,
        registry: &str,
        image: &ImageRef,
        credential: Option<&Credential>,
    ) -> Result<String, ResolveError> {
        let host = crate::reference::api_host(registry);
        let _permit = self.limiter.acquire(host).await;
        let url = Url::parse(&format!(
            "{}://{host}/v2/{}/manifests/{}",
            self.settings.scheme(registry),
            image.repository,
            image.effective_tag()
        ))
        .map_err(|_| ResolveError::Refused("not a valid registry URL".into()))?;
        let scope = format!("repository:{}:pull", image.repository);
        let token_key = TokenKey {
            host: host.to_owned(),
            scope: scope.clone(),
            identity: credential.map(|c| c.identity.clone()),
        };
        let mut auth = self
            .tokens
            .get(&token_key)
            .await
            .map(|(token, _)| format!("Bearer {token}"));
        let mut response = self.send(Method::HEAD, &url, auth.as_deref()).await?;
        if response.status() == StatusCode::UNAUTHORIZED {
            let header = response
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|h| h.to_str().ok())
                .unwrap_or_default();
            auth = Some(match parse_challenge(header) {
                Some(Challenge::Basic) => {
                    let c = credential.ok_or_else(|| {
                        ResolveError::Unauthorized(
                            "credentials required, no pull secret matches".into(),
                        )
                    })?;
                    basic(c)
                }
                Some(Challenge::Bearer {
                    realm,
                    service,
                    scope: challenge_scope,
                }) => {
                    let scope = challenge_scope.unwrap_or(scope);
                    let (token, ttl) = self
                        .token(&realm, &url, service.as_deref(), &scope, credential)
                        .await?;
                    self.tokens.insert(token_key, (token.clone(), ttl)).await;
                    format!("Bearer {token}")
                }
                None => {
                    return Err(ResolveError::Unauthorized(
                        "unsupported WWW-Authenticate challenge".into(),
                    ));
                }
            });
            response = self.send(Method::HEAD, &url, auth.as_deref()).await?;
        }
        match response.status() {
            StatusCode::OK => {
                if let Some(digest) = header_digest(&response) {
                    return Ok(digest);
                }
            }
            StatusCode::NOT_FOUND => return Err(ResolveError::NotFound),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(unauthorized(response.status()));
            }
            // Anything else (405 for HEAD, a proxy's 400): try GET.
            _ => {}
        }
        let response = self.send(Method::GET, &url, auth.as_deref()).await?;
        match response.status() {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Err(ResolveError::NotFound),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(unauthorized(response.status()));
            }
            status => {
                return Err(ResolveError::Protocol(format!(
                    "registry answered {status}"
                )));
            }
        }
        if let Some(digest) = header_digest(&response) {
            return Ok(digest);
        }
        let body = read_limited(response, MAX_MANIFEST_BYTES).await?;
        Ok(format!("sha256:{}", hex::encode(Sha256::digest(&body))))
    }

    /// The client allowed to request `url`: the trusted one for a listed registry, the public-only one for
    /// a name, none for a non-public address literal the config does not list.
    fn client_for(&self, url: &Url) -> Result<&reqwest::Client, ResolveError> {
        if policy::authority(url).is_some_and(|a| self.listed.contains(&a)) {
            return Ok(&self.trusted);
        }
        let Some(host) = url.host_str() else {
            return Err(ResolveError::Refused("a URL without a host".into()));
        };
        // An address literal is connected to without the resolver: judged here.
        let literal = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .ok();
        if literal.is_some_and(|ip| !policy::is_public(ip)) {
            return Err(ResolveError::Refused(format!(
                "{} is not a public address and not listed in the registry config",
                url.host_str().unwrap_or_default()
            )));
        }
        Ok(&self.open)
    }

    async fn send(
        &self,
        method: Method,
        url: &Url,
        auth: Option<&str>,
    ) -> Result<reqwest::Response, ResolveError> {
        let mut request = self
            .client_for(url)?
            .request(method, url.clone())
            .header(ACCEPT, HeaderValue::from_static(MANIFEST_ACCEPT));
        if let Some(auth) = auth {
            let mut value = HeaderValue::from_str(auth).map_err(|_| {
                ResolveError::Unauthorized("credential is not a valid header".into())
            })?;
            value.set_sensitive(true);
            request = request.header(AUTHORIZATION, value);
        }
        let response = request.send().await.map_err(transport_error)?;
        refuse_redirect(response)
    }

    /// A Bearer token from `realm` (the token endpoint), with the credential as Basic auth when there is
    /// one (anonymous tokens otherwise), and how long to keep it.
    async fn token(
        &self,
        realm: &str,
        registry_url: &Url,
        service: Option<&str>,
        scope: &str,
        credential: Option<&Credential>,
    ) -> Result<(String, Duration), ResolveError> {
        let mut url = Url::parse(realm)
            .map_err(|_| ResolveError::Protocol("a token realm that is not a URL".into()))?;
        // The realm receives the pull secret's credential: only the registry's own host or a configured one.
        if !policy::realm_allowed(&url, registry_url, &self.settings.realms, &self.insecure) {
            return Err(ResolveError::Refused(format!(
                "token realm {} is not https on the registry's host or a listed realm host",
                policy::authority(&url).unwrap_or_default()
            )));
        }
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = service {
                query.append_pair("service", service);
            }
            query.append_pair("scope", scope);
        }
        let mut request = self.client_for(&url)?.get(url);
        if let Some(c) = credential {
            request = request.basic_auth(&c.username, Some(&c.password));
        }
        let response = refuse_redirect(request.send().await.map_err(transport_error)?)?;
        match response.status() {
            StatusCode::OK => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(ResolveError::Unauthorized(
                    "the token endpoint refused the credentials".into(),
                ));
            }
            status => {
                return Err(ResolveError::Protocol(format!(
                    "token endpoint answered {status}"
                )));
            }
        }
        let body = read_limited(response, 1 << 20).await?;
        let parsed: TokenResponse = serde_json::from_slice(&body)
            .map_err(|_| ResolveError::Protocol("an unreadable token response".into()))?;
        let token = parsed
            .token
            .or(parsed.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ResolveError::Protocol("a token response without a token".into()))?;
        // The spec's default lifetime is 60 s; keep a margin so a token is never used as it expires.
        let lifetime = parsed.expires_in.unwrap_or(60).clamp(20, 3600);
        Ok((token, Duration::from_secs(lifetime - 10)))
    }
}

fn basic(c: &Credential) -> String {
    use base64::Engine;
    let pair = format!("{}:{}", c.username, c.password);
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

fn unauthorized(status: StatusCode) -> ResolveError {
    ResolveError::Unauthorized(
        if status == StatusCode::FORBIDDEN {
            "access denied"
        } else {
            "the registry refused the credentials"
        }
        .into(),
    )
}

/// A redirect the policy did not follow (another host, or too many) ends the request.
fn refuse_redirect(response: reqwest::Response) -> Result<reqwest::Response, ResolveError> {
    if response.status().is_redirection() {
        return Err(ResolveError::Refused(
            "a redirect to another host, or too many redirects".into(),
        ));
    }
    Ok(response)
}

fn header_digest(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get("docker-content-digest")
        .and_then(|h| h.to_str().ok())
        .map(str::trim)
        .filter(|d| valid_digest(d))
        .map(str::to_owned)
}

fn transport_error(error: reqwest::Error) -> ResolveError {
    if error.is_timeout() {
        return ResolveError::Timeout;
    }
    // Without the URL: it names the registry, which the caller's message already does.
    ResolveError::Unreachable(
        std::error::Error::source(&error)
            .map(ToString::to_string)
            .unwrap_or_else(|| error.without_url().to_string()),
    )
}

async fn read_limited(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, ResolveError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
        if body.len() + chunk.len() > limit {
            return Err(ResolveError::Protocol(
                "a manifest larger than 4 MiB".into(),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_normalise() {
        let s = RegistrySettings::parse(
            "insecure: [\"127.0.0.1:5000\"]\nmirrors:\n  index.docker.io: [Mirror.Example.com, \"10.0.0.1:5000\"]\n",
        )
        .unwrap();
        assert_eq!(s.insecure, ["127.0.0.1:5000"]);
        assert_eq!(s.scheme("127.0.0.1:5000"), "http");
        assert_eq!(s.scheme("ghcr.io"), "https");
        assert_eq!(
            s.endpoints("docker.io").collect::<Vec<_>>(),
            ["mirror.example.com", "10.0.0.1:5000", "docker.io"]
        );
        assert_eq!(s.endpoints("ghcr.io").collect::<Vec<_>>(), ["ghcr.io"]);
        // JSON is YAML too; empty means defaults.
        let j = RegistrySettings::parse(r#"{"insecure": ["a:1"], "mirrors": {}}"#).unwrap();
        assert_eq!(j.insecure, ["a:1"]);
        assert_eq!(
            RegistrySettings::parse("").unwrap(),
            RegistrySettings::default()
        );
        assert!(
            RegistrySettings::parse("insecur: [a]").is_err(),
            "a typo must not be ignored"
        );
        // The allow-list, extra realm hosts, and which authorities the config names (trusted at any address).
        let p = RegistrySettings::parse(
            "insecure: [\"127.0.0.1:5000\", reg.local]\nmirrors: {index.docker.io: [\"10.0.0.1:5000\"]}\n\
             registries: [Docker.io, ghcr.io]\nrealms: [Auth.Example.com]\n",
        )
        .unwrap();
        assert!(p.permits("docker.io") && p.permits("ghcr.io") && !p.permits("quay.io"));
        assert!(RegistrySettings::default().permits("anything.io"));
        assert_eq!(p.realms, ["auth.example.com"]);
        let mut listed = p.listed_authorities();
        listed.sort();
        assert_eq!(
            listed,
            [
                "10.0.0.1:5000",
                "127.0.0.1:5000",
                "ghcr.io:443",
                "reg.local:80",
                "registry-1.docker.io:443",
                "registry-1.docker.io:443"
            ]
        );
        assert!(RegistrySettings::load(Path::new("/nonexistent/registries.yaml")).is_err());
    }

    #[test]
    fn outcomes_are_a_closed_set() {
        let all = [
            ResolveError::NotFound,
            ResolveError::Unauthorized(String::new()),
            ResolveError::Unreachable(String::new()),
            ResolveError::Protocol(String::new()),
            ResolveError::Refused(String::new()),
            ResolveError::Timeout,
        ];
        let labels: Vec<_> = all.iter().map(ResolveError::outcome).collect();
        assert_eq!(
            labels,
            [
                "not_found",
                "unauthorized",
                "unreachable",
                "error",
                "refused",
                "timeout"
            ]
        );
    }
}
