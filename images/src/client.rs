//! The OCI distribution client: what a tag points at, as a digest.
//!
//! `HEAD /v2/<repo>/manifests/<tag>` with every manifest and index media type in `Accept`, so the registry
//! answers with the digest of what the tag names (for a multi-arch image that is the index, never one
//! platform's manifest), read from `Docker-Content-Digest`; a `GET` and the SHA-256 of the body when the
//! header is missing or HEAD is not served. Authentication follows the registry's `WWW-Authenticate`
//! challenge: Basic with the pull secret's credential, or a Bearer token from the challenge's realm.
//!
//! Where requests may go is [`crate::policy`]'s decision: listed registries through `trusted`, everything else
//! through `open`, whose DNS resolver drops every non-public or denied address at connect time (so a name
//! cannot be re-pointed between a check and the connection), and looks names up fully qualified (no search
//! list: a pod's `ndots:5` would otherwise turn one name into several queries).
//!
//! How much work it does is bounded process-wide by [`Limits`]: requests in flight (all registries, and per
//! registry), DNS lookups at once (each holds a blocking thread until the system resolver returns), bytes of
//! one response body and of all bodies being read, idle connections kept, hosts tracked.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::auth::{Challenge, Credential, parse_challenge};
use crate::cache::{ExpiringCache, RegistryLimiter};
use crate::policy::{self, Cidr};
use crate::reference::{ImageRef, api_host, normalise_registry, valid_digest};

/// Media types of everything a tag can point at: OCI manifest and index, Docker v2 manifest and list.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// Bounds of the registry work of one process (all resolutions share them). [`Limits::default`] is what the
/// webhook and the plugin use; each field's doc gives its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Resolutions at one endpoint (HEAD, token, GET, one connection each at most) in flight at once, over
    /// all registries: 32.
    pub requests: usize,
    /// Requests in flight to one registry host: 8.
    pub per_registry: usize,
    /// DNS lookups at once: 4. Each holds one blocking thread until the system resolver answers, so this is
    /// also the most threads registry names can hold.
    pub dns_lookups: usize,
    /// Largest manifest body read: 512 KiB (an image index of hundreds of platforms is tens of KiB); a larger
    /// declared `Content-Length` is refused before reading.
    pub manifest_bytes: usize,
    /// Largest token response read: 64 KiB.
    pub token_bytes: usize,
    /// Response body bytes being read at once, over all requests: 4 MiB (each read reserves its declared
    /// length, or its limit without one, before reading).
    pub body_bytes_in_flight: usize,
    /// Hosts the per-registry limiter tracks at once: 1024 (idle ones are pruned from 256 on).
    pub limiter_hosts: usize,
    /// Idle connections kept per host: 1, for 30 s.
    pub idle_per_host: usize,
    /// Bytes of cached tokens: 1 MiB.
    pub token_cache_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            requests: 32,
            per_registry: 8,
            dns_lookups: 4,
            manifest_bytes: 512 << 10,
            token_bytes: 64 << 10,
            body_bytes_in_flight: 4 << 20,
            limiter_hosts: 1024,
            idle_per_host: 1,
            token_cache_bytes: 1 << 20,
        }
    }
}

/// What the client did, for the caller's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A DNS lookup was started (one name, fully qualified for unlisted registries).
    DnsLookup,
    /// An HTTP request was sent.
    Request,
    /// A bound turned a request away: `hosts` (the limiter's map is full), `body` (a body over its limit).
    Shed(&'static str),
}

/// Receives [`Event`]s.
pub type Observer = Arc<dyn Fn(Event) + Send + Sync>;

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
    /// Address ranges (CIDRs, IPv4 and IPv6) never connected to for a registry the config does not list,
    /// on top of the non-public ones: the cluster's pod and Service ranges. Absent means
    /// [`policy::DEFAULT_DENY`]; a list replaces it (`[]` for none).
    #[serde(default)]
    pub deny: Option<Vec<Cidr>>,
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
            deny: raw.deny,
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

    /// The ranges refused for unlisted registries besides the non-public ones.
    pub fn deny_list(&self) -> Vec<Cidr> {
        self.deny.clone().unwrap_or_else(policy::default_deny)
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
    /// The registry answered 429 or 5xx, or a bound of the resolver turned the request away: try again.
    #[error("registry or resolver busy")]
    Busy(String),
    /// Not looked up: the workload names more distinct images or registries than one admission resolves.
    #[error("more images or registries than one admission resolves")]
    Skipped,
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
            ResolveError::Busy(_) => "busy",
            ResolveError::Skipped => "skipped",
        }
    }

    /// Whether the answer is about the image or its registry, the same for whoever asks next: what may be
    /// remembered for others. A timeout (the asker's budget, or a wait behind others' requests), a busy
    /// registry or resolver, and a skipped lookup are not.
    pub fn is_definite(&self) -> bool {
        !matches!(
            self,
            ResolveError::Timeout | ResolveError::Busy(_) | ResolveError::Skipped
        )
    }

    /// The message with what happened on the wire, for logs only.
    pub fn detail(&self) -> String {
        match self {
            ResolveError::Unreachable(d)
            | ResolveError::Protocol(d)
            | ResolveError::Refused(d)
            | ResolveError::Busy(d) => {
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

/// Resolves names for the registry clients, at most [`Limits::dns_lookups`] at once (the permit is held by
/// the blocking lookup itself, so an abandoned lookup still counts until the system resolver returns).
/// `public_only`: for registries the config does not list, names are looked up fully qualified and only
/// public addresses outside the deny-list are returned, checked on the addresses actually connected to.
struct BoundedResolver {
    public_only: Option<Arc<[Cidr]>>,
    lookups: Arc<Semaphore>,
    observer: Option<Observer>,
}

/// `name` as a fully-qualified DNS name (a trailing dot), so the resolver's search list is not tried.
pub fn fully_qualified(name: &str) -> String {
    if name.ends_with('.') || name.parse::<std::net::IpAddr>().is_ok() {
        name.to_owned()
    } else {
        format!("{name}.")
    }
}

impl reqwest::dns::Resolve for BoundedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let public_only = self.public_only.clone();
        let query = match public_only {
            Some(_) => fully_qualified(name.as_str()),
            None => name.as_str().to_owned(),
        };
        let lookups = self.lookups.clone();
        let observer = self.observer.clone();
        Box::pin(async move {
            let permit = lookups.acquire_owned().await?;
            if let Some(observe) = &observer {
                observe(Event::DnsLookup);
            }
            let found = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                std::net::ToSocketAddrs::to_socket_addrs(&(query.as_str(), 0))
                    .map(Iterator::collect::<Vec<SocketAddr>>)
            })
            .await??;
            let addrs: Vec<SocketAddr> = match &public_only {
                Some(deny) => found
                    .into_iter()
                    .filter(|a| policy::may_connect(a.ip(), deny))
                    .collect(),
                None => found,
            };
            if addrs.is_empty() {
                return Err(match public_only {
                    Some(_) => "no public address outside the deny-list (others need the registry listed in the registry config)",
                    None => "no address",
                }
                .into());
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
    /// Ranges refused for unlisted registries (literal addresses here, names in the resolver).
    deny: Arc<[Cidr]>,
    /// A token and how long its registry said it lasts.
    tokens: ExpiringCache<TokenKey, (String, Duration)>,
    limiter: RegistryLimiter,
    limits: Limits,
    requests: Semaphore,
    body_bytes: Semaphore,
    observer: Option<Observer>,
}

impl RegistryClient {
    /// `product` names the program in the `User-Agent` (`helmop-webhook`, `kubectl-helmop`).
    pub fn new(settings: RegistrySettings, product: &str) -> Result<RegistryClient, SetupError> {
        Self::with_limits(settings, product, Limits::default(), None)
    }

    /// [`RegistryClient::new`] with explicit bounds, reporting what it does to `observer`.
    pub fn with_limits(
        settings: RegistrySettings,
        product: &str,
        limits: Limits,
        observer: Option<Observer>,
    ) -> Result<RegistryClient, SetupError> {
        let lookups = Arc::new(Semaphore::new(limits.dns_lookups.max(1)));
        let deny: Arc<[Cidr]> = settings.deny_list().into();
        let builder = || {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .pool_max_idle_per_host(limits.idle_per_host)
                .pool_idle_timeout(Duration::from_secs(30))
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
        let trusted = builder()
            .dns_resolver(Arc::new(BoundedResolver {
                public_only: None,
                lookups: lookups.clone(),
                observer: observer.clone(),
            }))
            .build()
            .map_err(SetupError::Build)?;
        let open = builder()
            .no_proxy()
            .dns_resolver(Arc::new(BoundedResolver {
                public_only: Some(deny.clone()),
                lookups,
                observer: observer.clone(),
            }))
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
            deny,
            tokens: ExpiringCache::weighed(
                limits.token_cache_bytes,
                |k: &TokenKey, (token, _): &(String, Duration)| {
                    let bytes = k.host.len()
                        + k.scope.len()
                        + k.identity.as_ref().map_or(0, String::len)
                        + token.len()
                        + 128;
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                },
                |(_, ttl): &(String, Duration)| *ttl,
            ),
            limiter: RegistryLimiter::bounded(limits.per_registry, limits.limiter_hosts),
            requests: Semaphore::new(limits.requests.max(1)),
            body_bytes: Semaphore::new(limits.body_bytes_in_flight.max(1)),
            limits,
            observer,
        })
    }

    /// The bounds this client works under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn observe(&self, event: Event) {
        if let Some(observe) = &self.observer {
            observe(event);
        }
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
        // The registry's slot first, so requests waiting for a busy registry hold no global one.
        let Some(_slot) = self.limiter.acquire(host).await else {
            self.observe(Event::Shed("hosts"));
            return Err(ResolveError::Busy(
                "too many registry hosts in use at once".into(),
            ));
        };
        let _request = self
            .requests
            .acquire()
            .await
            .map_err(|_| ResolveError::Busy("closed".into()))?;
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
            status if busy(status) => {
                return Err(ResolveError::Busy(format!("registry answered {status}")));
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
            status if busy(status) => {
                return Err(ResolveError::Busy(format!("registry answered {status}")));
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
        let body = self
            .read_limited(response, self.limits.manifest_bytes, "manifest")
            .await?;
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
        if literal.is_some_and(|ip| !policy::may_connect(ip, &self.deny)) {
            return Err(ResolveError::Refused(format!(
                "{} is not a public address outside the deny-list and not listed in the registry config",
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
        self.observe(Event::Request);
        let response = request.send().await.map_err(transport_error)?;
        refuse_redirect(response)
    }

    /// The body of `response`, at most `limit` bytes: a larger declared length is refused unread, and the
    /// bytes are reserved from [`Limits::body_bytes_in_flight`] before reading.
    async fn read_limited(
        &self,
        mut response: reqwest::Response,
        limit: usize,
        what: &str,
    ) -> Result<Vec<u8>, ResolveError> {
        let too_large = || {
            self.observe(Event::Shed("body"));
            ResolveError::Protocol(format!("a {what} larger than {limit} bytes"))
        };
        let declared = response.content_length();
        if declared.is_some_and(|n| n > u64::try_from(limit).unwrap_or(u64::MAX)) {
            return Err(too_large());
        }
        let reserve = declared
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(limit)
            .min(limit)
            .min(self.limits.body_bytes_in_flight)
            .max(1);
        let _bytes = self
            .body_bytes
            .acquire_many(u32::try_from(reserve).unwrap_or(u32::MAX))
            .await
            .map_err(|_| ResolveError::Busy("closed".into()))?;
        let mut body = Vec::with_capacity(reserve.min(64 << 10));
        while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
            if body.len() + chunk.len() > reserve {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
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
        self.observe(Event::Request);
        let response = refuse_redirect(request.send().await.map_err(transport_error)?)?;
        match response.status() {
            StatusCode::OK => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(ResolveError::Unauthorized(
                    "the token endpoint refused the credentials".into(),
                ));
            }
            status if busy(status) => {
                return Err(ResolveError::Busy(format!(
                    "token endpoint answered {status}"
                )));
            }
            status => {
                return Err(ResolveError::Protocol(format!(
                    "token endpoint answered {status}"
                )));
            }
        }
        let body = self
            .read_limited(response, self.limits.token_bytes, "token response")
            .await?;
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

/// Answers that say "later": rate limiting and server errors, about load rather than the image.
fn busy(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

fn transport_error(error: reqwest::Error) -> ResolveError {
    // Any timeout, the connect timeout included (it covers the wait for a DNS lookup slot, which others'
    // lookups can make long): about this request, not the registry.
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

    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A loopback registry: `answer(request line)` is the whole response to write, `None` to hold the connection
    /// open without answering. Counts connections and the most open at once.
    struct Loopback {
        addr: SocketAddr,
        accepted: Arc<AtomicUsize>,
        open: Arc<AtomicUsize>,
        most_open: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Loopback {
        async fn start(answer: fn(&str) -> Option<Vec<u8>>) -> Loopback {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let accepted = Arc::new(AtomicUsize::new(0));
            let open = Arc::new(AtomicUsize::new(0));
            let most_open = Arc::new(AtomicUsize::new(0));
            let (a, o, m) = (accepted.clone(), open.clone(), most_open.clone());
            let task = tokio::spawn(async move {
                while let Ok((mut socket, _)) = listener.accept().await {
                    a.fetch_add(1, Ordering::SeqCst);
                    let now = o.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    let o = o.clone();
                    tokio::spawn(async move {
                        let mut head = Vec::new();
                        let mut buf = [0u8; 4096];
                        loop {
                            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                                match socket.read(&mut buf).await {
                                    Ok(0) | Err(_) => {
                                        o.fetch_sub(1, Ordering::SeqCst);
                                        return;
                                    }
                                    Ok(n) => head.extend_from_slice(&buf[..n]),
                                }
                            }
                            let text = String::from_utf8_lossy(&head).into_owned();
                            head.clear();
                            let line = text.lines().next().unwrap_or_default().to_owned();
                            match answer(&line) {
                                Some(response) => {
                                    if socket.write_all(&response).await.is_err() {
                                        break;
                                    }
                                }
                                // Held until the client goes away.
                                None => {
                                    let _ = socket.read(&mut buf).await;
                                    break;
                                }
                            }
                        }
                        o.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            });
            Loopback {
                addr,
                accepted,
                open,
                most_open,
                task,
            }
        }

        fn client(&self, limits: Limits) -> RegistryClient {
            let settings =
                RegistrySettings::parse(&format!("insecure: [\"{}\"]", self.addr)).unwrap();
            RegistryClient::with_limits(settings, "test", limits, None).unwrap()
        }

        fn image(&self, repository: &str) -> ImageRef {
            ImageRef::parse(&format!("{}/{repository}:latest", self.addr)).unwrap()
        }
    }

    impl Drop for Loopback {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn with_body(length: Option<usize>, body: &[u8]) -> Vec<u8> {
        let mut r = b"HTTP/1.1 200 OK\r\ncontent-type: application/vnd.oci.image.index.v1+json\r\n"
            .to_vec();
        match length {
            Some(n) => r.extend_from_slice(format!("content-length: {n}\r\n\r\n").as_bytes()),
            None => r.extend_from_slice(b"connection: close\r\n\r\n"),
        }
        r.extend_from_slice(body);
        r
    }

    fn not_allowed() -> Vec<u8> {
        b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n".to_vec()
    }

    #[test]
    fn unlisted_names_are_looked_up_fully_qualified() {
        assert_eq!(fully_qualified("reg.example.com"), "reg.example.com.");
        assert_eq!(fully_qualified("reg.example.com."), "reg.example.com.");
        assert_eq!(fully_qualified("10.0.0.1"), "10.0.0.1");
        assert_eq!(fully_qualified("::1"), "::1");
    }

    #[test]
    fn deny_defaults_and_replacement() {
        assert_eq!(
            RegistrySettings::default().deny_list(),
            policy::default_deny()
        );
        let s = RegistrySettings::parse("deny: [\"10.244.0.0/16\", \"fd12::/56\"]").unwrap();
        assert_eq!(s.deny_list().len(), 2);
        assert!(
            RegistrySettings::parse("deny: []")
                .unwrap()
                .deny_list()
                .is_empty()
        );
        assert!(RegistrySettings::parse("deny: [\"10.0.0.0/40\"]").is_err());
        // A denied literal address is refused before any connection.
        let client = RegistryClient::new(RegistrySettings::default(), "test").unwrap();
        let url = Url::parse("https://[2001:cafe:42::5]/v2/").unwrap();
        assert!(matches!(
            client.client_for(&url),
            Err(ResolveError::Refused(_))
        ));
        let url = Url::parse("https://[2606:4700::1111]/v2/").unwrap();
        assert!(client.client_for(&url).is_ok());
    }

    #[tokio::test]
    async fn bodies_over_their_limit_are_refused() {
        // HEAD without a digest header: the GET body is hashed.
        let declared = Loopback::start(|line| {
            Some(if line.starts_with("HEAD") {
                not_allowed()
            } else if line.contains("big") {
                with_body(Some(2000), &[b'x'; 2000])
            } else {
                with_body(Some(10), b"0123456789")
            })
        })
        .await;
        let limits = Limits {
            manifest_bytes: 1000,
            ..Limits::default()
        };
        let client = declared.client(limits);
        let big = client.resolve(&declared.image("big"), |_| None).await;
        assert!(
            matches!(&big, Err(ResolveError::Protocol(d)) if d.contains("larger than 1000")),
            "{big:?}"
        );
        let small = client.resolve(&declared.image("small"), |_| None).await;
        assert_eq!(
            small,
            Ok(format!(
                "sha256:{}",
                hex::encode(Sha256::digest(b"0123456789"))
            ))
        );
        // Without a declared length, reading stops at the limit.
        let undeclared = Loopback::start(|line| {
            Some(if line.starts_with("HEAD") {
                not_allowed()
            } else {
                with_body(None, &[b'y'; 5000])
            })
        })
        .await;
        let client = undeclared.client(limits);
        let r = client.resolve(&undeclared.image("app"), |_| None).await;
        assert!(
            matches!(&r, Err(ResolveError::Protocol(d)) if d.contains("larger than 1000")),
            "{r:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn registry_requests_are_bounded_process_wide() {
        let slow = Loopback::start(|_| None).await;
        let limits = Limits {
            requests: 2,
            ..Limits::default()
        };
        let client = Arc::new(slow.client(limits));
        let tasks: Vec<_> = (0..6)
            .map(|i| {
                let (client, image) = (client.clone(), slow.image(&format!("r{i}")));
                tokio::spawn(async move { client.resolve(&image, |_| None).await })
            })
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while slow.accepted.load(Ordering::SeqCst) < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the first two never connected"
            );
            tokio::task::yield_now().await;
        }
        // The others wait for a slot: nothing more is connected while the first two hold theirs.
        for _ in 0..1000 {
            tokio::task::yield_now().await;
        }
        assert_eq!(client.requests.available_permits(), 0);
        assert_eq!(slow.accepted.load(Ordering::SeqCst), 2);
        assert!(slow.most_open.load(Ordering::SeqCst) <= 2);
        // Aborting frees slots one task at a time: a waiter not yet aborted may take a freed slot
        // and connect before the server has seen the first connections close, so the server's
        // count of open connections is only meaningful before this point.
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        assert_eq!(
            client.requests.available_permits(),
            2,
            "abandoned requests give their slot back"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while slow.open.load(Ordering::SeqCst) > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "abandoned requests left their connections open"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
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
            ResolveError::Busy(String::new()),
            ResolveError::Skipped,
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
                "timeout",
                "busy",
                "skipped"
            ]
        );
        let definite: Vec<bool> = all.iter().map(ResolveError::is_definite).collect();
        assert_eq!(
            definite,
            [true, true, true, true, true, false, false, false]
        );
    }
}
