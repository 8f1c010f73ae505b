//! The runtime part of `ward demo` (issue 32): image transforms handed over as C source, compiled inside a runtime's
//! domain and called; a transform that crashes, and source that crashes the compiler, each cost the runtime a
//! recovery, and the transforms it still holds answer as before.

use anyhow::{Context, Result};
use serde::Serialize;
use ward::{Arg, Isolation, Policy, RetType, Signature, Supervisor, ValType, Value};
use ward_classes::runtime::{Code, Runtime, RuntimeError, RuntimeOptions};

use crate::output::{self, say};

const IMAGE_H: &str = include_str!("../../../../extensions/runtime/ward_image.h");
const GRAYSCALE: &str = include_str!("../../../../extensions/runtime/grayscale.c");
const FAULTY: &str = include_str!("../../../../extensions/runtime/faulty.c");
/// A host built-in and a plugin that calls it.
const SCALED: &str = "long host_scale(long);\nlong scaled(long x) { return host_scale(x) + 1; }\n";

/// A 2x1 image and what grayscale makes of it.
const PIXELS: [u8; 6] = [10, 20, 30, 255, 0, 0];
const GRAY: [u8; 6] = [18, 18, 18, 76, 76, 76];

#[derive(Serialize)]
struct RuntimeLine {
    #[serde(rename = "type")]
    kind_of_line: &'static str,
    isolation: String,
    step: &'static str,
    got: String,
    ok: bool,
}

pub fn run(isolation: Isolation, json: bool) -> Result<bool> {
    if !json {
        say!("")?;
        say!("a runtime (isolation {isolation}): plugins compiled from C source in its domain, at run time:")?;
    }
    let sup = Supervisor::new(Policy::default());
    let options = RuntimeOptions { isolation: Some(isolation), ..RuntimeOptions::default() };
    let rt = Runtime::open(&sup, "demo", &options).context("cannot open a runtime")?;
    rt.header("ward_image.h", IMAGE_H)?;
    rt.builtin("host_scale", Signature::new(&[ValType::I64], RetType::I64), |args| {
        Value::I64(args.first().and_then(Value::as_i64).unwrap_or(0) * 3)
    })?;
    let mut lines = Vec::new();
    let mut line = |step: &'static str, got: String, ok: bool| {
        lines.push(RuntimeLine { kind_of_line: "runtime", isolation: isolation.to_string(), step, got, ok });
    };

    let gray = rt.create("grayscale", Code::Source(GRAYSCALE)).context("cannot compile grayscale")?;
    let apply = || -> Result<Vec<u8>, RuntimeError> {
        let mut out = [0u8; 16 + 6];
        let args = &mut [Arg::In(&PIXELS), Arg::I64(2), Arg::I64(1), Arg::Out(&mut out), Arg::I64(22)];
        rt.call(gray, args, RetType::I64)?;
        Ok(out[16..].to_vec())
    };
    let first = apply();
    let first_ok = matches!(&first, Ok(p) if p[..] == GRAY);
    line("grayscale compiled and applied", pixels(&first), first_ok);

    let scaled = rt.create("scaled", Code::Source(SCALED)).context("cannot compile scaled")?;
    let got = rt.call(scaled, &mut [Arg::I64(5)], RetType::I64);
    let ok = matches!(got, Ok(Value::I64(16)));
    line("a plugin calling the host's built-in", format!("scaled(5) = {}", value(&got)), ok);

    let faulty = rt.create("faulty", Code::Source(FAULTY)).context("cannot compile faulty")?;
    let mut out = [0u8; 16 + 6];
    let args = &mut [Arg::In(&PIXELS), Arg::I64(2), Arg::I64(1), Arg::Out(&mut out), Arg::I64(22)];
    let (got, ok) = match rt.call(faulty, args, RetType::I64) {
        Err(RuntimeError::PluginFault { fault, unlinked, .. }) => {
            (format!("contained ({}), unlinked {unlinked:?}", fault.kind_name()), rt.lookup("faulty").is_none())
        }
        other => (format!("NOT contained: {other:?}"), false),
    };
    line("a transform that writes through a wild pointer", got, ok);

    let depth = 300_000;
    let deep = format!("long deep(void) {{ return {}1{}; }}\n", "(".repeat(depth), ")".repeat(depth));
    let (got, ok) = match rt.create("deep", Code::Source(&deep)) {
        Err(RuntimeError::CompilerFault { fault, .. }) => (format!("contained ({})", fault.kind_name()), true),
        other => (format!("NOT contained: {other:?}"), false),
    };
    line("source whose nesting overflows the compiler's stack", got, ok);

    let again = apply();
    let scaled_again = rt.call(scaled, &mut [Arg::I64(7)], RetType::I64);
    let ok = matches!(&again, Ok(p) if p[..] == GRAY) && matches!(scaled_again, Ok(Value::I64(22)));
    line(
        "the other plugins afterwards",
        format!("grayscale {}, scaled(7) = {}", pixels(&again), value(&scaled_again)),
        ok,
    );

    let mut all = true;
    for l in lines {
        all &= l.ok;
        if json {
            output::json_line(&l)?;
        } else {
            let verdict = if l.ok { "correct" } else { "WRONG" };
            say!("  {:<52} {}: {verdict}", l.step, l.got)?;
        }
    }
    Ok(all)
}

fn pixels(got: &Result<Vec<u8>, RuntimeError>) -> String {
    match got {
        Ok(p) => format!("{p:?}"),
        Err(e) => format!("error: {e}"),
    }
}

fn value(got: &Result<Value, RuntimeError>) -> String {
    match got {
        Ok(Value::I64(v)) => v.to_string(),
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("error: {e}"),
    }
}
