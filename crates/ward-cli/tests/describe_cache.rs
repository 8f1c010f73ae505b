//! The cache of descriptions under `ward run`: a host that scans libraries it scanned before, unchanged since, gets
//! their descriptions from the user's cache, with no describer domain and none of their code loaded; a changed file,
//! an entry that is not believable, a policy that turns the cache off and a cache directory that is not private all
//! mean describing as before. Every test has a cache directory of its own (`WARD_CACHE_DIR`). Debian's
//! `listplugins`, `ffmpeg` and LADSPA and frei0r plugins come from scripts/deps.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{host, output, scan_host, stderr, ward, Scratch};

const LADSPA_DIR: &str = "/usr/lib/ladspa";

/// The Debian libraries a test scans, copied into a directory of its own (so it may change them).
const LIBRARIES: [&str; 5] = ["amp.so", "delay.so", "noise.so", "sine.so", "comb_1190.so"];

/// A directory with copies of [`LIBRARIES`].
fn plugin_dir(s: &Scratch) -> PathBuf {
    let dir = s.path("plugins");
    std::fs::create_dir_all(&dir).expect("make the plugin directory");
    for name in LIBRARIES {
        std::fs::copy(Path::new(LADSPA_DIR).join(name), dir.join(name))
            .unwrap_or_else(|e| panic!("copy {name}: {e}: run scripts/deps"));
    }
    dir
}

/// What `listplugins` prints natively for `dir`.
fn native_listing(dir: &Path) -> String {
    let out = output(Command::new(host("listplugins")).env("LADSPA_PATH", dir));
    assert!(out.status.success(), "{}", stderr(&out));
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(listing.contains("amp_mono"), "listplugins natively: {listing}");
    listing
}

/// `ward run --verbose -- listplugins` over `dir` with the cache in `cache` (and the policy file `policy`, if
/// any): its listing and what ward said.
fn listplugins(dir: &Path, cache: &Path, policy: Option<&Path>) -> (String, String) {
    let mut cmd = ward();
    cmd.args(["run", "--verbose", "--isolation", "process"]);
    if let Some(policy) = policy {
        cmd.arg("--policy").arg(policy);
    }
    let out = output(cmd.args(["--", "listplugins"]).env("LADSPA_PATH", dir).env("WARD_CACHE_DIR", cache));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), err)
}

fn describer_starts(err: &str) -> usize {
    err.lines().filter(|l| l.starts_with("ward: LADSPA describer started")).count()
}

/// The libraries ward said it described from the cache.
fn from_cache(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.contains(": LADSPA plugin described under ward, from the cache")).collect()
}

/// The libraries ward said the describer described.
fn described_anew(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.contains(": LADSPA plugin described under ward (its domain starts")).collect()
}

/// The lines saying the cache directory is not used.
fn not_used(err: &str) -> usize {
    err.lines().filter(|l| l.starts_with("ward: the cache of descriptions is not used")).count()
}

/// The entries in the cache directory `cache`.
fn entries(cache: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = match std::fs::read_dir(cache) {
        Ok(dir) => dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect(),
        Err(_) => Vec::new(),
    };
    found.sort();
    found
}

/// The cache entry of the file `library` (the one whose identity names its inode; entries a test damaged are
/// passed over).
fn entry_of(cache: &Path, library: &Path) -> PathBuf {
    let inode = std::fs::metadata(library).expect("the library").ino();
    entries(cache)
        .into_iter()
        .find(|e| {
            let entry = serde_json::from_slice::<serde_json::Value>(&std::fs::read(e).expect("read an entry"));
            entry.is_ok_and(|entry| entry["identity"]["inode"].as_u64() == Some(inode))
        })
        .unwrap_or_else(|| panic!("no cache entry of {}", library.display()))
}

#[test]
fn a_second_scan_gets_every_description_from_the_cache_with_no_describer_and_the_native_listing() {
    let s = Scratch::new("describe-cache", "second-scan");
    let dir = plugin_dir(&s);
    let cache = s.path("cache");
    let native = native_listing(&dir);

    let (listing, err) = listplugins(&dir, &cache, None);
    assert_eq!(listing, native, "first scan: {err}");
    assert_eq!(describer_starts(&err), 1, "{err}");
    assert_eq!(described_anew(&err).len(), LIBRARIES.len(), "{err}");
    assert!(from_cache(&err).is_empty(), "{err}");
    let mode = std::fs::symlink_metadata(&cache).expect("the cache directory was made").mode();
    assert_eq!(mode & 0o777, 0o700, "the cache directory is private");
    assert_eq!(entries(&cache).len(), LIBRARIES.len(), "one entry per library");
    for entry in entries(&cache) {
        assert_eq!(std::fs::metadata(&entry).unwrap().mode() & 0o777, 0o600, "{}", entry.display());
    }

    let (listing, err) = listplugins(&dir, &cache, None);
    assert_eq!(listing, native, "second scan: {err}");
    assert_eq!(describer_starts(&err), 0, "no describer: {err}");
    assert!(described_anew(&err).is_empty(), "{err}");
    assert_eq!(from_cache(&err).len(), LIBRARIES.len(), "{err}");
    let said: Vec<&str> = err.lines().filter(|l| l.contains("were described from the cache in")).collect();
    assert_eq!(said.len(), 1, "said once: {err}");
    assert!(said[0].starts_with(&format!("ward: {} LADSPA libraries and 0 frei0r plugins", LIBRARIES.len())), "{err}");
}

/// A host that opens only libraries that are no plugins (by path, as hosts scanning a directory do) leaves no cache
/// directory behind: looking an entry up makes none, only keeping one does.
#[test]
fn a_host_that_opens_no_plugin_makes_no_cache_directory() {
    let s = Scratch::new("describe-cache", "no-plugin");
    let dir = s.path("not-plugins");
    std::fs::create_dir_all(&dir).expect("make the directory");
    let library = ["/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("zlib, which every Debian system has");
    std::fs::copy(library, dir.join("notaplugin.so")).expect("copy a library that is no plugin");
    let cache = s.path("cache");
    let (_, err) = listplugins(&dir, &cache, None);
    assert!(!err.contains("plugin described under ward"), "nothing was a plugin: {err}");
    assert!(std::fs::symlink_metadata(&cache).is_err(), "{} was made: {err}", cache.display());
}

/// Changing one library (here only its times, its modification time even set back to what it was: the change
/// time, which no process sets, still differs) makes that one miss, and only that one.
#[test]
fn touching_one_library_makes_only_that_one_miss() {
    let s = Scratch::new("describe-cache", "touch");
    let dir = plugin_dir(&s);
    let cache = s.path("cache");
    let native = native_listing(&dir);
    let (_, err) = listplugins(&dir, &cache, None);
    assert_eq!(describer_starts(&err), 1, "{err}");

    let touched = dir.join("delay.so");
    let modified = std::fs::metadata(&touched).unwrap().modified().unwrap();
    let file = std::fs::File::options().write(true).open(&touched).expect("open delay.so");
    file.set_modified(modified).expect("set its modification time back to what it was");
    drop(file);

    let (listing, err) = listplugins(&dir, &cache, None);
    assert_eq!(listing, native, "{err}");
    assert_eq!(describer_starts(&err), 1, "{err}");
    let anew = described_anew(&err);
    assert_eq!(anew.len(), 1, "{err}");
    assert!(anew[0].contains("/delay.so: "), "{err}");
    assert_eq!(from_cache(&err).len(), LIBRARIES.len() - 1, "{err}");
}

/// Entries that are not JSON, are cut short, or hold a description no plugin could give are misses: the libraries
/// are described again, the listing is the native one, and the next scan finds them kept anew.
#[test]
fn a_corrupted_cache_entry_is_a_miss_with_the_native_listing() {
    let s = Scratch::new("describe-cache", "corrupt");
    let dir = plugin_dir(&s);
    let cache = s.path("cache");
    let native = native_listing(&dir);
    let (_, err) = listplugins(&dir, &cache, None);
    assert_eq!(describer_starts(&err), 1, "{err}");

    std::fs::write(entry_of(&cache, &dir.join("amp.so")), b"\x00\xffnot an entry").unwrap();
    let cut = entry_of(&cache, &dir.join("delay.so"));
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    // A description whose first port's name now holds a control character (a byte of the name turned into 0x07),
    // and one cut short: both fail the checks a description from a domain gets.
    for (name, damage) in [("noise.so", "bell"), ("sine.so", "short")] {
        let path = entry_of(&cache, &dir.join(name));
        let mut entry: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let hex = entry["descriptions"][0].as_str().expect("a description").to_string();
        let damaged = match damage {
            // The label is the first string, after the id (8 bytes), properties (4), port count (4), flags (4) and
            // its length (4): its first byte is at 24, hex digits 48 and 49.
            "bell" => format!("{}07{}", &hex[..48], &hex[50..]),
            _ => hex[..hex.len() - 8].to_string(),
        };
        entry["descriptions"][0] = serde_json::Value::String(damaged);
        std::fs::write(&path, serde_json::to_vec(&entry).unwrap()).unwrap();
    }

    let (listing, err) = listplugins(&dir, &cache, None);
    assert_eq!(listing, native, "{err}");
    assert_eq!(describer_starts(&err), 1, "{err}");
    let mut anew: Vec<&str> = described_anew(&err)
        .into_iter()
        .map(|l| l.split(": LADSPA").next().unwrap_or_default().rsplit('/').next().unwrap_or_default())
        .collect();
    anew.sort();
    assert_eq!(anew, ["amp.so", "delay.so", "noise.so", "sine.so"], "{err}");
    assert_eq!(from_cache(&err).len(), 1, "{err}");

    let (listing, err) = listplugins(&dir, &cache, None);
    assert_eq!(listing, native, "{err}");
    assert_eq!(describer_starts(&err), 0, "the damaged entries were written anew: {err}");
    assert_eq!(from_cache(&err).len(), LIBRARIES.len(), "{err}");
}

#[test]
fn with_describe_cache_false_in_the_policy_every_scan_starts_the_describer() {
    let s = Scratch::new("describe-cache", "policy-off");
    let dir = plugin_dir(&s);
    let cache = s.path("cache");
    let policy = s.path("policy.toml");
    std::fs::write(&policy, "[defaults]\ndescribe_cache = false\n").unwrap();
    let native = native_listing(&dir);
    for run in 0..2 {
        let (listing, err) = listplugins(&dir, &cache, Some(&policy));
        assert_eq!(listing, native, "{err}");
        assert_eq!(describer_starts(&err), 1, "run {run}: {err}");
        assert!(from_cache(&err).is_empty(), "{err}");
    }
    assert!(entries(&cache).is_empty(), "nothing kept");
    // Turned on again, the cache works as ever.
    listplugins(&dir, &cache, None);
    let (_, err) = listplugins(&dir, &cache, None);
    assert_eq!(describer_starts(&err), 0, "{err}");
}

/// A cache directory someone else could have written to is not used: every scan describes anew, ward says so once,
/// and nothing is written there.
fn refused(cache: &Path, dir: &Path, native: &str, look_in: &Path) {
    for run in 0..2 {
        let (listing, err) = listplugins(dir, cache, None);
        assert_eq!(listing, native, "{err}");
        assert_eq!(describer_starts(&err), 1, "run {run}: {err}");
        assert!(from_cache(&err).is_empty(), "{err}");
        assert_eq!(not_used(&err), 1, "said once: {err}");
    }
    assert!(entries(look_in).is_empty(), "nothing written to {}", look_in.display());
}

#[test]
fn a_world_writable_cache_directory_is_not_used() {
    let s = Scratch::new("describe-cache", "world-writable");
    let dir = plugin_dir(&s);
    let cache = s.path("cache");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(&cache, &dir, &native_listing(&dir), &cache);
}

#[test]
fn a_symlinked_cache_directory_is_not_used() {
    let s = Scratch::new("describe-cache", "symlink");
    let dir = plugin_dir(&s);
    let real = s.path("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let cache = s.path("cache");
    std::os::unix::fs::symlink(&real, &cache).unwrap();
    refused(&cache, &dir, &native_listing(&dir), &real);
}

#[test]
fn a_cache_directory_owned_by_someone_else_is_not_used() {
    let s = Scratch::new("describe-cache", "other-owner");
    let dir = plugin_dir(&s);
    let cache = s.path("cache");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Giving a directory away needs root (the tests run as root, CI too).
    std::os::unix::fs::chown(&cache, Some(65534), Some(65534))
        .unwrap_or_else(|e| panic!("this test gives a directory to uid 65534, which needs root: {e}"));
    refused(&cache, &dir, &native_listing(&dir), &cache);
}

/// A host that scans every Debian library then processes a second of audio: the second time every description
/// comes from the cache, and the library it instantiates from gets its own domain as ever, with the native samples.
#[test]
fn a_host_that_scans_from_the_cache_then_processes_gets_the_native_output_from_the_plugins_own_domain() {
    let s = Scratch::new("describe-cache", "scan-then-process");
    let exe = scan_host(&s);
    let cache = s.path("cache");
    let args = |out: &str| {
        [LADSPA_DIR.into(), format!("{LADSPA_DIR}/amp.so"), "amp_mono".into(), s.path(out).display().to_string()]
    };
    let native = output(Command::new(&exe).args(args("native.raw")));
    assert!(native.status.success(), "{}", stderr(&native));
    for run in ["first", "second"] {
        let out = output(
            ward()
                .args(["run", "--verbose", "--isolation", "process", "--"])
                .arg(&exe)
                .args(args("ward.raw"))
                .env("WARD_CACHE_DIR", &cache),
        );
        let err = stderr(&out);
        assert!(out.status.success(), "{run}: {err}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&native.stdout), "{run}: {err}");
        assert!(std::fs::read(s.path("native.raw")).unwrap() == std::fs::read(s.path("ward.raw")).unwrap(), "{run}");
        let domains: Vec<&str> = err.lines().filter(|l| l.contains("plugin under ward (isolation")).collect();
        assert_eq!(domains.len(), 1, "{run}: {err}");
        assert!(domains[0].contains("amp.so: LADSPA plugin under ward (isolation process, domain process"), "{err}");
        if run == "second" {
            assert_eq!(describer_starts(&err), 0, "{err}");
            assert!(described_anew(&err).is_empty(), "{err}");
            assert!(err.contains("/amp.so: LADSPA plugin described under ward, from the cache"), "{err}");
        }
    }
}

/// An entry planted for a library (another library's descriptions under its identity) shows the host what the
/// entry says, but the library's own domain reads the file itself when the host instantiates from it: it is refused
/// there, never run with ports the host did not expect.
#[test]
fn a_planted_entry_is_refused_when_the_host_instantiates_from_the_library() {
    let s = Scratch::new("describe-cache", "planted");
    let exe = scan_host(&s);
    let dir = plugin_dir(&s);
    let cache = s.path("cache");
    listplugins(&dir, &cache, None);
    let (amp, delay) = (entry_of(&cache, &dir.join("amp.so")), entry_of(&cache, &dir.join("delay.so")));
    let mut planted: serde_json::Value = serde_json::from_slice(&std::fs::read(&amp).unwrap()).unwrap();
    let delays: serde_json::Value = serde_json::from_slice(&std::fs::read(&delay).unwrap()).unwrap();
    planted["identity"] = delays["identity"].clone();
    std::fs::write(&delay, serde_json::to_vec(&planted).unwrap()).unwrap();
    let out = output(
        ward()
            .args(["run", "--verbose", "--isolation", "process", "--"])
            .arg(&exe)
            .arg(&dir)
            .arg(dir.join("delay.so"))
            .arg("amp_mono")
            .arg(s.path("ward.raw"))
            .env("WARD_CACHE_DIR", &cache),
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "the host could not instantiate: {err}");
    assert!(err.contains("/delay.so: LADSPA plugin described under ward, from the cache"), "{err}");
    assert!(err.contains("changed since the host read its descriptions"), "{err}");
    assert!(err.contains("amp_mono: instantiate failed"), "{err}");
}

#[test]
fn ffmpeg_gets_a_frei0r_description_from_the_cache_the_second_time_and_the_native_frames() {
    let s = Scratch::new("describe-cache", "ffmpeg");
    let cache = s.path("cache");
    let args: Vec<String> = ["-nostdin", "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i"]
        .into_iter()
        .chain(["testsrc=duration=0.4:size=64x48:rate=25", "-vf", "frei0r=invert0r", "-f", "framecrc", "-"])
        .map(String::from)
        .collect();
    let native = output(Command::new(host("ffmpeg")).args(&args));
    assert!(native.status.success(), "{}", stderr(&native));
    for run in ["first", "second"] {
        let out = output(
            ward()
                .args(["run", "--verbose", "--isolation", "process", "--", "ffmpeg"])
                .args(&args)
                .env("WARD_CACHE_DIR", &cache),
        );
        let err = stderr(&out);
        assert!(out.status.success(), "{run}: {err}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&native.stdout), "{run}: {err}");
        let starts = err.lines().filter(|l| l.starts_with("ward: frei0r describer started")).count();
        let cached = err.contains("invert0r.so: frei0r plugin described under ward, from the cache");
        assert_eq!((starts, cached), if run == "first" { (1, false) } else { (0, true) }, "{run}: {err}");
        assert!(err.contains("invert0r.so: frei0r plugin under ward (isolation process"), "{run}: {err}");
    }
}

/// A library whose description failed (its constructor crashes in the describer) is never kept: every scan
/// describes it again and refuses it as before, while the library beside it comes from the cache.
#[test]
fn a_library_that_failed_to_be_described_is_never_kept() {
    let s = Scratch::new("describe-cache", "failed");
    let dir = s.path("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let builtin = ward_extensions::extracted().expect("extract the built-in extensions");
    std::fs::copy(builtin.join("bad_ladspa_ctor_crash.so"), dir.join("bad_ladspa_ctor_crash.so")).expect("copy");
    std::fs::copy(Path::new(LADSPA_DIR).join("amp.so"), dir.join("zz_amp.so")).expect("copy amp.so");
    let cache = s.path("cache");
    for run in ["first", "second"] {
        let (listing, err) = listplugins(&dir, &cache, None);
        assert!(listing.contains("amp_mono"), "{run}: {listing}");
        assert_eq!(describer_starts(&err), 1, "{run}: the crashing library is described every time: {err}");
        let refused = err.lines().filter(|l| l.contains("bad_ladspa_ctor_crash.so: not loaded: ")).count();
        assert_eq!(refused, 1, "{run}: {err}");
        assert_eq!(entries(&cache).len(), 1, "{run}: only zz_amp.so is kept");
        assert_eq!(from_cache(&err).len(), usize::from(run == "second"), "{run}: {err}");
    }
    assert!(entry_of(&cache, &dir.join("zz_amp.so")).is_file());
}
