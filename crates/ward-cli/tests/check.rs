//! `ward check` end to end: arguments, directories, output formats and exit statuses. Nothing is loaded.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn ward() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ward"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("cannot run the ward binary")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A directory holding copies of the built-in extensions and a text file, removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ward-cli-check-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        for name in ["well", "faulty"] {
            let from = ward_extensions::path_of(name).expect("extract the built-in extensions");
            std::fs::copy(from, dir.join(format!("{name}.so"))).expect("copy a built-in extension");
        }
        std::fs::write(dir.join("notes.txt"), "not an extension\n").expect("write");
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn dir(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn human_output_has_a_line_per_extension_reasons_and_a_total() {
    let s = Scratch::new("human");
    let out = run(ward().arg("check").arg(s.path("well.so")).arg(s.path("faulty.so")));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("well ") && lines[0].ends_with("none ok  process ok  mpk ok"), "{text}");
    assert!(lines[1].starts_with("faulty ") && lines[1].ends_with("mpk NO (5 reasons)"), "{text}");
    assert!(lines.iter().any(|l| l.starts_with("    mpk: imports syscall: ")), "{text}");
    assert_eq!(lines.last(), Some(&"1 of 2 extensions can run under mpk"), "{text}");
    assert!(!text.contains("imports exit"), "exit is a fault, not a reason: {text}");
}

#[test]
fn brief_output_has_summary_lines_only() {
    let s = Scratch::new("brief");
    let out = run(ward().args(["check", "--brief"]).arg(s.path("faulty.so")));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(!text.contains("    "), "{text}");
}

#[test]
fn a_directory_means_every_so_inside_in_name_order() {
    let s = Scratch::new("dir");
    let out = run(ward().args(["check", "--json"]).arg(s.dir()));
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let names: Vec<&str> = lines.iter().map(|l| l["name"].as_str().expect("a name")).collect();
    assert_eq!(names, ["faulty", "well"], "notes.txt is not a .so and is skipped");
    for line in &lines {
        let kinds = line["kinds"].as_array().expect("kinds");
        let isolations: Vec<&str> = kinds.iter().map(|k| k["isolation"].as_str().expect("isolation")).collect();
        assert_eq!(isolations, ["none", "process", "mpk"]);
        assert_eq!(kinds[0]["ok"], true);
        assert_eq!(kinds[1]["ok"], true);
        assert!(line["imports"].as_array().is_some_and(|i| !i.is_empty()));
    }
    let faulty_mpk = &lines[0]["kinds"][2];
    assert_eq!(faulty_mpk["ok"], false);
    let first = &faulty_mpk["reasons"][0];
    assert_eq!(first["reason"], "unsupported_import");
    assert_eq!(first["name"], "__getdelim");
    assert!(first["message"].as_str().is_some_and(|m| m.starts_with("imports __getdelim: ")), "{first}");
    assert_eq!(lines[1]["kinds"][2]["ok"], true);
}

#[test]
fn bad_inputs_exit_2_each_named_and_the_rest_still_checked() {
    let s = Scratch::new("bad");
    let missing = s.path("missing.so");
    let text = s.path("notes.txt");
    let out = run(ward().arg("check").arg(&missing).arg(s.path("well.so")).arg(&text));
    assert_eq!(out.status.code(), Some(2), "stdout: {}\nstderr: {}", stdout(&out), stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("{} does not exist", missing.display())), "{err}");
    assert!(err.contains(&format!("{} is not an ELF shared object", text.display())), "{err}");
    assert!(err.contains("2 of 3 inputs could not be checked"), "{err}");
    // The good one is reported all the same.
    assert!(stdout(&out).starts_with("well "), "{}", stdout(&out));
    assert!(stdout(&out).contains("1 of 1 extension can run under mpk"), "{}", stdout(&out));
}

#[test]
fn a_directory_without_extensions_is_bad_input() {
    let s = Scratch::new("empty");
    let empty = s.path("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let out = run(ward().arg("check").arg(&empty));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains(&format!("{} holds no *.so files", empty.display())), "{}", stderr(&out));
}

#[test]
fn no_path_is_a_usage_error() {
    let out = run(ward().arg("check"));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("PATH"), "{}", stderr(&out));
}

#[test]
fn sandbox_lists_every_protection_and_what_the_policy_loosens() {
    let s = Scratch::new("sandbox");
    let strict = run(ward().args(["check", "--sandbox"]).arg(s.path("well.so")));
    assert!(strict.status.success(), "{}", stderr(&strict));
    let text = stdout(&strict);
    for protection in [
        "pid-namespace",
        "stdout",
        "no-new-privs",
        "not-dumpable",
        "capabilities",
        "landlock-files",
        "seccomp",
        "shared-memory",
        "past-buffers",
        "limits",
        "cgroup-memory",
        "cgroup-pids",
        "cgroup-cpu",
        "idle-cpu",
    ] {
        assert!(text.lines().any(|l| l.trim_start().starts_with(protection)), "{protection} not listed: {text}");
    }
    let seccomp = text.lines().find(|l| l.trim_start().starts_with("seccomp")).expect("a seccomp line");
    assert!(seccomp.contains(" on ") && seccomp.contains("sockets"), "{seccomp}");
    let shared = text.lines().find(|l| l.trim_start().starts_with("shared-memory")).expect("a shared-memory line");
    assert!(shared.contains(" on ") && shared.contains("read-only descriptors"), "{shared}");

    let policy = s.path("loose.toml");
    std::fs::write(&policy, "[extension.well.sandbox]\nnetwork = true\nreason = \"talks to its licence server\"\n")
        .expect("write the policy");
    let loose = run(ward().args(["check", "--sandbox", "--policy"]).arg(&policy).arg(s.path("well.so")));
    assert!(loose.status.success(), "{}", stderr(&loose));
    let text = stdout(&loose);
    let seccomp = text.lines().find(|l| l.trim_start().starts_with("seccomp")).expect("a seccomp line");
    assert!(seccomp.contains("loosened") && seccomp.contains("talks to its licence server"), "{seccomp}");
    assert!(!seccomp.contains("sockets,"), "sockets are allowed now: {seccomp}");

    // Writes allowed: a read-only descriptor could be reopened read-write, and the listing says so.
    std::fs::write(&policy, "[extension.well.sandbox]\nwritable = [\"/tmp\"]\nreason = \"keeps a cache\"\n")
        .expect("write the policy");
    let writes = run(ward().args(["check", "--sandbox", "--policy"]).arg(&policy).arg(s.path("well.so")));
    assert!(writes.status.success(), "{}", stderr(&writes));
    let text = stdout(&writes);
    let shared = text.lines().find(|l| l.trim_start().starts_with("shared-memory")).expect("a shared-memory line");
    assert!(shared.contains("loosened") && shared.contains("reopened read-write"), "{shared}");
}

#[test]
fn sandbox_lists_the_cgroup_limits_and_the_cpu_check_as_the_policy_sets_them() {
    let s = Scratch::new("sandbox-limits");
    let line = |text: &str, name: &str| -> String {
        text.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or_default().to_string()
    };
    let strict = run(ward().args(["check", "--sandbox"]).arg(s.path("well.so")));
    assert!(strict.status.success(), "{}", stderr(&strict));
    let text = stdout(&strict);
    let memory = line(&text, "cgroup-memory");
    assert!(memory.contains(" on ") || memory.contains(" missing "), "{memory}");
    if memory.contains(" on ") {
        assert!(memory.contains("1024 MiB") && memory.contains("memfd"), "{memory}");
    }
    assert!(line(&text, "idle-cpu").contains(" on ") && line(&text, "idle-cpu").contains("100 ms"), "{text}");
    assert!(line(&text, "past-buffers").contains("16 KiB of zeros"), "{text}");

    let policy = s.path("limits.toml");
    std::fs::write(
        &policy,
        "[extension.well]\nread_past_input_kb = 0\n[extension.well.limits]\nmemory_mb = 0\npids = 32\nidle_cpu_ms = 0\n",
    )
    .expect("write the policy");
    let set = run(ward().args(["check", "--sandbox", "--policy"]).arg(&policy).arg(s.path("well.so")));
    assert!(set.status.success(), "{}", stderr(&set));
    let text = stdout(&set);
    let memory = line(&text, "cgroup-memory");
    assert!(memory.contains(" off ") || memory.contains(" missing "), "{memory}");
    let pids = line(&text, "cgroup-pids");
    assert!(pids.contains("at most 32") || pids.contains(" missing "), "{pids}");
    assert!(line(&text, "idle-cpu").contains(" off "), "{text}");
    assert!(line(&text, "past-buffers").contains("reading past an input faults"), "{text}");

    std::fs::write(&policy, "[extension.well.limits]\npids = 2\n").expect("write the policy");
    let bad = run(ward().args(["check", "--sandbox", "--policy"]).arg(&policy).arg(s.path("well.so")));
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("pids"), "{}", stderr(&bad));
}

#[test]
fn a_sandbox_loosened_without_a_reason_is_a_bad_policy() {
    let s = Scratch::new("sandbox-reason");
    let policy = s.path("noreason.toml");
    std::fs::write(&policy, "[extension.well.sandbox]\nexec = true\n").expect("write the policy");
    let out = run(ward().args(["check", "--sandbox", "--policy"]).arg(&policy).arg(s.path("well.so")));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("noreason.toml:1") && err.contains("reason"), "{err}");
}

#[test]
fn sandbox_shows_the_pid_namespace_turned_off_with_its_reason() {
    let s = Scratch::new("sandbox-pidns");
    let policy = s.path("nopidns.toml");
    std::fs::write(
        &policy,
        "[extension.well.sandbox]\npid_namespace = false\nreason = \"lists the machine's processes\"\n",
    )
    .expect("write the policy");
    let out = run(ward().args(["check", "--sandbox", "--policy"]).arg(&policy).arg(s.path("well.so")));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let line = text.lines().find(|l| l.trim_start().starts_with("pid-namespace")).expect("a pid-namespace line");
    assert!(line.contains(" off ") && line.contains("lists the machine's processes"), "{line}");
}

// ---- LV2 bundles --------------------------------------------------------------------------------------------------

const LV2_PREFIXES: &str = "@prefix lv2: <http://lv2plug.in/ns/lv2core#> .\n\
                            @prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .\n\
                            @prefix ui: <http://lv2plug.in/ns/extensions/ui#> .\n";

/// An LV2 bundle `name` in the scratch directory: two plugins sharing `dsp.so` (the built-in well-behaved
/// extension), a third in `faulty.so`, and a UI in `gui.so`.
fn lv2_bundle(s: &Scratch, name: &str) -> PathBuf {
    let dir = s.path(name);
    std::fs::create_dir_all(&dir).expect("create a bundle directory");
    std::fs::copy(s.path("well.so"), dir.join("dsp.so")).expect("copy a binary");
    std::fs::copy(s.path("faulty.so"), dir.join("faulty.so")).expect("copy a binary");
    std::fs::copy(s.path("well.so"), dir.join("gui.so")).expect("copy a binary");
    let manifest = format!(
        "{LV2_PREFIXES}\
         <urn:ward:one> a lv2:Plugin ; lv2:binary <dsp.so> ; rdfs:seeAlso <plugins.ttl> .\n\
         <urn:ward:faulty> a lv2:Plugin ; lv2:binary <faulty.so> .\n\
         <urn:ward:two> a lv2:Plugin ; lv2:binary <dsp.so> ; rdfs:seeAlso <plugins.ttl> .\n\
         <urn:ward:one#ui> a ui:X11UI ; ui:binary <gui.so> .\n"
    );
    std::fs::write(dir.join("manifest.ttl"), manifest).expect("write the manifest");
    let plugins = format!(
        "{LV2_PREFIXES}\
         <urn:ward:one> lv2:port [ a lv2:InputPort, lv2:ControlPort ; lv2:index 0 ; lv2:symbol \"gain\" ] .\n"
    );
    std::fs::write(dir.join("plugins.ttl"), plugins).expect("write the plugins' file");
    dir
}

fn json_lines(out: &Output) -> Vec<Value> {
    stdout(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

#[test]
fn a_bundle_has_each_plugin_binary_checked_once_with_its_plugins_and_its_ui_binaries_listed() {
    let s = Scratch::new("lv2-bundle");
    let bundle = lv2_bundle(&s, "test.lv2");
    let out = run(ward().arg("check").arg(&bundle));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("test.lv2/dsp.so ") && lines[0].ends_with("mpk ok  (LV2, 2 plugins)"), "{text}");
    assert_eq!(lines[1..3], ["    LV2 plugin: urn:ward:one", "    LV2 plugin: urn:ward:two"], "{text}");
    let faulty = lines.iter().position(|l| l.starts_with("test.lv2/faulty.so ")).expect("faulty.so is listed");
    assert!(lines[faulty].contains("mpk NO (5 reasons)  (LV2, 1 plugin)"), "{text}");
    assert_eq!(lines[faulty + 1], "    LV2 plugin: urn:ward:faulty", "{text}");
    assert!(lines[faulty + 2].starts_with("    mpk: "), "every reason is listed: {text}");
    let gui = lines.iter().find(|l| l.starts_with("test.lv2/gui.so ")).expect("gui.so is listed");
    assert!(gui.ends_with("LV2 UI: left alone by ward run"), "{text}");
    assert_eq!(text.matches("test.lv2/dsp.so").count(), 1, "a binary of two plugins is checked once: {text}");
    assert!(text.contains("\n1 of 2 extensions can run under mpk\n"), "the UI binary is not checked: {text}");
    assert!(
        text.ends_with("LV2: 2 of 3 plugins (in 2 binaries) can run under mpk; 1 UI binary left alone\n"),
        "{text}"
    );

    let brief = run(ward().args(["check", "--brief"]).arg(&bundle));
    assert!(brief.status.success(), "{}", stderr(&brief));
    let text = stdout(&brief);
    assert_eq!(text.lines().count(), 5, "three binaries and two totals: {text}");
    assert!(!text.lines().any(|l| l.starts_with(' ')), "no URIs, no reasons: {text}");

    let json = run(ward().args(["check", "--json"]).arg(&bundle));
    assert!(json.status.success(), "{}", stderr(&json));
    let lines = json_lines(&json);
    assert_eq!(lines.len(), 3, "{}", stdout(&json));
    let dsp = &lines[0];
    assert_eq!(dsp["class"], "lv2");
    assert_eq!(dsp["path"], bundle.join("dsp.so").to_str().expect("a UTF-8 path"));
    assert_eq!(dsp["bundle"], bundle.to_str().expect("a UTF-8 path"));
    assert_eq!(dsp["plugins"], serde_json::json!(["urn:ward:one", "urn:ward:two"]));
    assert_eq!(dsp["kinds"][2]["ok"], true);
    assert_eq!(lines[1]["plugins"], serde_json::json!(["urn:ward:faulty"]));
    assert_eq!(lines[1]["kinds"][2]["ok"], false);
    assert!(lines[1]["kinds"][2]["reasons"].as_array().is_some_and(|r| r.len() == 5), "{}", lines[1]);
    let gui = &lines[2];
    assert_eq!(gui["class"], "lv2-ui");
    assert_eq!(gui["checked"], false);
    assert_eq!(gui["uis"], serde_json::json!(["urn:ward:one#ui"]));
    assert!(gui.get("kinds").is_none(), "a UI binary is not checked: {gui}");
}

#[test]
fn a_directory_of_bundles_checks_each_and_a_bundle_that_cannot_be_read_is_bad_input() {
    let s = Scratch::new("lv2-dir");
    let lib = s.path("lv2");
    std::fs::create_dir_all(&lib).expect("mkdir");
    lv2_bundle(&s, "lv2/good.lv2");
    let broken = lib.join("broken.lv2");
    std::fs::create_dir_all(&broken).expect("mkdir");
    std::fs::write(broken.join("manifest.ttl"), "<urn:x> a <urn:y>\n<urn:z> .\n").expect("write");
    let bare = lib.join("bare.lv2");
    std::fs::create_dir_all(&bare).expect("mkdir");
    std::fs::copy(s.path("well.so"), lib.join("loose.so")).expect("copy a binary");
    // A device named as a binary is not read (it could stall the check).
    let device = lib.join("device.lv2");
    std::fs::create_dir_all(&device).expect("mkdir");
    let manifest = format!("{LV2_PREFIXES}<urn:ward:device> a lv2:Plugin ; lv2:binary <file:///dev/zero> .\n");
    std::fs::write(device.join("manifest.ttl"), manifest).expect("write");

    let out = run(ward().arg("check").arg(&lib));
    assert_eq!(out.status.code(), Some(2), "stdout: {}\nstderr: {}", stdout(&out), stderr(&out));
    let err = stderr(&out);
    let said =
        |what: &str| err.lines().any(|l| l.starts_with("ward: error: cannot read an LV2 bundle: ") && l.contains(what));
    assert!(said(&format!("{}:2:1: Turtle syntax error", broken.join("manifest.ttl").display())), "{err}");
    assert!(said(&format!("{}: not an LV2 bundle: it has no manifest.ttl", bare.display())), "{err}");
    let device_error = format!(
        "/dev/zero: the LV2 bundle {} names it as a plugin binary, but it is no regular file",
        device.display()
    );
    assert!(err.contains(&device_error), "{err}");
    assert!(err.contains("3 of 6 inputs could not be checked"), "two bundles, three binaries, loose.so: {err}");
    // The rest is checked all the same, in name order, the loose *.so among the bundles.
    let text = stdout(&out);
    let names: Vec<&str> =
        text.lines().filter(|l| !l.starts_with(' ')).map(|l| l.split(' ').next().unwrap_or("")).collect();
    assert_eq!(names[..4], ["good.lv2/dsp.so", "good.lv2/faulty.so", "good.lv2/gui.so", "loose"], "{text}");
}

#[test]
fn a_debian_lv2_bundle_is_checked_with_its_plugin() {
    let bundle = Path::new("/usr/lib/lv2/amp-swh.lv2");
    assert!(bundle.exists(), "{} is missing: run scripts/deps", bundle.display());
    let out = run(ward().args(["check", "--json"]).arg(bundle));
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{}", stdout(&out));
    assert_eq!(lines[0]["class"], "lv2");
    assert_eq!(lines[0]["plugins"], serde_json::json!(["http://plugin.org.uk/swh-plugins/amp"]));
    assert_eq!(lines[0]["kinds"][2]["ok"], true, "swh's amp can run under mpk: {}", lines[0]);

    // Every swh binary is called plugin-linux.so: the sandbox listing names the bundle, and the policy name.
    let out = run(ward().args(["check", "--sandbox"]).arg(bundle));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let header = "amp-swh.lv2/plugin-linux.so (named plugin-linux in policies): sandbox of its process domain";
    assert!(text.lines().any(|l| l.starts_with(header)), "{text}");
}
