//! Why an extension cannot have an isolation kind: typed, with the offending names and offsets, and a message
//! for people ([`fmt::Display`]).

use std::fmt;

use serde::Serialize;

use super::scan::Forbidden;

/// One place in an extension's executable bytes where an instruction that can write PKRU or the FS base begins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ForbiddenSite {
    pub instruction: Forbidden,
    /// File offset of the instruction's `0F` escape byte.
    pub offset: u64,
    /// Its virtual address as linked.
    pub address: u64,
    /// The function containing it (`name+0xoff`), when a symbol with a size covers it.
    pub function: Option<String>,
    /// The section containing it (`.text`), when section headers cover it.
    pub section: Option<String>,
}

impl fmt::Display for ForbiddenSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at file offset {:#x}", self.instruction.mnemonic(), self.offset)?;
        match (&self.function, &self.section) {
            (Some(function), _) => write!(f, " (in {function})"),
            (None, Some(section)) => write!(f, " (in {section})"),
            (None, None) => Ok(()),
        }
    }
}

/// An import named in a reason.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ImportRef {
    pub name: String,
    /// A weak reference: still a reason, since binding it to null would change what the extension does.
    pub weak: bool,
}

impl fmt::Display for ImportRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if self.weak {
            f.write_str(" (weak)")?;
        }
        Ok(())
    }
}

/// Why an isolation kind is refused. Reasons of one verdict come in the order of the variants here, and within a
/// variant sorted by offset or name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Reason {
    /// A position-independent executable (`PT_INTERP` or `DF_1_PIE`): `dlopen` refuses it.
    PositionIndependentExecutable,
    /// Marked `DF_1_NOOPEN`: `dlopen` refuses it.
    NotDlopenable,
    /// Executable bytes contain instructions that can write PKRU or the FS base.
    ForbiddenInstructions { sites: Vec<ForbiddenSite> },
    /// Imports that start threads.
    Threads { imports: Vec<ImportRef> },
    /// Thread-local variables of another library (imported `STT_TLS` symbols): they live in the host's thread
    /// blocks, which a domain may not write. (Its own live in the domain's.)
    ForeignTls { symbols: Vec<String> },
    /// A library other than glibc's that would be loaded into the domain.
    Dependency { library: String },
    /// An import the domain runtime cannot honour.
    UnsupportedImport {
        #[serde(flatten)]
        import: ImportRef,
        /// The classification group (`mappings`, `cxx-library`, `unknown`, ...).
        group: &'static str,
        why: &'static str,
    },
}

/// How many forbidden sites a message lists before summing up the rest (the data has them all).
const SITES_IN_MESSAGE: usize = 8;

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::PositionIndependentExecutable => {
                f.write_str("a position-independent executable, which dlopen refuses; build it with -shared")
            }
            Reason::NotDlopenable => f.write_str("marked as not to be opened with dlopen (DF_1_NOOPEN)"),
            Reason::ForbiddenInstructions { sites } => {
                write!(f, "executable bytes that can write the protection-key register: ")?;
                for (i, site) in sites.iter().take(SITES_IN_MESSAGE).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{site}")?;
                }
                if sites.len() > SITES_IN_MESSAGE {
                    write!(f, " and {} more", sites.len() - SITES_IN_MESSAGE)?;
                }
                Ok(())
            }
            Reason::Threads { imports } => write!(f, "starts threads: {}", join(imports)),
            Reason::ForeignTls { symbols } => {
                write!(f, "uses thread-local variables of other libraries: {}", symbols.join(", "))
            }
            Reason::Dependency { library } => {
                write!(f, "needs {library}: its code would run inside the domain; not analysed")
            }
            Reason::UnsupportedImport { import, why, .. } => write!(f, "imports {import}: {why}"),
        }
    }
}

fn join(imports: &[ImportRef]) -> String {
    imports.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}
