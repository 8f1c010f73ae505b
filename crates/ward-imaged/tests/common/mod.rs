//! What the server tests share: a server process on loopback, HTTP requests, PPM, and the transforms' documented
//! behaviour computed in Rust.

#![allow(dead_code)] // each test binary uses part of it

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const BINARY: &str = env!("CARGO_BIN_EXE_ward-imaged");

pub fn runtime_source(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../extensions/runtime").join(format!("{name}.c"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A server this test started; killed and reaped when dropped.
pub struct ServerProcess {
    pub child: Child,
    pub address: String,
}

impl ServerProcess {
    pub fn start(extra: &[&str]) -> Self {
        let mut child = Command::new(BINARY)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting ward-imaged serve");
        let mut line = String::new();
        // The first line is the bound address; end of file means the server did not start.
        let stdout = child.stdout.take().expect("piped stdout");
        BufReader::new(stdout).read_line(&mut line).expect("reading the server's first line");
        let address = line.trim().to_owned();
        let server = Self { child, address };
        assert!(server.address.starts_with("127.0.0.1:"), "the server's first line is not its address: {line:?}");
        server
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// One request on a connection of its own: the status and the body.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let mut stream = TcpStream::connect(&self.address).expect("connecting to the server");
        // A generous bound, so a broken server fails the test instead of hanging it.
        stream.set_read_timeout(Some(Duration::from_secs(120))).expect("read timeout");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.address,
            body.len()
        );
        stream.write_all(head.as_bytes()).expect("sending the request");
        stream.write_all(body).expect("sending the body");
        let mut response = Vec::new();
        stream.read_to_end(&mut response).expect("reading the response");
        let split = response.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
        let head = String::from_utf8_lossy(&response[..split]).into_owned();
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status code");
        let content_length: Option<usize> = head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse().ok())?
        });
        let body = response[split + 4..].to_vec();
        if let Some(length) = content_length {
            assert_eq!(body.len(), length, "body length against content-length");
        }
        (status, body)
    }

    pub fn get(&self, path: &str) -> (u16, Vec<u8>) {
        self.request("GET", path, b"")
    }

    pub fn install(&self, name: &str, source: &str) -> (u16, String) {
        let (status, body) = self.request("PUT", &format!("/plugins/{name}"), source.as_bytes());
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    pub fn get_text(&self, path: &str) -> (u16, String) {
        let (status, body) = self.get(path);
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An image as the test reads it: width, height, RGB bytes.
#[derive(Debug, PartialEq)]
pub struct Rgb {
    pub width: usize,
    pub height: usize,
    pub pixels: Vec<u8>,
}

/// Reads the PPM the server writes: `P6\nW H\n255\n` and the pixels.
pub fn parse_ppm(bytes: &[u8]) -> Rgb {
    let mut fields = Vec::new();
    let mut at = 0;
    for _ in 0..4 {
        let end = at + bytes[at..].iter().position(|b| b.is_ascii_whitespace()).expect("a PPM header field");
        fields.push(std::str::from_utf8(&bytes[at..end]).expect("ASCII header").to_owned());
        at = end + 1;
    }
    assert_eq!((fields[0].as_str(), fields[3].as_str()), ("P6", "255"), "PPM header {fields:?}");
    let (width, height) = (fields[1].parse().unwrap(), fields[2].parse().unwrap());
    let pixels = bytes[at..].to_vec();
    assert_eq!(pixels.len(), width * height * 3, "PPM pixel bytes for {width}x{height}");
    Rgb { width, height, pixels }
}

/// grayscale.c: each pixel the BT.601 luma of its colour, in integers, rounded.
pub fn grayscale(image: &Rgb) -> Rgb {
    let pixels = image
        .pixels
        .chunks(3)
        .flat_map(|p| {
            let y = ((299 * p[0] as u32 + 587 * p[1] as u32 + 114 * p[2] as u32 + 500) / 1000) as u8;
            [y, y, y]
        })
        .collect();
    Rgb { width: image.width, height: image.height, pixels }
}

/// downsample.c: half each side (rounded up), each pixel the rounded mean of the up to four it covers.
pub fn downsample(image: &Rgb) -> Rgb {
    let (width, height) = (image.width.div_ceil(2), image.height.div_ceil(2));
    let mut pixels = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        for x in 0..width {
            for c in 0..3 {
                let mut covered = Vec::new();
                for (sx, sy) in [(2 * x, 2 * y), (2 * x + 1, 2 * y), (2 * x, 2 * y + 1), (2 * x + 1, 2 * y + 1)] {
                    if sx < image.width && sy < image.height {
                        covered.push(image.pixels[(sy * image.width + sx) * 3 + c] as usize);
                    }
                }
                let n = covered.len();
                pixels.push(((covered.iter().sum::<usize>() + n / 2) / n) as u8);
            }
        }
    }
    Rgb { width, height, pixels }
}

/// crop.c: the centre, half each side (rounded up).
pub fn crop(image: &Rgb) -> Rgb {
    let (width, height) = (image.width.div_ceil(2), image.height.div_ceil(2));
    let (x0, y0) = ((image.width - width) / 2, (image.height - height) / 2);
    let mut pixels = Vec::with_capacity(width * height * 3);
    for y in y0..y0 + height {
        let row = (y * image.width + x0) * 3;
        pixels.extend_from_slice(&image.pixels[row..row + width * 3]);
    }
    Rgb { width, height, pixels }
}

pub fn expected(transform: &str, image: &Rgb) -> Rgb {
    match transform {
        "grayscale" => grayscale(image),
        "downsample" => downsample(image),
        "crop" => crop(image),
        other => panic!("no expectation for {other}"),
    }
}
