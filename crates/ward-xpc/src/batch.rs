//! Batches of deferred calls (Nooks' deferred XPC): many calls with scalar arguments in one record, so a run of
//! deferred calls costs one ring record and one domain crossing instead of one each.
//!
//! ```text
//! header   len u32 @0 | op u8 @4 = 8 | nargs 0 | ret 0 | flags 0 | id u64 @8
//! body     count u32 @16, pad u32 @20, entries @24, zero padding to a multiple of 16
//! entry    func u32 @0, nargs u8 @4, pad 3; with arguments only: kinds u64 @8 (argument i's ArgKind code in
//!          bits 4i..4i+4), values nargs x u64 @16 (Int: the value; F64, F32: the bits; Callback: the stub slot)
//!
//! An entry without arguments is 8 bytes: the record is written into memory the other side has just read, so every
//! byte saved is a cache line fewer to pull across for a run of argument-less calls.
//! ```
//!
//! [`BatchView::parse`] checks the whole record before any entry is handed out: every entry lies inside the record,
//! has at most [`MAX_ARGS`] arguments of scalar kinds only, and the entries end exactly where the length says.

use crate::ring::MAX_RECORD;
use crate::wire::{round_up, ArgKind, Op, WireArg, WireError, MAX_ARGS};

const COUNT: usize = 16;
const ENTRIES: usize = 24;
/// An entry's function and argument count.
const ENTRY_HEADER: usize = 8;
/// Where an entry's argument values start (after its kinds), when it has arguments.
const ENTRY_VALUES: usize = 16;

/// Bytes one entry with `nargs` arguments takes.
pub const fn entry_len(nargs: usize) -> usize {
    if nargs == 0 {
        ENTRY_HEADER
    } else {
        ENTRY_VALUES + 8 * nargs
    }
}

fn is_scalar(kind: ArgKind) -> bool {
    matches!(kind, ArgKind::Int | ArgKind::F64 | ArgKind::F32 | ArgKind::Callback)
}

/// Host side: collects calls into one record.
#[derive(Debug)]
pub struct BatchWriter {
    buf: Box<[u8]>,
    end: usize,
    count: u32,
}

impl Default for BatchWriter {
    fn default() -> Self {
        BatchWriter::new()
    }
}

impl BatchWriter {
    pub fn new() -> BatchWriter {
        BatchWriter { buf: vec![0u8; MAX_RECORD].into_boxed_slice(), end: ENTRIES, count: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Calls collected so far.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether a call with `nargs` arguments still fits in this record.
    pub fn fits(&self, nargs: usize) -> bool {
        nargs <= MAX_ARGS && round_up(self.end + entry_len(nargs)) <= MAX_RECORD
    }

    /// Append one call. Only scalar arguments (Int, F64, F32, Callback) travel in a batch.
    pub fn push<I>(&mut self, func: u32, args: I) -> Result<(), WireError>
    where
        I: IntoIterator<Item = WireArg>,
        I::IntoIter: ExactSizeIterator,
    {
        let args = args.into_iter();
        let nargs = args.len();
        if !self.fits(nargs) {
            return Err(WireError("the call does not fit in this batch"));
        }
        let at = self.end;
        let mut kinds = 0u64;
        for (i, a) in args.enumerate() {
            if !is_scalar(a.kind) {
                return Err(WireError("only scalar arguments travel in a batch"));
            }
            kinds |= u64::from(u8::from(a.kind) & 0xf) << (4 * i);
            let v = at + ENTRY_VALUES + 8 * i;
            self.buf[v..v + 8].copy_from_slice(&a.a.to_le_bytes());
        }
        self.buf[at..at + 4].copy_from_slice(&func.to_le_bytes());
        self.buf[at + 4..at + 8].copy_from_slice(&[nargs as u8, 0, 0, 0]);
        if nargs > 0 {
            self.buf[at + 8..at + 16].copy_from_slice(&kinds.to_le_bytes());
        }
        self.end += entry_len(nargs);
        self.count += 1;
        Ok(())
    }

    /// The finished record, stamped with `id`. The writer keeps its contents until [`BatchWriter::clear`].
    pub fn finish(&mut self, id: u64) -> &[u8] {
        let len = round_up(self.end);
        self.buf[self.end..len].fill(0);
        self.buf[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        self.buf[4..8].copy_from_slice(&[u8::from(Op::Batch), 0, 0, 0]);
        self.buf[8..16].copy_from_slice(&id.to_le_bytes());
        self.buf[COUNT..COUNT + 4].copy_from_slice(&self.count.to_le_bytes());
        self.buf[COUNT + 4..ENTRIES].fill(0);
        &self.buf[..len]
    }

    pub fn clear(&mut self) {
        self.end = ENTRIES;
        self.count = 0;
    }
}

/// Domain side: a checked view of a batch record.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    record: &'a [u8],
    count: u32,
    id: u64,
}

/// One call of a batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchEntry<'a> {
    pub func: u32,
    kinds: u64,
    values: &'a [u8],
}

impl<'a> BatchEntry<'a> {
    pub fn nargs(&self) -> usize {
        self.values.len() / 8
    }

    pub fn args(&self) -> impl ExactSizeIterator<Item = WireArg> + 'a {
        let kinds = self.kinds;
        self.values.chunks_exact(8).enumerate().map(move |(i, v)| {
            let mut b = [0u8; 8];
            b.copy_from_slice(v);
            WireArg { kind: ArgKind::from(((kinds >> (4 * i)) & 0xf) as u8), pool: 0, a: u64::from_le_bytes(b), b: 0 }
        })
    }
}

fn u32_at(r: &[u8], at: usize) -> Result<u32, WireError> {
    let b = r.get(at..at + 4).ok_or(WireError("batch truncated"))?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(r: &[u8], at: usize) -> Result<u64, WireError> {
    let b = r.get(at..at + 8).ok_or(WireError("batch truncated"))?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Ok(u64::from_le_bytes(a))
}

impl<'a> BatchView<'a> {
    pub fn parse(record: &'a [u8]) -> Result<BatchView<'a>, WireError> {
        let len = u32_at(record, 0)? as usize;
        if len != record.len() || len & 15 != 0 || !(ENTRIES..=MAX_RECORD).contains(&len) {
            return Err(WireError("batch length does not match the record"));
        }
        if record.get(4).copied().map(Op::from) != Some(Op::Batch) {
            return Err(WireError("not a batch record"));
        }
        let id = u64_at(record, 8)?;
        let count = u32_at(record, COUNT)?;
        if count == 0 {
            return Err(WireError("empty batch"));
        }
        let mut at = ENTRIES;
        for _ in 0..count {
            let (_, nargs, kinds) = entry_header(record, at)?;
            // Kinds past the arguments must be zero; the arguments' own must be scalar. Most deferred calls have
            // few arguments, so this looks at those only (it runs once per call in the domain).
            let used = if nargs >= 16 { u64::MAX } else { (1u64 << (4 * nargs)) - 1 };
            if kinds & !used != 0 {
                return Err(WireError("batch entry with a bad argument kind"));
            }
            for i in 0..nargs {
                if !is_scalar(ArgKind::from(((kinds >> (4 * i)) & 0xf) as u8)) {
                    return Err(WireError("batch entry with a bad argument kind"));
                }
            }
            at += entry_len(nargs);
            if at > len {
                return Err(WireError("batch entry runs past the record"));
            }
        }
        if round_up(at) != len {
            return Err(WireError("batch entries do not end where the length says"));
        }
        Ok(BatchView { record, count, id })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The calls, in order. Only for a record `parse` accepted, so every read is in bounds.
    pub fn entries(&self) -> impl Iterator<Item = BatchEntry<'a>> + 'a {
        let record = self.record;
        let mut at = ENTRIES;
        (0..self.count).map_while(move |_| {
            let (func, nargs, kinds) = entry_header(record, at).ok()?;
            let values = if nargs == 0 { &[][..] } else { record.get(at + ENTRY_VALUES..at + entry_len(nargs))? };
            at += entry_len(nargs);
            Some(BatchEntry { func, kinds, values })
        })
    }
}

fn entry_header(record: &[u8], at: usize) -> Result<(u32, usize, u64), WireError> {
    if at + ENTRY_HEADER > record.len() {
        return Err(WireError("batch entry runs past the record"));
    }
    let func = u32_at(record, at)?;
    let nargs = record[at + 4] as usize;
    if nargs > MAX_ARGS {
        return Err(WireError("batch entry with more than 14 arguments"));
    }
    let kinds = if nargs == 0 { 0 } else { u64_at(record, at + 8)? };
    Ok((func, nargs, kinds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(v: u64) -> WireArg {
        WireArg { kind: ArgKind::Int, pool: 0, a: v, b: 0 }
    }

    #[test]
    fn round_trips_calls_in_order() {
        let mut w = BatchWriter::new();
        w.push(3, []).unwrap();
        w.push(7, [int(1), WireArg { kind: ArgKind::F64, pool: 0, a: 2.5f64.to_bits(), b: 0 }]).unwrap();
        w.push(9, [WireArg { kind: ArgKind::Callback, pool: 0, a: 17, b: 0 }]).unwrap();
        let record = w.finish(42).to_vec();
        let v = BatchView::parse(&record).unwrap();
        assert_eq!((v.id(), v.len()), (42, 3));
        let e: Vec<_> = v.entries().collect();
        assert_eq!(e.iter().map(|e| e.func).collect::<Vec<_>>(), [3, 7, 9]);
        let args: Vec<WireArg> = e[1].args().collect();
        assert_eq!(args[0], int(1));
        assert_eq!(args[1].kind, ArgKind::F64);
        assert_eq!(f64::from_bits(args[1].a), 2.5);
        assert_eq!(e[2].args().next().unwrap().kind, ArgKind::Callback);
        w.clear();
        assert!(w.is_empty());
    }

    #[test]
    fn fills_up_and_refuses_what_does_not_fit_or_is_not_scalar() {
        let mut w = BatchWriter::new();
        let mut n = 0;
        while w.fits(0) {
            w.push(1, []).unwrap();
            n += 1;
        }
        assert_eq!(n, (MAX_RECORD - ENTRIES) / ENTRY_HEADER);
        assert!(w.push(1, []).is_err());
        let record = w.finish(1).to_vec();
        assert_eq!(BatchView::parse(&record).unwrap().len(), n);
        let mut w = BatchWriter::new();
        assert!(w.push(1, [WireArg { kind: ArgKind::BufIn, pool: 0, a: 0, b: 4 }]).is_err());
    }

    #[test]
    fn malformed_batches_are_refused_and_never_panic() {
        let mut w = BatchWriter::new();
        w.push(5, [int(9), int(10)]).unwrap();
        let good = w.finish(8).to_vec();
        // Wrong length, wrong op, zero count, an entry past the end, a bad kind.
        let mut bad = good.clone();
        bad[0] = 32;
        assert!(BatchView::parse(&bad).is_err());
        let mut bad = good.clone();
        bad[4] = 1;
        assert!(BatchView::parse(&bad).is_err());
        let mut bad = good.clone();
        bad[16] = 0;
        assert!(BatchView::parse(&bad).is_err());
        let mut bad = good.clone();
        bad[24 + 4] = 14;
        assert!(BatchView::parse(&bad).is_err());
        let mut bad = good.clone();
        bad[24 + 8] = 0x4; // BufIn
        assert!(BatchView::parse(&bad).is_err());
        // Random bytes with a plausible header: never a panic.
        let mut rng = crate::mix::SplitMix64::new(0);
        for _ in 0..50_000 {
            let mut r = good.clone();
            for b in r.iter_mut().skip(16) {
                let x = rng.next_u64();
                if x.is_multiple_of(5) {
                    *b = x as u8;
                }
            }
            if let Ok(v) = BatchView::parse(&r) {
                for e in v.entries() {
                    assert!(e.nargs() <= MAX_ARGS);
                    for a in e.args() {
                        assert!(is_scalar(a.kind));
                    }
                }
            }
        }
    }
}
