//! The load generator: N keep-alive HTTP/1.1 connections, one task each, each sending `GET
//! /images/IMAGE[?transform=NAME]` as soon as its previous answer is read, until the duration is over; then the
//! requests per second and the latency distribution of the successful requests.
//!
//! It talks to loopback addresses only: it is the benchmark's client for a server on the same machine, not a tool
//! to point at other hosts.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper::header::HOST;
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use thiserror::Error;
use tokio::net::TcpStream;

/// How long one request may take before it counts as failed (and its connection is replaced).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What to load and for how long.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The server's base URL, `http://HOST:PORT` (a path, if any, is prefixed to the request's).
    pub url: String,
    pub image: String,
    pub transform: Option<String>,
    pub connections: usize,
    pub duration: Duration,
}

/// Why no load was generated.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("bad URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("{0} is not a loopback address: the load generator talks to this machine only")]
    NotLoopback(String),
    #[error("cannot resolve {host}: {reason}")]
    Resolve { host: String, reason: String },
    #[error("at least one connection is needed")]
    NoConnections,
}

/// The outcome of a run.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// The URL requested.
    pub url: String,
    pub connections: usize,
    /// The duration asked for, in seconds.
    pub duration_s: f64,
    /// From the first request to the last answer, in seconds (a little past the duration: requests in flight at
    /// its end are answered).
    pub elapsed_s: f64,
    /// Requests answered 200 with their whole body read.
    pub requests: u64,
    /// Requests that failed: another status, a broken connection, a timeout, a refused connection.
    pub failures: u64,
    /// Successful requests per second of `elapsed_s`.
    pub requests_per_s: f64,
    /// Latency of the successful requests in milliseconds (all zero when there were none).
    pub latency_ms: Latency,
    /// What the first failure was, if any.
    pub first_failure: Option<String>,
}

/// Latency percentiles, in milliseconds (nearest rank).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Latency {
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Latency {
    /// The percentiles of `samples` (sorted here).
    pub fn of(samples: &mut [Duration]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let rank = |p: f64| {
            // Nearest rank: the smallest sample with at least p of them at or below it.
            let index = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
            samples[index].as_secs_f64() * 1e3
        };
        Self { median: rank(0.5), p90: rank(0.9), p99: rank(0.99), max: rank(1.0) }
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}: {} connections for {:.1} s", self.url, self.connections, self.duration_s)?;
        writeln!(f, "requests: {} ({} failed) in {:.3} s", self.requests, self.failures, self.elapsed_s)?;
        writeln!(f, "requests/s: {:.1}", self.requests_per_s)?;
        let l = self.latency_ms;
        write!(f, "latency ms: median {:.3}, p90 {:.3}, p99 {:.3}, max {:.3}", l.median, l.p90, l.p99, l.max)?;
        if let Some(failure) = &self.first_failure {
            write!(f, "\nfirst failure: {failure}")?;
        }
        Ok(())
    }
}

/// Where to connect and what to ask.
struct Target {
    address: SocketAddr,
    host_header: String,
    path: String,
}

/// Runs the load on the caller's tokio runtime.
pub async fn run(config: &LoadConfig) -> Result<LoadReport, LoadError> {
    if config.connections == 0 {
        return Err(LoadError::NoConnections);
    }
    let target = std::sync::Arc::new(target(config).await?);
    let url = format!("http://{}{}", target.host_header, target.path);
    let started = Instant::now();
    let deadline = started + config.duration;
    let tasks: Vec<_> =
        (0..config.connections).map(|_| tokio::spawn(connection(std::sync::Arc::clone(&target), deadline))).collect();
    let mut samples = Vec::new();
    let mut failures = 0;
    let mut first_failure = None;
    for task in tasks {
        match task.await {
            Ok(outcome) => {
                samples.extend(outcome.latencies);
                failures += outcome.failures;
                first_failure = first_failure.or(outcome.first_failure);
            }
            Err(e) => {
                failures += 1;
                first_failure = first_failure.or(Some(format!("connection task failed: {e}")));
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let requests = samples.len() as u64;
    Ok(LoadReport {
        url,
        connections: config.connections,
        duration_s: config.duration.as_secs_f64(),
        elapsed_s: elapsed,
        requests,
        failures,
        requests_per_s: if elapsed > 0.0 { requests as f64 / elapsed } else { 0.0 },
        latency_ms: Latency::of(&mut samples),
        first_failure,
    })
}

/// The address (a loopback one) and request path of the configuration.
async fn target(config: &LoadConfig) -> Result<Target, LoadError> {
    let bad = |reason: &str| LoadError::Url { url: config.url.clone(), reason: reason.to_owned() };
    let uri: Uri = config.url.parse().map_err(|e: hyper::http::uri::InvalidUri| bad(&e.to_string()))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad("only http:// URLs"));
    }
    let authority = uri.authority().ok_or_else(|| bad("no host"))?;
    let host = authority.host();
    let port = authority.port_u16().unwrap_or(80);
    let address = match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        Ok(ip) if ip.is_loopback() => SocketAddr::new(ip, port),
        Ok(_) => return Err(LoadError::NotLoopback(host.to_owned())),
        Err(_) if host.eq_ignore_ascii_case("localhost") => {
            let mut found = tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| LoadError::Resolve { host: host.to_owned(), reason: e.to_string() })?;
            found.find(|a| a.ip().is_loopback()).ok_or_else(|| LoadError::NotLoopback(host.to_owned()))?
        }
        Err(_) => return Err(LoadError::NotLoopback(host.to_owned())),
    };
    let mut path = format!("{}/images/{}", uri.path().trim_end_matches('/'), config.image);
    if let Some(transform) = &config.transform {
        path.push_str("?transform=");
        path.push_str(transform);
    }
    Ok(Target { address, host_header: authority.as_str().to_owned(), path })
}

/// What one connection's task saw.
#[derive(Default)]
struct ConnectionOutcome {
    latencies: Vec<Duration>,
    failures: u64,
    first_failure: Option<String>,
}

impl ConnectionOutcome {
    fn fail(&mut self, what: String) {
        self.failures += 1;
        self.first_failure.get_or_insert(what);
    }
}

/// One keep-alive connection sending requests back to back until `deadline`; a broken connection is replaced, a
/// refused one ends the task (the server is gone).
async fn connection(target: std::sync::Arc<Target>, deadline: Instant) -> ConnectionOutcome {
    let mut outcome = ConnectionOutcome::default();
    let mut sender: Option<http1::SendRequest<Empty<Bytes>>> = None;
    while Instant::now() < deadline {
        let mut current = match sender.take() {
            Some(current) => current,
            None => match connect(target.address).await {
                Ok(current) => current,
                Err(e) => {
                    outcome.fail(format!("connecting to {}: {e}", target.address));
                    break;
                }
            },
        };
        let request = match Request::get(target.path.as_str())
            .header(HOST, target.host_header.as_str())
            .body(Empty::<Bytes>::new())
        {
            Ok(request) => request,
            Err(e) => {
                outcome.fail(format!("bad request: {e}"));
                break;
            }
        };
        let started = Instant::now();
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            current.ready().await?;
            let response = current.send_request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, body))
        })
        .await;
        match answer {
            Ok(Ok((StatusCode::OK, _))) => {
                outcome.latencies.push(started.elapsed());
                sender = Some(current);
            }
            Ok(Ok((status, body))) => {
                let text = String::from_utf8_lossy(&body[..body.len().min(200)]).trim_end().to_owned();
                outcome.fail(format!("{status}: {text}"));
                sender = Some(current);
            }
            Ok(Err(e)) => outcome.fail(format!("request failed: {e}")),
            Err(_) => outcome.fail(format!("no answer within {} s", REQUEST_TIMEOUT.as_secs())),
        }
    }
    outcome
}

async fn connect(address: SocketAddr) -> Result<http1::SendRequest<Empty<Bytes>>, String> {
    let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(address))
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    // The connection's driver; it ends when the sender is dropped or the server closes.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let latency = Latency::of(&mut samples);
        assert_eq!(latency, Latency { median: 50.0, p90: 90.0, p99: 99.0, max: 100.0 });
        assert_eq!(Latency::of(&mut [Duration::from_millis(7)]).p99, 7.0);
        assert_eq!(Latency::of(&mut []), Latency::default());
    }

    fn config(url: &str) -> LoadConfig {
        LoadConfig {
            url: url.into(),
            image: "55x55".into(),
            transform: Some("crop".into()),
            connections: 1,
            duration: Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn only_loopback_http_urls_are_loaded() {
        let t = target(&config("http://127.0.0.1:8080")).await.unwrap();
        assert_eq!((t.address.to_string(), t.path.as_str()), ("127.0.0.1:8080".into(), "/images/55x55?transform=crop"));
        let t = target(&config("http://[::1]:9/base/")).await.unwrap();
        assert_eq!((t.address.to_string(), t.path.as_str()), ("[::1]:9".into(), "/base/images/55x55?transform=crop"));
        assert!(matches!(target(&config("http://10.0.0.1:80")).await, Err(LoadError::NotLoopback(_))));
        assert!(matches!(target(&config("http://example.invalid")).await, Err(LoadError::NotLoopback(_))));
        assert!(matches!(target(&config("https://127.0.0.1")).await, Err(LoadError::Url { .. })));
    }
}
