//! A TCP forwarder in front of a real API server that can hold every request back (`stall`), so a
//! client behind it sees an API server that is slow, not one that fails: connections stay open and
//! nothing is answered until the stall ends. It can also play an outage (`outage`): every connection
//! closed and new ones closed at once, as an unreachable load balancer, while the API server stays up
//! and keeps its history (so a client can resume its watches afterwards).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards connections on `addr` to the upstream; dropped, it stops accepting and forwarding.
pub struct StallingProxy {
    pub addr: SocketAddr,
    stalled: watch::Sender<bool>,
    /// The number of outages started so far, and whether one is on.
    outages: watch::Sender<(u64, bool)>,
    task: tokio::task::JoinHandle<()>,
}

impl StallingProxy {
    /// Listens on the upstream's own IP (so the API server's certificate still names it), any port.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<StallingProxy> {
        let listener = TcpListener::bind(SocketAddr::new(upstream.ip(), 0)).await?;
        let addr = listener.local_addr()?;
        let (stalled, rx) = watch::channel(false);
        let (outages, outage_rx) = watch::channel((0, false));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let rx = rx.clone();
                let mut outage = outage_rx.clone();
                // Closed at once during an outage (dropped), else until the next outage starts.
                let (started, on) = *outage.borrow_and_update();
                if on {
                    continue;
                }
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let next = outage.wait_for(|&(n, on)| on && n > started);
                        tokio::select! {
                            () = forward(client, server, rx) => {}
                            _ = next => {}
                        }
                    }
                });
            }
        });
        Ok(StallingProxy {
            addr,
            stalled,
            outages,
            task,
        })
    }

    /// From now on, bytes from clients wait (answers already under way still arrive); `false` lets
    /// them through again.
    pub fn stall(&self, on: bool) {
        self.stalled.send_replace(on);
    }

    /// `true` closes every connection forwarded so far and, until `false`, each new one at once.
    pub fn outage(&self, on: bool) {
        self.outages.send_modify(|(n, was)| {
            if on && !*was {
                *n += 1;
            }
            *was = on;
        });
    }

    /// `https://ADDR` of the proxy, for a client's cluster URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(client: TcpStream, server: TcpStream, mut stalled: watch::Receiver<bool>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            while *stalled.borrow_and_update() {
                if stalled.changed().await.is_err() {
                    return;
                }
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// The `IP:PORT` of `cluster`'s API server, for [`StallingProxy::start`].
pub fn server_addr(cluster: &crate::ClusterInfo) -> anyhow::Result<SocketAddr> {
    use anyhow::Context;
    let hostport = cluster
        .server
        .strip_prefix("https://")
        .context("the API server URL is not https://")?;
    hostport.trim_end_matches('/').parse().with_context(|| {
        format!(
            "the API server URL {:?} is not https://IP:PORT",
            cluster.server
        )
    })
}

/// A kubeconfig file for `cluster` that talks through `proxy` (the same IP, so the API server's
/// certificate still matches); removed when dropped.
pub fn kubeconfig_through(
    cluster: &crate::ClusterInfo,
    proxy: &StallingProxy,
) -> anyhow::Result<tempfile::NamedTempFile> {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(
        file.path(),
        cluster
            .kubeconfig_yaml()
            .replace(&cluster.server, &proxy.url()),
    )?;
    Ok(file)
}
