//! Hosts that scan every plugin library at start under `ward run`: what they only read is described in one shared
//! describer domain, and a library gets a domain of its own only when the host instantiates from it. Debian's
//! `listplugins` and a scanning test host of ours (`hosts/scan_host.c`), natively and under ward: the same output,
//! and no domain for a library only scanned. The hosts and plugins come from scripts/deps.

use std::path::Path;
use std::process::Command;

mod common;
use common::{host, output, scan_host, stderr, ward, Scratch};

const LADSPA_DIR: &str = "/usr/lib/ladspa";

/// The LADSPA libraries in `dir`.
fn libraries_in(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/deps", dir.display()))
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "so"))
        .count()
}

/// The lines of `ward run --verbose` saying a plugin library got a domain of its own.
fn plugin_domains(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.starts_with("ward: ") && l.contains("plugin under ward (isolation")).collect()
}

fn describer_starts(err: &str) -> usize {
    err.lines().filter(|l| l.starts_with("ward: LADSPA describer started")).count()
}

#[test]
fn listplugins_lists_what_it_lists_natively_and_no_library_gets_a_domain() {
    let native = output(Command::new(host("listplugins")).env("LADSPA_PATH", LADSPA_DIR));
    assert!(native.status.success(), "{}", stderr(&native));
    assert!(
        native.stdout.len() > 1000,
        "listplugins natively listed little: {}",
        String::from_utf8_lossy(&native.stdout)
    );
    let out = output(
        ward().args(["run", "--verbose", "--isolation", "process", "--", "listplugins"]).env("LADSPA_PATH", LADSPA_DIR),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&native.stdout), "listings differ");
    assert_eq!(plugin_domains(&err), Vec::<&str>::new(), "a scan starts no domain of a plugin's own: {err}");
    assert_eq!(describer_starts(&err), 1, "one describer for the whole scan: {err}");
    let described = err.lines().filter(|l| l.contains(": LADSPA plugin described under ward")).count();
    assert_eq!(described, libraries_in(Path::new(LADSPA_DIR)), "every library described: {err}");
}

/// The scanning test host natively and under `ward run --verbose` (with `policy`, a policy file's text, if given):
/// the same listing and the same samples; what ward said on its standard error.
fn scan_then_process(what: &str, policy: Option<&str>) -> String {
    let s = Scratch::new("scan", what);
    let exe = scan_host(&s);
    let args = |out: &str| {
        [LADSPA_DIR.into(), format!("{LADSPA_DIR}/amp.so"), "amp_mono".into(), s.path(out).display().to_string()]
    };
    let native = output(Command::new(&exe).args(args("native.raw")));
    assert!(native.status.success(), "{}", stderr(&native));
    let mut cmd = ward();
    cmd.args(["run", "--verbose", "--isolation", "process"]);
    if let Some(policy) = policy {
        std::fs::write(s.path("policy.toml"), policy).unwrap();
        cmd.arg("--policy").arg(s.path("policy.toml"));
    }
    let out = output(cmd.arg("--").arg(&exe).args(args("ward.raw")));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&native.stdout), "scans differ");
    let (n, w) = (std::fs::read(s.path("native.raw")).unwrap(), std::fs::read(s.path("ward.raw")).unwrap());
    assert_eq!(n.len(), 48000 * 4, "one second of samples");
    assert!(n == w, "the processed audio differs");
    err
}

#[test]
fn a_host_that_scans_then_processes_gets_the_native_output_with_one_plugin_domain() {
    let err = scan_then_process("scan-then-process", None);
    let domains = plugin_domains(&err);
    assert_eq!(domains.len(), 1, "only the plugin instantiated gets a domain: {err}");
    assert!(domains[0].contains("amp.so: LADSPA plugin under ward (isolation process, domain process"), "{err}");
    assert_eq!(describer_starts(&err), 1, "{err}");
}

/// With `group = "host"` a scanned library joins the host's group only when the host instantiates from it: the
/// group does not grow (and restart) once per library scanned.
#[test]
fn a_grouped_host_that_scans_then_processes_adds_only_the_plugin_it_instantiates_to_its_group() {
    let err = scan_then_process("grouped-scan-then-process", Some("[defaults]\ngroup = \"host\"\n"));
    let domains = plugin_domains(&err);
    assert_eq!(domains.len(), 1, "only the plugin instantiated joins the group: {err}");
    assert!(domains[0].contains("amp.so: LADSPA plugin under ward"), "{err}");
    assert_eq!(describer_starts(&err), 1, "{err}");
}

#[test]
fn a_library_that_crashes_or_hangs_while_described_fails_alone_and_the_next_is_described() {
    let s = Scratch::new("scan", "bad-in-describer");
    let exe = scan_host(&s);
    let dir = s.path("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let builtin = ward_extensions::extracted().expect("extract the built-in extensions");
    for bad in ["bad_ladspa_ctor_crash.so", "bad_ladspa_ctor_hang.so"] {
        std::fs::copy(builtin.join(bad), dir.join(bad)).expect("copy a bad plugin");
    }
    // Scanned after the bad ones (the host scans in name order), processed.
    let amp = dir.join("zz_amp.so");
    std::fs::copy(Path::new(LADSPA_DIR).join("amp.so"), &amp).expect("copy amp.so");
    std::fs::write(s.path("policy.toml"), "[defaults]\ndeadline_ms = 1500\nmax_restarts = 2\n").unwrap();
    let out = output(
        ward()
            .args(["run", "--verbose", "--isolation", "process", "--policy"])
            .arg(s.path("policy.toml"))
            .arg("--")
            .arg(&exe)
            .arg(&dir)
            .arg(&amp)
            .args(["amp_mono"])
            .arg(s.path("ward.raw")),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "the host goes on past the bad libraries: {err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for bad in ["bad_ladspa_ctor_crash.so", "bad_ladspa_ctor_hang.so"] {
        // Refused as without the describer: once, with the reason, and the host's dlopen failed.
        let refusals: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("ward: ") && l.contains(bad) && l.contains(": not loaded: "))
            .collect();
        assert_eq!(refusals.len(), 1, "{bad}: {err}");
        assert!(refusals[0].contains("failed under ward"), "{err}");
        assert!(stdout.lines().any(|l| l.contains(bad) && l.contains("cannot open")), "{stdout}");
    }
    assert!(stdout.contains("zz_amp.so #0 1048 amp_mono"), "{stdout}");
    // Each failure cost the describer its domain; the library after it got a fresh one.
    assert_eq!(describer_starts(&err), 3, "{err}");
    assert!(err.contains("zz_amp.so: LADSPA plugin described under ward"), "{err}");
    let native = output(
        Command::new(&exe).args([LADSPA_DIR, &format!("{LADSPA_DIR}/amp.so"), "amp_mono"]).arg(s.path("native.raw")),
    );
    assert!(native.status.success(), "{}", stderr(&native));
    assert!(std::fs::read(s.path("native.raw")).unwrap() == std::fs::read(s.path("ward.raw")).unwrap());
}

#[test]
fn ffmpeg_gets_the_native_frames_from_a_frei0r_filter_whose_domain_starts_at_construct() {
    let args = |out: &str| -> Vec<String> {
        ["-nostdin", "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i"]
            .into_iter()
            .chain(["testsrc=duration=0.4:size=64x48:rate=25", "-vf", "frei0r=invert0r", "-f", "framecrc", out])
            .map(String::from)
            .collect()
    };
    let native = output(Command::new(host("ffmpeg")).args(args("-")));
    assert!(native.status.success(), "{}", stderr(&native));
    let out = output(ward().args(["run", "--verbose", "--isolation", "process", "--", "ffmpeg"]).args(args("-")));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&native.stdout), "frames differ");
    assert!(err.contains("invert0r.so: frei0r plugin described under ward"), "{err}");
    let domains = plugin_domains(&err);
    assert_eq!(domains.len(), 1, "{err}");
    assert!(domains[0].contains("invert0r.so: frei0r plugin under ward (isolation process, domain process"), "{err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("ward: frei0r describer started")).count(), 1, "{err}");
}

/// A host that keeps every library it scans open (the proxies of all of them loaded at once, each under a name of
/// its own): every library's plugins are its own, as natively.
#[test]
fn a_host_keeping_every_scanned_library_open_sees_each_librarys_own_plugins() {
    let s = Scratch::new("scan", "keep-open");
    std::fs::write(
        s.path("keep.c"),
        r#"#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "ward_ladspa_abi.h"
static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }
static int is_so(const struct dirent *e) { size_t n = strlen(e->d_name); return n > 3 && !strcmp(e->d_name + n - 3, ".so"); }
int main(int argc, char **argv) {
    struct dirent **e;
    int n = scandir(argv[1], &e, is_so, by_name);
    void *open[1024];
    int count = 0;
    for (int i = 0; i < n && count < 1024; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], e[i]->d_name);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h) open[count++] = h;
    }
    for (int i = 0; i < count; i++) {
        LADSPA_Descriptor_Function f = (LADSPA_Descriptor_Function)dlsym(open[i], "ladspa_descriptor");
        const LADSPA_Descriptor *d;
        for (unsigned long k = 0; f && (d = f(k)) != NULL; k++) printf("%d %lu %s\n", i, k, d->Label);
    }
    return 0;
}
"#,
    )
    .expect("write the host");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = s.path("keep");
    let built = output(
        Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg("-I")
            .arg(manifest.join("../../include"))
            .arg(s.path("keep.c"))
            // libm, as audio hosts link it (ladspa-sdk's filter.so needs it and does not link it itself).
            .args(["-ldl", "-Wl,--no-as-needed", "-lm"]),
    );
    assert!(built.status.success(), "cc: {}", stderr(&built));
    let native = output(Command::new(&exe).arg(LADSPA_DIR));
    assert!(native.status.success(), "{}", stderr(&native));
    let out = output(ward().args(["run", "--isolation", "process", "--"]).arg(&exe).arg(LADSPA_DIR));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&native.stdout), "{}", stderr(&out));
}
