//! The system's trust roots, read once per process for every downstream client whose kubeconfig
//! embeds no CA.
//!
//! kube builds a new rustls configuration per client; without a CA in the kubeconfig it asks the
//! platform verifier, which on Linux reads and parses every certificate of the system store
//! (`SSL_CERT_FILE` and each file of `SSL_CERT_DIR`) again for each client. Over a fleet that was
//! most of a cold `propagate`'s CPU (docs/performance.md, section 7). Handing kube the same roots,
//! read once, verifies exactly as that verifier does there (webpki against the system roots).
//! Elsewhere (macOS, Windows, Android) the platform verifier asks the operating system, which this
//! cannot stand in for, so configurations are left as they are.

#[cfg(all(unix, not(target_vendor = "apple"), not(target_os = "android")))]
mod system {
    use std::sync::OnceLock;

    /// DER of every system root rustls accepts as a trust anchor (the platform verifier also
    /// skips the others); `None` when there is none, so kube reports that as it always did.
    fn roots() -> Option<&'static Vec<Vec<u8>>> {
        static ROOTS: OnceLock<Option<Vec<Vec<u8>>>> = OnceLock::new();
        ROOTS
            .get_or_init(|| {
                let found = rustls_native_certs::load_native_certs();
                for e in &found.errors {
                    tracing::warn!(error = %e, "cannot read a system CA root certificate");
                }
                let usable: Vec<Vec<u8>> = found
                    .certs
                    .into_iter()
                    .filter(|c| rustls::RootCertStore::empty().add(c.clone()).is_ok())
                    .map(|c| c.to_vec())
                    .collect();
                (!usable.is_empty()).then_some(usable)
            })
            .as_ref()
    }

    pub fn trust_system_roots(config: &mut kube::Config) {
        if config.root_cert.is_none()
            && let Some(roots) = roots()
        {
            config.root_cert = Some(roots.clone());
        }
    }
}

/// Gives `config` the system roots, read once, when its kubeconfig names no CA.
#[cfg(all(unix, not(target_vendor = "apple"), not(target_os = "android")))]
pub use system::trust_system_roots;

/// The platform verifier asks the operating system here: nothing to share.
#[cfg(not(all(unix, not(target_vendor = "apple"), not(target_os = "android"))))]
pub fn trust_system_roots(_config: &mut kube::Config) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_kubeconfig_ca_is_kept_and_a_missing_one_becomes_the_system_roots() {
        let mut with_ca = kube::Config::new("https://10.0.0.1:6443".parse().unwrap());
        with_ca.root_cert = Some(vec![b"their CA".to_vec()]);
        trust_system_roots(&mut with_ca);
        assert_eq!(with_ca.root_cert, Some(vec![b"their CA".to_vec()]));

        let mut without = kube::Config::new("https://10.0.0.1:6443".parse().unwrap());
        trust_system_roots(&mut without);
        let mut again = kube::Config::new("https://10.0.0.2:6443".parse().unwrap());
        trust_system_roots(&mut again);
        // This machine has system roots (the e2e tests' TLS relies on them being readable).
        let roots = without.root_cert.clone().unwrap_or_default();
        assert!(!roots.is_empty());
        assert_eq!(again.root_cert, without.root_cert, "read once, the same");
        // kube accepts them as they are: a client can be built.
        assert!(kube::Client::try_from(without).is_ok());
    }
}
