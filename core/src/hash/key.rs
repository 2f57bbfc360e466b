//! The cluster's hash key.

use std::fmt;

use hmac::{Hmac, Mac};
use k8s_openapi::api::core::v1::Secret;
use sha2::Sha256;

use crate::names;

pub(crate) type HmacSha256 = Hmac<Sha256>;

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
