//! The compiler's messages, as the runtime adapter reports them, made into diagnostics with a file, a line and a
//! column.
//!
//! The adapter writes one message per line, `LINE\tCOLUMN\tMESSAGE`, where LINE and COLUMN are where the lexer stood
//! in the plugin's source when the message came (0 when it was not in the source) and MESSAGE is the compiler's
//! text: `FILE:LINE: error: WHAT`, `FILE:LINE: warning: WHAT`, or `tcc: error: WHAT` for an error at link time.

use std::fmt;

/// How bad a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One message of the compiler about a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// The file the message is about: the plugin's source (`NAME.c`) or a header it includes; `None` for a message
    /// about the plugin as a whole (an undefined name found when linking).
    pub file: Option<String>,
    /// 1-based; `None` when the message has no place.
    pub line: Option<u32>,
    /// 1-based: the start of the token the compiler had just read when it complained; `None` when not known.
    pub column: Option<u32>,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        match (&self.file, self.line, self.column) {
            (Some(file), Some(line), Some(column)) => write!(f, "{file}:{line}:{column}: {severity}: {}", self.message),
            (Some(file), Some(line), None) => write!(f, "{file}:{line}: {severity}: {}", self.message),
            (Some(file), None, _) => write!(f, "{file}: {severity}: {}", self.message),
            (None, ..) => write!(f, "{severity}: {}", self.message),
        }
    }
}

/// The diagnostics of a report (lines that are not the adapter's format are kept as errors without a place).
pub(crate) fn parse(report: &str) -> Vec<Diagnostic> {
    report.lines().filter(|l| !l.trim().is_empty()).map(parse_line).collect()
}

fn parse_line(line: &str) -> Diagnostic {
    let mut fields = line.splitn(3, '\t');
    let (lexer_line, lexer_column, text) = match (fields.next(), fields.next(), fields.next()) {
        (Some(l), Some(c), Some(text)) => (l.parse::<u32>().unwrap_or(0), c.parse::<u32>().unwrap_or(0), text),
        _ => (0, 0, line),
    };
    let (severity, at) = match (text.rfind(": error: "), text.rfind(": warning: ")) {
        (Some(e), Some(w)) if w > e => (Severity::Warning, Some((w, ": warning: ".len()))),
        (Some(e), _) => (Severity::Error, Some((e, ": error: ".len()))),
        (None, Some(w)) => (Severity::Warning, Some((w, ": warning: ".len()))),
        (None, None) => (Severity::Error, None),
    };
    let Some((at, marker)) = at else {
        let message = text.strip_prefix("error: ").unwrap_or(text).to_string();
        return Diagnostic { severity, file: None, line: None, column: None, message };
    };
    let message = text[at + marker..].to_string();
    // The place is the last `FILE:LINE` before the severity ("In file included from A:2: B:5: error: ...").
    let place = text[..at].rsplit(' ').next().unwrap_or("");
    let (file, line) = match place.rsplit_once(':') {
        Some((file, line)) => match line.parse::<u32>() {
            Ok(line) => (Some(short_name(file)), Some(line)),
            Err(_) => (None, None),
        },
        None => (None, None),
    };
    // "tcc" is the compiler naming itself, not a file.
    let file = file.filter(|f| f != "tcc");
    let column = (line == Some(lexer_line) && lexer_line > 0 && lexer_column > 0).then_some(lexer_column);
    Diagnostic { severity, file, line, column, message }
}

/// Points a column at the token a message names, when the message quotes one (`'missing' undeclared`, `got "}"`)
/// and it is on the line at or before where the lexer stood: the lexer reads a token ahead, so it stands past the
/// token most messages are about.
pub(crate) fn refine_columns(diagnostics: &mut [Diagnostic], file: &str, source: &str) {
    for d in diagnostics.iter_mut().filter(|d| d.file.as_deref() == Some(file)) {
        let (Some(line), Some(column)) = (d.line, d.column) else { continue };
        let Some(text) = source.lines().nth(line as usize - 1) else { continue };
        let Some(token) = quoted(&d.message) else { continue };
        let upto = text.char_indices().nth(column as usize).map_or(text.len(), |(i, _)| i);
        if let Some(at) = text[..upto].rfind(token) {
            d.column = Some(text[..at].chars().count() as u32 + 1);
        }
    }
}

/// The first token a message quotes, in '...' or "...".
fn quoted(message: &str) -> Option<&str> {
    let start = message.find(['\'', '"'])?;
    let quote = message[start..].chars().next()?;
    let rest = &message[start + 1..];
    let end = rest.find(quote)?;
    Some(&rest[..end]).filter(|t| !t.is_empty())
}

/// A file as the plugin's author knows it: the adapter's in-memory directories left out.
fn short_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_located_error_with_its_column() {
        let d = parse("3\t14\t/ward/src/blur.c:3: error: ';' expected (got \"}\")\n");
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].severity, Severity::Error);
        assert_eq!(d[0].file.as_deref(), Some("blur.c"));
        assert_eq!((d[0].line, d[0].column), (Some(3), Some(14)));
        assert_eq!(d[0].message, "';' expected (got \"}\")");
        assert_eq!(d[0].to_string(), "blur.c:3:14: error: ';' expected (got \"}\")");
    }

    #[test]
    fn drops_a_column_from_another_line() {
        let d = parse("4\t2\t/ward/src/blur.c:3: error: x undeclared\n");
        assert_eq!((d[0].line, d[0].column), (Some(3), None));
    }

    #[test]
    fn reads_warnings_link_errors_and_included_files() {
        let report = "1\t28\t/ward/src/g.c:1: warning: implicit declaration of function 'printf'\n\
                      0\t0\ttcc: error: undefined symbol 'printf'\n\
                      2\t18\tIn file included from /ward/src/h.c:2: /ward/include/ward_image.h:7: error: bad\n";
        let d = parse(report);
        assert_eq!(d[0].severity, Severity::Warning);
        assert_eq!(
            d[1],
            Diagnostic {
                severity: Severity::Error,
                file: None,
                line: None,
                column: None,
                message: "undefined symbol 'printf'".into()
            }
        );
        assert_eq!(d[2].file.as_deref(), Some("ward_image.h"));
        assert_eq!((d[2].line, d[2].column), (Some(7), None));
    }

    #[test]
    fn points_the_column_at_the_token_a_message_quotes() {
        let source = "int f(int a) {\n    return a + missing;\n}\n";
        let mut d = parse("2\t23\t/ward/src/f.c:2: error: 'missing' undeclared\n");
        refine_columns(&mut d, "f.c", source);
        assert_eq!(d[0].column, Some(16));
        // Nothing quoted: the lexer's column stays.
        let mut d = parse("2\t23\t/ward/src/f.c:2: error: lvalue expected\n");
        refine_columns(&mut d, "f.c", source);
        assert_eq!(d[0].column, Some(23));
    }

    #[test]
    fn keeps_the_adapters_own_errors() {
        let d = parse("0\t0\terror: no function named 'blur': a plugin's entry point has the plugin's name\n");
        assert_eq!(d[0].severity, Severity::Error);
        assert_eq!(d[0].file, None);
        assert!(d[0].message.starts_with("no function named 'blur'"));
    }
}
