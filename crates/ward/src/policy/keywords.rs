//! The policy's values that are words (`isolation = "process"`): each enum, its keywords, and parsing them.

use std::fmt;
use std::str::FromStr;

/// A value written as a keyword, for reading policy files.
pub(crate) trait Keyword: Copy + 'static {
    /// Every value, in the order the documentation lists them.
    const ALL: &'static [Self];

    /// The keyword naming this value.
    fn as_str(&self) -> &'static str;

    /// The accepted keywords, quoted and separated by commas.
    fn quoted_list() -> String {
        Self::ALL.iter().map(|v| format!("{:?}", v.as_str())).collect::<Vec<_>>().join(", ")
    }
}

/// A word that names no value of a keyword enum (`"vm".parse::<Isolation>()`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {got:?}: expected one of {expected}")]
pub struct UnknownKeyword {
    /// What the word was to name ("isolation", "wait mode").
    pub what: &'static str,
    /// The word.
    pub got: String,
    /// The accepted keywords, quoted and separated by commas.
    pub expected: String,
}

/// Implements `as_str`, `ALL`, [`Keyword`], `FromStr` and `Display` for an enum whose values are written as
/// keywords.
macro_rules! keywords {
    ($ty:ident, $what:literal, { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in the order the documentation lists them.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The keyword naming this value in policy files and on the command line.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($ty::$variant => $text),+
                }
            }
        }

        impl Keyword for $ty {
            const ALL: &'static [$ty] = $ty::ALL;

            fn as_str(&self) -> &'static str {
                $ty::as_str(self)
            }
        }

        impl FromStr for $ty {
            type Err = UnknownKeyword;

            fn from_str(s: &str) -> Result<Self, UnknownKeyword> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| UnknownKeyword {
                    what: $what,
                    got: s.to_string(),
                    expected: <Self as Keyword>::quoted_list(),
                })
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// How an extension is isolated from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// In the host process, unprotected.
    None,
    /// In a separate domain process.
    Process,
    /// In the host process, behind memory protection keys.
    Mpk,
    /// `Mpk` where the hardware supports it, else `Process`.
    Auto,
}

keywords!(Isolation, "isolation", {
    None => "none",
    Process => "process",
    Mpk => "mpk",
    Auto => "auto",
});

/// How a caller waits for the reply of its domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Spin a while ([`ExtensionPolicy::spin`](super::ExtensionPolicy::spin)), then sleep. A process domain whose
    /// short calls keep finding it asleep (they come further apart than it spins) is moved to its caller's processor
    /// and both sides then sleep at once, as with `Sleep`; when calls come close together again it goes back to
    /// spinning on its own processor.
    Adaptive,
    /// Spin only, for as long as the other side can be running: on a machine with more runnable tasks than
    /// processors a wait sleeps instead (`ward_xpc::ring`, as every wait does past its first turns).
    Poll,
    /// Do not spin. A process domain then runs on the processor of the thread that calls it, so each call is a
    /// hand-over on one processor rather than a wake-up across processors (`ward::placement`): the caller yields
    /// that processor to the domain, and sleeps only if the reply is slow to come.
    Sleep,
}

keywords!(WaitMode, "wait mode", {
    Adaptive => "adaptive",
    Poll => "poll",
    Sleep => "sleep",
});

/// What the call in flight gets when its extension fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFault {
    /// Re-issued after the restart, if the function is retryable and
    /// retries are left; else it fails.
    Retry,
    /// Fails at once.
    Fail,
}

keywords!(OnFault, "on_fault value", {
    Retry => "retry",
    Fail => "fail",
});

/// What happens past the restart limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLimit {
    /// The extension is disabled: every later call fails.
    Disable,
    /// The failure is reported to the host as fatal.
    Fail,
}

keywords!(OnLimit, "on_limit value", {
    Disable => "disable",
    Fail => "fail",
});
