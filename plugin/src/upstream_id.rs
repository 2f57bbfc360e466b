//! The default upstream id (DESIGN section 3): a stable short name for the management cluster,
//! so copies made from two management clusters never collide.
//!
//! `up-` followed by the first 12 hex digits of SHA-256 over a domain tag and the API server's
//! CA certificates (DER, each length-prefixed), in the order the kubeconfig lists them. The CA is
//! what a laptop (`https://rancher.example.com/k8s/...`) and a pod in the cluster
//! (`https://10.43.0.1:443`) have in common, where the URLs differ. Without a CA in the
//! configuration (the system trust store, or `insecure-skip-tls-verify`) the URL is hashed
//! instead, with its own tag. Two management clusters that share a CA must be told apart with
//! `--upstream-id`.

use sha2::{Digest, Sha256};

const TAG_CA: &[u8] = b"helmop.dev/upstream-id/v1/ca\0";
const TAG_URL: &[u8] = b"helmop.dev/upstream-id/v1/url\0";

/// The default upstream id for a client configuration.
pub fn derive(config: &kube::Config) -> String {
    derive_from(config.root_cert.as_deref(), &config.cluster_url.to_string())
}

/// [`derive`] from its inputs: DER certificates, else the server URL.
pub fn derive_from(ca_certs: Option<&[Vec<u8>]>, cluster_url: &str) -> String {
    let mut hasher = Sha256::new();
    match ca_certs.filter(|certs| !certs.is_empty()) {
        Some(certs) => {
            hasher.update(TAG_CA);
            for der in certs {
                hasher.update((der.len() as u64).to_be_bytes());
                hasher.update(der);
            }
        }
        None => {
            hasher.update(TAG_URL);
            hasher.update(normalize_url(cluster_url).as_bytes());
        }
    }
    let digest = hasher.finalize();
    format!("up-{}", &hex::encode(digest)[..12])
}

/// Scheme and host are case-insensitive and a trailing `/` means nothing.
fn normalize_url(url: &str) -> String {
    let url = url.trim().trim_end_matches('/');
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            format!(
                "{}://{}{path}",
                scheme.to_ascii_lowercase(),
                authority.to_ascii_lowercase()
            )
        }
        None => url.to_ascii_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use helmop_core::plan::validate_upstream_id;

    use super::*;

    #[test]
    fn same_ca_same_id_whatever_the_url() {
        let ca = vec![vec![1u8, 2, 3], vec![4u8]];
        let a = derive_from(Some(&ca), "https://rancher.example.com/k8s/clusters/local");
        let b = derive_from(Some(&ca), "https://10.43.0.1:443");
        assert_eq!(a, b);
        assert!(validate_upstream_id(&a).is_ok(), "{a}");
        assert_eq!(a.len(), 15);
    }

    #[test]
    fn encoding_is_unambiguous_and_ordered() {
        let one = derive_from(Some(&[vec![1u8, 2], vec![3u8]]), "");
        let other = derive_from(Some(&[vec![1u8], vec![2u8, 3]]), "");
        assert_ne!(one, other);
        let swapped = derive_from(Some(&[vec![3u8], vec![1u8, 2]]), "");
        assert_ne!(one, swapped);
    }

    #[test]
    fn without_ca_the_normalized_url_counts() {
        let a = derive_from(None, "https://API.example.com:6443/");
        assert_eq!(a, derive_from(Some(&[]), "https://api.example.com:6443"));
        assert_ne!(a, derive_from(None, "https://api.example.com:6444"));
        // The path is case-sensitive.
        assert_ne!(
            derive_from(None, "https://h/k8s/A"),
            derive_from(None, "https://h/k8s/a")
        );
    }

    #[test]
    fn known_value() {
        // Pinned so that a change of the derivation (which would orphan every copy) is seen.
        let id = derive_from(None, "https://127.0.0.1:6443");
        let mut h = Sha256::new();
        h.update(b"helmop.dev/upstream-id/v1/url\0https://127.0.0.1:6443");
        assert_eq!(id, format!("up-{}", &hex::encode(h.finalize())[..12]));
    }
}
