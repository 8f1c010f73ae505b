//! Output: aligned table rows for people, one JSON object per line for machines, and number formatting.

use std::io::Write;

use anyhow::{Context, Result};
use serde::Serialize;

/// Fixed-width columns; the last cell of a row is never padded. Fixed widths let rows print as they are
/// measured instead of after the whole run.
pub struct Columns {
    widths: Vec<usize>,
}

impl Columns {
    pub fn new(widths: &[usize]) -> Columns {
        Columns { widths: widths.to_vec() }
    }

    pub fn row(&self, cells: &[&str]) -> String {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            match self.widths.get(i) {
                Some(&w) if i + 1 < cells.len() => line.push_str(&format!("{cell:<w$}")),
                _ => line.push_str(cell),
            }
        }
        line.trim_end().to_string()
    }
}

/// `say!(...)`: like `println!`, but a closed stdout is an error to return, not a panic.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::line(&format!($($arg)*))
    };
}
pub(crate) use say;

/// One line of text on stdout.
pub fn line(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").context("cannot write to stdout")
}

/// One JSON object on its own line of stdout.
pub fn json_line(value: &impl Serialize) -> Result<()> {
    line(&serde_json::to_string(value).context("cannot encode a result as JSON")?)
}

/// Microseconds for people: "412 us", "3.41 ms".
pub fn fmt_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us} us")
    } else {
        format!("{:.2} ms", us as f64 / 1000.0)
    }
}

/// Nanoseconds for people: "2.1 ns", "312 ns", "7.42 us", "1.31 ms".
pub fn fmt_ns(ns: f64) -> String {
    if ns < 100.0 {
        format!("{ns:.1} ns")
    } else if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

/// A rate with a decimal prefix: "23.40 M calls/s", "8.12 GB/s".
pub fn fmt_rate(per_s: f64, unit: &str) -> String {
    let (v, p) = if per_s >= 1e9 {
        (per_s / 1e9, "G")
    } else if per_s >= 1e6 {
        (per_s / 1e6, "M")
    } else if per_s >= 1e3 {
        (per_s / 1e3, "k")
    } else {
        (per_s, "")
    };
    // Bytes take the prefix directly (GB/s); counted things keep a space (M calls/s).
    let sep = if p.is_empty() || unit.starts_with('B') { "" } else { " " };
    format!("{v:.2} {p}{sep}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_all_but_the_last_cell() {
        let c = Columns::new(&[3, 5]);
        assert_eq!(c.row(&["1", "ab", "long text"]), "1    ab     long text");
    }

    #[test]
    fn formats_numbers() {
        assert_eq!(fmt_ns(2.14), "2.1 ns");
        assert_eq!(fmt_ns(7420.0), "7.42 us");
        assert_eq!(fmt_us(412), "412 us");
        assert_eq!(fmt_us(3_410), "3.41 ms");
        assert_eq!(fmt_rate(23.4e6, "calls/s"), "23.40 M calls/s");
        assert_eq!(fmt_rate(8.123e9, "B/s"), "8.12 GB/s");
    }
}
