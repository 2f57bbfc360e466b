//! The default upstream id (recorded in every copy's owners and source): a stable short name for the management cluster,
//! so copies made from two management clusters never collide (docs/cluster-identity.md).
//!
//! [`derive_from_uid`] (the default): `up-` followed by the first 12 hex digits of SHA-256 over
//! a domain tag and the UID of the upstream's `kube-system` namespace. That UID is what the
//! cluster is, whatever endpoint, proxy or CA a client goes through: a laptop behind a
//! TLS-intercepting proxy and a pod in the cluster derive the same id.
//!
//! [`derive()`] (the legacy id, v1): the same over the API server's CA certificates (DER, each
//! length-prefixed, in the order the kubeconfig lists them), or over the URL without a CA.
//! Earlier releases used it as the default; it is still computed as an alias, so a run
//! recognises (and migrates) the copies it made under its old id. It is also the default when
//! `kube-system` cannot be read.

use sha2::{Digest, Sha256};

const TAG_CA: &[u8] = b"helmop.dev/upstream-id/v1/ca\0";
const TAG_URL: &[u8] = b"helmop.dev/upstream-id/v1/url\0";
const TAG_UID: &[u8] = b"helmop.dev/upstream-id/v2/kube-system-uid\0";

/// The default upstream id from the UID of the upstream's `kube-system` namespace.
pub fn derive_from_uid(uid: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(TAG_UID);
    hasher.update(uid.as_bytes());
    format!("up-{}", &hex::encode(hasher.finalize())[..12])
}

/// The legacy (v1) upstream id for a client configuration.
pub fn derive(config: &kube::Config) -> String {
    derive_from(config.root_cert.as_deref(), &config.cluster_url.to_string())
}

/// [`derive()`] from its inputs: DER certificates, else the server URL.
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
    fn the_uid_id_is_a_valid_id_distinct_from_the_legacy_ones() {
        let uid = "5f3c1a0e-8d1b-4b5e-9a43-0c2f6d7e8a91";
        let id = derive_from_uid(uid);
        assert!(validate_upstream_id(&id).is_ok(), "{id}");
        assert_eq!(id, derive_from_uid(uid));
        assert_ne!(id, derive_from_uid("5f3c1a0e-8d1b-4b5e-9a43-0c2f6d7e8a92"));
        // Another tag than the legacy derivations, even over the same bytes.
        assert_ne!(id, derive_from(None, uid));
        let mut h = Sha256::new();
        h.update(b"helmop.dev/upstream-id/v2/kube-system-uid\0");
        h.update(uid.as_bytes());
        assert_eq!(id, format!("up-{}", &hex::encode(h.finalize())[..12]));
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
