//! TLS for the admission endpoint: rustls with the ring provider, TLS 1.2 and 1.3 only, ALPN h2 and http/1.1,
//! and a serving certificate that follows the files on disk.
//!
//! Reloading is a poll, not a file watch: every interval both files are read by path and compared with what is
//! being served. Reading by path follows symlinks at each read, so the `..data` symlink swap of Secret volumes,
//! an in-place rewrite and a rename over the file are all seen the same way, with no watch to re-arm.
//! The resolver hands each new handshake the current pair; established connections keep theirs.
//!
//! A pair that fails to load is retried on the next poll before it is reported: cert and key are often written
//! one after the other, and the half-written moment in between is not an error worth an alert.
//!
//! With a client CA (`--client-ca`), every connection must present a certificate that CA signed, checked in
//! the handshake: a caller without one never gets to send a request. The file is polled like the serving
//! pair; a connection made before a change is judged again under the new CAs before its next request
//! is served (`server::client_auth`), so a removed CA loses its kept-alive connections too.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::UnixTime;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls::{RootCertStore, ServerConfig, version};

use crate::error::Error;
use crate::metrics::Metrics;

/// The ring provider, shared by every config the webhook builds.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

const CERT_FILE: &str = "certificate file";
const CLIENT_CA_FILE: &str = "client CA file";

/// Parses a PEM certificate chain and private key and checks that they belong together.
pub fn load_certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, Error> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Error::Pem {
            file: CERT_FILE,
            source,
        })?;
    if chain.is_empty() {
        return Err(Error::NoCertificate { file: CERT_FILE });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|source| Error::Pem {
        file: "key file",
        source,
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(Error::KeyMismatch)
}

/// Serves whichever certificate was stored last.
#[derive(Debug)]
pub struct CertResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertResolver {
    pub fn new(key: CertifiedKey) -> Self {
        CertResolver {
            current: RwLock::new(Arc::new(key)),
        }
    }

    pub fn store(&self, key: CertifiedKey) {
        // The lock only guards a pointer swap; a poisoned lock still holds a valid pointer.
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Parses the PEM certificates that client certificates must chain to.
pub fn load_client_ca(pem: &[u8]) -> Result<RootCertStore, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Error::Pem {
            file: CLIENT_CA_FILE,
            source,
        })?;
    if certs.is_empty() {
        return Err(Error::NoCertificate {
            file: CLIENT_CA_FILE,
        });
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(Error::ClientCa)?;
    }
    Ok(roots)
}

/// A client-certificate verifier whose CAs can be replaced while serving: `--client-ca` is re-read
/// like the serving certificate, so a rotated client CA (the bootstrap writes the new CA next to the
/// old one first, see `bootstrap::next_bundle`) is accepted without a restart and a removed one stops
/// being accepted. Each handshake uses the CAs current when it starts; a connection's certificate is
/// judged again ([`ClientCaVerifier::trusts`]) once the [`ClientCaVerifier::generation`] it was accepted
/// under has passed.
#[derive(Debug)]
pub struct ClientCaVerifier {
    current: RwLock<Arc<dyn ClientCertVerifier>>,
    /// Bumped after every swap of `current` (never before: a handshake that reads the new generation
    /// must be verified by the new CAs).
    generation: AtomicU64,
}

impl ClientCaVerifier {
    pub fn new(roots: RootCertStore) -> Result<Self, Error> {
        Ok(ClientCaVerifier {
            current: RwLock::new(Self::build(roots)?),
            generation: AtomicU64::new(0),
        })
    }

    /// How many times the CAs were replaced.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the CAs in use now still accept `chain` (the end-entity certificate first), as a new
    /// handshake would.
    pub fn trusts(&self, chain: &[CertificateDer<'static>]) -> bool {
        let Some((end_entity, intermediates)) = chain.split_first() else {
            return false;
        };
        self.inner().is_some_and(|v| {
            v.verify_client_cert(end_entity, intermediates, UnixTime::now())
                .is_ok()
        })
    }

    fn build(roots: RootCertStore) -> Result<Arc<dyn ClientCertVerifier>, Error> {
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| Error::Tls(format!("client CA: {e}")))
    }

    /// Trusts exactly `roots` from the next handshake on.
    pub fn store(&self, roots: RootCertStore) -> Result<(), Error> {
        let next = Self::build(roots)?;
        if let Ok(mut current) = self.current.write() {
            *current = next;
        }
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    fn inner(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        self.current.read().ok().map(|c| c.clone())
    }
}

fn poisoned() -> rustls::Error {
    rustls::Error::General("client CA verifier unavailable".into())
}

impl ClientCertVerifier for ClientCaVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        true
    }
    /// No hints: they would borrow from CAs that may be replaced meanwhile, and clients with one
    /// certificate (the API server's) send it without them.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner()
            .ok_or_else(poisoned)?
            .verify_client_cert(end_entity, intermediates, now)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner()
            .ok_or_else(poisoned)?
            .verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner()
            .ok_or_else(poisoned)?
            .verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner()
            .map(|v| v.supported_verify_schemes())
            .unwrap_or_default()
    }
}

/// The rustls server configuration of the admission port; `client_ca` makes a client certificate it signed
/// mandatory.
pub fn server_config(
    resolver: Arc<CertResolver>,
    client_ca: Option<Arc<ClientCaVerifier>>,
) -> Result<ServerConfig, Error> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&version::TLS13, &version::TLS12])
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(verifier) => builder.with_client_cert_verifier(verifier),
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// What the two files held at one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Observation {
    Read { cert: Vec<u8>, key: Vec<u8> },
    Unreadable(String),
}

/// What one poll changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollResult {
    Unchanged,
    Reloaded,
    /// Changed content failed to load; retried on the next poll before it is reported.
    Pending,
    /// Changed content failed to load twice in a row; reported (log + metric) and kept out of service.
    Failed(String),
}

/// Polls the certificate and key files and swaps the resolver's pair when they change.
pub struct CertReloader {
    cert_path: PathBuf,
    key_path: PathBuf,
    resolver: Arc<CertResolver>,
    metrics: Metrics,
    serving: Observation,
    /// Last observation that failed to load, and whether that failure was reported already.
    failing: Option<(Observation, bool)>,
}

impl CertReloader {
    /// Loads the initial pair; a failure here is fatal to the caller (nothing to serve).
    pub async fn start(
        cert_path: &Path,
        key_path: &Path,
        metrics: Metrics,
    ) -> Result<CertReloader, Error> {
        let observation = observe(cert_path, key_path).await;
        let key = match &observation {
            Observation::Read { cert, key } => {
                load_certified_key(cert, key).map_err(|e| e.to_string())
            }
            Observation::Unreadable(reason) => Err(reason.clone()),
        }
        .map_err(|reason| Error::Tls(format!("cannot serve {}: {reason}", cert_path.display())))?;
        Ok(CertReloader {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            resolver: Arc::new(CertResolver::new(key)),
            metrics,
            serving: observation,
            failing: None,
        })
    }

    pub fn resolver(&self) -> Arc<CertResolver> {
        self.resolver.clone()
    }

    pub async fn poll(&mut self) -> PollResult {
        let observation = observe(&self.cert_path, &self.key_path).await;
        if observation == self.serving {
            // A failing pair reverted to the served one: nothing left to report.
            self.failing = None;
            return PollResult::Unchanged;
        }
        if matches!(&self.failing, Some((seen, true)) if *seen == observation) {
            // Already reported; wait for the next change.
            return PollResult::Unchanged;
        }
        let loaded = match &observation {
            Observation::Read { cert, key } => {
                load_certified_key(cert, key).map_err(|e| e.to_string())
            }
            Observation::Unreadable(reason) => Err(reason.clone()),
        };
        match loaded {
            Ok(key) => {
                self.resolver.store(key);
                self.serving = observation;
                self.failing = None;
                self.metrics.cert_reloaded();
                tracing::info!(
                    cert = %resolved(&self.cert_path).display(),
                    key = %resolved(&self.key_path).display(),
                    "serving certificate reloaded"
                );
                PollResult::Reloaded
            }
            Err(reason) => match &mut self.failing {
                Some((seen, reported)) if *seen == observation => {
                    *reported = true;
                    self.metrics.cert_reload_failed();
                    tracing::error!(
                        cert = %self.cert_path.display(),
                        key = %self.key_path.display(),
                        reason = %reason,
                        "serving certificate changed but cannot be loaded; keeping the previous one"
                    );
                    PollResult::Failed(reason)
                }
                _ => {
                    self.failing = Some((observation, false));
                    PollResult::Pending
                }
            },
        }
    }

    /// Polls every `interval` until `shutdown` resolves.
    pub async fn run(
        mut self,
        interval: Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticker.tick() => { self.poll().await; }
            }
        }
    }
}

/// Polls `--client-ca` and swaps the verifier's CAs when the file changes; content that does not
/// load is reported once and the CAs in use are kept.
pub struct ClientCaReloader {
    path: PathBuf,
    verifier: Arc<ClientCaVerifier>,
    serving: Vec<u8>,
    failed: Option<Vec<u8>>,
}

impl ClientCaReloader {
    /// Loads the file (a failure is fatal to the caller: it would serve nobody).
    pub fn start(path: &Path) -> Result<ClientCaReloader, Error> {
        let pem = std::fs::read(path)
            .map_err(|e| Error::Tls(format!("cannot read {}: {e}", path.display())))?;
        let roots =
            load_client_ca(&pem).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
        Ok(ClientCaReloader {
            path: path.to_owned(),
            verifier: Arc::new(ClientCaVerifier::new(roots)?),
            serving: pem,
            failed: None,
        })
    }

    pub fn verifier(&self) -> Arc<ClientCaVerifier> {
        self.verifier.clone()
    }

    /// True when new CAs were taken into use.
    pub async fn poll(&mut self) -> bool {
        let Ok(pem) = tokio::fs::read(&self.path).await else {
            return false;
        };
        if pem == self.serving || self.failed.as_ref() == Some(&pem) {
            return false;
        }
        let loaded = load_client_ca(&pem).and_then(|roots| self.verifier.store(roots));
        match loaded {
            Ok(()) => {
                tracing::info!(client_ca = %resolved(&self.path).display(), cas = CertificateDer::pem_slice_iter(&pem).count(), "client CA reloaded");
                self.serving = pem;
                self.failed = None;
                true
            }
            Err(error) => {
                tracing::error!(client_ca = %self.path.display(), %error, "client CA changed but cannot be loaded; keeping the previous one");
                self.failed = Some(pem);
                false
            }
        }
    }

    /// Polls every `interval` until `shutdown` resolves.
    pub async fn run(
        mut self,
        interval: Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticker.tick() => { self.poll().await; }
            }
        }
    }
}

async fn observe(cert_path: &Path, key_path: &Path) -> Observation {
    let cert = tokio::fs::read(cert_path).await;
    let key = tokio::fs::read(key_path).await;
    match (cert, key) {
        (Ok(cert), Ok(key)) => Observation::Read { cert, key },
        (Err(e), _) => Observation::Unreadable(format!("cannot read {}: {e}", cert_path.display())),
        (_, Err(e)) => Observation::Unreadable(format!("cannot read {}: {e}", key_path.display())),
    }
}

/// Where a path currently points (the timestamped directory behind `..data` in a Secret volume), for the log.
fn resolved(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn served_name(reloader: &CertReloader) -> Vec<u8> {
        reloader.resolver().current().cert[0].to_vec()
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn a_replaced_ca_is_a_new_generation_that_judges_chains_again() {
        use crate::bootstrap::{generate_ca, issue_client_cert};
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let (old, new) = (generate_ca(now).unwrap(), generate_ca(now).unwrap());
        let client = issue_client_cert(&old, "kube-apiserver", now, 30).unwrap();
        let chain = vec![der(&client.cert)];
        let verifier = ClientCaVerifier::new(load_client_ca(old.cert.as_bytes()).unwrap()).unwrap();
        assert_eq!(verifier.generation(), 0);
        assert!(verifier.trusts(&chain));
        assert!(!verifier.trusts(&[]), "no certificate is trusted");

        let both = format!("{}{}", new.cert, old.cert);
        verifier
            .store(load_client_ca(both.as_bytes()).unwrap())
            .unwrap();
        assert_eq!(verifier.generation(), 1);
        assert!(verifier.trusts(&chain), "added before removed");

        verifier
            .store(load_client_ca(new.cert.as_bytes()).unwrap())
            .unwrap();
        assert_eq!(verifier.generation(), 2);
        assert!(!verifier.trusts(&chain), "a removed CA still trusted");
    }

    #[test]
    fn mismatched_or_garbage_pairs_are_refused() {
        let (c1, k1) = pair("a");
        let (_c2, k2) = pair("b");
        assert!(load_certified_key(c1.as_bytes(), k1.as_bytes()).is_ok());
        let err = load_certified_key(c1.as_bytes(), k2.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("certificate and key"), "{err}");
        assert!(
            load_certified_key(b"", k1.as_bytes())
                .unwrap_err()
                .to_string()
                .contains("no CERTIFICATE")
        );
        assert!(
            load_certified_key(c1.as_bytes(), b"junk")
                .unwrap_err()
                .to_string()
                .contains("key file")
        );
    }

    #[test]
    fn key_material_never_reaches_the_error() {
        let (c1, k1) = pair("a");
        // A truncated key must not be echoed back in the error.
        let truncated = &k1[..k1.len() / 2];
        let err = load_certified_key(c1.as_bytes(), truncated.as_bytes())
            .unwrap_err()
            .to_string();
        let body_line = k1.lines().nth(1).unwrap();
        assert!(!err.contains(body_line), "{err}");
    }

    #[tokio::test]
    async fn transient_mismatch_is_not_reported_persistent_garbage_is_once() {
        let dir = tempfile::tempdir().unwrap();
        let (cp, kp) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (c1, k1) = pair("one");
        let (c2, k2) = pair("two");
        std::fs::write(&cp, &c1).unwrap();
        std::fs::write(&kp, &k1).unwrap();
        let metrics = Metrics::new();
        let mut r = CertReloader::start(&cp, &kp, metrics.clone())
            .await
            .unwrap();
        let first = served_name(&r);
        assert_eq!(r.poll().await, PollResult::Unchanged);

        // Cert written, key not yet: pending, not reported, old pair still served.
        std::fs::write(&cp, &c2).unwrap();
        assert_eq!(r.poll().await, PollResult::Pending);
        assert_eq!(served_name(&r), first);
        std::fs::write(&kp, &k2).unwrap();
        assert_eq!(r.poll().await, PollResult::Reloaded);
        assert_ne!(served_name(&r), first);
        assert_eq!(
            (metrics.cert_reloads(), metrics.cert_reload_failures()),
            (1, 0)
        );

        // Garbage that stays: reported exactly once.
        std::fs::write(&kp, "garbage").unwrap();
        assert_eq!(r.poll().await, PollResult::Pending);
        assert!(matches!(r.poll().await, PollResult::Failed(_)));
        assert_eq!(r.poll().await, PollResult::Unchanged);
        assert_eq!(metrics.cert_reload_failures(), 1);

        // Files removed: same treatment, the served pair survives.
        std::fs::remove_file(&kp).unwrap();
        assert_eq!(r.poll().await, PollResult::Pending);
        assert!(
            matches!(r.poll().await, PollResult::Failed(reason) if reason.contains("cannot read"))
        );
        assert_eq!(metrics.cert_reload_failures(), 2);

        // Back to the served pair: nothing to do.
        std::fs::write(&kp, &k2).unwrap();
        assert_eq!(r.poll().await, PollResult::Unchanged);
        assert_eq!(metrics.cert_reloads(), 1);
    }

    #[tokio::test]
    async fn a_client_ca_that_does_not_load_is_not_taken_into_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let (cert, _) = pair("ca");
        std::fs::write(&path, &cert).unwrap();
        let mut r = ClientCaReloader::start(&path).unwrap();
        assert!(!r.poll().await, "unchanged");
        std::fs::write(&path, "not a certificate").unwrap();
        assert!(!r.poll().await, "garbage taken into use");
        assert_eq!(r.serving, cert.as_bytes());
        let (other, _) = pair("other");
        std::fs::write(&path, &other).unwrap();
        assert!(r.poll().await);
        assert!(ClientCaReloader::start(&dir.path().join("missing")).is_err());
    }

    #[tokio::test]
    async fn unloadable_start_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = CertReloader::start(
            &dir.path().join("nope.crt"),
            &dir.path().join("nope.key"),
            Metrics::new(),
        )
        .await
        .err()
        .unwrap();
        assert!(err.to_string().contains("cannot read"), "{err}");
    }
}
