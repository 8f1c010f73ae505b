//! The generic call API: arguments, return types and values of plain C functions.

use std::ffi::CStr;

use crate::callback::Callback;

/// One argument of a call into an extension.
///
/// Scalars travel in registers. Buffers are copied call-by-value-result: the extension sees a copy (in a process
/// domain, in a shared pool, ending at a guard page) and an `Out`/`InOut` buffer is copied back only when the call
/// succeeds, so a failed call leaves the host's buffer as it was. The exception: in a process whose large heap
/// blocks come from ward's arena (`ward run`), an `In`, `Scratch` or `InOut` buffer of 64 KiB or more inside one
/// block is lent to a process domain in place, with the same protections (inputs read-only or privately
/// writable, nothing beside the buffer reachable); an `InOut` buffer then holds whatever a failed call wrote.
#[derive(Debug)]
pub enum Arg<'a> {
    I64(i64),
    U64(u64),
    F64(f64),
    F32(f32),
    /// An address passed as it is. It means something only in the host's address space; a process domain cannot
    /// reach it (by design).
    Ptr(usize),
    /// Input bytes: the extension reads them and must not change them.
    In(&'a [u8]),
    /// Input bytes, as `In`, in a buffer the caller lets the core keep: where the call is kept as history, the core
    /// takes this buffer instead of a copy of it and leaves another in its place (empty, or the buffer of a
    /// history entry it dropped, holding anything). A caller that passes the same bytes again fills it anew.
    InVec(&'a mut Vec<u8>),
    /// Output bytes: the extension writes them.
    Out(&'a mut [u8]),
    /// Bytes the extension reads and writes.
    InOut(&'a mut [u8]),
    /// Input bytes the extension may also write, as scratch space (plugins that write into their "const" input):
    /// it works on a private, writable copy ending at a guard page in a process domain; the host's bytes never
    /// change and nothing is copied back.
    Scratch(&'a [u8]),
    /// A NUL-terminated string.
    Str(&'a CStr),
    /// A handle an earlier call returned as [`RetType::Handle`]: translated to the current incarnation's object.
    Handle(u64),
    /// A host function the extension may call back, registered with [`crate::Supervisor::register_callback`].
    Callback(&'a Callback),
}

impl Arg<'_> {
    /// The same argument, borrowed again for a shorter while: to pass a caller's arguments on in a call of one's
    /// own (a runtime puts its plugin's handle before them) without giving up the caller's buffers.
    pub fn reborrow(&mut self) -> Arg<'_> {
        match self {
            Arg::I64(v) => Arg::I64(*v),
            Arg::U64(v) => Arg::U64(*v),
            Arg::F64(v) => Arg::F64(*v),
            Arg::F32(v) => Arg::F32(*v),
            Arg::Ptr(v) => Arg::Ptr(*v),
            Arg::In(b) => Arg::In(b),
            Arg::InVec(v) => Arg::InVec(v),
            Arg::Out(b) => Arg::Out(b),
            Arg::InOut(b) => Arg::InOut(b),
            Arg::Scratch(b) => Arg::Scratch(b),
            Arg::Str(s) => Arg::Str(s),
            Arg::Handle(h) => Arg::Handle(*h),
            Arg::Callback(c) => Arg::Callback(c),
        }
    }
}

/// How to read a function's return value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetType {
    Void,
    I64,
    F64,
    F32,
    /// A pointer to an object the extension created (an instance). ward hands the host a stable handle instead
    /// and remaps it after a restart, so the host keeps using the handle it has.
    Handle,
}

/// A scalar type, for callback signatures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValType {
    I64,
    F64,
    F32,
}

/// A returned value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Void,
    I64(i64),
    F64(f64),
    F32(f32),
    Handle(u64),
}

impl Value {
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F64(v) => Some(v),
            Value::F32(v) => Some(f64::from(v)),
            _ => None,
        }
    }

    pub fn as_handle(&self) -> Option<u64> {
        match *self {
            Value::Handle(v) => Some(v),
            _ => None,
        }
    }

    /// Decode return registers as the given return type.
    pub fn from_regs(ret: RetType, regs: ward_abi::RegRet) -> Value {
        match ret {
            RetType::Void => Value::Void,
            RetType::I64 => Value::I64(regs.as_i64()),
            RetType::F64 => Value::F64(regs.as_f64()),
            RetType::F32 => Value::F32(regs.as_f32()),
            RetType::Handle => Value::Handle(regs.int),
        }
    }

    /// Encode as return registers (a callback's result).
    pub(crate) fn to_regs(self) -> ward_abi::RegRet {
        match self {
            Value::Void => ward_abi::RegRet::default(),
            Value::I64(v) => ward_abi::RegRet { int: v as u64, float: 0 },
            Value::Handle(v) => ward_abi::RegRet { int: v, float: 0 },
            Value::F64(v) => ward_abi::RegRet { int: 0, float: v.to_bits() },
            Value::F32(v) => ward_abi::RegRet { int: 0, float: u64::from(v.to_bits()) },
        }
    }
}

/// A callback's signature: the extension calls it as `ret f(args...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub args: Vec<ValType>,
    pub ret: RetType,
}

impl Signature {
    pub fn new(args: &[ValType], ret: RetType) -> Signature {
        Signature { args: args.to_vec(), ret }
    }

    /// Decode the registers a callback stub captured into values, in argument order.
    pub(crate) fn decode(&self, regs: &ward_abi::RegArgs) -> Vec<Value> {
        let (mut i, mut f) = (0usize, 0usize);
        let mut out = Vec::with_capacity(self.args.len());
        for t in &self.args {
            match t {
                ValType::I64 => {
                    out.push(Value::I64(regs.ints.get(i).copied().unwrap_or(0) as i64));
                    i += 1;
                }
                ValType::F64 => {
                    out.push(Value::F64(f64::from_bits(regs.floats.get(f).copied().unwrap_or(0))));
                    f += 1;
                }
                ValType::F32 => {
                    out.push(Value::F32(f32::from_bits(regs.floats.get(f).copied().unwrap_or(0) as u32)));
                    f += 1;
                }
            }
        }
        out
    }
}

/// Pack arguments for a call to a function in this very process (isolation `none`, or a native host): numbers in
/// registers, buffers and strings as their host addresses. `handle` says what a handle stands for, `callback` what
/// function pointer a callback becomes; either may refuse with a reason. A [`Arg::Scratch`] is copied into
/// `copies`, which must outlive the call, and its copy passed.
pub fn pack_in_process(
    args: &mut [Arg<'_>],
    copies: &mut Vec<Vec<u8>>,
    mut handle: impl FnMut(u64) -> Result<u64, String>,
    mut callback: impl FnMut(&Callback) -> Result<u64, String>,
) -> Result<ward_abi::RegArgs, String> {
    let mut packer = ward_abi::ArgPacker::new();
    for a in args.iter_mut() {
        let pushed = match a {
            Arg::I64(v) => packer.push_int(*v as u64),
            Arg::U64(v) => packer.push_int(*v),
            Arg::F64(v) => packer.push_f64(*v),
            Arg::F32(v) => packer.push_f32(*v),
            Arg::Ptr(p) => packer.push_int(*p as u64),
            Arg::In(b) => packer.push_int(b.as_ptr() as u64),
            Arg::InVec(v) => packer.push_int(v.as_ptr() as u64),
            Arg::Out(b) | Arg::InOut(b) => packer.push_int(b.as_mut_ptr() as u64),
            Arg::Scratch(b) => {
                // The copy's heap buffer stays put when `copies` grows.
                copies.push(b.to_vec());
                packer.push_int(copies.last_mut().map_or(0, |c| c.as_mut_ptr() as u64))
            }
            Arg::Str(s) => packer.push_int(s.as_ptr() as u64),
            Arg::Handle(h) => packer.push_int(handle(*h)?),
            Arg::Callback(c) => packer.push_int(callback(c)?),
        };
        pushed.map_err(|e| e.to_string())?;
    }
    Ok(packer.finish())
}
