//! A run's output: one entry per call, the call written out and its result as text, so outputs compare by equality
//! and a difference reads as "well_add(2, 40): expected 42, got 41". Each call's time span is kept too, to measure
//! how long ward took to notice a hang in it, and so is every block or frame a class wrapper bypassed (the host was
//! told that the plugin could not process it).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One call and what came of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The call as written: `well_add(2, 40)`.
    pub call: String,
    /// Its result: a value, `error: ...`, or `skipped: ...` when an earlier call gave nothing to go on.
    pub result: String,
}

/// When a call began and ended, from the recorder's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: Duration,
    pub end: Duration,
}

/// Collects a run's entries as the workload makes its calls.
#[derive(Debug)]
pub struct Recorder {
    origin: Instant,
    entries: Vec<Entry>,
    spans: Vec<Span>,
    bypassed: Vec<String>,
}

impl Recorder {
    /// Spans are measured from `origin`.
    pub fn new(origin: Instant) -> Recorder {
        Recorder { origin, entries: Vec::new(), spans: Vec::new(), bypassed: Vec::new() }
    }

    /// Make one call: `f` does it, `show` writes a successful result. Returns the result for later calls to use.
    pub fn call<T, E: std::fmt::Display>(
        &mut self,
        call: impl Into<String>,
        f: impl FnOnce() -> Result<T, E>,
        show: impl FnOnce(&T) -> String,
    ) -> Option<T> {
        let start = self.origin.elapsed();
        let result = f();
        self.spans.push(Span { start, end: self.origin.elapsed() });
        let (text, value) = match result {
            Ok(v) => (show(&v), Some(v)),
            Err(e) => (format!("error: {e}"), None),
        };
        self.entries.push(Entry { call: call.into(), result: text });
        value
    }

    /// A call not made, and why; it still counts in the output.
    pub fn skip(&mut self, call: impl Into<String>, why: &str) {
        self.entries.push(Entry { call: call.into(), result: format!("skipped: {why}") });
    }

    /// The class wrapper bypassed the plugin in the last call (`Processed::Bypassed`): its output is the class's
    /// fallback, and the host was told why. The output is recorded as usual; this notes that the host knew.
    pub fn bypassed(&mut self, reason: impl Into<String>) {
        self.bypassed.push(reason.into());
    }

    /// Why each bypassed call was bypassed, in order.
    pub fn bypasses(&self) -> &[String] {
        &self.bypassed
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    pub fn into_entries(self) -> Vec<Entry> {
        self.entries
    }
}

/// The first entry where `got` differs from `expected`, in words; `None` when they are equal.
pub fn first_difference(expected: &[Entry], got: &[Entry]) -> Option<String> {
    for (i, e) in expected.iter().enumerate() {
        match got.get(i) {
            None => return Some(format!("output ends before {} ({} of {} calls)", e.call, got.len(), expected.len())),
            Some(g) if g.call != e.call => return Some(format!("call {} is {}, expected {}", i + 1, g.call, e.call)),
            Some(g) if g.result != e.result => {
                return Some(format!("{}: expected {}, got {}", e.call, e.result, g.result))
            }
            Some(_) => {}
        }
    }
    (got.len() > expected.len()).then(|| format!("{} calls, expected {}", got.len(), expected.len()))
}

/// How many calls of `got` differ from `expected` (a missing or extra call counts), and how many of those failed
/// cleanly: returned an error, or were skipped for want of an earlier call's result.
pub fn count_differences(expected: &[Entry], got: &[Entry]) -> (u32, u32) {
    let (mut wrong, mut failed) = (0, 0);
    for i in 0..expected.len().max(got.len()) {
        match (expected.get(i), got.get(i)) {
            (Some(e), Some(g)) if e == g => {}
            (_, Some(g)) if g.result.starts_with("error: ") || g.result.starts_with("skipped: ") => {
                wrong += 1;
                failed += 1;
            }
            _ => wrong += 1,
        }
    }
    (wrong, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(call: &str, result: &str) -> Entry {
        Entry { call: call.into(), result: result.into() }
    }

    #[test]
    fn records_results_errors_and_skips() {
        let mut r = Recorder::new(Instant::now());
        assert_eq!(r.call("f(1)", || Ok::<i64, String>(2), |v| v.to_string()), Some(2));
        assert_eq!(r.call("g()", || Err::<i64, String>("boom".into()), |v| v.to_string()), None);
        r.skip("h()", "no handle");
        assert_eq!(r.entries(), [entry("f(1)", "2"), entry("g()", "error: boom"), entry("h()", "skipped: no handle")]);
        assert_eq!(r.spans().len(), 2);
        assert!(r.spans()[0].start <= r.spans()[0].end && r.spans()[0].end <= r.spans()[1].start);
    }

    #[test]
    fn describes_the_first_difference() {
        let a = [entry("f(1)", "2"), entry("g()", "3")];
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(first_difference(&a, &[entry("f(1)", "2"), entry("g()", "4")]).unwrap(), "g(): expected 3, got 4");
        assert_eq!(first_difference(&a, &a[..1]).unwrap(), "output ends before g() (1 of 2 calls)");
        let longer = [entry("f(1)", "2"), entry("g()", "3"), entry("h()", "0")];
        assert_eq!(first_difference(&a, &longer).unwrap(), "3 calls, expected 2");
    }

    #[test]
    fn counts_wrong_and_cleanly_failed_calls() {
        let a = [entry("f(1)", "2"), entry("g()", "3"), entry("h()", "4")];
        assert_eq!(count_differences(&a, &a), (0, 0));
        let got = [entry("f(1)", "error: boom"), entry("g()", "5"), entry("h()", "skipped: no handle")];
        assert_eq!(count_differences(&a, &got), (3, 2));
        assert_eq!(count_differences(&a, &got[..1]), (3, 1));
    }
}
