//! Function boundaries from `.eh_frame`, for objects stripped of `.symtab`.
//!
//! A stripped shared object (every Debian plugin) still names its exported functions in `.dynsym`, but its internal
//! ones (a plugin's `run`, `instantiate`, its constructor...) are named nowhere. The unwind tables still describe
//! them: x86-64 code is compiled with asynchronous unwind tables by default, so `.eh_frame` holds one FDE (frame
//! description entry) per function, with the function's start and length. This module reads just that: the
//! records' framing, each CIE's pointer encoding, and each FDE's address range (the `.eh_frame` format of the
//! Linux Standard Base, DWARF call frame information with GCC's augmentations). Anything it does not understand
//! ends the reading; what was read so far is kept.

use std::collections::HashMap;

/// `DW_EH_PE_omit`: no value.
const PE_OMIT: u8 = 0xff;

/// One function as its FDE describes it: virtual address and length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fde {
    pub start: u64,
    pub len: u64,
}

struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let bytes = self.data.get(self.at..self.at.checked_add(N)?)?;
        self.at += N;
        bytes.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    fn uleb(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn sleb(&mut self) -> Option<i64> {
        let mut value = 0i64;
        let mut shift = 0;
        loop {
            let b = self.u8()?;
            value |= i64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    value |= -1i64 << shift;
                }
                return Some(value);
            }
            if shift >= 64 {
                return None;
            }
        }
    }

    fn cstr(&mut self) -> Option<&[u8]> {
        let rest = self.data.get(self.at..)?;
        let len = rest.iter().position(|&b| b == 0)?;
        self.at += len + 1;
        Some(&rest[..len])
    }

    /// A value in the format of encoding `enc` (its low four bits), not applied to any base.
    fn value(&mut self, enc: u8) -> Option<u64> {
        Some(match enc & 0x0f {
            0x00 | 0x04 | 0x0c => self.u64()?,
            0x01 => self.uleb()?,
            0x02 => u64::from(self.u16()?),
            0x03 => u64::from(self.u32()?),
            0x09 => self.sleb()? as u64,
            0x0a => i64::from(self.u16()? as i16) as u64,
            0x0b => i64::from(self.u32()? as i32) as u64,
            _ => return None,
        })
    }

    /// A pointer in encoding `enc`, absolute or relative to its own address (`address` is the data's first
    /// byte's); other bases (data-, text-, function-relative) are not used in shared objects' FDEs.
    fn pointer(&mut self, enc: u8, address: u64) -> Option<u64> {
        let here = address.wrapping_add(self.at as u64);
        let value = self.value(enc)?;
        match enc & 0x70 {
            0x00 => Some(value),
            0x10 => Some(here.wrapping_add(value)),
            _ => None,
        }
    }
}

/// Reads a CIE's body (after its id): the encoding of its FDEs' addresses.
fn cie_encoding(c: &mut Cursor<'_>, address: u64) -> Option<u8> {
    let version = c.u8()?;
    let augmentation = c.cstr()?.to_vec();
    if augmentation.windows(2).any(|w| w == b"eh") {
        c.u64()?;
    }
    c.uleb()?; // code alignment
    c.sleb()?; // data alignment
    if version == 1 {
        c.u8()?;
    } else {
        c.uleb()?;
    }
    let mut encoding = 0; // DW_EH_PE_absptr
    if augmentation.first() == Some(&b'z') {
        c.uleb()?; // augmentation data length
        for &a in &augmentation[1..] {
            match a {
                b'R' => encoding = c.u8()?,
                b'P' => {
                    let personality = c.u8()?;
                    c.pointer(personality & 0x7f, address)?;
                }
                b'L' => {
                    c.u8()?;
                }
                b'S' | b'B' => {}
                _ => return None,
            }
        }
    }
    Some(encoding)
}

/// The FDEs of an `.eh_frame` section whose bytes are `data`, loaded at `address`.
pub(crate) fn fdes(data: &[u8], address: u64) -> Vec<Fde> {
    let mut found = Vec::new();
    let mut encodings: HashMap<usize, Option<u8>> = HashMap::new();
    let mut at = 0;
    while at + 4 <= data.len() {
        let mut c = Cursor { data, at };
        let Some(length) = c.u32() else { break };
        if length == 0 {
            break; // the terminator
        }
        let length = if length == u32::MAX { c.u64() } else { Some(u64::from(length)) };
        let Some(end) = length.and_then(|l| usize::try_from(l).ok()).and_then(|l| c.at.checked_add(l)) else { break };
        if end > data.len() {
            break;
        }
        let id_at = c.at;
        let Some(id) = c.u32() else { break };
        if id == 0 {
            let encoding = cie_encoding(&mut c, address);
            encodings.insert(at, encoding);
        } else {
            // The FDE's CIE pointer is the distance back from the pointer itself to its CIE.
            let cie = id_at.checked_sub(id as usize);
            let encoding = match cie.map(|cie| (cie, encodings.get(&cie).copied())) {
                Some((_, Some(Some(enc)))) => Some(enc),
                Some((cie, None)) if cie < data.len() => {
                    // A CIE after its FDEs (allowed, if unusual): read it now.
                    let mut cc = Cursor { data, at: cie };
                    let enc = cc.u32().filter(|&l| l != 0 && l != u32::MAX).and_then(|_| {
                        cc.u32().filter(|&id| id == 0)?;
                        cie_encoding(&mut cc, address)
                    });
                    encodings.insert(cie, enc);
                    enc
                }
                _ => None,
            };
            if let Some(enc) = encoding.filter(|&e| e != PE_OMIT) {
                let start = c.pointer(enc, address);
                let len = c.value(enc & 0x0f);
                if let (Some(start), Some(len)) = (start, len) {
                    if len > 0 {
                        found.push(Fde { start, len });
                    }
                }
            }
        }
        at = end;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CIE with augmentation "zR" (FDE pointers pc-relative, signed 4 bytes) and two FDEs.
    fn section() -> Vec<u8> {
        let mut s = Vec::new();
        // CIE at 0: length 20, id 0, version 1, "zR", code align 1, data align -8, RA 16, aug len 1, enc 0x1b,
        // then padding (DW_CFA_nop) to the length.
        s.extend_from_slice(&20u32.to_le_bytes());
        s.extend_from_slice(&0u32.to_le_bytes());
        s.extend_from_slice(&[1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b]);
        s.resize(24, 0);
        for (target, len) in [(0x1000u64, 0x40u32), (0x1040, 0x8)] {
            // FDE: length 16, CIE pointer, pc_begin (pc-relative to the field), pc_range, aug data length 0.
            let here = s.len();
            s.extend_from_slice(&16u32.to_le_bytes());
            s.extend_from_slice(&((here + 4) as u32).to_le_bytes());
            let field = 0x800 + s.len() as u64;
            s.extend_from_slice(&((target.wrapping_sub(field)) as u32).to_le_bytes());
            s.extend_from_slice(&len.to_le_bytes());
            s.push(0);
            s.resize(here + 20, 0);
        }
        s.extend_from_slice(&0u32.to_le_bytes());
        s
    }

    #[test]
    fn reads_each_fde_range() {
        let found = fdes(&section(), 0x800);
        assert_eq!(found, [Fde { start: 0x1000, len: 0x40 }, Fde { start: 0x1040, len: 8 }]);
    }

    #[test]
    fn stops_at_what_it_cannot_read() {
        let s = section();
        assert_eq!(fdes(&s[..30], 0x800), []);
        assert_eq!(fdes(&s[..48], 0x800).len(), 1);
        assert_eq!(fdes(&[], 0), []);
        assert_eq!(fdes(&[0xff; 64], 0), []);
    }

    #[test]
    fn reads_leb128() {
        let mut c = Cursor { data: &[0xe5, 0x8e, 0x26, 0x7f, 0x80, 0x7f], at: 0 };
        assert_eq!(c.uleb(), Some(624_485));
        assert_eq!(c.sleb(), Some(-1));
        assert_eq!(c.sleb(), Some(-128));
    }
}
