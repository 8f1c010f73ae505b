//! One way to make generic C calls, natively or through ward, so a built-in extension's workload is written once.
//! Arguments and return types are ward's ([`Arg`], [`RetType`], [`Value`]).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;

use ward::{Arg, Extension, Function, RetType, Value};

use super::WorkloadError;

/// Makes calls into an extension by symbol name. A workload records errors as text, it does not act on them.
pub trait Caller {
    fn call(&mut self, symbol: &str, args: &mut [Arg<'_>], ret: RetType) -> Result<Value, WorkloadError>;
}

/// Where a native host finds an extension's functions (the host's own dlopen/dlsym).
pub trait Symbols {
    fn address(&self, symbol: &str) -> Result<*const c_void, WorkloadError>;
}

/// Calls through ward: the extension's domain, with its policy, recovery and events.
pub struct WardCaller<'e> {
    ext: &'e Extension,
    functions: HashMap<String, Function>,
}

impl<'e> WardCaller<'e> {
    pub fn new(ext: &'e Extension) -> WardCaller<'e> {
        WardCaller { ext, functions: HashMap::new() }
    }
}

impl Caller for WardCaller<'_> {
    fn call(&mut self, symbol: &str, args: &mut [Arg<'_>], ret: RetType) -> Result<Value, WorkloadError> {
        if !self.functions.contains_key(symbol) {
            // Resolved once: later calls skip the lookup, as a host holding function handles would.
            let f = self.ext.function(symbol)?;
            self.functions.insert(symbol.to_string(), f);
        }
        let function = &self.functions[symbol];
        Ok(function.call(args, ret)?)
    }
}

/// Calls the functions directly, in this process, as a host without ward does: host pointers are passed as they
/// are, a function pointer is passed as [`Arg::Ptr`], and whatever the function does happens to this process.
pub struct NativeCaller<'s> {
    symbols: &'s dyn Symbols,
    resolved: HashMap<String, usize>,
}

impl<'s> NativeCaller<'s> {
    /// # Safety
    /// Every call made through the caller must match the C declaration of the function it names: the arguments'
    /// number, order and classes (integer or pointer, `double`, `float`), the return type, and pointers valid for
    /// what the function does with them.
    pub unsafe fn new(symbols: &'s dyn Symbols) -> NativeCaller<'s> {
        NativeCaller { symbols, resolved: HashMap::new() }
    }
}

impl Caller for NativeCaller<'_> {
    fn call(&mut self, symbol: &str, args: &mut [Arg<'_>], ret: RetType) -> Result<Value, WorkloadError> {
        let address = match self.resolved.get(symbol) {
            Some(&a) => a,
            None => {
                let a = self.symbols.address(symbol)? as usize;
                self.resolved.insert(symbol.to_string(), a);
                a
            }
        };
        let mut copies = Vec::new();
        let regs = ward::call::pack_in_process(args, &mut copies, Ok, |_| {
            Err("a native host passes its own function pointer (Arg::Ptr)".into())
        })
        .map_err(|reason| WorkloadError::Arguments { symbol: symbol.to_string(), reason })?;
        // SAFETY: `address` came from the extension's symbol table; `new`'s contract makes the caller of `call`
        // match the function's C declaration, and every pointer packed above borrows memory that `args` keeps
        // alive until this call returns.
        let ret_regs = unsafe { ward_abi::call_native(address as *const c_void, &regs) };
        Ok(Value::from_regs(ret, ret_regs))
    }
}
