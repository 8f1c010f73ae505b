//! The workload of the built-in `well` extension (extensions/well.c): every kind of call it offers, in a fixed order,
//! with fixed arguments: integer, double and float arithmetic; a buffer read, one written and one changed in place;
//! a string; a callback into the host; a process-wide counter; an instance behind a handle, created, used and freed.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::path::Path;
use std::time::Duration;

use ward::policy::FunctionOverride;
use ward::{Arg, Extension, Isolation, Policy, RetType, Signature, Supervisor, ValType, Value};

use super::{Caller, NativeCaller, Recorder, Symbols, WardCaller, Workload, WorkloadError};

pub struct Well;

/// Enough restarts that the host always gets to the end: each of the workload's 21 calls may fail and be retried
/// once (two restarts), and a failed replay costs a restart too.
const MAX_RESTARTS: u32 = 100;

impl Workload for Well {
    fn name(&self) -> &'static str {
        "well"
    }

    fn builtin(&self) -> Option<&'static str> {
        Some("well")
    }

    fn describe(&self) -> &'static str {
        "21 calls: integer, double and float arithmetic, in, out and in-out buffers, a string, a host callback, a \
         process-wide counter, and an instance behind a handle"
    }

    fn policy(&self, deadline: Option<Duration>) -> Policy {
        let mut policy = match deadline {
            Some(deadline) => super::trial_policy(deadline, MAX_RESTARTS),
            None => Policy::default(),
        };
        let d = policy.defaults_mut();
        for state in ["counter_add", "acc_new", "acc_add"] {
            d.functions.insert(state.into(), FunctionOverride { state: Some(true), ..FunctionOverride::default() });
        }
        d.functions.insert("acc_free".into(), FunctionOverride { destroys: Some(true), ..FunctionOverride::default() });
        policy
    }

    fn run_native(&self, symbols: &dyn Symbols, out: &mut Recorder) {
        // SAFETY: `sequence` calls each function of well.c with its C declaration (written beside each call), and
        // passes `square`, an `extern "C" fn(int64_t) -> int64_t`, where well_map_sum takes one.
        let mut caller = unsafe { NativeCaller::new(symbols) };
        sequence(&mut caller, Ok(Arg::Ptr(square as *const () as usize)), out);
    }

    fn run_ward(
        &self,
        sup: &Supervisor,
        path: &Path,
        isolation: Isolation,
        out: &mut Recorder,
    ) -> Result<Extension, WorkloadError> {
        let ext = sup.load_with(path, Some(isolation))?;
        let callback = sup.register_callback(Signature::new(&[ValType::I64], RetType::I64), |args| {
            Value::I64(square(args.first().and_then(Value::as_i64).unwrap_or(0)))
        });
        let mut caller = WardCaller::new(&ext);
        match callback {
            Ok(cb) => sequence(&mut caller, Ok(Arg::Callback(&cb)), out),
            Err(e) => sequence(&mut caller, Err(WorkloadError::from(e)), out),
        }
        Ok(ext)
    }
}

/// The host function well_map_sum calls back.
extern "C" fn square(x: i64) -> i64 {
    x.wrapping_mul(x)
}

fn sequence(c: &mut dyn Caller, callback: Result<Arg<'_>, WorkloadError>, out: &mut Recorder) {
    // int64_t well_add(int64_t, int64_t)
    for (a, b) in [(2i64, 40i64), (-7, 1_000_000_007)] {
        let call = || c.call("well_add", &mut [Arg::I64(a), Arg::I64(b)], RetType::I64);
        out.call(format!("well_add({a}, {b})"), call, show);
    }
    // int64_t well_mul3(int64_t, int64_t, int64_t)
    let call = || c.call("well_mul3", &mut [Arg::I64(3), Arg::I64(5), Arg::I64(7)], RetType::I64);
    out.call("well_mul3(3, 5, 7)", call, show);
    // double well_fma(double, double, double)
    let call = || c.call("well_fma", &mut [Arg::F64(1.5), Arg::F64(2.0), Arg::F64(0.25)], RetType::F64);
    out.call("well_fma(1.5, 2.0, 0.25)", call, show);
    // float well_halve(float)
    let call = || c.call("well_halve", &mut [Arg::F32(3.0)], RetType::F32);
    out.call("well_halve(3.0)", call, show);

    // int64_t well_sum(const uint8_t *, size_t)
    let data: Vec<u8> = (0..200u32).map(|i| (i * 7 % 251) as u8).collect();
    let call = || c.call("well_sum", &mut [Arg::In(&data), Arg::U64(data.len() as u64)], RetType::I64);
    out.call("well_sum(200 bytes)", call, show);
    // void well_xor(const uint8_t *in, uint8_t *out, size_t, int64_t key)
    let text = b"WardKeepsTheHostAlive";
    let call = || {
        let mut xored = vec![0u8; text.len()];
        let args = &mut [Arg::In(text), Arg::Out(&mut xored), Arg::U64(text.len() as u64), Arg::I64(0x20)];
        c.call("well_xor", args, RetType::Void).map(|_| xored)
    };
    out.call("well_xor(\"WardKeepsTheHostAlive\", 0x20)", call, |b| hex(b));
    // void well_reverse(uint8_t *, size_t)
    let call = || {
        let mut bytes: Vec<u8> = (1..=16).collect();
        let len = bytes.len() as u64;
        c.call("well_reverse", &mut [Arg::InOut(&mut bytes), Arg::U64(len)], RetType::Void).map(|_| bytes)
    };
    out.call("well_reverse(01..10)", call, |b| hex(b));
    // size_t well_strlen(const char *)
    let s = CString::new("ward campaign").unwrap_or_default();
    let call = || c.call("well_strlen", &mut [Arg::Str(&s)], RetType::I64);
    out.call("well_strlen(\"ward campaign\")", call, show);

    // int64_t well_map_sum(int64_t (*)(int64_t), int64_t)
    let call = || c.call("well_map_sum", &mut [callback?, Arg::I64(10)], RetType::I64);
    out.call("well_map_sum(square, 10)", call, show);

    // int64_t counter_add(int64_t), int64_t counter_get(void)
    for d in 1..=5i64 {
        out.call(format!("counter_add({d})"), || c.call("counter_add", &mut [Arg::I64(d)], RetType::I64), show);
    }
    out.call("counter_get()", || c.call("counter_get", &mut [], RetType::I64), show);

    // void *acc_new(int64_t), int64_t acc_add(void *, int64_t), int64_t acc_get(void *), void acc_free(void *)
    let handle = out.call("acc_new(100)", || c.call("acc_new", &mut [Arg::I64(100)], RetType::Handle), show);
    let later = ["acc_add(acc, 5)", "acc_add(acc, -3)", "acc_get(acc)", "acc_free(acc)"];
    let Some(Value::Handle(h)) = handle.filter(|v| *v != Value::Handle(0)) else {
        for call in later {
            out.skip(call, "acc_new gave no instance");
        }
        return;
    };
    for d in [5i64, -3] {
        let call = || c.call("acc_add", &mut [Arg::Handle(h), Arg::I64(d)], RetType::I64);
        out.call(format!("acc_add(acc, {d})"), call, show);
    }
    out.call("acc_get(acc)", || c.call("acc_get", &mut [Arg::Handle(h)], RetType::I64), show);
    out.call("acc_free(acc)", || c.call("acc_free", &mut [Arg::Handle(h)], RetType::Void), show);
}

/// A result as text. Floats carry their bits, so a change in the last place shows. Handles are ward's stable
/// numbers under ward and addresses natively, so only whether there is one counts.
fn show(v: &Value) -> String {
    match *v {
        Value::Void => "done".into(),
        Value::I64(x) => x.to_string(),
        Value::F64(x) => format!("{x:?} ({:#018x})", x.to_bits()),
        Value::F32(x) => format!("{x:?} ({:#010x})", x.to_bits()),
        Value::Handle(0) => "null".into(),
        Value::Handle(_) => "instance".into(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
