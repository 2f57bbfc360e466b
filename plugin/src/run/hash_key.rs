//! The upstream cluster's hash key (the HMAC key of every content hash): Secret `helmop-system/helmop-hash-key`,
//! 32 random bytes under data key `key`. Copies' `helmop.dev/content-hash` values are keyed with
//! it. `propagate` creates it when it is absent and the user may; other commands never write and
//! fall back to a throw-away key (then every copy reads as changed, which is the truth as far as
//! anyone can tell without the key).
//!
//! The key's bytes never leave this process: not in logs, errors or output.

use std::collections::BTreeMap;

use helmop_core::hash::HashKey;
use helmop_core::names::{HASH_KEY_DATA_KEY, HASH_KEY_SECRET, SYSTEM_NAMESPACE};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::cluster::api_error;
use crate::error::PluginError;

/// Bytes of a newly created key.
pub const NEW_KEY_LEN: usize = 32;

/// Where the key in use came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum KeyOrigin {
    /// Read from the Secret.
    Existing,
    /// The Secret was absent; this run created it.
    Created,
    /// The Secret was absent and this run may not create it (dry run, status): a random key
    /// only this process knows.
    Ephemeral,
}

/// Reads the upstream hash key; when absent, creates it (`create`) or makes an ephemeral one.
pub async fn load(
    client: &Client,
    create: bool,
    on_write: impl Fn(),
) -> Result<(HashKey, KeyOrigin), PluginError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let what = format!("reading the hash key Secret {SYSTEM_NAMESPACE}/{HASH_KEY_SECRET}");
    if let Some(secret) = secrets
        .get_opt(HASH_KEY_SECRET)
        .await
        .map_err(|e| api_error::upstream(&what, &e))?
    {
        return Ok((from_secret(&secret)?, KeyOrigin::Existing));
    }
    if !create {
        return Ok((random_key()?.0, KeyOrigin::Ephemeral));
    }
    ensure_namespace(client, &on_write).await?;
    let (key, bytes) = random_key()?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(HASH_KEY_SECRET.into()),
            namespace: Some(SYSTEM_NAMESPACE.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".to_string(),
                "helmop".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            HASH_KEY_DATA_KEY.to_string(),
            ByteString(bytes),
        )])),
        ..Secret::default()
    };
    let pp = PostParams {
        field_manager: Some(helmop_core::names::MANAGER.into()),
        ..PostParams::default()
    };
    match secrets.create(&pp, &secret).await {
        Ok(_) => {
            on_write();
            Ok((key, KeyOrigin::Created))
        }
        // Someone else (another propagate, the installer) was quicker: use theirs.
        Err(e) if api_error::is_conflict(&e) => {
            let secret = secrets
                .get(HASH_KEY_SECRET)
                .await
                .map_err(|e| api_error::upstream(&what, &e))?;
            Ok((from_secret(&secret)?, KeyOrigin::Existing))
        }
        Err(e) => Err(api_error::upstream(
            &format!(
                "the hash key Secret {SYSTEM_NAMESPACE}/{HASH_KEY_SECRET} is missing and cannot be created"
            ),
            &e,
        )),
    }
}

fn from_secret(secret: &Secret) -> Result<HashKey, PluginError> {
    HashKey::from_secret(secret).map_err(|e| {
        PluginError::Upstream(format!(
            "the hash key Secret {SYSTEM_NAMESPACE}/{HASH_KEY_SECRET} is unusable: {e}"
        ))
    })
}

/// A fresh key from the operating system's random source, and its bytes (to store).
fn random_key() -> Result<(HashKey, Vec<u8>), PluginError> {
    let mut bytes = vec![0u8; NEW_KEY_LEN];
    getrandom::fill(&mut bytes).map_err(|e| {
        PluginError::Upstream(format!("cannot get random bytes for a hash key: {e}"))
    })?;
    let key = HashKey::new(&bytes)
        .map_err(|e| PluginError::Upstream(format!("cannot make a hash key: {e}")))?;
    Ok((key, bytes))
}

async fn ensure_namespace(client: &Client, on_write: &impl Fn()) -> Result<(), PluginError> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let what = format!("creating namespace {SYSTEM_NAMESPACE} for the hash key");
    if namespaces
        .get_opt(SYSTEM_NAMESPACE)
        .await
        .map_err(|e| api_error::upstream(&what, &e))?
        .is_some()
    {
        return Ok(());
    }
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(SYSTEM_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {
            on_write();
            Ok(())
        }
        Err(e) if api_error::is_conflict(&e) => Ok(()),
        Err(e) => Err(api_error::upstream(&what, &e)),
    }
}
