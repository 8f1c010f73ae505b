//! What the end-to-end tests share: running ward, finding a host, a scratch directory per test, and the rule of the tests that
//! need PKU.
// Each suite uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub mod bounded;
pub mod jack;
pub mod wav;

/// The `ward` program this crate built.
pub fn ward() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ward"))
}

/// What `cmd` did; the test fails when it cannot be started.
pub fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Its standard error, as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A host program Debian ships; the test fails (never skips) when it is missing.
pub fn host(name: &str) -> &str {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|d| d.join(name).is_file());
    assert!(
        found,
        "{name} is not installed: run scripts/deps (it installs the hosts and plugin collections the tests use)"
    );
    name
}

/// A scratch directory for one test (`ward-cli-SUITE-PID-TEST` in the temporary directory), removed at the end.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(suite: &str, test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ward-cli-{suite}-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn dir(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// For the tests that need PKU, which are marked `#[ignore = "needs PKU"]` (`scripts/test` runs them where the
/// processor has PKU, under emulation where it has not): fails the test, saying why, where there is no PKU, so that
/// a run with `--include-ignored` on such a machine fails instead of passing without having run.
pub fn require_pku() {
    assert!(
        ward::mpk_available(),
        "this test needs memory protection keys (PKU), which this machine does not have: run it under scripts/pku-vm"
    );
}
