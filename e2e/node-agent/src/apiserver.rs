//! Makes the apiserver reachable from Pods. There is no kube-proxy here, so the `kubernetes` Service's
//! ClusterIP is not routable, and the e2e apiserver listens on 127.0.0.1 of the host, which inside a Pod's
//! network namespace is the Pod itself. The agent therefore listens on the bridge (node) address at the
//! apiserver's port and relays TCP to the apiserver; TLS stays end to end, so the apiserver's serving
//! certificate must name the bridge address (e2e/cluster/up.sh adds it from `POD_CIDR`). Containers get
//! `KUBERNETES_SERVICE_HOST/PORT` pointing at that address ([`crate::env::apiserver_env`]).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::{Error, Result};

/// Most relayed connections at once (each holds two 8 KiB copy buffers).
pub const MAX_CONNECTIONS: usize = 512;

/// The apiserver address a kubeconfig's cluster URL points at (`https://HOST:PORT`, port 443 if absent).
pub async fn target_of(cluster_url: &http::Uri) -> Result<SocketAddr> {
    let host = cluster_url
        .host()
        .ok_or_else(|| Error::Apiserver(format!("cluster URL {cluster_url} has no host")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = cluster_url.port_u16().unwrap_or(443);
    let mut addrs = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(Error::io(format!("resolving apiserver host {host}")))?;
    addrs
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| Error::Apiserver(format!("{host}:{port} has no IPv4 address")))
}

/// Binds `listen` and relays every connection to `target` until the returned task is aborted.
pub async fn relay(listen: SocketAddr, target: SocketAddr) -> Result<JoinHandle<()>> {
    let listener = TcpListener::bind(listen).await.map_err(Error::io(format!(
        "binding the apiserver relay on {listen}"
    )))?;
    tracing::info!(%listen, %target, "apiserver relay for Pods");
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    Ok(tokio::spawn(async move {
        loop {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let (mut inbound, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "apiserver relay accept");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            tokio::spawn(async move {
                let _permit = permit;
                match TcpStream::connect(target).await {
                    Ok(mut out) => {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                    Err(e) => tracing::warn!(%peer, error = %e, "apiserver relay connect"),
                }
            });
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn relays_bytes_both_ways() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = upstream.local_addr().unwrap();
        let echo = tokio::spawn(async move {
            let (mut s, _) = upstream.accept().await.unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        });
        // Find a free port for the relay, then bind it.
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen: SocketAddr = ([127, 0, 0, 1], port).into();
        let task = relay(listen, target).await.unwrap();
        let mut c = TcpStream::connect(listen).await.unwrap();
        c.write_all(b"hello").await.unwrap();
        let mut back = [0u8; 5];
        tokio::time::timeout(std::time::Duration::from_secs(5), c.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&back, b"hello");
        echo.await.unwrap();
        task.abort();
    }

    #[tokio::test]
    async fn target_from_cluster_url() {
        let u: http::Uri = "https://127.0.0.1:26443".parse().unwrap();
        assert_eq!(
            target_of(&u).await.unwrap(),
            "127.0.0.1:26443".parse().unwrap()
        );
        let u: http::Uri = "https://127.0.0.1".parse().unwrap();
        assert_eq!(target_of(&u).await.unwrap().port(), 443);
    }
}
