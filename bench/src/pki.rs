//! Certificates for the servers under test: one CA, leaves for `localhost`/127.0.0.1, written the way the
//! kubelet writes a Secret volume (`tls.crt -> ..data/tls.crt`, `..data -> ..<timestamp>`) so a rotation is
//! the same atomic symlink swap a cluster does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::CertificateDer;

pub struct Pki {
    ca_der: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    /// PKCS#8 DER of the key.
    pub key_der: Vec<u8>,
    pub der: CertificateDer<'static>,
}

impl Pki {
    pub fn new() -> anyhow::Result<Pki> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "helmop bench CA");
        let ca = params.self_signed(&key)?;
        Ok(Pki {
            ca_der: ca.der().clone(),
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    pub fn leaf(&self, common_name: &str) -> anyhow::Result<Leaf> {
        let key = rcgen::KeyPair::generate()?;
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            key_der: key.serialize_der(),
            der: cert.der().clone(),
        })
    }

    /// A client trusting only this CA, speaking HTTP/1.1 (what the API server uses for webhooks).
    pub fn client_config(&self) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone())?;
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A directory laid out like a mounted Secret volume.
pub struct SecretVolume {
    dir: tempfile::TempDir,
    generation: usize,
}

impl SecretVolume {
    pub fn new(leaf: &Leaf) -> anyhow::Result<SecretVolume> {
        let dir = tempfile::Builder::new()
            .prefix("helmop-bench-tls-")
            .tempdir()?;
        std::os::unix::fs::symlink("..data/tls.crt", dir.path().join("tls.crt"))?;
        std::os::unix::fs::symlink("..data/tls.key", dir.path().join("tls.key"))?;
        let mut volume = SecretVolume { dir, generation: 0 };
        volume.swap_in(leaf)?;
        Ok(volume)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }

    /// New timestamped directory, `..data` re-pointed by an atomic rename, old directory removed: the
    /// kubelet's AtomicWriter sequence.
    pub fn swap_in(&mut self, leaf: &Leaf) -> anyhow::Result<()> {
        let root = self.dir.path();
        let previous = std::fs::read_link(root.join("..data")).ok();
        self.generation += 1;
        let name = format!(
            "..2025_01_01_00_00_{:04}.{}",
            self.generation,
            std::process::id()
        );
        let fresh = root.join(&name);
        std::fs::create_dir(&fresh)?;
        std::fs::write(fresh.join("tls.crt"), &leaf.cert_pem)?;
        std::fs::write(fresh.join("tls.key"), &leaf.key_pem)?;
        std::os::unix::fs::symlink(&name, root.join("..data_tmp"))?;
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).context("swapping ..data")?;
        if let Some(previous) = previous {
            std::fs::remove_dir_all(root.join(previous))?;
        }
        Ok(())
    }
}
