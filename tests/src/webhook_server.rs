//! The real admission webhook (serving stack and decision logic) run in-process on 127.0.0.1
//! with the throwaway test certificate, for suites that register it on a test cluster. It requires
//! the client certificate the harness's API servers present (`--client-ca`), so every suite using it
//! exercises that authentication too.

use std::sync::Arc;

use helmop_webhook::Metrics;
use helmop_webhook::server::{ServeOptions, Server};
use helmop_webhook::state::{AppState, Config, Options};
use kube::Client;

use crate::{DEFAULT_TIMEOUT, test_certs, wait_until};

/// A webhook serving on loopback (random ports), stopped when dropped (or by [`LocalWebhook::stop`]).
pub struct LocalWebhook {
    pub state: AppState,
    pub metrics: Metrics,
    /// `https://127.0.0.1:PORT`; append the endpoint path (`/mutate/workloads`).
    pub url: String,
    /// The CA a registration trusts the webhook with.
    pub ca_pem: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl LocalWebhook {
    /// Starts serving with default options and waits until the webhook's caches have synced.
    pub async fn start(client: Client, config: Config) -> anyhow::Result<LocalWebhook> {
        Self::start_with(client, config, Metrics::new(), Options::default()).await
    }

    /// [`LocalWebhook::start`] with `options` whose parts (e.g. an image resolver) report to
    /// `metrics`.
    pub async fn start_with(
        client: Client,
        config: Config,
        metrics: Metrics,
        options: Options,
    ) -> anyhow::Result<LocalWebhook> {
        let certs = test_certs();
        let dir = tempfile::tempdir()?;
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, &certs.cert_pem)?;
        std::fs::write(&key, &certs.key_pem)?;
        // Only the test API servers may call it, as in production with `--client-ca`.
        let client_ca = dir.path().join("client-ca.crt");
        std::fs::write(&client_ca, &crate::certs::webhook_client_pki().ca_pem)?;
        let state = AppState::start_with(client, config, &metrics, options).await?;
        let serve = ServeOptions {
            listen: "127.0.0.1:0".parse()?,
            admin_listen: "127.0.0.1:0".parse()?,
            tls_cert: cert,
            tls_key: key,
            client_ca: Some(client_ca),
            ..ServeOptions::default()
        };
        let server = Server::bind(serve, Arc::new(state.clone()), metrics.clone()).await?;
        let url = format!("https://{}", server.webhook_addr());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        wait_until("the webhook's caches to sync", DEFAULT_TIMEOUT, || {
            let ready = state.ready();
            async move { Ok(ready) }
        })
        .await?;
        Ok(LocalWebhook {
            state,
            metrics,
            url,
            ca_pem: certs.ca_pem,
            stop: Some(stop),
            _dir: dir,
        })
    }

    /// Stops serving now.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for LocalWebhook {
    fn drop(&mut self) {
        self.stop();
    }
}
