//! The Prometheus endpoint: `GET /metrics` over HTTP/1.1 (hyper), for `skipprd serve` and, when
//! `skippr.metrics.listen` is set, `skipprd sync`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::{Context, Error, Result};
use crate::telemetry::metrics;

/// Runs before each scrape, to refresh gauges that are read rather than counted.
pub type ScrapeHook = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// A slow or stuck client is dropped after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the endpoint's address, with an error that names the setting.
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Error::config(format!(
            "cannot listen on {addr} (skippr.metrics.listen): {e}; choose a free port"
        ))
    })?;
    let local = listener
        .local_addr()
        .context("reading the metrics address")?;
    tracing::info!(address = %local, "metrics at http://{local}/metrics");
    Ok(listener)
}

/// Serves until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    hook: Option<ScrapeHook>,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors or similar: back off instead of spinning.
                        tracing::warn!(error = %e, "metrics endpoint cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let hook = hook.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| respond(req, hook.clone()));
                    let conn = http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(REQUEST_TIMEOUT)
                        .serve_connection(TokioIo::new(socket), service);
                    match tokio::time::timeout(REQUEST_TIMEOUT, conn).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::debug!(peer = %peer, error = %e, "metrics request failed"),
                        Err(_) => tracing::debug!(peer = %peer, "metrics client too slow; dropped"),
                    }
                });
            }
            _ = stop.changed() => {
                if *stop.borrow() {
                    return Ok(());
                }
            }
        }
    }
}

async fn respond(
    req: Request<Incoming>,
    hook: Option<ScrapeHook>,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path();
    let (status, content_type, body) = match (req.method(), path) {
        (&Method::GET, "/metrics") => {
            if let Some(hook) = hook {
                hook().await;
            }
            (StatusCode::OK, metrics::CONTENT_TYPE, metrics::render())
        }
        (&Method::GET, "/") => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "skipprd: metrics at /metrics\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: metrics are at /metrics\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn serves_metrics_runs_the_hook_and_stops() {
        let listener = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = watch::channel(false);
        let hook: ScrapeHook = Arc::new(|| {
            Box::pin(async {
                metrics::set("skippr_endpoint_test", "Set by the scrape hook.", &[], 1.0)
            })
        });
        let server = tokio::spawn(serve(listener, Some(hook), rx));
        let ok = get(addr, "/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("application/openmetrics-text"), "{ok}");
        assert!(ok.contains("skippr_endpoint_test 1.0"), "{ok}");
        let missing = get(addr, "/other").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        tx.send(true).expect("stop");
        server.await.expect("join").expect("serve");
    }
}
