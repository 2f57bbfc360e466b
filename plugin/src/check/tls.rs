//! The serving certificate of a webhook, and whether a configuration's caBundle verifies it.
//!
//! Where the certificate comes from depends on how the API server reaches the webhook:
//! - `clientConfig.service` (the shipped manifests): from the Secret the Service's Deployment
//!   mounts (`tls.crt` only; the rest of the Secret, the private key, is dropped unread). A laptop
//!   cannot open a connection to a Service, and the API server's service proxy does not show the
//!   certificate, so the Secret is the one place both can see. It is what the pods serve once they
//!   have reloaded it (they re-read it every second).
//! - `clientConfig.url`: a TLS handshake with that URL from here, which sees exactly what the API
//!   server sees when the URL is reachable from this machine (a host process, a load balancer).
//!
//! The verification itself ([`check_chain`]) is pure: webpki (through rustls) against the
//! caBundle, for the name the API server verifies, at a moment the certificate is valid, so that
//! an expired certificate is reported as expired rather than as untrusted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use helmop_core::check::CertFact;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::cluster::api_error;

/// Where the API server sends a webhook's requests.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    Service { namespace: String, name: String },
    Url(String),
}

impl Target {
    /// The name the API server verifies the certificate for: `NAME.NAMESPACE.svc` for a Service,
    /// the URL's host otherwise.
    pub fn server_name(&self) -> Option<String> {
        match self {
            Target::Service { namespace, name } => Some(format!("{name}.{namespace}.svc")),
            Target::Url(url) => host_port(url).map(|(host, _)| host),
        }
    }
}

/// Host and port of an `https://` URL (`[v6]` hosts unbracketed; port 443 when none).
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, tail) = v6.split_once(']')?;
        (host, tail.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => 443,
    };
    Some((host.to_owned(), port))
}

/// Checks `chain` (leaf first, DER) against the PEM `ca_bundle` for `server_name`.
pub fn check_chain(
    ca_bundle: &[u8],
    chain: &[CertificateDer<'static>],
    server_name: &str,
    now: i64,
    source: String,
) -> CertFact {
    let unavailable = |reason: String| CertFact::Unavailable {
        source: source.clone(),
        reason,
    };
    let Some(leaf) = chain.first() else {
        return unavailable("no certificate".into());
    };
    let (not_before, not_after) = match x509_parser::parse_x509_certificate(leaf) {
        Ok((_, cert)) => (
            cert.validity().not_before.timestamp(),
            cert.validity().not_after.timestamp(),
        ),
        Err(e) => return unavailable(format!("not an X.509 certificate: {e}")),
    };
    // Verify at a moment the certificate is valid: its expiry is judged on its own.
    let at = now.min(not_after.saturating_sub(1)).max(not_before);
    let chain_result = verify(ca_bundle, chain, server_name, at);
    CertFact::Checked {
        source,
        server_name: server_name.to_owned(),
        not_after,
        chain: chain_result,
    }
}

fn verify(
    ca_bundle: &[u8],
    chain: &[CertificateDer<'static>],
    server_name: &str,
    at: i64,
) -> Result<(), String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_bundle) {
        let cert = cert.map_err(|e| format!("caBundle is not PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("caBundle holds an unusable certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("caBundle holds no certificate".into());
    }
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| format!("caBundle: {e}"))?;
    let name = ServerName::try_from(server_name.to_owned())
        .map_err(|_| format!("{server_name:?} is not a DNS name or IP address"))?;
    let (leaf, intermediates) = chain.split_first().ok_or("no certificate")?;
    let at = UnixTime::since_unix_epoch(Duration::from_secs(u64::try_from(at).unwrap_or(0)));
    verifier
        .verify_server_cert(leaf, intermediates, &name, &[], at)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate chain `url` presents in a TLS handshake (nothing is sent after it).
pub async fn from_handshake(
    url: &str,
    timeout: Duration,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let (host, port) = host_port(url).ok_or_else(|| format!("{url:?} is not an https URL"))?;
    let name = ServerName::try_from(host.clone())
        .map_err(|_| format!("{host:?} is not a DNS name or IP address"))?;
    let capture = Arc::new(Capture {
        chain: Mutex::new(Vec::new()),
        provider: provider(),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(capture.clone())
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
        connector
            .connect(name, tcp)
            .await
            .map(drop)
            .map_err(|e| format!("TLS handshake with {host}:{port}: {e}"))
    };
    let outcome = tokio::time::timeout(timeout, handshake)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no TLS answer from {host}:{port} within {timeout:?}"
            ))
        });
    // A webhook that requires a client certificate (`--client-ca`) ends the handshake after it
    // showed its own, which is all that is needed here.
    let chain = capture.chain.lock().map(|c| c.clone()).unwrap_or_default();
    match (chain.is_empty(), outcome) {
        (false, _) => Ok(chain),
        (true, Err(e)) => Err(e),
        (true, Ok(())) => Err(format!("{host}:{port} presented no certificate")),
    }
}

/// Records the server's chain and accepts it: it is verified against the caBundle afterwards
/// ([`check_chain`]), and nothing is ever sent over this connection.
#[derive(Debug)]
struct Capture {
    chain: Mutex<Vec<CertificateDer<'static>>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Ok(mut chain) = self.chain.lock() {
            *chain = std::iter::once(end_entity)
                .chain(intermediates)
                .map(|c| c.clone().into_owned())
                .collect();
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A serving chain and where it was read, or where it was looked for and why it is not there.
pub type Fetched = Result<(Vec<CertificateDer<'static>>, String), (String, String)>;

/// The Secret the shipped Deployment mounts when it has no volume naming one.
const DEFAULT_TLS_SECRET: &str = "helmop-webhook-tls";

/// The serving chain from the Secret mounted by the Deployment behind Service `namespace/name`
/// (the manifests give both the same name), and where it was read.
pub async fn from_secret(client: &Client, namespace: &str, name: &str) -> Fetched {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let mut secrets: Vec<String> = match deployments.get_opt(name).await {
        Ok(Some(d)) => d
            .spec
            .template
            .spec
            .and_then(|s| s.volumes)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|v| v.secret.and_then(|s| s.secret_name))
            .collect(),
        Ok(None) => Vec::new(),
        Err(e) => {
            return Err((
                format!("Deployment {namespace}/{name}"),
                api_error::describe(&e),
            ));
        }
    };
    if secrets.is_empty() {
        secrets.push(DEFAULT_TLS_SECRET.to_owned());
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut last = None;
    for secret in secrets {
        let source = format!("Secret {namespace}/{secret}");
        match api.get_opt(&secret).await {
            Ok(Some(s)) => {
                // Only the public certificate is looked at; the Secret (and its key) is dropped here.
                let pem = s
                    .data
                    .and_then(|mut d| d.remove("tls.crt"))
                    .map(|b| b.0)
                    .unwrap_or_default();
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
                    .filter_map(Result::ok)
                    .collect();
                if chain.is_empty() {
                    last = Some((source, "no PEM certificate under tls.crt".to_owned()));
                    continue;
                }
                return Ok((chain, source));
            }
            Ok(None) => last = Some((source, "not found".to_owned())),
            Err(e) => last = Some((source, api_error::describe(&e))),
        }
    }
    Err(last.unwrap_or_else(|| {
        (
            format!("Deployment {namespace}/{name}"),
            "no Secret volume".to_owned(),
        )
    }))
}

#[cfg(test)]
mod tests {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

    use super::*;

    struct Pki {
        ca_pem: String,
        leaf: CertificateDer<'static>,
        not_after: i64,
    }

    /// A CA and a leaf for `names`, valid from 2025 to `until_year`-01-01.
    fn pki(names: &[&str], until_year: i32) -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.not_before = rcgen::date_time_ymd(2025, 1, 1);
        ca.not_after = rcgen::date_time_ymd(2040, 1, 1);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = rcgen::date_time_ymd(2025, 1, 1);
        params.not_after = rcgen::date_time_ymd(until_year, 1, 1);
        let not_after = params.not_after.unix_timestamp();
        let leaf = params.signed_by(&key, &issuer).unwrap();
        Pki {
            ca_pem: ca_cert.pem(),
            leaf: leaf.der().clone(),
            not_after,
        }
    }

    const NOW: i64 = 1_800_000_000; // 2027-01-15

    #[test]
    fn verifies_for_the_service_name() {
        let p = pki(&["helmop-webhook.helmop-system.svc"], 2030);
        let fact = check_chain(
            p.ca_pem.as_bytes(),
            std::slice::from_ref(&p.leaf),
            "helmop-webhook.helmop-system.svc",
            NOW,
            "s".into(),
        );
        assert_eq!(
            fact,
            CertFact::Checked {
                source: "s".into(),
                server_name: "helmop-webhook.helmop-system.svc".into(),
                not_after: p.not_after,
                chain: Ok(()),
            }
        );
    }

    #[test]
    fn another_ca_or_name_does_not_verify() {
        let p = pki(&["a.ns.svc"], 2030);
        let other = pki(&["a.ns.svc"], 2030);
        let chain_of = |ca: &str, name: &str| match check_chain(
            ca.as_bytes(),
            std::slice::from_ref(&p.leaf),
            name,
            NOW,
            "s".into(),
        ) {
            CertFact::Checked { chain, .. } => chain,
            other => panic!("{other:?}"),
        };
        assert!(chain_of(&p.ca_pem, "a.ns.svc").is_ok());
        assert!(chain_of(&other.ca_pem, "a.ns.svc").is_err());
        assert!(chain_of(&p.ca_pem, "b.ns.svc").is_err());
        assert!(chain_of("", "a.ns.svc").is_err());
        assert!(chain_of("not pem", "a.ns.svc").is_err());
    }

    #[test]
    fn an_expired_certificate_still_verifies_its_chain() {
        let p = pki(&["127.0.0.1"], 2026);
        let fact = check_chain(
            p.ca_pem.as_bytes(),
            std::slice::from_ref(&p.leaf),
            "127.0.0.1",
            NOW,
            "s".into(),
        );
        let CertFact::Checked {
            chain, not_after, ..
        } = fact
        else {
            panic!("{fact:?}");
        };
        assert_eq!(chain, Ok(()));
        assert!(not_after < NOW);
    }

    #[test]
    fn garbage_is_unavailable() {
        let fact = check_chain(
            b"",
            &[CertificateDer::from(vec![1, 2, 3])],
            "x",
            NOW,
            "s".into(),
        );
        assert!(matches!(fact, CertFact::Unavailable { .. }), "{fact:?}");
    }

    #[test]
    fn urls() {
        assert_eq!(
            host_port("https://127.0.0.1:8443/mutate/workloads"),
            Some(("127.0.0.1".into(), 8443))
        );
        assert_eq!(
            host_port("https://webhook.example.com/x"),
            Some(("webhook.example.com".into(), 443))
        );
        assert_eq!(
            host_port("https://[::1]:9443/x"),
            Some(("::1".into(), 9443))
        );
        assert_eq!(host_port("http://a/x"), None);
        assert_eq!(host_port("https://:80/x"), None);
        assert_eq!(host_port("https://a:port/x"), None);
        assert_eq!(
            Target::Service {
                namespace: "helmop-system".into(),
                name: "helmop-webhook".into()
            }
            .server_name()
            .as_deref(),
            Some("helmop-webhook.helmop-system.svc")
        );
    }
}
