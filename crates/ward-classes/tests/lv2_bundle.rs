//! The LV2 bundle reader: small bundles written here, and the real bundles Debian ships (swh-lv2, mda-lv2,
//! x42-plugins, lsp-plugins-lv2, zam-plugins), checked against what lilv's own tools (`lv2ls`, `lv2info`) read.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::Scratch;
use ward_classes::lv2::bundle::{
    all_bundles, plugins_of_binary, read_bundle, search_path, ui_binary, BundleError, Direction, PortKind,
};

const PREFIXES: &str = r#"
@prefix lv2:  <http://lv2plug.in/ns/lv2core#> .
@prefix atom: <http://lv2plug.in/ns/ext/atom#> .
@prefix rsz:  <http://lv2plug.in/ns/ext/resize-port#> .
@prefix ev:   <http://lv2plug.in/ns/ext/event#> .
@prefix doap: <http://usefulinc.com/ns/doap#> .
@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .
@prefix ui:   <http://lv2plug.in/ns/extensions/ui#> .
@prefix pset: <http://lv2plug.in/ns/ext/presets#> .
@prefix xsd:  <http://www.w3.org/2001/XMLSchema#> .
"#;

/// Writes `files` (name, Turtle without prefixes) into a new bundle directory `name` inside `scratch`.
fn bundle(scratch: &Scratch, name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = scratch.path(name);
    for (file, turtle) in files {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().expect("a file in the bundle has a directory")).expect("create dirs");
        std::fs::write(&path, format!("{PREFIXES}{turtle}")).expect("write a Turtle file");
    }
    dir
}

const EVERY_KIND: &str = r#"
<http://example.org/every-kind>
    a lv2:Plugin, lv2:DelayPlugin ;
    doap:name "Alles"@de, "Every kind", "Chaque sorte"@fr ;
    lv2:requiredFeature <http://lv2plug.in/ns/ext/urid#map> ;
    lv2:optionalFeature <http://lv2plug.in/ns/ext/options#options>, lv2:hardRTCapable ;
    lv2:extensionData <http://lv2plug.in/ns/ext/state#interface> ;
    lv2:port [
        a lv2:OutputPort, atom:AtomPort ;
        lv2:index 5 ;
        lv2:symbol "notify" ;
        atom:bufferType atom:Sequence ;
        rsz:minimumSize 8192 ;
    ] , [
        a lv2:InputPort, lv2:AudioPort ;
        lv2:index 0 ;
        lv2:symbol "in" ;
        lv2:name "Input" ;
    ] , [
        a lv2:OutputPort, lv2:AudioPort ;
        lv2:index 1 ;
        lv2:symbol "out" ;
        lv2:portProperty lv2:connectionOptional ;
    ] , [
        a lv2:InputPort, lv2:ControlPort ;
        lv2:index 2 ;
        lv2:symbol "gain" ;
        lv2:default 0.5 ;
        lv2:minimum -90 ;
        lv2:maximum 1.5e1 ;
    ] , [
        a lv2:InputPort, lv2:CVPort ;
        lv2:index "3"^^xsd:integer ;
        lv2:symbol "mod" ;
    ] , [
        a lv2:InputPort, atom:AtomPort ;
        lv2:index 4 ;
        lv2:symbol "control" ;
        atom:bufferType atom:Sequence ;
        atom:supports <http://lv2plug.in/ns/ext/midi#MidiEvent>, <http://lv2plug.in/ns/ext/patch#Message> ;
    ] , [
        a lv2:InputPort, ev:EventPort ;
        lv2:index 6 ;
        lv2:symbol "old_events" ;
    ] , [
        a lv2:InputPort, atom:AtomPort ;
        lv2:index 7 ;
        lv2:symbol "value" ;
        atom:bufferType atom:Float ;
    ] .
"#;

#[test]
fn a_plugin_with_blank_node_ports_of_every_kind_is_read() {
    let scratch = Scratch::new("lv2_bundle", "every_kind");
    let dir = bundle(
        &scratch,
        "every.lv2",
        &[
            (
                "manifest.ttl",
                "<http://example.org/every-kind> a lv2:Plugin ; lv2:binary <every.so> ; rdfs:seeAlso <every.ttl> .",
            ),
            ("every.ttl", EVERY_KIND),
        ],
    );
    let read = read_bundle(&dir).expect("the bundle reads");
    assert_eq!(read.dir, dir);
    assert_eq!(read.plugins.len(), 1);
    let plugin = &read.plugins[0];
    assert_eq!(plugin.uri, "http://example.org/every-kind");
    assert_eq!(plugin.bundle, dir);
    assert_eq!(plugin.binary, dir.join("every.so"));
    assert_eq!(plugin.name.as_deref(), Some("Every kind"), "the name without a language tag");
    assert_eq!(
        plugin.types,
        ["http://lv2plug.in/ns/lv2core#Plugin", "http://lv2plug.in/ns/lv2core#DelayPlugin"],
        "the manifest's type once, then the plugin file's other one"
    );
    assert_eq!(plugin.required_features, ["http://lv2plug.in/ns/ext/urid#map"]);
    assert_eq!(
        plugin.optional_features,
        ["http://lv2plug.in/ns/ext/options#options", "http://lv2plug.in/ns/lv2core#hardRTCapable"]
    );
    assert_eq!(plugin.extension_data, ["http://lv2plug.in/ns/ext/state#interface"]);

    let indices: Vec<u32> = plugin.ports.iter().map(|p| p.index).collect();
    assert_eq!(indices, (0..8).collect::<Vec<_>>(), "ports ordered by index, whatever the file's order");
    let summary: Vec<(&str, Direction, PortKind)> =
        plugin.ports.iter().map(|p| (p.symbol.as_str(), p.direction, p.kind.clone())).collect();
    assert_eq!(
        summary,
        [
            ("in", Direction::Input, PortKind::Audio),
            ("out", Direction::Output, PortKind::Audio),
            ("gain", Direction::Input, PortKind::Control),
            ("mod", Direction::Input, PortKind::Cv),
            ("control", Direction::Input, PortKind::Atom { sequence: true }),
            ("notify", Direction::Output, PortKind::Atom { sequence: true }),
            ("old_events", Direction::Input, PortKind::Other("http://lv2plug.in/ns/ext/event#EventPort".into())),
            ("value", Direction::Input, PortKind::Atom { sequence: false }),
        ]
    );
    let ports = &plugin.ports;
    assert_eq!(ports[0].name.as_deref(), Some("Input"));
    assert_eq!(ports[1].name, None);
    assert!(!ports[0].connection_optional);
    assert!(ports[1].connection_optional);
    assert_eq!((ports[2].default, ports[2].minimum, ports[2].maximum), (Some(0.5), Some(-90.0), Some(15.0)));
    assert_eq!((ports[0].default, ports[0].minimum, ports[0].maximum), (None, None, None));
    assert_eq!(ports[5].minimum_size, Some(8192));
    assert_eq!(ports[4].minimum_size, None);
    assert_eq!(
        ports[4].supports,
        ["http://lv2plug.in/ns/ext/midi#MidiEvent", "http://lv2plug.in/ns/ext/patch#Message"]
    );
    assert!(read.uis.is_empty());
}

#[test]
fn a_plugin_spread_over_seealso_files_is_read_whole() {
    let scratch = Scratch::new("lv2_bundle", "spread");
    let dir = bundle(
        &scratch,
        "spread.lv2",
        &[
            (
                "manifest.ttl",
                r#"
                <http://example.org/spread> a lv2:Plugin ; rdfs:seeAlso <ttl/ports.ttl>, <ttl/more.ttl>,
                    <same-ports.ttl> , <manifest.ttl> .
                <http://example.org/spread#preset> a pset:Preset ; lv2:appliesTo <http://example.org/spread> ;
                    rdfs:seeAlso <presets.ttl> .
                <http://example.org/author> rdfs:seeAlso <http://example.org/author.ttl> .
                "#,
            ),
            (
                // Relative IRIs resolve against this file's own IRI: the binary is in ttl/lib/.
                "ttl/ports.ttl",
                r#"
                <http://example.org/spread> lv2:binary <lib/spread.so> ;
                    lv2:port [ a lv2:InputPort, lv2:AudioPort ; lv2:index 0 ; lv2:symbol "in" ] ,
                             <http://example.org/spread#out> .
                <http://example.org/spread#out> a lv2:OutputPort ; lv2:index 1 .
                "#,
            ),
            (
                "ttl/more.ttl",
                r#"
                <http://example.org/spread> doap:name "Spread" ;
                    lv2:port [ a lv2:InputPort, lv2:ControlPort ; lv2:index 2 ; lv2:symbol "level" ] .
                <http://example.org/spread#out> a lv2:AudioPort ; lv2:symbol "out" .
                "#,
            ),
            (
                "presets.ttl",
                r#"
                <http://example.org/spread#preset> a pset:Preset ; rdfs:label "Loud" ;
                    lv2:port [ lv2:symbol "level" ; pset:value 1.0 ] .
                "#,
            ),
        ],
    );
    // Another name of a file already read (and the manifest itself) is not read again.
    std::os::unix::fs::symlink("ttl/ports.ttl", dir.join("same-ports.ttl")).expect("make a link");
    let read = read_bundle(&dir).expect("the bundle reads");
    assert_eq!(read.plugins.len(), 1, "the preset is no plugin");
    let plugin = &read.plugins[0];
    assert_eq!(plugin.binary, dir.join("ttl/lib/spread.so"));
    assert_eq!(plugin.name.as_deref(), Some("Spread"));
    let ports: Vec<(&str, Direction, PortKind)> =
        plugin.ports.iter().map(|p| (p.symbol.as_str(), p.direction, p.kind.clone())).collect();
    assert_eq!(
        ports,
        [
            ("in", Direction::Input, PortKind::Audio),
            ("out", Direction::Output, PortKind::Audio),
            ("level", Direction::Input, PortKind::Control),
        ],
        "a named port's triples from two files make one port"
    );
}

fn expect_error(dir: &Path) -> BundleError {
    match read_bundle(dir) {
        Ok(read) => panic!("{} read although it is broken: {read:?}", dir.display()),
        Err(e) => e,
    }
}

const TWO_PORTS: &str = r#"
<http://example.org/p> a lv2:Plugin ; lv2:binary <p.so> ;
    lv2:port [ a lv2:InputPort, lv2:AudioPort ; lv2:index 0 ; lv2:symbol "in" ] ,
             [ a lv2:OutputPort, lv2:AudioPort ; lv2:index INDEX ; lv2:symbol "out" ] .
"#;

#[test]
fn a_hole_in_port_indices_is_an_error_naming_the_plugin_and_file() {
    let scratch = Scratch::new("lv2_bundle", "hole");
    let dir = bundle(&scratch, "hole.lv2", &[("manifest.ttl", &TWO_PORTS.replace("INDEX", "2"))]);
    let error = expect_error(&dir);
    assert!(
        matches!(&error, BundleError::PortIndexHole { index: 1, count: 2, plugin, file }
            if plugin == "http://example.org/p" && *file == dir.join("manifest.ttl")),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("http://example.org/p") && message.contains("manifest.ttl"), "{message}");
}

#[test]
fn a_duplicate_port_index_is_an_error() {
    let scratch = Scratch::new("lv2_bundle", "duplicate");
    let dir = bundle(&scratch, "dup.lv2", &[("manifest.ttl", &TWO_PORTS.replace("INDEX", "0"))]);
    let error = expect_error(&dir);
    assert!(matches!(&error, BundleError::DuplicatePortIndex { index: 0, .. }), "{error:?}");
}

#[test]
fn a_port_without_an_index_or_direction_is_an_error() {
    let scratch = Scratch::new("lv2_bundle", "bad_port");
    let no_index = bundle(&scratch, "noindex.lv2", &[("manifest.ttl", &TWO_PORTS.replace("lv2:index INDEX ;", ""))]);
    let error = expect_error(&no_index);
    assert!(matches!(&error, BundleError::BadPortIndex { port, .. } if port == "\"out\""), "{error:?}");
    let no_direction = bundle(
        &scratch,
        "nodir.lv2",
        &[("manifest.ttl", &TWO_PORTS.replace("INDEX", "1").replace("lv2:OutputPort,", ""))],
    );
    let error = expect_error(&no_direction);
    assert!(matches!(&error, BundleError::BadPort { index: 1, .. }), "{error:?}");
}

#[test]
fn a_syntax_error_names_the_file_and_line() {
    let scratch = Scratch::new("lv2_bundle", "syntax");
    // PREFIXES takes lines 1 to 10 (the first empty), so the broken port is on line 14 of the file.
    let dir = bundle(
        &scratch,
        "syntax.lv2",
        &[
            ("manifest.ttl", "<http://example.org/s> a lv2:Plugin ; lv2:binary <s.so> ; rdfs:seeAlso <s.ttl> ."),
            ("s.ttl", "\n<http://example.org/s>\n  doap:name \"S\" ;\n  lv2:port [ lv2:index 0 lv2:symbol \"x\" ] .\n"),
        ],
    );
    let error = expect_error(&dir);
    let BundleError::Syntax { file, line, .. } = &error else {
        panic!("not a syntax error: {error:?}");
    };
    assert_eq!(*file, dir.join("s.ttl"));
    assert_eq!(*line, 14, "{error}");
    assert!(error.to_string().contains("s.ttl:14:"), "{error}");
}

#[test]
fn a_ui_binary_is_told_from_a_plugin_binary() {
    let scratch = Scratch::new("lv2_bundle", "ui");
    let dir = bundle(
        &scratch,
        "ui.lv2",
        &[(
            "manifest.ttl",
            r#"
            <http://example.org/with-ui> a lv2:Plugin ; lv2:binary <dsp.so> ; ui:ui <http://example.org/with-ui#ui> ;
                lv2:port [ a lv2:InputPort, lv2:ControlPort ; lv2:index 0 ; lv2:symbol "x" ] .
            <http://example.org/other> a lv2:Plugin ; lv2:binary <other.so> .
            <http://example.org/with-ui#ui> a ui:X11UI ; ui:binary <gui.so> .
            "#,
        )],
    );
    for so in ["dsp.so", "gui.so", "other.so"] {
        std::fs::write(dir.join(so), b"not really a library").expect("write a binary");
    }
    let read = read_bundle(&dir).expect("the bundle reads");
    assert_eq!(read.uis.len(), 1);
    assert_eq!(read.uis[0].uri, "http://example.org/with-ui#ui");
    assert_eq!(read.uis[0].binary, dir.join("gui.so"));

    assert!(ui_binary(&dir.join("gui.so")));
    assert!(!ui_binary(&dir.join("dsp.so")));
    let plugins = plugins_of_binary(&dir.join("dsp.so")).expect("the bundle reads");
    assert_eq!(plugins.iter().map(|p| p.uri.as_str()).collect::<Vec<_>>(), ["http://example.org/with-ui"]);
    // The same file through another spelling of its path (compared canonicalised).
    let roundabout = dir.join(".").join("..").join("ui.lv2").join("other.so");
    let plugins = plugins_of_binary(&roundabout).expect("the bundle reads");
    assert_eq!(plugins.iter().map(|p| p.uri.as_str()).collect::<Vec<_>>(), ["http://example.org/other"]);
    assert!(plugins_of_binary(&dir.join("gui.so")).expect("the bundle reads").is_empty());
}

#[test]
fn a_bundle_without_a_manifest_or_a_plugin_without_a_binary_is_refused() {
    let scratch = Scratch::new("lv2_bundle", "refused");
    let empty = scratch.path("empty.lv2");
    std::fs::create_dir_all(&empty).expect("create a directory");
    assert!(matches!(expect_error(&empty), BundleError::MissingManifest { dir } if dir == empty));
    assert!(plugins_of_binary(&empty.join("x.so")).is_err());
    assert!(!ui_binary(&empty.join("x.so")));

    let no_binary = bundle(&scratch, "nobin.lv2", &[("manifest.ttl", "<http://example.org/nb> a lv2:Plugin .")]);
    let error = expect_error(&no_binary);
    assert!(matches!(&error, BundleError::NoBinary { plugin, .. } if plugin == "http://example.org/nb"), "{error:?}");
    let web_binary = bundle(
        &scratch,
        "webbin.lv2",
        &[("manifest.ttl", "<http://example.org/wb> a lv2:Plugin ; lv2:binary <http://example.org/wb.so> .")],
    );
    let error = expect_error(&web_binary);
    assert!(matches!(&error, BundleError::NoBinary { found: Some(_), .. }), "{error:?}");
}

#[test]
fn a_seealso_file_outside_the_bundle_is_refused() {
    let scratch = Scratch::new("lv2_bundle", "outside");
    std::fs::write(scratch.path("elsewhere.ttl"), format!("{PREFIXES}<http://example.org/o> lv2:binary <o.so> ."))
        .expect("write a file outside the bundle");
    let manifest = "<http://example.org/o> a lv2:Plugin ; rdfs:seeAlso <../elsewhere.ttl> .";
    let dir = bundle(&scratch, "out.lv2", &[("manifest.ttl", manifest)]);
    let error = expect_error(&dir);
    assert!(
        matches!(&error, BundleError::OutsideBundle { file, target, .. }
            if *file == dir.join("manifest.ttl") && target.ends_with("/elsewhere.ttl")),
        "{error:?}"
    );

    // The same file reached through a symbolic link inside the bundle.
    let manifest = "<http://example.org/o> a lv2:Plugin ; rdfs:seeAlso <link.ttl> .";
    let linked = bundle(&scratch, "link.lv2", &[("manifest.ttl", manifest)]);
    std::os::unix::fs::symlink(scratch.path("elsewhere.ttl"), linked.join("link.ttl")).expect("make a link");
    let error = expect_error(&linked);
    assert!(matches!(&error, BundleError::OutsideBundle { .. }), "{error:?}");
}

#[test]
fn deeply_nested_blank_nodes_are_an_error_or_data_never_a_crash() {
    let scratch = Scratch::new("lv2_bundle", "nested");
    let depth = 200_000;
    let nested =
        format!("<http://example.org/n> rdfs:comment {} 1 {} .", "[ rdfs:comment ".repeat(depth), "]".repeat(depth));
    let dir = bundle(
        &scratch,
        "nested.lv2",
        &[("manifest.ttl", &format!("<http://example.org/n> a lv2:Plugin ; lv2:binary <n.so> .\n{nested}"))],
    );
    let read = read_bundle(&dir).expect("nesting is valid Turtle");
    assert_eq!(read.plugins.len(), 1);
}

#[test]
fn all_bundles_reads_every_lv2_directory_in_name_order() {
    let scratch = Scratch::new("lv2_bundle", "all");
    let plugin = |uri: &str| format!("<{uri}> a lv2:Plugin ; lv2:binary <x.so> .");
    bundle(&scratch, "b.lv2", &[("manifest.ttl", &plugin("http://example.org/b"))]);
    bundle(&scratch, "a.lv2", &[("manifest.ttl", &plugin("http://example.org/a"))]);
    bundle(&scratch, "not-a-bundle", &[("manifest.ttl", &plugin("http://example.org/no"))]);
    std::fs::write(scratch.path("file.lv2"), b"a file, not a bundle").expect("write a file");
    std::fs::create_dir_all(scratch.path("broken.lv2")).expect("create a directory");
    let missing = scratch.path("no-such-directory");

    let found = all_bundles(&[missing, scratch.path("")]);
    let summary: Vec<Result<Vec<String>, String>> = found
        .into_iter()
        .map(|b| b.map(|b| b.plugins.into_iter().map(|p| p.uri).collect()).map_err(|e| e.to_string()))
        .collect();
    assert_eq!(summary.len(), 3, "{summary:?}");
    assert_eq!(summary[0], Ok(vec!["http://example.org/a".to_string()]));
    assert_eq!(summary[1], Ok(vec!["http://example.org/b".to_string()]));
    assert!(summary[2].as_ref().is_err_and(|e| e.contains("broken.lv2") && e.contains("manifest")), "{summary:?}");
}

/// Run as a child of `search_path_is_lv2_path_when_set` (the environment is the process's, shared by every test
/// thread): prints the search path, one entry a line.
#[test]
fn search_path_child() {
    if std::env::var_os("WARD_LV2_SEARCH_PATH_CHILD").is_none() {
        return;
    }
    for dir in search_path() {
        println!("search-path: {}", dir.display());
    }
}

fn search_path_in_child(lv2_path: Option<&str>) -> Vec<String> {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"));
    child.args(["--exact", "search_path_child", "--nocapture", "--test-threads=1"]);
    child.env("WARD_LV2_SEARCH_PATH_CHILD", "1").env("HOME", "/home/someone");
    match lv2_path {
        Some(value) => child.env("LV2_PATH", value),
        None => child.env_remove("LV2_PATH"),
    };
    let output = child.output().expect("run the test binary");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        // The harness may print its "test ... " on the line of the first entry.
        .filter_map(|l| l.split_once("search-path: "))
        .map(|(_, dir)| dir.to_string())
        .collect()
}

#[test]
fn search_path_is_lv2_path_when_set_and_lilvs_default_otherwise() {
    assert_eq!(search_path_in_child(Some("~/mine::/opt/lv2")), ["/home/someone/mine", "/opt/lv2"]);
    let default = search_path_in_child(None);
    assert_eq!(default.first().map(String::as_str), Some("/home/someone/.lv2"), "{default:?}");
    for dir in ["/usr/lib/lv2", "/usr/local/lib/lv2"] {
        assert!(default.iter().any(|d| d == dir), "{dir} missing from {default:?}");
    }
    assert!(default.iter().any(|d| d.starts_with("/usr/lib/") && d.ends_with("-linux-gnu/lv2")), "{default:?}");
}

// ---- The real bundles Debian ships, against lilv ----

const PACKAGES: [&str; 5] = ["swh-lv2", "mda-lv2", "x42-plugins", "lsp-plugins-lv2", "zam-plugins"];
const SYSTEM_LV2: &str = "/usr/lib/lv2";
/// Plugins compared port by port with `lv2info`, per package (all of a package that has fewer).
const SAMPLE_PER_PACKAGE: usize = 10;

/// Runs one of lilv's tools on the system bundles only, failing clearly when it is not installed.
fn lilv_tool(tool: &str, args: &[&str]) -> String {
    let output = Command::new(tool)
        .args(args)
        .env("LV2_PATH", SYSTEM_LV2)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool} ({e}): scripts/deps must install lilv-utils"));
    assert!(output.status.success(), "{tool} {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap_or_else(|e| panic!("{tool} printed no text: {e}"))
}

/// The bundle directories a Debian package installs.
fn bundles_of_package(package: &str) -> BTreeSet<PathBuf> {
    let output = Command::new("dpkg")
        .args(["-L", package])
        .output()
        .unwrap_or_else(|e| panic!("cannot run dpkg ({e}): these tests need Debian's packages"));
    assert!(
        output.status.success(),
        "{package} is not installed: scripts/deps must install it ({})",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let bundles: BTreeSet<PathBuf> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with(SYSTEM_LV2) && l.ends_with("/manifest.ttl"))
        .filter_map(|l| Path::new(l).parent().map(Path::to_path_buf))
        .collect();
    assert!(!bundles.is_empty(), "{package} installs no LV2 bundle under {SYSTEM_LV2}");
    bundles
}

/// What `lv2info` says about one plugin: its fields, and each port's.
#[derive(Debug, Default)]
struct LilvPlugin {
    fields: BTreeMap<String, Vec<String>>,
    ports: Vec<BTreeMap<String, Vec<String>>>,
}

/// Parses `lv2info`'s output: `Key: value` lines, values continued on the lines after; `Port N:` opens a port.
fn parse_lv2info(text: &str) -> LilvPlugin {
    let mut plugin = LilvPlugin::default();
    let mut last_key: Option<String> = None;
    for line in text.lines().skip(1) {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(number) = trimmed.strip_prefix("Port ").and_then(|r| r.strip_suffix(':')) {
            assert_eq!(number.parse::<usize>().ok(), Some(plugin.ports.len()), "lv2info's ports in order: {line}");
            plugin.ports.push(BTreeMap::new());
            last_key = None;
            continue;
        }
        let fields = plugin.ports.last_mut().unwrap_or(&mut plugin.fields);
        let key_value = trimmed.split_once(':').filter(|(key, _)| {
            key.starts_with(char::is_uppercase) && key.chars().all(|c| c.is_alphabetic() || c == ' ')
        });
        match key_value {
            Some((key, value)) => {
                fields
                    .entry(key.to_string())
                    .or_default()
                    .extend(Some(value.trim().to_string()).filter(|v| !v.is_empty()));
                last_key = Some(key.to_string());
            }
            None => {
                if let Some(key) = &last_key {
                    fields.entry(key.clone()).or_default().push(trimmed.to_string());
                }
            }
        }
    }
    plugin
}

fn set(values: Option<&Vec<String>>) -> BTreeSet<String> {
    values.map(|v| v.iter().cloned().collect()).unwrap_or_default()
}

#[test]
fn debian_bundles_read_as_lilv_reads_them() {
    let listed: BTreeSet<String> = lilv_tool("lv2ls", &[]).lines().map(str::to_string).collect();
    assert!(!listed.is_empty(), "lv2ls lists no plugin in {SYSTEM_LV2}: scripts/deps must install the LV2 packages");

    let mut bundles = BTreeMap::new();
    let mut errors = Vec::new();
    for read in all_bundles(&[PathBuf::from(SYSTEM_LV2)]) {
        match read {
            Ok(bundle) => {
                bundles.insert(bundle.dir.clone(), bundle);
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    assert!(errors.is_empty(), "bundles in {SYSTEM_LV2} that do not read:\n{}", errors.join("\n"));

    let mut read: BTreeMap<&str, &ward_classes::lv2::bundle::PluginInfo> = BTreeMap::new();
    for plugin in bundles.values().flat_map(|b| &b.plugins) {
        read.entry(plugin.uri.as_str()).or_insert(plugin);
    }
    let read_uris: BTreeSet<String> = read.keys().map(|u| u.to_string()).collect();
    assert_eq!(
        listed.difference(&read_uris).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "plugins lv2ls lists that the reader does not find"
    );
    assert_eq!(
        read_uris.difference(&listed).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "plugins the reader finds that lv2ls does not list"
    );

    let mut compared = 0;
    let mut uis_checked = 0;
    for package in PACKAGES {
        let package_bundles = bundles_of_package(package);
        let mut uris: Vec<&str> = Vec::new();
        for dir in &package_bundles {
            let bundle =
                bundles.get(dir).unwrap_or_else(|| panic!("{package}'s bundle {} was not read", dir.display()));
            uris.extend(bundle.plugins.iter().map(|p| p.uri.as_str()));
        }
        uris.sort();
        assert!(!uris.is_empty(), "{package} has no plugin");
        // An even spread over the package's plugins, by URI.
        let step = uris.len().div_ceil(SAMPLE_PER_PACKAGE).max(1);
        for uri in uris.iter().step_by(step) {
            uis_checked += compare_with_lv2info(read[uri]);
            compared += 1;
        }
    }
    assert!(compared >= 40, "only {compared} plugins compared with lv2info");
    assert!(uis_checked > 0, "no UI binary among the plugins compared: lsp-plugins and x42 have UIs");
    eprintln!(
        "{} plugins listed by lv2ls found; {compared} compared port by port with lv2info ({uis_checked} UI binaries)",
        listed.len()
    );
}

/// `lv2info`'s number as the reader's `f32` prints in it (`%f` of the float).
fn lilv_number(value: Option<f32>) -> Vec<String> {
    value.map(|v| format!("{v:.6}")).into_iter().collect()
}

/// Compares one plugin with what `lv2info` prints of it; returns how many of its UIs' binaries were checked.
fn compare_with_lv2info(plugin: &ward_classes::lv2::bundle::PluginInfo) -> usize {
    let uri = &plugin.uri;
    let lilv = parse_lv2info(&lilv_tool("lv2info", &[uri]));
    assert_eq!(plugin.ports.len(), lilv.ports.len(), "{uri}: port count");
    let binary = lilv.fields.get("Binary").and_then(|b| b.first()).map(String::as_str);
    assert_eq!(binary.and_then(|b| b.strip_prefix("file://")), plugin.binary.to_str(), "{uri}: binary");
    assert!(!ui_binary(&plugin.binary), "{uri}: its binary taken for a UI's");
    // The plugin's UIs follow (their "Binary:" lines come after the plugin's own).
    let uis = lilv.fields.get("Binary").map_or(0, |b| b.len().saturating_sub(1));
    for ui in lilv.fields.get("Binary").into_iter().flatten().skip(1) {
        let path = ui.strip_prefix("file://").unwrap_or_else(|| panic!("{uri}: a UI binary {ui} that is no file"));
        assert!(ui_binary(Path::new(path)), "{uri}: {path} is a UI binary to lilv, not to the reader");
    }
    let of_binary = plugins_of_binary(&plugin.binary).unwrap_or_else(|e| panic!("{uri}: {e}"));
    assert!(of_binary.iter().any(|p| p == plugin), "{uri}: not among the plugins of its binary");
    assert_eq!(set(lilv.fields.get("Required Features")), plugin.required_features.iter().cloned().collect(), "{uri}");
    assert_eq!(set(lilv.fields.get("Optional Features")), plugin.optional_features.iter().cloned().collect(), "{uri}");
    assert_eq!(set(lilv.fields.get("Extension Data")), plugin.extension_data.iter().cloned().collect(), "{uri}");

    for (port, lilv_port) in plugin.ports.iter().zip(&lilv.ports) {
        let at = format!("{uri} port {}", port.index);
        assert_eq!(lilv_port.get("Symbol"), Some(&vec![port.symbol.clone()]), "{at}: symbol");
        let types = set(lilv_port.get("Type"));
        let direction = match port.direction {
            Direction::Input => "http://lv2plug.in/ns/lv2core#InputPort",
            Direction::Output => "http://lv2plug.in/ns/lv2core#OutputPort",
        };
        assert!(types.contains(direction), "{at}: {:?} but lilv says {types:?}", port.direction);
        let kind = match &port.kind {
            PortKind::Audio => "http://lv2plug.in/ns/lv2core#AudioPort",
            PortKind::Control => "http://lv2plug.in/ns/lv2core#ControlPort",
            PortKind::Cv => "http://lv2plug.in/ns/lv2core#CVPort",
            PortKind::Atom { .. } => "http://lv2plug.in/ns/ext/atom#AtomPort",
            PortKind::Other(class) => class.as_str(),
        };
        assert!(types.contains(kind), "{at}: {:?} but lilv says {types:?}", port.kind);
        assert_eq!(lilv_port.get("Minimum").cloned().unwrap_or_default(), lilv_number(port.minimum), "{at}: minimum");
        assert_eq!(lilv_port.get("Maximum").cloned().unwrap_or_default(), lilv_number(port.maximum), "{at}: maximum");
        assert_eq!(lilv_port.get("Default").cloned().unwrap_or_default(), lilv_number(port.default), "{at}: default");
    }
    uis
}
