//! The cluster's hash key.

use std::fmt;

use hmac::{Hmac, Mac};
use k8s_openapi::api::core::v1::Secret;
use sha2::Sha256;

use crate::names;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// Domain tag of the per-namespace subkey ([`HashKey::namespace_key`]).
pub const NAMESPACE_KEY_TAG: &str = "helmop.dev/v2/namespace";

/// Why a hash key was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HashKeyError {
    #[error(
        "hash key is {len} bytes; it must be at least {} random bytes",
        HashKey::MIN_LEN
    )]
    TooShort { len: usize },
    #[error("hash key secret has no data key `{}`", names::HASH_KEY_DATA_KEY)]
    MissingDataKey,
}

/// The key every helmop hash is made with. `Debug` never shows it, and nothing in this crate
/// can hand its bytes back out.
#[derive(Clone)]
pub struct HashKey {
    // Keyed once: cloning a keyed HMAC state skips the key schedule on every hash.
    mac: HmacSha256,
}

impl HashKey {
    /// Minimum key length in bytes (SHA-256's output size: shorter keys weaken HMAC).
    pub const MIN_LEN: usize = 32;

    pub fn new(key: &[u8]) -> Result<HashKey, HashKeyError> {
        if key.len() < Self::MIN_LEN {
            return Err(HashKeyError::TooShort { len: key.len() });
        }
        // HMAC accepts keys of any length, so this cannot fail; mapping keeps it panic-free.
        let mac = HmacSha256::new_from_slice(key)
            .map_err(|_| HashKeyError::TooShort { len: key.len() })?;
        Ok(HashKey { mac })
    }

    /// The key stored raw under data key `key` of Secret `helmop-system/helmop-hash-key`.
    pub fn from_secret(secret: &Secret) -> Result<HashKey, HashKeyError> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(names::HASH_KEY_DATA_KEY))
            .ok_or(HashKeyError::MissingDataKey)?;
        HashKey::new(&bytes.0)
    }

    /// The namespace's subkey, which keys v2 config hashes:
    /// `HMAC-SHA256(key, "helmop.dev/v2/namespace" || 0x00 || namespace)`. The tag separates it from
    /// every other use of the key (each hash encoding starts with a length prefix, never with this
    /// tag's bytes), and the NUL ends the tag: a namespace name never holds one.
    pub fn namespace_key(&self, namespace: &str) -> HashKey {
        let mut mac = self.mac();
        mac.update(NAMESPACE_KEY_TAG.as_bytes());
        mac.update(&[0]);
        mac.update(namespace.as_bytes());
        let sub = mac.finalize().into_bytes();
        // HMAC pads a key shorter than its 64-byte block with zeros (RFC 2104), so keying with the
        // padded block is HMAC keyed with the 32-byte subkey, without a fallible constructor.
        let mut block = hmac::digest::generic_array::GenericArray::default();
        block[..sub.len()].copy_from_slice(&sub);
        HashKey {
            mac: <HmacSha256 as hmac::digest::KeyInit>::new(&block),
        }
    }

    pub(crate) fn mac(&self) -> HmacSha256 {
        self.mac.clone()
    }
}

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HashKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn length_rule() {
        assert_eq!(
            HashKey::new(&[7; 31]).unwrap_err(),
            HashKeyError::TooShort { len: 31 }
        );
        assert!(HashKey::new(&[]).is_err());
        assert!(HashKey::new(&[7; 32]).is_ok());
        assert!(HashKey::new(&[7; 200]).is_ok());
        assert_eq!(
            HashKeyError::TooShort { len: 3 }.to_string(),
            "hash key is 3 bytes; it must be at least 32 random bytes"
        );
    }

    #[test]
    fn debug_hides_the_key() {
        let key = HashKey::new(b"0123456789abcdef0123456789abcdef").unwrap();
        let shown = format!("{key:?} {key:#?}");
        assert!(!shown.contains("0123"), "{shown}");
        assert!(!shown.contains("30313233"), "{shown}");
        assert_eq!(format!("{key:?}"), "HashKey(<redacted>)");
    }

    #[test]
    fn from_secret() {
        let mut secret = Secret::default();
        assert_eq!(
            HashKey::from_secret(&secret).unwrap_err(),
            HashKeyError::MissingDataKey
        );
        secret.data = Some(BTreeMap::from([(
            "key".to_string(),
            ByteString(vec![1; 8]),
        )]));
        assert_eq!(
            HashKey::from_secret(&secret).unwrap_err(),
            HashKeyError::TooShort { len: 8 }
        );
        secret.data = Some(BTreeMap::from([(
            "key".to_string(),
            ByteString(vec![1; 32]),
        )]));
        assert!(HashKey::from_secret(&secret).is_ok());
    }
}
