//! What a plugin may say about itself. A description is checked before a host sees it: a value outside the set its
//! ABI defines, or text no plugin writes (a control character, an empty name), is a bad call as much as a crash is.
//! The class declares a fault, ward recovers the extension and the description is read again (see each class's
//! `open`); a faulty build that described itself wrongly is thereby caught before its wrong words reach the host.

use crate::error::DescriptionError;

/// Whether a piece of text must say something.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Text {
    /// A name or label: not empty, no control characters.
    Name,
    /// Free text (an explanation, a copyright line): may be empty, may break lines.
    Prose,
}

/// `value`, which the description calls `what`, as a plugin may write it.
pub(crate) fn text(what: &str, value: &str, kind: Text) -> Result<(), DescriptionError> {
    if kind == Text::Name && value.is_empty() {
        return Err(DescriptionError::EmptyName { what: what.to_string() });
    }
    let allowed = |c: char| kind == Text::Prose && matches!(c, '\n' | '\r' | '\t');
    match value.char_indices().find(|&(_, c)| c.is_control() && !allowed(c)) {
        Some((at, c)) => Err(DescriptionError::ControlCharacter {
            what: what.to_string(),
            value: value.to_string(),
            code: c as u32,
            at,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_say_something_printable() {
        assert!(text("the name", "Comb Filter", Text::Name).is_ok());
        assert!(text("the name", "Ä Öl ©", Text::Name).is_ok());
        assert_eq!(text("the name", "", Text::Name).unwrap_err().to_string(), "the name is empty");
        let e = text("the name", "H\u{5}i", Text::Name).unwrap_err().to_string();
        assert!(e.contains("control character 0x05 at byte 1"), "{e}");
        assert!(text("the name", "two\nlines", Text::Name).is_err());
    }

    #[test]
    fn prose_may_be_empty_and_break_lines() {
        assert!(text("the explanation", "", Text::Prose).is_ok());
        assert!(text("the explanation", "one\n\tand two\r\n", Text::Prose).is_ok());
        assert!(text("the explanation", "bell\u{7}", Text::Prose).is_err());
        assert!(text("the explanation", "del\u{7f}", Text::Prose).is_err());
    }
}
