//! Images as the transform ABI passes them (`extensions/runtime/ward_image.h`): width * height pixels, three bytes
//! each (red, green, blue), rows top to bottom.

/// The output header: the output's width and height, two little-endian int64.
pub const IMAGE_HEADER_BYTES: usize = 16;

/// The largest width or height the ABI accepts.
pub const MAX_IMAGE_SIDE: u32 = 65536;

/// An RGB image whose pixel buffer matches its size.
#[derive(Clone, PartialEq, Eq)]
pub struct Image {
    width: u32,
    height: u32,
    pixels: Vec<u8>,
}

/// The size and the first pixels only: an image's pixels are too many to be read in a message.
impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = self.pixels.len().min(12);
        write!(f, "Image({}x{}, starting {:?})", self.width, self.height, &self.pixels[..shown])
    }
}

/// An image whose size or pixels the ABI cannot carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("image of {width}x{height}: each side must be 1 to {MAX_IMAGE_SIDE}")]
    BadSize { width: i64, height: i64 },
    #[error("image of {width}x{height} needs {expected} bytes of pixels, got {actual}")]
    WrongLength { width: u32, height: u32, expected: usize, actual: usize },
}

impl Image {
    pub fn new(width: u32, height: u32, pixels: Vec<u8>) -> Result<Self, ImageError> {
        if !side_ok(i64::from(width)) || !side_ok(i64::from(height)) {
            return Err(ImageError::BadSize { width: width.into(), height: height.into() });
        }
        let expected =
            pixel_bytes(width, height).ok_or(ImageError::BadSize { width: width.into(), height: height.into() })?;
        if pixels.len() != expected {
            return Err(ImageError::WrongLength { width, height, expected, actual: pixels.len() });
        }
        Ok(Self { width, height, pixels })
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    pub fn into_pixels(self) -> Vec<u8> {
        self.pixels
    }

    /// What a host offers a transform for this image: the header and as many pixels as the input has, which the
    /// ABI promises is always enough.
    pub fn output_capacity(&self) -> usize {
        IMAGE_HEADER_BYTES + self.pixels.len()
    }
}

pub(crate) fn side_ok(side: i64) -> bool {
    (1..=i64::from(MAX_IMAGE_SIDE)).contains(&side)
}

/// Bytes of pixels of an image of this size; `None` where that does not fit a `usize`.
pub(crate) fn pixel_bytes(width: u32, height: u32) -> Option<usize> {
    usize::try_from(width).ok()?.checked_mul(usize::try_from(height).ok()?)?.checked_mul(3)
}
