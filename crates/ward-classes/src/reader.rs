//! Reading what an adapter serialised: little-endian scalars and length-prefixed strings, every read bounds-checked
//! (the bytes come from a domain, which the host never trusts).

use crate::error::DescriptionError;

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], DescriptionError> {
        let end = self.at.checked_add(N).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or(DescriptionError::Truncated { at: self.at })?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.at..end]);
        self.at = end;
        Ok(out)
    }

    pub fn u32(&mut self) -> Result<u32, DescriptionError> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    pub fn i32(&mut self) -> Result<i32, DescriptionError> {
        self.take::<4>().map(i32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Result<u64, DescriptionError> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    pub fn f32(&mut self) -> Result<f32, DescriptionError> {
        self.take::<4>().map(f32::from_le_bytes)
    }

    pub fn f64(&mut self) -> Result<f64, DescriptionError> {
        self.take::<8>().map(f64::from_le_bytes)
    }

    /// A string; bytes that are not UTF-8 are replaced, as a plugin's names are only shown.
    pub fn string(&mut self) -> Result<String, DescriptionError> {
        let len = self.u32()? as usize;
        let end = self.at.checked_add(len).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or(DescriptionError::StringPastEnd { len })?;
        let s = String::from_utf8_lossy(&self.bytes[self.at..end]).into_owned();
        self.at = end;
        Ok(s)
    }

    /// Everything was read.
    pub fn finish(&self) -> Result<(), DescriptionError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(DescriptionError::StrayBytes { count: self.bytes.len() - self.at })
        }
    }
}
