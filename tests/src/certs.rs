//! Throwaway certificates for test servers the API server calls (webhooks), and the client certificate the
//! test API servers present to them.

use std::sync::OnceLock;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA and a serving certificate/key it signed, all PEM.
#[derive(Debug, Clone)]
pub struct TestCerts {
    /// Goes into a webhook's `caBundle`.
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Serving certificate for `127.0.0.1` and `localhost`.
pub fn test_certs() -> TestCerts {
    test_certs_for(&["127.0.0.1", "localhost"])
}

/// Serving certificate for the given IP addresses and DNS names.
pub fn test_certs_for(names: &[&str]) -> TestCerts {
    // Only fixed, valid inputs reach rcgen here, so a failure is a bug in this function.
    let ca_key = KeyPair::generate().expect("generate CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "helmop-tests CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign CA");
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().expect("generate serving key");
    let sans: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = CertificateParams::new(sans)
        .unwrap_or_else(|e| panic!("invalid certificate names {names:?}: {e}"));
    params
        .distinguished_name
        .push(DnType::CommonName, "helmop-tests server");
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &issuer).expect("sign serving cert");
    TestCerts {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// The client certificate every kube-apiserver the harness starts presents to admission webhooks (its
/// admission `kubeConfigFile`), and the CA a webhook verifies it with (`--client-ca`). One per test process,
/// so a webhook on loopback accepts the calls of any control plane this process started.
#[derive(Debug, Clone)]
pub struct WebhookClientPki {
    /// The CA webhooks trust for client certificates.
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn webhook_client_pki() -> &'static WebhookClientPki {
    static PKI: OnceLock<WebhookClientPki> = OnceLock::new();
    PKI.get_or_init(|| {
        // Only fixed, valid inputs reach rcgen here, so a failure is a bug in this function.
        let ca_key = KeyPair::generate().expect("generate CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "helmop-tests webhook client CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign CA");
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("generate client key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver-webhook-client");
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &issuer).expect("sign client cert");
        WebhookClientPki {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    })
}
