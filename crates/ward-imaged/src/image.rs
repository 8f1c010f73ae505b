//! RGB images in the layout of the transform ABI (`ward_image.h`): width × height pixels, three bytes each (red,
//! green, blue), rows top to bottom; binary PPM (P6) in and out; the transform's output buffer checked and read.
//!
//! An [`Image`] can hold only valid states: both sides between 1 and [`MAX_SIDE`] and exactly `width * height * 3`
//! bytes of pixels. Everything that makes one from outside bytes (a PPM file, a transform's output) goes through a
//! checked constructor, so the server never indexes past a buffer a client or a plugin described.

use std::fmt::Write as _;

use thiserror::Error;

/// The largest width or height the transform ABI accepts (`ward_image_args_ok`).
pub const MAX_SIDE: usize = 65536;

/// Bytes of the header a transform writes before its pixels: two little-endian int64, width and height.
pub const OUTPUT_HEADER: usize = 16;

/// An RGB image, three bytes a pixel.
#[derive(Clone, PartialEq, Eq)]
pub struct Image {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A few million pixel bytes help no one reading a failed assertion.
        write!(f, "Image({}x{})", self.width, self.height)
    }
}

/// Why bytes do not make an image.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ImageError {
    /// A side is zero or larger than the ABI allows.
    #[error("image size {width}x{height} out of range (each side 1 to {MAX_SIDE})")]
    Size { width: usize, height: usize },
    /// The pixel bytes do not match the size.
    #[error("{width}x{height} image needs {expected} bytes of pixels, got {actual}")]
    PixelLength { width: usize, height: usize, expected: usize, actual: usize },
}

impl Image {
    /// An image of the given size from its pixel bytes (`width * height * 3` of them).
    pub fn new(width: usize, height: usize, pixels: Vec<u8>) -> Result<Self, ImageError> {
        if !(1..=MAX_SIDE).contains(&width) || !(1..=MAX_SIDE).contains(&height) {
            return Err(ImageError::Size { width, height });
        }
        // Cannot overflow: both sides are at most 2^16.
        let expected = width * height * 3;
        if pixels.len() != expected {
            return Err(ImageError::PixelLength { width, height, expected, actual: pixels.len() });
        }
        Ok(Self { width, height, pixels })
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn height(&self) -> usize {
        self.height
    }

    /// The pixels, three bytes each, rows top to bottom.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// The bytes a host offers a transform for its output: always enough, since no transform's output is larger
    /// than its input's pixels plus the header (`ward_image.h`).
    pub fn output_capacity(&self) -> usize {
        OUTPUT_HEADER + self.pixels.len()
    }

    /// The image as a binary PPM (P6, maxval 255).
    pub fn to_ppm(&self) -> Vec<u8> {
        let header = format!("P6\n{} {}\n255\n", self.width, self.height);
        let mut ppm = Vec::with_capacity(header.len() + self.pixels.len());
        ppm.extend_from_slice(header.as_bytes());
        ppm.extend_from_slice(&self.pixels);
        ppm
    }

    /// An image from a binary PPM (P6). Comments (`#` to the end of a line) are allowed where the format allows
    /// them; a maxval below 255 is scaled to 255; 16-bit samples (maxval above 255) are refused.
    pub fn from_ppm(bytes: &[u8]) -> Result<Self, PpmError> {
        let mut reader = PpmReader { bytes, at: 0 };
        if reader.bytes.get(..2) != Some(b"P6") {
            return Err(PpmError::NotP6);
        }
        reader.at = 2;
        let width = reader.number("width")?;
        let height = reader.number("height")?;
        let maxval = reader.number("maxval")?;
        // Exactly one whitespace byte separates the maxval from the pixels.
        match reader.bytes.get(reader.at) {
            Some(b) if b.is_ascii_whitespace() => reader.at += 1,
            _ => return Err(PpmError::Header("no whitespace after the maxval")),
        }
        if !(1..=255).contains(&maxval) {
            return Err(PpmError::Maxval(maxval));
        }
        if !(1..=MAX_SIDE).contains(&width) || !(1..=MAX_SIDE).contains(&height) {
            return Err(PpmError::Image(ImageError::Size { width, height }));
        }
        let expected = width * height * 3;
        let body = &reader.bytes[reader.at..];
        if body.len() < expected {
            return Err(PpmError::Image(ImageError::PixelLength { width, height, expected, actual: body.len() }));
        }
        let mut pixels = body[..expected].to_vec();
        if maxval != 255 {
            for sample in &mut pixels {
                let value = usize::from(*sample).min(maxval);
                // At most 255 * 255 / 1 before the division, and the result at most 255.
                *sample = ((value * 255 + maxval / 2) / maxval) as u8;
            }
        }
        Ok(Self::new(width, height, pixels)?)
    }

    /// The image a transform wrote into `out` (its output buffer) when it returned `returned`: checks the return
    /// value against the buffer and the header against the return value, as a host must before it trusts a byte.
    pub fn from_transform_output(out: &[u8], returned: i64) -> Result<Self, OutputError> {
        if returned < 0 {
            return Err(OutputError::Refused(returned));
        }
        let length = usize::try_from(returned).map_err(|_| OutputError::Length { returned, capacity: out.len() })?;
        if length < OUTPUT_HEADER || length > out.len() {
            return Err(OutputError::Length { returned, capacity: out.len() });
        }
        let side = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&out[at..at + 8]);
            i64::from_le_bytes(raw)
        };
        let (width, height) = (side(0), side(8));
        let valid = |s: i64| usize::try_from(s).ok().filter(|s| (1..=MAX_SIDE).contains(s));
        let (Some(w), Some(h)) = (valid(width), valid(height)) else {
            return Err(OutputError::Header { width, height });
        };
        let expected = OUTPUT_HEADER + w * h * 3;
        if length != expected {
            return Err(OutputError::Mismatch { width: w, height: h, expected, returned: length });
        }
        Ok(Self { width: w, height: h, pixels: out[OUTPUT_HEADER..length].to_vec() })
    }
}

/// Why a transform's output is not an image: a fault of the transform.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OutputError {
    /// The transform returned a negative number: it refused its arguments.
    #[error("refused its arguments (returned {0})")]
    Refused(i64),
    /// The return value is shorter than the header or longer than the buffer offered.
    #[error("returned {returned} bytes, outside 16 to {capacity} (the header to the buffer's size)")]
    Length { returned: i64, capacity: usize },
    /// The header's width or height is not a valid side.
    #[error("wrote a header of {width}x{height}, not an image size")]
    Header { width: i64, height: i64 },
    /// The header's size does not match the bytes returned.
    #[error("wrote a {width}x{height} header ({expected} bytes with it) but returned {returned}")]
    Mismatch { width: usize, height: usize, expected: usize, returned: usize },
}

/// Why bytes are not a PPM image this server reads.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PpmError {
    #[error("not a binary PPM (does not start with P6)")]
    NotP6,
    #[error("PPM header: {0}")]
    Header(&'static str),
    #[error("PPM maxval {0} not supported (1 to 255)")]
    Maxval(usize),
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// The header fields of a PPM: decimal numbers separated by whitespace and comments.
struct PpmReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl PpmReader<'_> {
    fn number(&mut self, what: &'static str) -> Result<usize, PpmError> {
        loop {
            match self.bytes.get(self.at) {
                Some(b) if b.is_ascii_whitespace() => self.at += 1,
                Some(b'#') => {
                    while self.bytes.get(self.at).is_some_and(|&b| b != b'\n' && b != b'\r') {
                        self.at += 1;
                    }
                }
                Some(_) => break,
                None => return Err(PpmError::Header("ends before the header does")),
            }
        }
        let start = self.at;
        let mut value: usize = 0;
        while let Some(&b) = self.bytes.get(self.at).filter(|b| b.is_ascii_digit()) {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(usize::from(b - b'0')))
                .ok_or(PpmError::Header("number too large"))?;
            self.at += 1;
        }
        if self.at == start {
            return Err(PpmError::Header(match what {
                "width" => "width is not a number",
                "height" => "height is not a number",
                _ => "maxval is not a number",
            }));
        }
        Ok(value)
    }
}

/// The sides of the images the server makes by default: pixel data of about 9 KB, 99 KB, 270 KB and 3.3 MB, the
/// sizes the kernel-plugins paper's image server was measured with.
pub const GENERATED_SIDES: [usize; 4] = [55, 182, 300, 1050];

/// The name of a generated image of the given side: its size, `WIDTHxHEIGHT`.
pub fn generated_name(side: usize) -> String {
    format!("{side}x{side}")
}

/// The four default images, named by size, with deterministic content that is not flat: a red gradient across, a
/// green gradient down, and blue a checkerboard of 8-pixel squares with a diagonal ramp inside each, so that every
/// transform (grayscale, downsample, crop) changes something visible.
pub fn generated() -> Vec<(String, Image)> {
    GENERATED_SIDES.iter().map(|&side| (generated_name(side), pattern(side, side))).collect()
}

/// A deterministic test pattern of the given size (see [`generated`]).
pub fn pattern(width: usize, height: usize) -> Image {
    let mut pixels = Vec::with_capacity(width * height * 3);
    let ramp = |at: usize, len: usize| if len > 1 { (at * 255 / (len - 1)) as u8 } else { 0 };
    for y in 0..height {
        for x in 0..width {
            let square = ((x / 8 + y / 8) % 2) as u8;
            let diagonal = ((x % 8 + y % 8) * 8) as u8;
            pixels.extend_from_slice(&[ramp(x, width), ramp(y, height), square * 128 + diagonal]);
        }
    }
    // The size is in range for every caller in this crate and the length is right by construction.
    Image { width, height, pixels }
}

/// A short listing of images, one a line: `NAME WIDTHxHEIGHT BYTES`.
pub fn listing<'a>(images: impl IntoIterator<Item = (&'a str, &'a Image)>) -> String {
    let mut text = String::new();
    for (name, image) in images {
        let _ = writeln!(text, "{name} {}x{} {}", image.width, image.height, image.pixels.len());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ppm_round_trip_keeps_every_byte() {
        let image = pattern(13, 7);
        assert_eq!(Image::from_ppm(&image.to_ppm()).unwrap(), image);
    }

    #[test]
    fn ppm_with_comments_and_small_maxval_is_read_and_scaled() {
        let mut ppm = b"P6 # a comment\n2 # another\n1\n15\n".to_vec();
        ppm.extend_from_slice(&[0, 15, 7, 15, 0, 1]);
        let image = Image::from_ppm(&ppm).unwrap();
        assert_eq!((image.width(), image.height()), (2, 1));
        assert_eq!(image.pixels(), &[0, 255, 119, 255, 0, 17]);
    }

    #[test]
    fn ppm_errors_are_named() {
        assert_eq!(Image::from_ppm(b"P3\n1 1\n255\n"), Err(PpmError::NotP6));
        assert_eq!(Image::from_ppm(b"P6\n1 1\n65535\n\0\0\0\0\0\0"), Err(PpmError::Maxval(65535)));
        assert_eq!(Image::from_ppm(b"P6\n1 x\n255\n"), Err(PpmError::Header("height is not a number")));
        assert_eq!(Image::from_ppm(b"P6\n1 1"), Err(PpmError::Header("ends before the header does")));
        assert_eq!(
            Image::from_ppm(b"P6\n2 1\n255\n\0\0\0"),
            Err(PpmError::Image(ImageError::PixelLength { width: 2, height: 1, expected: 6, actual: 3 }))
        );
        assert_eq!(Image::from_ppm(b"P6\n0 1\n255\n"), Err(PpmError::Image(ImageError::Size { width: 0, height: 1 })));
    }

    fn output(width: i64, height: i64, pixels: &[u8], capacity: usize) -> Vec<u8> {
        let mut out = vec![0u8; capacity];
        out[..8].copy_from_slice(&width.to_le_bytes());
        out[8..16].copy_from_slice(&height.to_le_bytes());
        out[16..16 + pixels.len()].copy_from_slice(pixels);
        out
    }

    #[test]
    fn transform_output_is_read_when_consistent() {
        let out = output(2, 1, &[1, 2, 3, 4, 5, 6], 40);
        let image = Image::from_transform_output(&out, 22).unwrap();
        assert_eq!((image.width(), image.height(), image.pixels()), (2, 1, &[1u8, 2, 3, 4, 5, 6][..]));
    }

    #[test]
    fn transform_output_faults_are_told_apart() {
        let out = output(2, 1, &[0; 6], 40);
        assert_eq!(Image::from_transform_output(&out, -1), Err(OutputError::Refused(-1)));
        assert_eq!(Image::from_transform_output(&out, 8), Err(OutputError::Length { returned: 8, capacity: 40 }));
        assert_eq!(Image::from_transform_output(&out, 41), Err(OutputError::Length { returned: 41, capacity: 40 }));
        assert_eq!(
            Image::from_transform_output(&out, 28),
            Err(OutputError::Mismatch { width: 2, height: 1, expected: 22, returned: 28 })
        );
        let bad = output(-3, 1, &[], 40);
        assert_eq!(Image::from_transform_output(&bad, 16), Err(OutputError::Header { width: -3, height: 1 }));
        let huge = output(1 << 40, 1, &[], 40);
        assert_eq!(Image::from_transform_output(&huge, 16), Err(OutputError::Header { width: 1 << 40, height: 1 }));
    }

    #[test]
    fn generated_images_have_the_paper_sizes_and_are_not_flat() {
        let images = generated();
        let sizes: Vec<usize> = images.iter().map(|(_, i)| i.pixels().len()).collect();
        assert_eq!(sizes, [9075, 99372, 270000, 3307500]);
        assert_eq!(images[0].0, "55x55");
        for (name, image) in &images {
            for channel in 0..3 {
                let values: std::collections::BTreeSet<u8> =
                    image.pixels().iter().skip(channel).step_by(3).copied().collect();
                assert!(values.len() > 8, "{name}: channel {channel} has only {} values", values.len());
            }
        }
    }
}
