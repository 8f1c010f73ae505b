//! The HTTP server: images held in memory, transforms installed and removed by clients, images served as PPM
//! as they are or transformed.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /images` | the images, one a line: `NAME WIDTHxHEIGHT BYTES` |
//! | `GET /images/IMAGE` | the image as binary PPM |
//! | `GET /images/IMAGE?transform=NAME` | the image transformed by NAME, as binary PPM; 404 for an unknown image or transform, 502 when the transform faults (crash, hang past the quantum, bad output), 500 when the machinery fails |
//! | `GET /plugins` | the installed transforms, one name a line |
//! | `PUT /plugins/NAME` | installs the C source in the body as NAME: 201; 400 with the compiler's message (line and column) when it does not compile or does not define NAME; 409 when NAME is taken; 413 when the source is too large |
//! | `DELETE /plugins/NAME` | removes NAME: 204; 404 when unknown |
//!
//! Error bodies are short plain text naming what failed. HTTP/1.1 with keep-alive, one task a connection on the
//! tokio runtime the caller runs; every call into the [`Transforms`] goes to tokio's blocking pool, so a slow
//! compilation or transform never holds a reactor thread.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::net::TcpListener;

use crate::image::{self, Image};
use crate::transforms::{check_name, ApplyError, InstallError, RemoveError, Transforms};

/// The media type of binary PPM.
pub const PPM_TYPE: &str = "image/x-portable-pixmap";

/// The largest plugin source accepted by default.
pub const DEFAULT_MAX_SOURCE_BYTES: usize = 1 << 20;

/// The images a server holds, by name.
#[derive(Default)]
pub struct Images {
    by_name: BTreeMap<String, Stored>,
}

/// An image and its PPM encoding, made once: an untransformed image is served without copying.
struct Stored {
    image: Arc<Image>,
    ppm: Bytes,
}

/// Why an image was not added.
#[derive(Debug, Error)]
pub enum ImagesError {
    #[error("image name {0:?} is not usable in a URL (letters, digits, '.', '_' and '-' only)")]
    InvalidName(String),
    #[error("two images are named {0}")]
    Duplicate(String),
}

impl Images {
    /// The four generated images of [`image::generated`].
    pub fn generated() -> Self {
        let mut images = Self::default();
        for (name, image) in image::generated() {
            // Generated names are distinct and valid.
            let _ = images.add(name, image);
        }
        images
    }

    /// Adds an image under `name`, a path segment of the URL as it is.
    pub fn add(&mut self, name: String, image: Image) -> Result<(), ImagesError> {
        let valid =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid || name.starts_with('.') {
            return Err(ImagesError::InvalidName(name));
        }
        if self.by_name.contains_key(&name) {
            return Err(ImagesError::Duplicate(name));
        }
        let ppm = Bytes::from(image.to_ppm());
        self.by_name.insert(name, Stored { image: Arc::new(image), ppm });
        Ok(())
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

/// What a server holds: its images, its transforms and its limits.
pub struct Server {
    images: Images,
    transforms: Arc<dyn Transforms>,
    max_source_bytes: usize,
}

impl Server {
    pub fn new(images: Images, transforms: Arc<dyn Transforms>) -> Self {
        Self { images, transforms, max_source_bytes: DEFAULT_MAX_SOURCE_BYTES }
    }

    /// Sets the largest plugin source accepted (413 beyond it).
    pub fn max_source_bytes(mut self, bytes: usize) -> Self {
        self.max_source_bytes = bytes;
        self
    }

    /// Serves connections from `listener` until an error of the listener itself; runs on the caller's tokio
    /// runtime (multi-thread, so connections and blocking calls proceed in parallel).
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                // Out of descriptors or a connection reset before it was accepted: wait a moment (retrying at
                // once would spin) and go on serving the connections that exist.
                Err(e) if is_transient_accept_error(&e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Responses are written whole; Nagle's algorithm would only delay the last segment of each.
            let _ = stream.set_nodelay(true);
            let server = Arc::clone(&self);
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let server = Arc::clone(&server);
                    async move { Ok::<_, Infallible>(server.handle(request).await) }
                });
                if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
                    tracing::debug!("connection: {e}");
                }
            });
        }
    }

    /// Answers one request.
    pub async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = request.uri().path().to_owned();
        let query = request.uri().query().map(str::to_owned);
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let method = request.method().clone();
        match (&method, segments.as_slice()) {
            (&Method::GET, ["images"]) => {
                let listing = image::listing(self.images.by_name.iter().map(|(n, s)| (n.as_str(), &*s.image)));
                text(StatusCode::OK, listing)
            }
            (&Method::GET, ["images", name]) => self.get_image(name, query.as_deref()).await,
            (&Method::GET, ["plugins"]) => {
                let transforms = Arc::clone(&self.transforms);
                match tokio::task::spawn_blocking(move || transforms.names()).await {
                    Ok(names) => text(StatusCode::OK, names.iter().map(|n| format!("{n}\n")).collect::<String>()),
                    Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("listing transforms failed: {e}\n")),
                }
            }
            (&Method::PUT, ["plugins", name]) => self.install(name, request).await,
            (&Method::DELETE, ["plugins", name]) => self.remove(name).await,
            (_, ["images"] | ["images", _] | ["plugins"]) => not_allowed("GET"),
            (_, ["plugins", _]) => not_allowed("PUT, DELETE"),
            _ => text(StatusCode::NOT_FOUND, format!("no such resource: {path}\n")),
        }
    }

    async fn get_image(&self, name: &str, query: Option<&str>) -> Response<Full<Bytes>> {
        let Some(stored) = self.images.by_name.get(name) else {
            return text(StatusCode::NOT_FOUND, format!("no image {name}\n"));
        };
        let transform = match transform_parameter(query) {
            Ok(None) => return ppm(stored.ppm.clone()),
            Ok(Some(transform)) => transform,
            Err(message) => return text(StatusCode::BAD_REQUEST, message),
        };
        let transforms = Arc::clone(&self.transforms);
        let image = Arc::clone(&stored.image);
        let name = transform.clone();
        let applied = tokio::task::spawn_blocking(move || transforms.apply(&name, &image)).await;
        match applied {
            Ok(Ok(output)) => ppm(Bytes::from(output.to_ppm())),
            Ok(Err(e)) => {
                let status = match &e {
                    ApplyError::Unknown(_) => StatusCode::NOT_FOUND,
                    ApplyError::Fault { .. } => StatusCode::BAD_GATEWAY,
                    ApplyError::Backend { .. } => StatusCode::INTERNAL_SERVER_ERROR,
                };
                if status != StatusCode::NOT_FOUND {
                    tracing::warn!("{e}");
                }
                text(status, format!("{e}\n"))
            }
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("transform {transform} failed: {e}\n")),
        }
    }

    async fn install(&self, name: &str, request: Request<Incoming>) -> Response<Full<Bytes>> {
        if let Err(e) = check_name(name) {
            return text(StatusCode::BAD_REQUEST, format!("{e}\n"));
        }
        let too_large = || {
            text(StatusCode::PAYLOAD_TOO_LARGE, format!("plugin source larger than {} bytes\n", self.max_source_bytes))
        };
        let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|length| length > self.max_source_bytes as u64) {
            return too_large();
        }
        let body = match Limited::new(request.into_body(), self.max_source_bytes).collect().await {
            Ok(body) => body.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("reading the plugin source failed: {e}\n")),
        };
        let Ok(source) = String::from_utf8(body.to_vec()) else {
            return text(StatusCode::BAD_REQUEST, format!("the source of {name} is not UTF-8\n"));
        };
        let transforms = Arc::clone(&self.transforms);
        let owned = name.to_owned();
        match tokio::task::spawn_blocking(move || transforms.install(&owned, &source)).await {
            Ok(Ok(())) => {
                tracing::info!("installed transform {name}");
                text(StatusCode::CREATED, format!("installed {name}\n"))
            }
            Ok(Err(e)) => {
                let status = match &e {
                    InstallError::NameTaken(_) => StatusCode::CONFLICT,
                    InstallError::Backend { .. } => StatusCode::INTERNAL_SERVER_ERROR,
                    InstallError::InvalidName { .. }
                    | InstallError::Compile { .. }
                    | InstallError::MissingFunction { .. }
                    | InstallError::InvalidSource { .. } => StatusCode::BAD_REQUEST,
                };
                text(status, format!("{e}\n"))
            }
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("installing {name} failed: {e}\n")),
        }
    }

    async fn remove(&self, name: &str) -> Response<Full<Bytes>> {
        let transforms = Arc::clone(&self.transforms);
        let owned = name.to_owned();
        match tokio::task::spawn_blocking(move || transforms.remove(&owned)).await {
            Ok(Ok(())) => {
                tracing::info!("removed transform {name}");
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = StatusCode::NO_CONTENT;
                response
            }
            Ok(Err(e @ RemoveError::Unknown(_))) => text(StatusCode::NOT_FOUND, format!("{e}\n")),
            Ok(Err(e)) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("removing {name} failed: {e}\n")),
        }
    }
}

/// The transform a query names (`transform=NAME`), if any; any other parameter is an error, so a misspelt one is
/// not answered with the untransformed image.
fn transform_parameter(query: Option<&str>) -> Result<Option<String>, String> {
    let mut transform = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("transform", value)) if transform.is_none() => transform = Some(value.to_owned()),
            Some(("transform", _)) => return Err("transform given twice\n".into()),
            _ => return Err(format!("unknown query parameter {pair:?} (only transform=NAME)\n")),
        }
    }
    Ok(transform)
}

fn is_transient_accept_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock)
        || matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

fn ppm(bytes: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(bytes));
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(PPM_TYPE));
    response
}

fn not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut response = text(StatusCode::METHOD_NOT_ALLOWED, format!("method not allowed (allowed: {allow})\n"));
    response.headers_mut().insert(ALLOW, HeaderValue::from_static(allow));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_names_one_transform_or_none() {
        assert_eq!(transform_parameter(None), Ok(None));
        assert_eq!(transform_parameter(Some("")), Ok(None));
        assert_eq!(transform_parameter(Some("transform=crop")), Ok(Some("crop".into())));
        assert!(transform_parameter(Some("transfrom=crop")).is_err());
        assert!(transform_parameter(Some("transform=a&transform=b")).is_err());
    }

    #[test]
    fn image_names_must_be_url_segments_and_distinct() {
        let mut images = Images::generated();
        assert_eq!(images.names().collect::<Vec<_>>(), ["1050x1050", "182x182", "300x300", "55x55"]);
        let one = image::pattern(1, 1);
        assert!(matches!(images.add("55x55".into(), one.clone()), Err(ImagesError::Duplicate(_))));
        for bad in ["", "a b", "../x", ".hidden", "a/b", "a?b"] {
            assert!(matches!(images.add(bad.into(), one.clone()), Err(ImagesError::InvalidName(_))), "{bad:?}");
        }
        assert!(images.add("photo-1.v2_x".into(), one).is_ok());
    }
}
