//! What the end-to-end tests share: running ward, finding a host, a scratch directory per test, and the rule of the tests that
//! need PKU.
// Each suite uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod bounded;
pub mod jack;
pub mod wav;

/// The `ward` program this crate built, with a cache of descriptions of its own (`WARD_CACHE_DIR`, see
/// [`fresh_cache_dir`]): a test never finds descriptions an earlier run kept. A test of the cache sets its own.
pub fn ward() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ward"));
    cmd.env("WARD_CACHE_DIR", fresh_cache_dir());
    cmd
}

/// A cache directory no run used yet (not made: ward makes it when it keeps something), beneath a directory of this
/// test process's own; the directories of test processes that ended are removed on the way.
pub fn fresh_cache_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tmp = std::env::temp_dir();
    let prefix = "ward-cli-caches-";
    if NEXT.load(Ordering::Relaxed) == 0 {
        for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix(prefix) else { continue };
            if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    tmp.join(format!("{prefix}{}", std::process::id())).join(NEXT.fetch_add(1, Ordering::Relaxed).to_string())
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

/// The scanning test host, built with the workspace's LADSPA declarations.
pub fn scan_host(s: &Scratch) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = s.path("scan_host");
    let built = output(
        Command::new("cc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&exe)
            .arg("-I")
            .arg(manifest.join("../../include"))
            .arg(manifest.join("hosts/scan_host.c"))
            .args(["-ldl", "-lm"]),
    );
    assert!(built.status.success(), "cc scan_host.c: {}", stderr(&built));
    exe
}
