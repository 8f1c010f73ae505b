//! `ward::check` on the built-in extensions and on small C extensions compiled here, each with one property that
//! keeps it out of an mpk domain (or none).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use ward::check::{check, CheckReport, Forbidden, ImportClass, Reason};
use ward::{Error, Isolation};

fn builtin(name: &str) -> PathBuf {
    ward_extensions::path_of(name).expect("built-in extensions extract")
}

/// A fresh directory for one test's files, removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ward-check-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch(dir)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles `source` with `cc` and the given flags into `name` in `dir`.
fn compile(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write the C source");
    let out = dir.join(name);
    let status = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cannot run cc: install a C compiler (Debian: apt-get install gcc)");
    assert!(status.success(), "cc failed on {}", src.display());
    out
}

fn shared(dir: &Path, name: &str, source: &str, extra: &[&str]) -> PathBuf {
    let mut flags = vec!["-shared", "-fPIC", "-O2"];
    flags.extend_from_slice(extra);
    compile(dir, name, source, &flags)
}

fn mpk_reasons(report: &CheckReport) -> &[Reason] {
    &report.verdict(Isolation::Mpk).expect("an mpk verdict").reasons
}

fn unsupported(report: &CheckReport) -> BTreeSet<String> {
    mpk_reasons(report)
        .iter()
        .filter_map(|r| match r {
            Reason::UnsupportedImport { import, .. } => Some(import.name.clone()),
            _ => None,
        })
        .collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn class_of(report: &CheckReport, name: &str) -> ImportClass {
    report.imports.iter().find(|i| i.name == name).unwrap_or_else(|| panic!("{name} is not an import")).class
}

/// `(name, weak)` of every undefined dynamic symbol, as binutils' `nm -D` reads them.
fn nm_imports(path: &Path) -> BTreeSet<(String, bool)> {
    let out = Command::new("nm").args(["-D", "--undefined-only"]).arg(path).output().expect("cannot run nm (binutils)");
    assert!(out.status.success(), "nm failed on {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().rev();
            let symbol = fields.next()?;
            let kind = fields.next()?;
            let name = symbol.split('@').next()?.to_string();
            Some((name, kind == "w" || kind == "v"))
        })
        .collect()
}

fn our_imports(report: &CheckReport) -> BTreeSet<(String, bool)> {
    report.imports.iter().map(|i| (i.name.clone(), i.weak)).collect()
}

fn assert_loadable(report: &CheckReport) {
    for kind in [Isolation::None, Isolation::Process] {
        assert!(report.allows(kind), "{} refused for {kind}: {:?}", report.name, report.verdict(kind));
    }
}

#[test]
fn well_is_eligible_for_mpk() {
    let path = builtin("well");
    let report = check(&path).expect("well.so checks");
    assert_eq!(report.name, "well");
    assert_eq!(our_imports(&report), nm_imports(&path));
    assert_loadable(&report);
    assert!(report.allows(Isolation::Mpk), "well refused: {:#?}", mpk_reasons(&report));
    assert_eq!(report.kinds.iter().map(|k| k.isolation).collect::<Vec<_>>(), ward::check::KINDS);
    assert_eq!(class_of(&report, "malloc"), ImportClass::DomainRuntime);
    assert_eq!(class_of(&report, "free"), ImportClass::DomainRuntime);
    assert_eq!(class_of(&report, "memcpy"), ImportClass::Pure);
    assert_eq!(class_of(&report, "strlen"), ImportClass::Pure);
    assert_eq!(class_of(&report, "__cxa_finalize"), ImportClass::DomainRuntime);
    assert_eq!(class_of(&report, "__gmon_start__"), ImportClass::Toolchain);
}

#[test]
fn faulty_is_refused_for_its_system_calls_not_for_exiting() {
    let path = builtin("faulty");
    let report = check(&path).expect("faulty.so checks");
    assert_eq!(our_imports(&report), nm_imports(&path));
    assert_loadable(&report);
    assert!(!report.allows(Isolation::Mpk));
    // Every reason is an import (no forbidden bytes, threads, TLS or dependencies), sorted by name.
    assert_eq!(unsupported(&report).len(), mpk_reasons(&report).len(), "{:#?}", mpk_reasons(&report));
    assert_eq!(unsupported(&report), names(&["__getdelim", "open", "pause", "raise", "syscall"]));
    let listed: Vec<String> = mpk_reasons(&report).iter().map(|r| r.to_string()).collect();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(listed, sorted);
    // Ending the process is a fault of the domain, which ward recovers: not a reason to refuse.
    assert_eq!(class_of(&report, "exit"), ImportClass::Fault);
    assert_eq!(class_of(&report, "abort"), ImportClass::Fault);
    assert_eq!(class_of(&report, "fopen"), ImportClass::HostGate);
    assert_eq!(class_of(&report, "__isoc99_sscanf"), ImportClass::HostGate);
}

#[test]
fn wrpkru_and_xrstor_bytes_are_refused_with_their_offsets() {
    let dir = Scratch::new("wrpkru");
    let path = shared(
        &dir,
        "keys.so",
        r#"
        int keys_add(int a, int b) { return a + b; }
        /* Never called: the bytes alone are enough to refuse the extension. */
        void keys_never_called(void) { __asm__ volatile(".byte 0x0f, 0x01, 0xef"); }
        /* xrstor64 [rdi] */
        void keys_restore(void *area) { __asm__ volatile(".byte 0x48, 0x0f, 0xae, 0x2f" : : "D"(area) : "memory"); }
        "#,
        &[],
    );
    let bytes = std::fs::read(&path).expect("read keys.so");
    let report = check(&path).expect("keys.so checks");
    assert_loadable(&report);
    let [Reason::ForbiddenInstructions { sites }] = mpk_reasons(&report) else {
        panic!("exactly one reason expected: {:#?}", mpk_reasons(&report));
    };
    assert_eq!(sites.len(), 2, "{sites:#?}");
    let at = |offset: u64, len: usize| &bytes[offset as usize..offset as usize + len];
    assert_eq!(sites[0].instruction, Forbidden::Wrpkru);
    assert_eq!(at(sites[0].offset, 3), [0x0f, 0x01, 0xef]);
    assert!(sites[0].function.as_deref().is_some_and(|f| f.starts_with("keys_never_called+")), "{:?}", sites[0]);
    assert_eq!(sites[1].instruction, Forbidden::Xrstor);
    assert_eq!(at(sites[1].offset, 3), [0x0f, 0xae, 0x2f]);
    assert!(sites[1].function.as_deref().is_some_and(|f| f.starts_with("keys_restore+")), "{:?}", sites[1]);
    assert_eq!(sites[0].section.as_deref(), Some(".text"));
    let message = mpk_reasons(&report)[0].to_string();
    assert!(message.contains(&format!("WRPKRU at file offset {:#x}", sites[0].offset)), "{message}");
}

#[test]
fn fences_and_xsave_are_not_refused() {
    let dir = Scratch::new("fences");
    let path = shared(
        &dir,
        "fences.so",
        r#"
        void fences(void *area) {
            __asm__ volatile("lfence; mfence; sfence" ::: "memory");
            __asm__ volatile("xsave (%0)" : : "r"(area), "a"(0), "d"(0) : "memory");
            __asm__ volatile(".byte 0x0f, 0x01, 0xee" : : "c"(0) : "eax", "edx"); /* rdpkru: reading is harmless */
        }
        "#,
        &[],
    );
    let report = check(&path).expect("fences.so checks");
    assert!(report.allows(Isolation::Mpk), "{:#?}", mpk_reasons(&report));
}

#[test]
fn thread_local_data_of_its_own_is_allowed() {
    let dir = Scratch::new("tls");
    let path =
        shared(&dir, "tls.so", "static __thread int tls_counter;\nint tls_bump(void) { return ++tls_counter; }\n", &[]);
    let report = check(&path).expect("tls.so checks");
    assert_loadable(&report);
    assert!(report.allows(Isolation::Mpk), "{:#?}", mpk_reasons(&report));
}

#[test]
fn thread_local_data_of_another_library_is_refused() {
    let dir = Scratch::new("foreign-tls");
    let path = shared(
        &dir,
        "foreign_tls.so",
        "extern __thread int ward_elsewhere;\nint foreign_read(void) { return ward_elsewhere; }\n",
        &[],
    );
    let report = check(&path).expect("foreign_tls.so checks");
    assert_loadable(&report);
    let foreign = mpk_reasons(&report).iter().find_map(|r| match r {
        Reason::ForeignTls { symbols } => Some(symbols.clone()),
        _ => None,
    });
    assert_eq!(foreign, Some(vec!["ward_elsewhere".to_string()]), "{:#?}", mpk_reasons(&report));
}

#[test]
fn starting_a_thread_is_refused() {
    let dir = Scratch::new("threads");
    let path = shared(
        &dir,
        "threads.so",
        r#"
        #include <pthread.h>
        static void *run(void *arg) { return arg; }
        int threads_start(void) {
            pthread_t t;
            if (pthread_create(&t, 0, run, 0) != 0) return -1;
            return pthread_join(t, 0);
        }
        "#,
        &["-pthread"],
    );
    let report = check(&path).expect("threads.so checks");
    assert_loadable(&report);
    let reasons = mpk_reasons(&report);
    let Reason::Threads { imports } = &reasons[0] else { panic!("threads first: {reasons:#?}") };
    assert_eq!(imports.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), ["pthread_create"]);
    assert_eq!(unsupported(&report), names(&["pthread_create", "pthread_join"]));
}

#[test]
fn weak_imports_are_reasons_marked_weak() {
    let dir = Scratch::new("weak");
    let path = shared(
        &dir,
        "weak.so",
        r#"
        extern int weak_probe(void) __attribute__((weak));
        int weak_has(void) { return weak_probe ? weak_probe() : -1; }
        "#,
        &[],
    );
    let report = check(&path).expect("weak.so checks");
    let [Reason::UnsupportedImport { import, group, .. }] = mpk_reasons(&report) else {
        panic!("{:#?}", mpk_reasons(&report));
    };
    assert_eq!((import.name.as_str(), import.weak, *group), ("weak_probe", true, "unknown"));
    assert!(mpk_reasons(&report)[0].to_string().contains("weak_probe (weak)"));
}

#[test]
fn dependencies_other_than_glibc_are_reasons() {
    let dir = Scratch::new("deps");
    let path =
        shared(&dir, "deps.so", "int deps_one(void) { return 1; }\n", &["-Wl,--no-as-needed", "-lstdc++", "-lm"]);
    let report = check(&path).expect("deps.so checks");
    let deps: Vec<String> = mpk_reasons(&report)
        .iter()
        .filter_map(|r| match r {
            Reason::Dependency { library } => Some(library.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(deps, ["libstdc++.so.6"]);
    assert_eq!(
        mpk_reasons(&report)[0].to_string(),
        "needs libstdc++.so.6: its code would run inside the domain; not analysed"
    );
}

#[test]
fn a_position_independent_executable_is_not_loadable() {
    let dir = Scratch::new("pie");
    let path = compile(&dir, "pie", "int main(void) { return 0; }\n", &["-fPIE", "-pie"]);
    let report = check(&path).expect("a PIE is ET_DYN and checks");
    for verdict in &report.kinds {
        assert!(!verdict.ok, "{verdict:?}");
        assert_eq!(verdict.reasons.first(), Some(&Reason::PositionIndependentExecutable));
    }
}

#[test]
fn bad_inputs_are_errors_naming_the_file() {
    let dir = Scratch::new("bad");
    let missing = dir.join("missing.so");
    assert!(matches!(check(&missing), Err(Error::NotFound { .. })));

    let text = dir.join("text.so");
    std::fs::write(&text, "not an ELF file\n").expect("write");
    let err = check(&text).expect_err("a text file is refused");
    assert!(matches!(err, Error::NotElf { .. }));
    assert!(err.to_string().contains("text.so"), "{err}");

    // An i386 shared object's identification: class 1 (32-bit), little-endian, ET_DYN, EM_386.
    let mut elf32 = vec![0u8; 64];
    elf32[..4].copy_from_slice(b"\x7fELF");
    elf32[4] = 1;
    elf32[5] = 1;
    elf32[16] = 3;
    elf32[18] = 3;
    let i386 = dir.join("i386.so");
    std::fs::write(&i386, &elf32).expect("write");
    let err = check(&i386).expect_err("32-bit is refused");
    assert!(matches!(err, Error::Unusable { .. }), "{err}");
    assert!(err.to_string().contains("i386.so") && err.to_string().contains("32-bit"), "{err}");

    let object = compile(&dir, "plain.o", "int plain(void) { return 0; }\n", &["-c", "-fPIC"]);
    let err = check(&object).expect_err("a relocatable object is refused");
    assert!(err.to_string().contains("relocatable"), "{err}");

    let err = check(&dir).expect_err("a directory is refused");
    assert!(matches!(err, Error::NotElf { .. }), "{err}");
}
