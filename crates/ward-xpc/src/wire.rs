//! Records on the rings: a 16-byte header and a body per op. All numbers are little-endian.
//!
//! ```text
//! header   len u32 @0 (total, multiple of 16) | op u8 @4 | nargs u8 @5 | ret u8 @6 | flags u8 @7 | id u64 @8
//! Call / Deferred (op 1 / 2)   func u32 @16, pad, args @24 (nargs x 24 bytes), inline bytes, zero padding
//!     arg                      kind u8 @0, pad, pool u32 @4, a u64 @8, b u64 @16
//! Reply (op 3, 48 bytes)       status u32 @16, pad, ret_int u64 @24, ret_float u64 @32, pad
//! Callback (op 4, 144 bytes)   slot u32 @16, pad, ints 6 x u64 @24, floats 8 x u64 @72, pad (ret kind in header)
//! CallbackReply (op 5, 32)     ret_int u64 @16, ret_float u64 @24
//! Resolve (op 6)               ext u32 @16, name_len u32 @20, name @24 (no NUL), zero padding
//! Ping (op 7, 16 bytes)        header only
//! Batch (op 8)                 deferred calls with scalar arguments, many to a record: see `batch`
//! Pad (op 9)                   ring filler, never parsed as a message
//! Load (op 10)                 flags u32 @16 (bit 0: poison), path_len u32 @20, init_len u32 @24, pad,
//!                              reason offset u64 @32, reason len u64 @40 (in the output pool), path @48, init
//!                              right after it (neither with a NUL), zero padding
//! ```
//!
//! # Contract
//!
//! [`Message::parse`] is the only way in for bytes from the other side. It never panics, on any input, and returns a
//! [`Message`] only for a record whose length field, op, argument count, argument kinds, return kind and inline ranges
//! are all valid, and whose length is exactly what its contents need; the message borrows the record (which the caller
//! must already have copied out of shared memory). Reserved bytes and `flags` are ignored by `parse` and written as
//! zero by `emit`; the two flags, [`FLAG_NESTED`] and [`FLAG_HAND_OVER`], are set on a finished record by
//! [`mark_nested`] and [`mark_hand_over`]. [`Message::emit`]
//! writes every byte of the record, padding included, and fails rather than write a record that `parse` would refuse;
//! `parse(emit(m)) == m` for every message that emits.

use std::ops::Range;

use crate::ring::{MAX_RECORD, RECORD_ALIGN};

/// Header flag of a request the host sent while it was serving a callback of the domain's: a call (or batch)
/// made from inside that callback, which the domain runs at once. A call without it that reaches a domain waiting
/// for a callback's answer was made before the host saw the callback (the callback came from a deferred call), so
/// the domain runs it after the deferred calls before it, keeping the host's order.
pub const FLAG_NESTED: u8 = 1;

/// Set [`FLAG_NESTED`] on a finished record (a no-op on one shorter than a header).
pub fn mark_nested(record: &mut [u8]) {
    set_flag(record, FLAG_NESTED);
}

/// Whether a record carries [`FLAG_NESTED`].
pub fn is_nested(record: &[u8]) -> bool {
    has_flag(record, FLAG_NESTED)
}

/// Header flag of a request sent while the host hands its processor over to the domain for each call (the domain
/// runs on the caller's processor): after it the domain must sleep at once rather than spin, since spinning there
/// would only keep the caller from running.
pub const FLAG_HAND_OVER: u8 = 2;

/// Set [`FLAG_HAND_OVER`] on a finished record (a no-op on one shorter than a header).
pub fn mark_hand_over(record: &mut [u8]) {
    set_flag(record, FLAG_HAND_OVER);
}

/// Whether a record carries [`FLAG_HAND_OVER`].
pub fn is_hand_over(record: &[u8]) -> bool {
    has_flag(record, FLAG_HAND_OVER)
}

fn set_flag(record: &mut [u8], flag: u8) {
    if let Some(flags) = record.get_mut(field::FLAGS) {
        *flags |= flag;
    }
}

fn has_flag(record: &[u8], flag: u8) -> bool {
    record.get(field::FLAGS).is_some_and(|f| f & flag != 0)
}

/// Length of the record header.
pub const HEADER_LEN: usize = 16;
/// Length of one argument.
pub const ARG_LEN: usize = 24;
/// Most arguments a call carries.
pub const MAX_ARGS: usize = 14;
/// Length of a Reply record.
pub const REPLY_LEN: usize = 48;
/// Length of a Callback record.
pub const CALLBACK_LEN: usize = 144;
/// Length of a CallbackReply record.
pub const CALLBACK_REPLY_LEN: usize = 32;
/// Length of a Ping record.
pub const PING_LEN: usize = 16;
/// Integer registers a callback carries.
pub const CALLBACK_INTS: usize = 6;
/// Float registers a callback carries.
pub const CALLBACK_FLOATS: usize = 8;

/// Op code of PAD records (ring filler).
pub(crate) const OP_PAD: u8 = 9;

/// Byte offsets inside a record.
pub(crate) mod field {
    use std::ops::Range;

    pub type Field = Range<usize>;

    pub const LEN: Field = 0..4;
    pub const OP: usize = 4;
    pub const NARGS: usize = 5;
    pub const RET: usize = 6;
    pub const FLAGS: usize = 7;
    pub const ID: Field = 8..16;

    pub const CALL_FUNC: Field = 16..20;
    pub const CALL_ARGS: usize = 24;
    /// Inside one argument.
    pub const ARG_KIND: usize = 0;
    pub const ARG_POOL: Field = 4..8;
    pub const ARG_A: Field = 8..16;
    pub const ARG_B: Field = 16..24;

    pub const REPLY_STATUS: Field = 16..20;
    pub const REPLY_RET_INT: Field = 24..32;
    pub const REPLY_RET_FLOAT: Field = 32..40;

    pub const CALLBACK_SLOT: Field = 16..20;
    pub const CALLBACK_INTS: usize = 24;
    pub const CALLBACK_FLOATS: usize = 72;

    pub const CALLBACK_REPLY_RET_INT: Field = 16..24;
    pub const CALLBACK_REPLY_RET_FLOAT: Field = 24..32;

    pub const RESOLVE_EXT: Field = 16..20;
    pub const RESOLVE_NAME_LEN: Field = 20..24;
    pub const RESOLVE_NAME: usize = 24;

    pub const LOAD_FLAGS: Field = 16..20;
    pub const LOAD_PATH_LEN: Field = 20..24;
    pub const LOAD_INIT_LEN: Field = 24..28;
    pub const LOAD_REASON_OFFSET: Field = 32..40;
    pub const LOAD_REASON_LEN: Field = 40..48;
    pub const LOAD_PATH: usize = 48;
}

/// Load flag: call the new extension's functions poisoned.
pub const LOAD_POISON: u32 = 1;

/// The one error of this module: the record is malformed, for the reason given.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("malformed record: {0}")]
pub struct WireError(pub &'static str);

/// A wire enum that keeps codes it does not know in `Unknown`.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident($ty:ty) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A code this version does not know.
            Unknown($ty),
        }

        impl From<$ty> for $name {
            fn from(code: $ty) -> Self {
                match code {
                    $( $value => $name::$variant, )+
                    other => $name::Unknown(other),
                }
            }
        }

        impl From<$name> for $ty {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}

wire_enum! {
    /// What a record is.
    pub enum Op(u8) {
        Call = 1,
        Deferred = 2,
        Reply = 3,
        Callback = 4,
        CallbackReply = 5,
        Resolve = 6,
        Ping = 7,
        Batch = 8,
        Pad = 9,
        Load = 10,
    }
}

wire_enum! {
    /// What a function (or callback) returns.
    pub enum RetKind(u8) {
        Void = 0,
        Int = 1,
        F64 = 2,
        F32 = 3,
    }
}

wire_enum! {
    /// How an argument is passed.
    #[derive(Default)]
    pub enum ArgKind(u8) {
        /// `a` holds the integer.
        #[default]
        Int = 1,
        /// `a` holds the f64's bits.
        F64 = 2,
        /// `a` holds the f32's bits (low 32).
        F32 = 3,
        /// `(pool, a = offset, b = len)` is a rich pointer into the input pool.
        BufIn = 4,
        /// A rich pointer into the output pool.
        BufOut = 5,
        /// A rich pointer into the output pool, read and written.
        BufInOut = 6,
        /// A rich pointer to a string in the input pool.
        Str = 7,
        /// `a` is a callback stub slot.
        Callback = 8,
        /// `a` = offset of the bytes from the start of the record, `b` = their length.
        Inline = 9,
        /// An input the extension may write into without the host seeing it: a rich pointer into the output pool
        /// (a private copy), or into the arena (lent read-only; written pages become the domain's private copy).
        BufScratch = 10,
    }
}

wire_enum! {
    /// How a request went.
    pub enum Status(u32) {
        Ok = 0,
        UnknownFunction = 1,
        BadArgs = 2,
        ResolveFailed = 3,
        UnknownOp = 4,
        /// A Load the domain could not do; the reply's `ret_int` is the length of the reason it wrote.
        LoadFailed = 5,
    }
}

fn known_ret(ret: RetKind) -> bool {
    !matches!(ret, RetKind::Unknown(_))
}

fn known_arg(kind: ArgKind) -> bool {
    !matches!(kind, ArgKind::Unknown(_))
}

/// One argument of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireArg {
    pub kind: ArgKind,
    pub pool: u32,
    pub a: u64,
    pub b: u64,
}

/// Up to [`MAX_ARGS`] arguments, inline (no allocation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArgList {
    /// Entries past `len` are always `WireArg::default()`, so the derived equality is equality of the lists.
    args: [WireArg; MAX_ARGS],
    len: u8,
}

impl ArgList {
    pub fn new() -> Self {
        Self::default()
    }

    /// The arguments of `args`, or an error if there are more than [`MAX_ARGS`].
    pub fn from_slice(args: &[WireArg]) -> Result<Self, WireError> {
        let mut list = Self::new();
        for &arg in args {
            list.push(arg)?;
        }
        Ok(list)
    }

    /// Append an argument; an error when the list already holds [`MAX_ARGS`].
    pub fn push(&mut self, arg: WireArg) -> Result<(), WireError> {
        let slot = self.args.get_mut(usize::from(self.len)).ok_or(WireError("too many arguments"))?;
        *slot = arg;
        self.len += 1;
        Ok(())
    }

    pub fn as_slice(&self) -> &[WireArg] {
        &self.args[..usize::from(self.len)]
    }

    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Offset, from the start of a call record, of the first byte after `nargs` arguments: where inline bytes start.
pub const fn inline_base(nargs: usize) -> usize {
    field::CALL_ARGS + nargs * ARG_LEN
}

/// Round `n` up to the record alignment.
pub const fn round_up(n: usize) -> usize {
    (n + RECORD_ALIGN - 1) & !(RECORD_ALIGN - 1)
}

fn bytes<const N: usize>(record: &[u8], at: usize) -> Result<[u8; N], WireError> {
    at.checked_add(N)
        .and_then(|end| record.get(at..end))
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(WireError("truncated record"))
}

fn get_u32(record: &[u8], f: Range<usize>) -> Result<u32, WireError> {
    bytes::<4>(record, f.start).map(u32::from_le_bytes)
}

fn get_u64(record: &[u8], f: Range<usize>) -> Result<u64, WireError> {
    bytes::<8>(record, f.start).map(u64::from_le_bytes)
}

fn get_u64_at(record: &[u8], at: usize) -> Result<u64, WireError> {
    bytes::<8>(record, at).map(u64::from_le_bytes)
}

fn get_u8(record: &[u8], at: usize) -> Result<u8, WireError> {
    record.get(at).copied().ok_or(WireError("truncated record"))
}

// Writers for emit: callers have checked that the buffer holds the whole record, and every offset used lies inside
// the record, so indexing cannot fail.
fn put(buf: &mut [u8], at: usize, src: &[u8]) {
    buf[at..at + src.len()].copy_from_slice(src);
}

fn put_u32(buf: &mut [u8], f: Range<usize>, v: u32) {
    put(buf, f.start, &v.to_le_bytes());
}

fn put_u64(buf: &mut [u8], f: Range<usize>, v: u64) {
    put(buf, f.start, &v.to_le_bytes());
}

/// The 16-byte header of any record, as read (nothing but its presence is checked). Useful to answer a record
/// that does not parse (its id) with [`Status::UnknownOp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub len: u32,
    pub op: Op,
    pub nargs: u8,
    pub ret: u8,
    pub flags: u8,
    pub id: u64,
}

impl RecordHeader {
    pub fn parse(record: &[u8]) -> Result<Self, WireError> {
        Ok(RecordHeader {
            len: get_u32(record, field::LEN)?,
            op: Op::from(get_u8(record, field::OP)?),
            nargs: get_u8(record, field::NARGS)?,
            ret: get_u8(record, field::RET)?,
            flags: get_u8(record, field::FLAGS)?,
            id: get_u64(record, field::ID)?,
        })
    }

    /// Write the 16 header bytes into `buf` (at least 16 bytes long).
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let buf = buf.get_mut(..HEADER_LEN).ok_or(WireError("buffer too small"))?;
        put_u32(buf, field::LEN, self.len);
        buf[field::OP] = u8::from(self.op);
        buf[field::NARGS] = self.nargs;
        buf[field::RET] = self.ret;
        buf[field::FLAGS] = self.flags;
        put_u64(buf, field::ID, self.id);
        Ok(())
    }
}

/// A parsed record (or one to emit).
// Held by value on purpose: a Call's argument list lives inline so that parsing and emitting never allocate.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// Call (op 1) or Deferred (op 2, no reply). `inline` holds exactly the bytes from the end of the arguments to
    /// the furthest end of an `Inline` argument (whose `a` counts from the start of the record); see
    /// [`Message::inline_arg`].
    Call { id: u64, deferred: bool, func: u32, ret: RetKind, args: ArgList, inline: &'a [u8] },
    /// Op 3: the answer to a Call, Resolve or Ping.
    Reply { id: u64, status: Status, ret_int: u64, ret_float: u64 },
    /// Op 4: the domain calls a host callback.
    Callback { id: u64, slot: u32, ret: RetKind, ints: [u64; CALLBACK_INTS], floats: [u64; CALLBACK_FLOATS] },
    /// Op 5: the host's answer to a Callback.
    CallbackReply { id: u64, ret_int: u64, ret_float: u64 },
    /// Op 6: look a function up by name; the reply's `ret_int` is the function id.
    Resolve { id: u64, ext: u32, name: &'a [u8] },
    /// Op 7.
    Ping { id: u64 },
    /// Op 10: load one more extension into the running incarnation (a group gained a member). The reply's
    /// `ret_int` is the new extension's index; on failure the domain writes why, as UTF-8, into the output-pool
    /// buffer `reason` names (offset, length) and the reply says how many bytes it wrote.
    Load { id: u64, poison: bool, path: &'a [u8], init: &'a [u8], reason: (u64, u64) },
}

impl<'a> Message<'a> {
    /// Parse a record (already copied out of shared memory). `record` may be longer than the record's length field;
    /// the rest is ignored.
    pub fn parse(record: &'a [u8]) -> Result<Message<'a>, WireError> {
        let (header, record) = frame(record)?;
        let len = record.len();
        let id = header.id;
        let exact = |want: usize| {
            if len == want {
                Ok(())
            } else {
                Err(WireError("wrong length for its op"))
            }
        };
        match header.op {
            Op::Call | Op::Deferred => Self::parse_call(record, &header),
            Op::Reply => {
                exact(REPLY_LEN)?;
                Ok(Message::Reply {
                    id,
                    status: Status::from(get_u32(record, field::REPLY_STATUS)?),
                    ret_int: get_u64(record, field::REPLY_RET_INT)?,
                    ret_float: get_u64(record, field::REPLY_RET_FLOAT)?,
                })
            }
            Op::Callback => {
                exact(CALLBACK_LEN)?;
                let ret = RetKind::from(header.ret);
                if !known_ret(ret) {
                    return Err(WireError("unknown return kind"));
                }
                let mut ints = [0u64; CALLBACK_INTS];
                for (i, v) in ints.iter_mut().enumerate() {
                    *v = get_u64_at(record, field::CALLBACK_INTS + 8 * i)?;
                }
                let mut floats = [0u64; CALLBACK_FLOATS];
                for (i, v) in floats.iter_mut().enumerate() {
                    *v = get_u64_at(record, field::CALLBACK_FLOATS + 8 * i)?;
                }
                Ok(Message::Callback { id, slot: get_u32(record, field::CALLBACK_SLOT)?, ret, ints, floats })
            }
            Op::CallbackReply => {
                exact(CALLBACK_REPLY_LEN)?;
                Ok(Message::CallbackReply {
                    id,
                    ret_int: get_u64(record, field::CALLBACK_REPLY_RET_INT)?,
                    ret_float: get_u64(record, field::CALLBACK_REPLY_RET_FLOAT)?,
                })
            }
            Op::Resolve => {
                let ext = get_u32(record, field::RESOLVE_EXT)?;
                let name_len = get_u32(record, field::RESOLVE_NAME_LEN)? as usize;
                // name_len < 2^32 and RESOLVE_NAME is small: no overflow on 64-bit, checked anyway.
                let end = field::RESOLVE_NAME.checked_add(name_len).ok_or(WireError("name too long"))?;
                if end > len {
                    return Err(WireError("name runs past the record"));
                }
                if round_up(end) != len {
                    return Err(WireError("wrong length for its name"));
                }
                let name = record.get(field::RESOLVE_NAME..end).ok_or(WireError("name runs past the record"))?;
                Ok(Message::Resolve { id, ext, name })
            }
            Op::Ping => {
                exact(PING_LEN)?;
                Ok(Message::Ping { id })
            }
            Op::Load => {
                if len < field::LOAD_PATH {
                    return Err(WireError("load record too short"));
                }
                let flags = get_u32(record, field::LOAD_FLAGS)?;
                if flags & !LOAD_POISON != 0 {
                    return Err(WireError("unknown load flag"));
                }
                let path_len = get_u32(record, field::LOAD_PATH_LEN)? as usize;
                let init_len = get_u32(record, field::LOAD_INIT_LEN)? as usize;
                let path_end = field::LOAD_PATH.checked_add(path_len).ok_or(WireError("path too long"))?;
                let end = path_end.checked_add(init_len).ok_or(WireError("init name too long"))?;
                if end > len {
                    return Err(WireError("path or init name runs past the record"));
                }
                if round_up(end) != len {
                    return Err(WireError("wrong length for its path and init name"));
                }
                let path = record.get(field::LOAD_PATH..path_end).ok_or(WireError("path runs past the record"))?;
                let init = record.get(path_end..end).ok_or(WireError("init name runs past the record"))?;
                let reason = (get_u64(record, field::LOAD_REASON_OFFSET)?, get_u64(record, field::LOAD_REASON_LEN)?);
                Ok(Message::Load { id, poison: flags & LOAD_POISON != 0, path, init, reason })
            }
            Op::Pad => Err(WireError("padding record")),
            Op::Batch => Err(WireError("a batch record is read with batch::BatchView")),
            Op::Unknown(_) => Err(WireError("unknown op")),
        }
    }

    #[inline(always)]
    fn parse_call(record: &'a [u8], header: &RecordHeader) -> Result<Message<'a>, WireError> {
        let shape = check_call(record, header)?;
        // Filled in place rather than pushed: this is the hot path of every call.
        let mut args = ArgList { args: [WireArg::default(); MAX_ARGS], len: header.nargs };
        for (slot, chunk) in args.args.iter_mut().zip(shape.raw_args.chunks_exact(ARG_LEN)) {
            *slot = decode_arg(chunk);
        }
        Ok(Message::Call {
            id: header.id,
            deferred: header.op == Op::Deferred,
            func: shape.func,
            ret: shape.ret,
            args,
            inline: shape.inline,
        })
    }

    /// For a Call, the bytes an `Inline` argument points at (None for other messages or out-of-range arguments).
    pub fn inline_arg(&self, arg: &WireArg) -> Option<&'a [u8]> {
        let Message::Call { args, inline, .. } = self else {
            return None;
        };
        let base = inline_base(args.len());
        let range = inline_range(arg, base, base + inline.len()).ok()?;
        inline.get(range.start - base..range.end - base)
    }

    /// Op of this message.
    pub fn op(&self) -> Op {
        match self {
            Message::Call { deferred: false, .. } => Op::Call,
            Message::Call { deferred: true, .. } => Op::Deferred,
            Message::Reply { .. } => Op::Reply,
            Message::Callback { .. } => Op::Callback,
            Message::CallbackReply { .. } => Op::CallbackReply,
            Message::Resolve { .. } => Op::Resolve,
            Message::Ping { .. } => Op::Ping,
            Message::Load { .. } => Op::Load,
        }
    }

    /// Id of this message.
    pub fn id(&self) -> u64 {
        match *self {
            Message::Call { id, .. }
            | Message::Reply { id, .. }
            | Message::Callback { id, .. }
            | Message::CallbackReply { id, .. }
            | Message::Resolve { id, .. }
            | Message::Load { id, .. }
            | Message::Ping { id } => id,
        }
    }

    /// Length of the record `emit` writes (a multiple of 16).
    pub fn wire_len(&self) -> usize {
        match self {
            Message::Call { args, inline, .. } => round_up(inline_base(args.len()).saturating_add(inline.len())),
            Message::Reply { .. } => REPLY_LEN,
            Message::Callback { .. } => CALLBACK_LEN,
            Message::CallbackReply { .. } => CALLBACK_REPLY_LEN,
            Message::Resolve { name, .. } => round_up(field::RESOLVE_NAME.saturating_add(name.len())),
            Message::Ping { .. } => PING_LEN,
            Message::Load { path, init, .. } => {
                round_up(field::LOAD_PATH.saturating_add(path.len()).saturating_add(init.len()))
            }
        }
    }

    /// Refuse what `parse` would refuse.
    fn check(&self) -> Result<(), WireError> {
        if self.wire_len() > MAX_RECORD {
            return Err(WireError("record longer than MAX_RECORD"));
        }
        match self {
            Message::Call { ret, args, inline, .. } => {
                if !known_ret(*ret) {
                    return Err(WireError("unknown return kind"));
                }
                let base = inline_base(args.len());
                let end = base + inline.len();
                let mut furthest = base;
                for arg in args.as_slice() {
                    if !known_arg(arg.kind) {
                        return Err(WireError("unknown argument kind"));
                    }
                    if arg.kind == ArgKind::Inline {
                        furthest = furthest.max(inline_range(arg, base, end)?.end);
                    }
                }
                if furthest != end {
                    return Err(WireError("inline bytes not covered by an Inline argument"));
                }
                Ok(())
            }
            Message::Callback { ret, .. } if !known_ret(*ret) => Err(WireError("unknown return kind")),
            _ => Ok(()),
        }
    }

    /// Write the record into `buf` (at least [`Message::wire_len`] bytes); every byte of the record is written,
    /// padding as zero. Returns the record's length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.check()?;
        let len = self.wire_len();
        let buf = buf.get_mut(..len).ok_or(WireError("buffer too small"))?;
        buf.fill(0);
        let (nargs, ret) = match self {
            Message::Call { args, ret, .. } => (args.len(), u8::from(*ret)),
            Message::Callback { ret, .. } => (0, u8::from(*ret)),
            _ => (0, 0),
        };
        // check() bounds len by MAX_RECORD and nargs by MAX_ARGS.
        RecordHeader { len: len as u32, op: self.op(), nargs: nargs as u8, ret, flags: 0, id: self.id() }.emit(buf)?;
        match self {
            Message::Call { func, args, inline, .. } => {
                put_u32(buf, field::CALL_FUNC, *func);
                for (i, arg) in args.as_slice().iter().enumerate() {
                    let at = field::CALL_ARGS + i * ARG_LEN;
                    buf[at + field::ARG_KIND] = u8::from(arg.kind);
                    put(buf, at + field::ARG_POOL.start, &arg.pool.to_le_bytes());
                    put(buf, at + field::ARG_A.start, &arg.a.to_le_bytes());
                    put(buf, at + field::ARG_B.start, &arg.b.to_le_bytes());
                }
                put(buf, inline_base(args.len()), inline);
            }
            Message::Reply { status, ret_int, ret_float, .. } => {
                put_u32(buf, field::REPLY_STATUS, u32::from(*status));
                put_u64(buf, field::REPLY_RET_INT, *ret_int);
                put_u64(buf, field::REPLY_RET_FLOAT, *ret_float);
            }
            Message::Callback { slot, ints, floats, .. } => {
                put_u32(buf, field::CALLBACK_SLOT, *slot);
                for (i, v) in ints.iter().enumerate() {
                    put(buf, field::CALLBACK_INTS + 8 * i, &v.to_le_bytes());
                }
                for (i, v) in floats.iter().enumerate() {
                    put(buf, field::CALLBACK_FLOATS + 8 * i, &v.to_le_bytes());
                }
            }
            Message::CallbackReply { ret_int, ret_float, .. } => {
                put_u64(buf, field::CALLBACK_REPLY_RET_INT, *ret_int);
                put_u64(buf, field::CALLBACK_REPLY_RET_FLOAT, *ret_float);
            }
            Message::Resolve { ext, name, .. } => {
                put_u32(buf, field::RESOLVE_EXT, *ext);
                // check() bounds the name by MAX_RECORD.
                put_u32(buf, field::RESOLVE_NAME_LEN, name.len() as u32);
                put(buf, field::RESOLVE_NAME, name);
            }
            Message::Ping { .. } => {}
            Message::Load { poison, path, init, reason, .. } => {
                put_u32(buf, field::LOAD_FLAGS, if *poison { LOAD_POISON } else { 0 });
                // check() bounds path and init by MAX_RECORD.
                put_u32(buf, field::LOAD_PATH_LEN, path.len() as u32);
                put_u32(buf, field::LOAD_INIT_LEN, init.len() as u32);
                put_u64(buf, field::LOAD_REASON_OFFSET, reason.0);
                put_u64(buf, field::LOAD_REASON_LEN, reason.1);
                put(buf, field::LOAD_PATH, path);
                put(buf, field::LOAD_PATH + path.len(), init);
            }
        }
        Ok(len)
    }
}

/// Check the framing every record shares: its length is a multiple of 16 in `[16, MAX_RECORD]` and within `record`.
/// Returns the header and the record cut to its length.
#[inline(always)]
fn frame(record: &[u8]) -> Result<(RecordHeader, &[u8]), WireError> {
    let header = RecordHeader::parse(record)?;
    let len = header.len as usize;
    if len < HEADER_LEN || len & (RECORD_ALIGN - 1) != 0 {
        return Err(WireError("length is not a positive multiple of 16"));
    }
    if len > MAX_RECORD {
        return Err(WireError("record longer than MAX_RECORD"));
    }
    let record = record.get(..len).ok_or(WireError("record shorter than its length field"))?;
    Ok((header, record))
}

/// What `check_call` found valid in a Call record.
struct CallShape<'a> {
    func: u32,
    ret: RetKind,
    /// The argument array, `nargs * ARG_LEN` bytes.
    raw_args: &'a [u8],
    inline: &'a [u8],
}

/// Validate the body of a framed Call/Deferred record: argument count, return kind, argument kinds, inline ranges,
/// and a length that is exactly what the arguments and inline bytes need.
#[inline(always)]
fn check_call<'a>(record: &'a [u8], header: &RecordHeader) -> Result<CallShape<'a>, WireError> {
    let len = record.len();
    let nargs = usize::from(header.nargs);
    if nargs > MAX_ARGS {
        return Err(WireError("too many arguments"));
    }
    let ret = RetKind::from(header.ret);
    if !known_ret(ret) {
        return Err(WireError("unknown return kind"));
    }
    let base = inline_base(nargs);
    let raw_args = record.get(field::CALL_ARGS..base).ok_or(WireError("arguments run past the record"))?;
    let func = get_u32(record, field::CALL_FUNC)?;
    let mut inline_end = base;
    for chunk in raw_args.chunks_exact(ARG_LEN) {
        let arg = decode_arg(chunk);
        if !known_arg(arg.kind) {
            return Err(WireError("unknown argument kind"));
        }
        if arg.kind == ArgKind::Inline {
            inline_end = inline_end.max(inline_range(&arg, base, len)?.end);
        }
    }
    if round_up(inline_end) != len {
        return Err(WireError("wrong length for its inline bytes"));
    }
    let inline = record.get(base..inline_end).ok_or(WireError("inline bytes run past the record"))?;
    Ok(CallShape { func, ret, raw_args, inline })
}

/// Hot path: a zero-copy view of a Call or Deferred record that passed exactly the checks of [`Message::parse`],
/// without copying its arguments into an [`ArgList`]. Like a parsed [`Message`], it borrows a private copy of the
/// record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallView<'a> {
    record: &'a [u8],
    id: u64,
    deferred: bool,
    func: u32,
    ret: RetKind,
    raw_args: &'a [u8],
    inline: &'a [u8],
}

impl<'a> CallView<'a> {
    /// Check a Call/Deferred record; any other op is an error.
    pub fn parse(record: &'a [u8]) -> Result<Self, WireError> {
        let (header, record) = frame(record)?;
        if !matches!(header.op, Op::Call | Op::Deferred) {
            return Err(WireError("not a call"));
        }
        let shape = check_call(record, &header)?;
        Ok(CallView {
            record,
            id: header.id,
            deferred: header.op == Op::Deferred,
            func: shape.func,
            ret: shape.ret,
            raw_args: shape.raw_args,
            inline: shape.inline,
        })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Op 2: no reply expected.
    pub fn deferred(&self) -> bool {
        self.deferred
    }

    pub fn func(&self) -> u32 {
        self.func
    }

    pub fn ret(&self) -> RetKind {
        self.ret
    }

    pub fn nargs(&self) -> usize {
        self.raw_args.len() / ARG_LEN
    }

    /// Argument `i`, if there is one.
    pub fn arg(&self, i: usize) -> Option<WireArg> {
        let start = i.checked_mul(ARG_LEN)?;
        self.raw_args.get(start..start.checked_add(ARG_LEN)?).map(decode_arg)
    }

    /// The arguments, in order.
    pub fn args(&self) -> impl Iterator<Item = WireArg> + 'a {
        self.raw_args.chunks_exact(ARG_LEN).map(decode_arg)
    }

    /// The inline bytes (as in [`Message::Call`]).
    pub fn inline(&self) -> &'a [u8] {
        self.inline
    }

    /// The bytes an `Inline` argument points at.
    pub fn inline_arg(&self, arg: &WireArg) -> Option<&'a [u8]> {
        let base = field::CALL_ARGS + self.raw_args.len();
        let range = inline_range(arg, base, base + self.inline.len()).ok()?;
        self.record.get(range)
    }

    /// The whole record.
    pub fn record(&self) -> &'a [u8] {
        self.record
    }

    /// The same call as a [`Message`].
    pub fn to_message(&self) -> Message<'a> {
        let mut args = ArgList { args: [WireArg::default(); MAX_ARGS], len: 0 };
        for (slot, arg) in args.args.iter_mut().zip(self.args()) {
            *slot = arg;
            args.len += 1;
        }
        Message::Call {
            id: self.id,
            deferred: self.deferred,
            func: self.func,
            ret: self.ret,
            args,
            inline: self.inline,
        }
    }
}

/// Decode one argument from its bytes (`ARG_LEN` of them; shorter input decodes as zeroes, which never happens:
/// callers pass `chunks_exact(ARG_LEN)` pieces).
#[inline(always)]
fn decode_arg(raw: &[u8]) -> WireArg {
    let mut b = [0u8; ARG_LEN];
    if let Some(src) = raw.get(..ARG_LEN) {
        b.copy_from_slice(src);
    }
    let [k, _, _, _, p0, p1, p2, p3, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7] = b;
    WireArg {
        kind: ArgKind::from(k),
        pool: u32::from_le_bytes([p0, p1, p2, p3]),
        a: u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
        b: u64::from_le_bytes([b0, b1, b2, b3, b4, b5, b6, b7]),
    }
}

/// The record range `[a, a + b)` of an Inline argument, if it lies in `[base, end)`.
fn inline_range(arg: &WireArg, base: usize, end: usize) -> Result<Range<usize>, WireError> {
    let start = usize::try_from(arg.a).map_err(|_| WireError("inline argument out of bounds"))?;
    let len = usize::try_from(arg.b).map_err(|_| WireError("inline argument out of bounds"))?;
    match start.checked_add(len) {
        Some(stop) if start >= base && stop <= end => Ok(start..stop),
        _ => Err(WireError("inline argument out of bounds")),
    }
}

/// Hot path: write a Reply record (every byte) without going through [`Message`].
pub fn emit_reply(buf: &mut [u8; REPLY_LEN], id: u64, status: Status, ret_int: u64, ret_float: u64) {
    *buf = [0; REPLY_LEN];
    put_u32(buf, field::LEN, REPLY_LEN as u32);
    buf[field::OP] = u8::from(Op::Reply);
    put_u64(buf, field::ID, id);
    put_u32(buf, field::REPLY_STATUS, u32::from(status));
    put_u64(buf, field::REPLY_RET_INT, ret_int);
    put_u64(buf, field::REPLY_RET_FLOAT, ret_float);
}

/// Hot path: write a Call (or Deferred) record with no inline bytes straight into `buf`, without building a
/// [`Message`] (whose inline argument list is large to move). Returns the record's length. The result parses to
/// exactly the `Message::Call` with the same fields.
pub fn emit_call<I>(
    buf: &mut [u8],
    id: u64,
    deferred: bool,
    func: u32,
    ret: RetKind,
    args: I,
) -> Result<usize, WireError>
where
    I: IntoIterator<Item = WireArg>,
    I::IntoIter: ExactSizeIterator,
{
    let args = args.into_iter();
    let nargs = args.len();
    if nargs > MAX_ARGS {
        return Err(WireError("more than 14 arguments"));
    }
    if matches!(ret, RetKind::Unknown(_)) {
        return Err(WireError("unknown return kind"));
    }
    let len = round_up(inline_base(nargs));
    let buf = buf.get_mut(..len).ok_or(WireError("buffer too small for the record"))?;
    put_u32(buf, field::LEN, len as u32);
    buf[field::OP] = u8::from(if deferred { Op::Deferred } else { Op::Call });
    buf[field::NARGS] = nargs as u8;
    buf[field::RET] = u8::from(ret);
    buf[field::FLAGS] = 0;
    put_u64(buf, field::ID, id);
    put_u32(buf, field::CALL_FUNC, func);
    put(buf, field::CALL_FUNC.end, &[0; 4]);
    for (i, a) in args.enumerate() {
        if matches!(a.kind, ArgKind::Inline | ArgKind::Unknown(_)) {
            return Err(WireError("emit_call carries no inline bytes and no unknown argument kinds"));
        }
        let at = field::CALL_ARGS + i * ARG_LEN;
        buf[at + field::ARG_KIND] = u8::from(a.kind);
        put(buf, at + field::ARG_KIND + 1, &[0; 3]);
        put(buf, at + field::ARG_POOL.start, &a.pool.to_le_bytes());
        put(buf, at + field::ARG_A.start, &a.a.to_le_bytes());
        put(buf, at + field::ARG_B.start, &a.b.to_le_bytes());
    }
    Ok(len)
}

/// Hot path: write a CallbackReply record.
pub fn emit_callback_reply(buf: &mut [u8; CALLBACK_REPLY_LEN], id: u64, ret_int: u64, ret_float: u64) {
    *buf = [0; CALLBACK_REPLY_LEN];
    put_u32(buf, field::LEN, CALLBACK_REPLY_LEN as u32);
    buf[field::OP] = u8::from(Op::CallbackReply);
    put_u64(buf, field::ID, id);
    put_u64(buf, field::CALLBACK_REPLY_RET_INT, ret_int);
    put_u64(buf, field::CALLBACK_REPLY_RET_FLOAT, ret_float);
}

/// Hot path: write a Ping record.
pub fn emit_ping(buf: &mut [u8; PING_LEN], id: u64) {
    *buf = [0; PING_LEN];
    put_u32(buf, field::LEN, PING_LEN as u32);
    buf[field::OP] = u8::from(Op::Ping);
    put_u64(buf, field::ID, id);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(kind: ArgKind, pool: u32, a: u64, b: u64) -> WireArg {
        WireArg { kind, pool, a, b }
    }

    #[test]
    fn emit_call_matches_the_message_it_stands_for() {
        let args = [arg(ArgKind::Int, 0, 7, 0), arg(ArgKind::BufIn, 0, 4096, 12), arg(ArgKind::F64, 0, 1, 0)];
        for deferred in [false, true] {
            let mut fast = [0xa5u8; 256];
            let n = emit_call(&mut fast, 99, deferred, 3, RetKind::F64, args).unwrap();
            let message = Message::Call {
                id: 99,
                deferred,
                func: 3,
                ret: RetKind::F64,
                args: ArgList::from_slice(&args).unwrap(),
                inline: &[],
            };
            let mut slow = [0u8; 256];
            let m = message.emit(&mut slow).unwrap();
            assert_eq!(&fast[..n], &slow[..m]);
            assert_eq!(Message::parse(&fast[..n]).unwrap(), message);
        }
        let inline = [arg(ArgKind::Inline, 0, 96, 4)];
        assert!(emit_call(&mut [0u8; 256], 1, true, 0, RetKind::Void, inline).is_err());
        assert!(emit_call(&mut [0u8; 16], 1, false, 0, RetKind::Void, args).is_err());
    }

    fn samples() -> Vec<Message<'static>> {
        static INLINE: [u8; 21] = *b"hello, inline world!!";
        let base2 = inline_base(3) as u64;
        let mut msgs = vec![
            Message::Call {
                id: 1,
                deferred: false,
                func: 7,
                ret: RetKind::Int,
                args: ArgList::from_slice(&[arg(ArgKind::Int, 0, 42, 0), arg(ArgKind::F64, 0, 1.5f64.to_bits(), 0)])
                    .unwrap(),
                inline: &[],
            },
            Message::Call {
                id: 2,
                deferred: true,
                func: 8,
                ret: RetKind::Void,
                args: ArgList::from_slice(&[
                    arg(ArgKind::Inline, 0, base2, 5),
                    arg(ArgKind::BufIn, 0, 4096, 100),
                    arg(ArgKind::Inline, 0, base2 + 7, 14),
                ])
                .unwrap(),
                inline: &INLINE,
            },
            Message::Call { id: 3, deferred: false, func: 0, ret: RetKind::F32, args: ArgList::new(), inline: &[] },
            Message::Reply { id: 4, status: Status::Ok, ret_int: u64::MAX, ret_float: 2.5f64.to_bits() },
            Message::Reply { id: 5, status: Status::Unknown(99), ret_int: 0, ret_float: 0 },
            Message::Callback {
                id: 6,
                slot: 3,
                ret: RetKind::F64,
                ints: [1, 2, 3, 4, 5, 6],
                floats: [7, 8, 9, 10, 11, 12, 13, 14],
            },
            Message::CallbackReply { id: 7, ret_int: 1, ret_float: 2 },
            Message::Resolve { id: 8, ext: 2, name: b"ward_add" },
            Message::Resolve { id: 9, ext: 0, name: b"" },
            Message::Resolve { id: 10, ext: 0, name: b"exactly_eight_ok" },
            Message::Ping { id: 11 },
            Message::Load { id: 13, poison: false, path: b"/usr/lib/ladspa/amp.so", init: b"", reason: (4096, 512) },
            Message::Load { id: 14, poison: true, path: b"ext.so", init: b"ext_init", reason: (0, 0) },
            Message::Load { id: 15, poison: false, path: b"", init: b"", reason: (u64::MAX, 1) },
        ];
        // Every argument kind and the most arguments.
        let kinds = [
            ArgKind::Int,
            ArgKind::F64,
            ArgKind::F32,
            ArgKind::BufIn,
            ArgKind::BufOut,
            ArgKind::BufInOut,
            ArgKind::Str,
            ArgKind::Callback,
            ArgKind::BufScratch,
        ];
        let mut all = ArgList::new();
        for i in 0..MAX_ARGS {
            all.push(arg(kinds[i % kinds.len()], i as u32, i as u64 * 3, i as u64 * 5)).unwrap();
        }
        msgs.push(Message::Call { id: 12, deferred: false, func: 1, ret: RetKind::Int, args: all, inline: &[] });
        msgs
    }

    #[test]
    fn parse_emit_round_trip() {
        for m in samples() {
            let mut buf = [0xa5u8; MAX_RECORD + 16];
            let n = m.emit(&mut buf).unwrap();
            assert_eq!(n, m.wire_len());
            assert_eq!(n % 16, 0);
            assert_eq!(Message::parse(&buf[..n]).unwrap(), m);
            // A longer buffer parses the same.
            assert_eq!(Message::parse(&buf).unwrap(), m);
            assert_eq!(buf[n], 0xa5, "emit wrote past the record");
        }
    }

    #[test]
    fn call_view_matches_parse() {
        for m in samples() {
            let rec = emitted(&m);
            match CallView::parse(&rec) {
                Ok(v) => {
                    assert_eq!(v.to_message(), m);
                    assert_eq!(v.record(), &rec[..]);
                    let Message::Call { id, deferred, func, ret, args, inline } = m else { panic!("{m:?}") };
                    assert_eq!((v.id(), v.deferred(), v.func(), v.ret()), (id, deferred, func, ret));
                    assert_eq!(v.nargs(), args.len());
                    assert_eq!(v.args().collect::<Vec<_>>(), args.as_slice());
                    assert_eq!(v.arg(args.len()), None);
                    assert_eq!(v.inline(), inline);
                    for a in args.as_slice() {
                        assert_eq!(v.inline_arg(a), m.inline_arg(a));
                    }
                    // A forged range into the header or arguments resolves to nothing.
                    assert_eq!(v.inline_arg(&arg(ArgKind::Inline, 0, 0, 16)), None);
                }
                Err(e) => {
                    assert!(!matches!(m, Message::Call { .. }), "{m:?}: {e}");
                    assert_eq!(e, WireError("not a call"));
                }
            }
        }
    }

    #[test]
    fn emit_writes_every_byte() {
        for m in samples() {
            let mut buf = [0xa5u8; MAX_RECORD];
            let n = m.emit(&mut buf).unwrap();
            assert!(!buf[..n].contains(&0xa5), "{m:?}: {:?}", &buf[..n]);
        }
    }

    #[test]
    fn fixed_layout_of_a_reply() {
        let m = Message::Reply { id: 0x0102_0304_0506_0708, status: Status::BadArgs, ret_int: 9, ret_float: 10 };
        let mut buf = [0u8; REPLY_LEN];
        m.emit(&mut buf).unwrap();
        let mut want = [0u8; REPLY_LEN];
        want[0] = 48;
        want[4] = 3;
        want[8..16].copy_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
        want[16] = 2;
        want[24] = 9;
        want[32] = 10;
        assert_eq!(buf, want);
        let mut fast = [0xa5u8; REPLY_LEN];
        emit_reply(&mut fast, 0x0102_0304_0506_0708, Status::BadArgs, 9, 10);
        assert_eq!(fast, want);
    }

    #[test]
    fn fast_emitters_match() {
        let mut a = [0xa5u8; CALLBACK_REPLY_LEN];
        emit_callback_reply(&mut a, 5, 6, 7);
        let mut b = [0u8; CALLBACK_REPLY_LEN];
        Message::CallbackReply { id: 5, ret_int: 6, ret_float: 7 }.emit(&mut b).unwrap();
        assert_eq!(a, b);
        let mut p = [0xa5u8; PING_LEN];
        emit_ping(&mut p, 9);
        assert_eq!(Message::parse(&p).unwrap(), Message::Ping { id: 9 });
    }

    fn emitted(m: &Message<'_>) -> Vec<u8> {
        let mut buf = vec![0u8; m.wire_len()];
        m.emit(&mut buf).unwrap();
        buf
    }

    #[test]
    fn truncated_and_oversized_records_fail() {
        for m in samples() {
            let rec = emitted(&m);
            for cut in 0..rec.len() {
                assert!(Message::parse(&rec[..cut]).is_err(), "{m:?} cut at {cut}");
            }
        }
        let mut big = vec![0u8; MAX_RECORD + 16];
        big[..4].copy_from_slice(&((MAX_RECORD + 16) as u32).to_le_bytes());
        big[4] = 1;
        assert_eq!(Message::parse(&big), Err(WireError("record longer than MAX_RECORD")));
        let mut ping = emitted(&Message::Ping { id: 1 });
        ping[0] = 32;
        ping.resize(32, 0);
        assert_eq!(Message::parse(&ping), Err(WireError("wrong length for its op")));
        ping[0] = 20;
        assert!(Message::parse(&ping).is_err());
        ping[0] = 0;
        assert!(Message::parse(&ping).is_err());
    }

    #[test]
    fn bad_ops_and_kinds_fail() {
        let mut ping = emitted(&Message::Ping { id: 1 });
        for op in [0u8, 8, 9, 10, 255] {
            ping[4] = op;
            assert!(Message::parse(&ping).is_err(), "op {op}");
        }
        let call = Message::Call {
            id: 1,
            deferred: false,
            func: 1,
            ret: RetKind::Void,
            args: ArgList::from_slice(&[arg(ArgKind::Int, 0, 1, 0)]).unwrap(),
            inline: &[],
        };
        let rec = emitted(&call);
        for kind in [0u8, 11, 200] {
            let mut r = rec.clone();
            r[24] = kind;
            assert_eq!(Message::parse(&r), Err(WireError("unknown argument kind")));
        }
        let mut r = rec.clone();
        r[6] = 4;
        assert_eq!(Message::parse(&r), Err(WireError("unknown return kind")));
        // nargs beyond MAX_ARGS, with a length that would hold them.
        let n = round_up(inline_base(15));
        let mut r = vec![0u8; n];
        r[..4].copy_from_slice(&(n as u32).to_le_bytes());
        r[4] = 1;
        r[5] = 15;
        for i in 0..15 {
            r[24 + 24 * i] = 1;
        }
        assert_eq!(Message::parse(&r), Err(WireError("too many arguments")));
        // nargs that runs past the record.
        let mut r = rec.clone();
        r[5] = 3;
        assert_eq!(Message::parse(&r), Err(WireError("arguments run past the record")));
        // Emit refuses unknown kinds too.
        let bad = Message::Call {
            id: 1,
            deferred: false,
            func: 1,
            ret: RetKind::Void,
            args: ArgList::from_slice(&[arg(ArgKind::Unknown(0), 0, 1, 0)]).unwrap(),
            inline: &[],
        };
        assert!(bad.emit(&mut [0u8; 64]).is_err());
        let bad = Message::Callback { id: 1, slot: 0, ret: RetKind::Unknown(7), ints: [0; 6], floats: [0; 8] };
        assert!(bad.emit(&mut [0u8; 256]).is_err());
    }

    #[test]
    fn inline_bounds_are_checked() {
        let base = inline_base(1) as u64; // 48
        let good = Message::Call {
            id: 1,
            deferred: false,
            func: 1,
            ret: RetKind::Void,
            args: ArgList::from_slice(&[arg(ArgKind::Inline, 0, base, 10)]).unwrap(),
            inline: b"0123456789",
        };
        let rec = emitted(&good);
        assert_eq!(rec.len(), 64);
        let parsed = Message::parse(&rec).unwrap();
        assert_eq!(parsed.inline_arg(&parsed_args(&parsed)[0]), Some(&b"0123456789"[..]));
        let with = |a: u64, b: u64| {
            let mut r = rec.clone();
            r[32..40].copy_from_slice(&a.to_le_bytes());
            r[40..48].copy_from_slice(&b.to_le_bytes());
            Message::parse(&r).map(|_| ())
        };
        // Past the record, into the arguments, overflowing, and shorter than the record needs.
        assert_eq!(with(base, 17), Err(WireError("inline argument out of bounds")));
        assert_eq!(with(base - 1, 10), Err(WireError("inline argument out of bounds")));
        assert_eq!(with(0, 4), Err(WireError("inline argument out of bounds")));
        assert_eq!(with(u64::MAX, 2), Err(WireError("inline argument out of bounds")));
        assert_eq!(with(base, u64::MAX), Err(WireError("inline argument out of bounds")));
        assert_eq!(with(base, 0), Err(WireError("wrong length for its inline bytes")));
        assert!(with(base + 10, 6).is_ok());
        // Emit refuses inline bytes no argument covers, and arguments outside the inline bytes.
        let Message::Call { args, .. } = good else { unreachable!() };
        let uncovered =
            Message::Call { id: 1, deferred: false, func: 1, ret: RetKind::Void, args, inline: b"0123456789ab" };
        assert!(uncovered.emit(&mut [0u8; 128]).is_err());
        let outside = Message::Call { id: 1, deferred: false, func: 1, ret: RetKind::Void, args, inline: b"01234" };
        assert!(outside.emit(&mut [0u8; 128]).is_err());
        // Inline arguments of other messages resolve to nothing.
        assert_eq!(Message::Ping { id: 1 }.inline_arg(&arg(ArgKind::Inline, 0, 16, 0)), None);
    }

    fn parsed_args(m: &Message<'_>) -> Vec<WireArg> {
        match m {
            Message::Call { args, .. } => args.as_slice().to_vec(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn resolve_lengths_are_checked() {
        let rec = emitted(&Message::Resolve { id: 1, ext: 1, name: b"abc" });
        assert_eq!(rec.len(), 32);
        let mut r = rec.clone();
        r[20..24].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(Message::parse(&r), Err(WireError("name runs past the record")));
        r[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Message::parse(&r).is_err());
        // A name that would fit in less than the record's length.
        let mut r = rec.clone();
        r.resize(48, 0);
        r[0] = 48;
        assert_eq!(Message::parse(&r), Err(WireError("wrong length for its name")));
    }

    #[test]
    fn load_lengths_and_flags_are_checked() {
        let rec = emitted(&Message::Load { id: 1, poison: true, path: b"a.so", init: b"in", reason: (64, 512) });
        assert_eq!(rec.len(), 64);
        assert_eq!(
            Message::parse(&rec),
            Ok(Message::Load { id: 1, poison: true, path: b"a.so", init: b"in", reason: (64, 512) })
        );
        let with = |at: usize, v: u32| {
            let mut r = rec.clone();
            r[at..at + 4].copy_from_slice(&v.to_le_bytes());
            Message::parse(&r).map(|_| ())
        };
        assert_eq!(with(16, 2), Err(WireError("unknown load flag")));
        assert_eq!(with(20, 17), Err(WireError("path or init name runs past the record")));
        assert_eq!(with(24, 15), Err(WireError("path or init name runs past the record")));
        assert!(with(20, u32::MAX).is_err());
        assert!(with(24, u32::MAX).is_err());
        // Path and init name that would fit in less than the record's length.
        let mut r = rec.clone();
        r[20..28].fill(0);
        assert_eq!(Message::parse(&r), Err(WireError("wrong length for its path and init name")));
        // Shorter than the fixed part.
        let mut r = rec[..32].to_vec();
        r[0] = 32;
        assert_eq!(Message::parse(&r), Err(WireError("load record too short")));
        // A path as long as a record allows, and one byte more.
        let path = [b'p'; MAX_RECORD - field::LOAD_PATH];
        let fits = Message::Load { id: 2, poison: false, path: &path, init: b"", reason: (0, 0) };
        assert_eq!(Message::parse(&emitted(&fits)), Ok(fits));
        let over = Message::Load { id: 2, poison: false, path: &path, init: b"x", reason: (0, 0) };
        assert_eq!(over.emit(&mut vec![0u8; 2 * MAX_RECORD]), Err(WireError("record longer than MAX_RECORD")));
    }

    #[test]
    fn emit_into_a_short_buffer_fails() {
        for m in samples() {
            let mut buf = vec![0u8; m.wire_len() - 1];
            assert_eq!(m.emit(&mut buf), Err(WireError("buffer too small")));
        }
        let long = [b'x'; MAX_RECORD];
        let m = Message::Resolve { id: 1, ext: 0, name: &long };
        assert_eq!(m.emit(&mut vec![0u8; 2 * MAX_RECORD]), Err(WireError("record longer than MAX_RECORD")));
    }

    #[test]
    fn arg_list_holds_at_most_max_args() {
        let mut l = ArgList::new();
        for _ in 0..MAX_ARGS {
            l.push(WireArg::default()).unwrap();
        }
        assert!(l.push(WireArg::default()).is_err());
        assert_eq!(l.len(), MAX_ARGS);
        assert_eq!(ArgList::from_slice(&[WireArg::default(); MAX_ARGS + 1]), Err(WireError("too many arguments")));
    }

    #[test]
    fn enums_keep_unknown_codes() {
        assert_eq!(Op::from(1), Op::Call);
        assert_eq!(Op::from(8), Op::Batch);
        assert_eq!(Op::from(10), Op::Load);
        assert_eq!(Op::from(11), Op::Unknown(11));
        assert_eq!(u8::from(Op::Unknown(11)), 11);
        assert_eq!(u8::from(Op::Pad), OP_PAD);
        assert_eq!(Status::from(4), Status::UnknownOp);
        assert_eq!(Status::from(5), Status::LoadFailed);
        assert_eq!(Status::from(6), Status::Unknown(6));
        assert_eq!(ArgKind::from(9), ArgKind::Inline);
        assert_eq!(RetKind::from(3), RetKind::F32);
        assert_eq!(WireArg::default().kind, ArgKind::Int);
    }

    struct Rng(crate::mix::SplitMix64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0.next_u64()
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn random_records_never_panic() {
        let mut rng = Rng(crate::mix::SplitMix64::new(0));
        let mut parsed = 0;
        for _ in 0..100_000 {
            let size = rng.below(600) as usize;
            let mut rec: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
            // Mostly plausible headers, so the body parsers get exercised too.
            if size >= 16 && rng.below(4) != 0 {
                let len = if rng.below(2) == 0 { size & !15 } else { rng.below(size as u64 + 32) as usize };
                rec[..4].copy_from_slice(&(len as u32).to_le_bytes());
                rec[4] = rng.below(11) as u8;
                rec[5] = rng.below(16) as u8;
                rec[6] = rng.below(5) as u8;
                let nargs = usize::from(rec[5]).min((size.saturating_sub(24)) / 24);
                for i in 0..nargs {
                    let at = 24 + 24 * i;
                    rec[at] = rng.below(11) as u8;
                    if rec[at] == 9 {
                        let base = inline_base(usize::from(rec[5])) as u64;
                        let a = base + rng.below(64);
                        rec[at + 8..at + 16].copy_from_slice(&a.to_le_bytes());
                        rec[at + 16..at + 24].copy_from_slice(&rng.below(64).to_le_bytes());
                    }
                }
                if rec[4] == 6 && size >= 24 {
                    let name_len = rng.below(size as u64) as u32;
                    rec[20..24].copy_from_slice(&name_len.to_le_bytes());
                }
            }
            let _ = RecordHeader::parse(&rec);
            // The fast view accepts exactly the calls the full parser accepts, and sees the same call.
            match (CallView::parse(&rec), Message::parse(&rec)) {
                (Ok(v), Ok(m)) => assert_eq!(v.to_message(), m),
                (Err(_), Ok(Message::Call { .. })) | (Ok(_), _) => {
                    panic!("CallView disagrees on {rec:?}")
                }
                (Err(_), _) => {}
            }
            if let Ok(m) = Message::parse(&rec) {
                parsed += 1;
                // Whatever parses re-emits to the same message.
                let mut out = vec![0u8; m.wire_len()];
                let n = m.emit(&mut out).expect("a parsed message emits");
                assert_eq!(Message::parse(&out[..n]).unwrap(), m);
                if let Message::Call { args, .. } = m {
                    for a in args.as_slice() {
                        if a.kind == ArgKind::Inline {
                            assert!(m.inline_arg(a).is_some());
                        }
                    }
                }
            }
        }
        assert!(parsed > 100, "the fuzz loop parsed only {parsed} records");
    }

    /// An argument-less call, emitted: the message and its record.
    fn emitted_call(id: u64) -> (Message<'static>, Vec<u8>) {
        let m = Message::Call { id, deferred: false, func: 2, ret: RetKind::Int, args: ArgList::new(), inline: &[] };
        let mut buf = vec![0u8; m.wire_len()];
        let n = m.emit(&mut buf).unwrap();
        buf.truncate(n);
        (m, buf)
    }

    #[test]
    fn a_nested_mark_is_seen_and_changes_nothing_else() {
        let (m, mut buf) = emitted_call(5);
        let n = buf.len();
        assert!(!is_nested(&buf[..n]), "emit writes no flags");
        mark_nested(&mut buf[..n]);
        assert!(is_nested(&buf[..n]));
        assert_eq!(Message::parse(&buf[..n]).unwrap(), m);
        assert!(CallView::parse(&buf[..n]).is_ok());
        assert!(!is_nested(&buf[..3]), "too short to carry flags");
    }

    #[test]
    fn a_hand_over_mark_is_seen_apart_from_the_nested_one_and_changes_nothing_else() {
        let (m, mut buf) = emitted_call(6);
        let n = buf.len();
        assert!(!is_hand_over(&buf[..n]), "emit writes no flags");
        mark_hand_over(&mut buf[..n]);
        assert!(is_hand_over(&buf[..n]));
        assert!(!is_nested(&buf[..n]), "one flag does not set the other");
        mark_nested(&mut buf[..n]);
        assert!(is_hand_over(&buf[..n]) && is_nested(&buf[..n]));
        assert_eq!(Message::parse(&buf[..n]).unwrap(), m);
        assert!(CallView::parse(&buf[..n]).is_ok());
    }
}
