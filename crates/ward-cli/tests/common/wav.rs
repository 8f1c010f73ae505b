//! WAV files as lilv's tools write them.

use std::path::Path;

/// An output file as compared: every byte of it, except the timestamp in the PEAK chunk libsndfile adds to a float
/// WAV (the time the file was written, in seconds; the chunk's peak values and positions are compared). A missing
/// file reads as empty.
pub fn comparable(path: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(path).unwrap_or_default();
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return bytes;
    }
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let size = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]) as usize;
        let data = at + 8;
        // PEAK: a 4-byte version, then the 4-byte timestamp, then a value and a position per channel.
        if &bytes[at..at + 4] == b"PEAK" && size >= 8 && data + 8 <= bytes.len() {
            bytes[data + 4..data + 8].fill(0);
        }
        // Chunks are padded to an even length.
        at = data.saturating_add(size).saturating_add(size & 1);
    }
    bytes
}
