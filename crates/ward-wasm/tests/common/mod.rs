//! What the tests share: the plugin sources, a compiler, generated images and the documented transforms in Rust.

#![allow(dead_code)]

use std::path::PathBuf;

use ward_wasm::{Image, ImageHeader, WasmCompiler};

/// `extensions/runtime/`, where the plugins and their header are.
pub fn runtime_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../extensions/runtime")
}

pub fn plugin_source(name: &str) -> String {
    let path = runtime_dir().join(format!("{name}.c"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A compiler for the plugins; fails the test, naming what to install, when the toolchain is missing.
pub fn compiler() -> WasmCompiler {
    WasmCompiler::new(ImageHeader::Directory(runtime_dir()))
        .unwrap_or_else(|e| panic!("the wasm32 toolchain is needed (run scripts/deps as root): {e}"))
}

/// An image whose every byte depends on its position and channel, so a misplaced pixel shows.
pub fn generated(width: u32, height: u32) -> Image {
    let mut pixels = Vec::with_capacity(width as usize * height as usize * 3);
    for y in 0..height {
        for x in 0..width {
            pixels.push((x * 7 + y * 13) as u8);
            pixels.push((x * 31 + y * 3 + 101) as u8);
            pixels.push((x * y + 17) as u8);
        }
    }
    Image::new(width, height, pixels).expect("generated image")
}

fn pixel(image: &Image, x: u32, y: u32) -> &[u8] {
    let at = (y as usize * image.width() as usize + x as usize) * 3;
    &image.pixels()[at..at + 3]
}

/// Each pixel the BT.601 luma of its colour, in integers, rounded.
pub fn grayscale(image: &Image) -> Image {
    let mut out = Vec::with_capacity(image.pixels().len());
    for p in image.pixels().chunks_exact(3) {
        let luma = ((299 * u32::from(p[0]) + 587 * u32::from(p[1]) + 114 * u32::from(p[2]) + 500) / 1000) as u8;
        out.extend_from_slice(&[luma, luma, luma]);
    }
    Image::new(image.width(), image.height(), out).expect("grayscale image")
}

/// Half the width and height, rounded up; each pixel the rounded mean of the up to four it covers.
pub fn downsample(image: &Image) -> Image {
    let (ow, oh) = (image.width().div_ceil(2), image.height().div_ceil(2));
    let mut out = Vec::with_capacity(ow as usize * oh as usize * 3);
    for y in 0..oh {
        for x in 0..ow {
            for c in 0..3 {
                let mut covered = Vec::new();
                for (sx, sy) in [(2 * x, 2 * y), (2 * x + 1, 2 * y), (2 * x, 2 * y + 1), (2 * x + 1, 2 * y + 1)] {
                    if sx < image.width() && sy < image.height() {
                        covered.push(u32::from(pixel(image, sx, sy)[c]));
                    }
                }
                let n = covered.len() as u32;
                out.push(((covered.iter().sum::<u32>() + n / 2) / n) as u8);
            }
        }
    }
    Image::new(ow, oh, out).expect("downsampled image")
}

/// The centre, half the width and height rounded up.
pub fn crop(image: &Image) -> Image {
    let (ow, oh) = (image.width().div_ceil(2), image.height().div_ceil(2));
    let (x0, y0) = ((image.width() - ow) / 2, (image.height() - oh) / 2);
    let mut out = Vec::with_capacity(ow as usize * oh as usize * 3);
    for y in 0..oh {
        for x in 0..ow {
            out.extend_from_slice(pixel(image, x0 + x, y0 + y));
        }
    }
    Image::new(ow, oh, out).expect("cropped image")
}

/// The sizes every transform is checked on: square, odd both ways, one pixel, one row, one column, and a large one
/// that makes the memory grow.
pub const SIZES: [(u32, u32); 7] = [(8, 8), (7, 5), (1, 1), (13, 1), (1, 9), (33, 17), (641, 479)];
