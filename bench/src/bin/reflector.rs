//! `helmop-bench-reflector`: the baseline of `helmop-bench rollout-watch`. It holds what a watcher that
//! caches every Secret and ConfigMap whole holds (Reloader's approach): kube-runtime reflectors on
//! `Api<Secret>::all` and `Api<ConfigMap>::all`, data included, kept current until SIGTERM. A separate
//! process so that its RSS compares with the rollout watcher's.
//!
//! Cluster from `KUBECONFIG` (or in-cluster). Prints one JSON line once both stores listed:
//! `{"event":"synced","secrets":N,"configMaps":M}`.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

/// A reflector over every object of `K`, driven until the watch ends; its store.
fn reflect<K>(client: &Client) -> (Store<K>, impl std::future::Future<Output = ()> + use<K>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = reflector::reflector(
        writer,
        watcher::watcher(Api::<K>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .applied_objects();
    let drive = async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                eprintln!("helmop-bench-reflector: watch error (retrying): {e}");
            }
        }
    };
    (store, drive)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let (secrets, drive_secrets) = reflect::<Secret>(&client);
    let (config_maps, drive_config_maps) = reflect::<ConfigMap>(&client);
    let report = async {
        secrets.wait_until_ready().await?;
        config_maps.wait_until_ready().await?;
        println!(
            "{}",
            serde_json::json!({
                "event": "synced",
                "secrets": secrets.state().len(),
                "configMaps": config_maps.state().len(),
            })
        );
        anyhow::Ok(())
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        () = drive_secrets => {}
        () = drive_config_maps => {}
        _ = term.recv() => return Ok(()),
        r = async { report.await?; std::future::pending::<anyhow::Result<()>>().await } => r?,
    }
    Ok(())
}
