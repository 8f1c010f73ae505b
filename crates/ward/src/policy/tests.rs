//! Unit tests of the policy: the file format, its messages, and the effective policies it gives.

use std::path::Path;

use super::file::{line_column, FileSection};
use super::*;

/// The example of the module documentation.
const EXAMPLE: &str = r#"
[defaults]                 # any extension field
isolation = "process"      # none | process | mpk | auto
deadline_ms = 10000
heartbeat_ms = 1000        # 0 = off
max_restarts = 10
restart_period_s = 60      # integer or float
backoff_initial_ms = 1     # integer or float
backoff_max_ms = 1000
backoff_factor = 2.0
on_fault = "retry"         # retry | fail
max_retries = 1
on_limit = "disable"       # disable | fail
zygote = true
wait = "adaptive"          # adaptive | poll | sleep
spin = 2000
init = "well_init"
[defaults.limits]
address_space_mb = 1024    # 0 = unlimited
cpu_s = 0
open_files = 256

[extension.faulty]
group = "demo"
deadline_ms = 500
[extension.faulty.limits]
open_files = 64
[extension.faulty.function.faulty_counter_add]
state = true
retryable = true
deadline_ms = 100
destroys = false

[group.demo]
zygote = false
"#;

fn parse(text: &str) -> Policy {
    match Policy::from_toml_str(text, "test.toml") {
        Ok(policy) => policy,
        Err(e) => panic!("policy refused: {e}"),
    }
}

/// The line, column and reason of an `Invalid` error.
fn refused(text: &str) -> (usize, usize, String) {
    match Policy::from_toml_str(text, "test.toml") {
        Err(PolicyError::Invalid { origin, line, column, reason }) => {
            assert_eq!(origin, "test.toml");
            (line, column, reason)
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn read_past_input_kb_is_set_per_extension_or_group_and_bounded() {
    assert_eq!(ExtensionPolicy::default().read_past_input_kb, 16);
    let policy = parse(
        "[defaults]\nread_past_input_kb = 4\n[extension.a]\nread_past_input_kb = 0\n[group.g]\nread_past_input_kb = 1024\n",
    );
    assert_eq!(policy.for_extension("a").read_past_input_kb, 0);
    assert_eq!(policy.for_extension("b").read_past_input_kb, 4);
    assert_eq!(policy.for_group("g").read_past_input_kb, 1024);
    for bad in ["1025", "-1", "4.5", "\"4\""] {
        let (line, _, reason) = refused(&format!("[defaults]\nread_past_input_kb = {bad}\n"));
        assert_eq!(line, 2, "{bad}");
        assert!(reason.contains("read_past_input_kb") && reason.contains("0 to 1024"), "{bad}: {reason}");
    }
}

#[test]
fn empty_text_gives_built_in_defaults() {
    let policy = parse("");
    assert_eq!(policy, Policy::default());
    let p = policy.for_extension("anything");
    assert_eq!(p, ExtensionPolicy::default());
    assert_eq!(p.isolation, Isolation::Process);
    assert_eq!(p.group, None);
    assert_eq!(p.deadline, Duration::from_secs(10));
    assert!(p.deadline_learned);
    assert_eq!(p.deadline_floor, Duration::from_millis(200));
    assert_eq!(p.deadline_ceiling, Duration::from_secs(10));
    assert_eq!(p.max_failures_in_row, 3);
    assert_eq!(p.when_disabled, None);
    assert_eq!(p.heartbeat, None);
    assert_eq!(p.max_restarts, 10);
    assert_eq!(p.restart_period, Duration::from_secs(60));
    assert_eq!(p.backoff_initial, Duration::from_millis(1));
    assert_eq!(p.backoff_max, Duration::from_secs(1));
    assert_eq!(p.backoff_factor, 2.0);
    assert_eq!(p.on_fault, OnFault::Retry);
    assert_eq!(p.max_retries, 1);
    assert_eq!(p.on_limit, OnLimit::Disable);
    assert!(p.zygote);
    assert_eq!(p.wait, WaitMode::Adaptive);
    assert_eq!(p.spin, 2000);
    assert_eq!(p.init, None);
    assert_eq!((p.history_mb, p.history_replay), (16, Duration::from_secs(1)), "history is on by default");
    assert_eq!(p.limits, Limits { address_space_mb: 1024, cpu_s: 0, open_files: 256, ..Limits::default() });
    assert!(p.functions.is_empty());
}

#[test]
fn history_replay_ms_is_a_duration_that_may_be_zero() {
    let p = parse("[extension.a]\nhistory_replay_ms = 250.5\nhistory_mb = 8\n").for_extension("a");
    assert_eq!((p.history_mb, p.history_replay), (8, Duration::from_micros(250_500)));
    assert_eq!(parse("[defaults]\nhistory_replay_ms = 0\n").for_extension("a").history_replay, Duration::ZERO);
    let err = Policy::from_toml_str("[defaults]\nhistory_replay_ms = -1\n", "p").unwrap_err().to_string();
    assert!(err.contains("history_replay_ms"), "{err}");
}

#[test]
fn full_example_parses_to_expected_values() {
    let policy = parse(EXAMPLE);
    let d = &policy.defaults;
    assert_eq!(d.isolation, Some(Isolation::Process));
    assert_eq!(d.deadline, Some(Duration::from_millis(10_000)));
    assert_eq!(d.heartbeat, Some(Some(Duration::from_millis(1000))));
    assert_eq!(d.max_restarts, Some(10));
    assert_eq!(d.restart_period, Some(Duration::from_secs(60)));
    assert_eq!(d.backoff_initial, Some(Duration::from_millis(1)));
    assert_eq!(d.backoff_max, Some(Duration::from_millis(1000)));
    assert_eq!(d.backoff_factor, Some(2.0));
    assert_eq!(d.on_fault, Some(OnFault::Retry));
    assert_eq!(d.max_retries, Some(1));
    assert_eq!(d.on_limit, Some(OnLimit::Disable));
    assert_eq!(d.zygote, Some(true));
    assert_eq!(d.wait, Some(WaitMode::Adaptive));
    assert_eq!(d.spin, Some(2000));
    assert_eq!(d.init.as_deref(), Some("well_init"));
    assert_eq!(
        d.limits,
        LimitsOverride {
            address_space_mb: Some(1024),
            cpu_s: Some(0),
            open_files: Some(256),
            ..LimitsOverride::default()
        }
    );

    let faulty = policy.for_extension("faulty");
    assert_eq!(faulty.group.as_deref(), Some("demo"));
    assert_eq!(faulty.deadline, Duration::from_millis(500));
    assert_eq!(faulty.heartbeat, Some(Duration::from_secs(1)));
    assert_eq!(faulty.init.as_deref(), Some("well_init"));
    assert_eq!(faulty.limits.open_files, 64);
    assert_eq!(faulty.limits.address_space_mb, 1024);
    assert_eq!(
        faulty.function("faulty_counter_add"),
        FunctionPolicy {
            state: true,
            retryable: true,
            deadline: Some(Duration::from_millis(100)),
            destroys: false,
            replaces_same: None,
            history: false,
            first_deadline: None,
        }
    );
    assert!(!policy.for_group("demo").zygote);
    assert_eq!(policy.groups.len(), 1);
    assert_eq!(policy.extensions.len(), 1);
}

#[test]
fn deadline_ms_fixes_deadlines_and_the_learning_keys_are_read() {
    let policy = parse(
        "[defaults]\ndeadline_floor_ms = 50\ndeadline_ceiling_ms = 4000.5\nmax_failures_in_row = 0\n\
         [extension.fixed]\ndeadline_ms = 300\n[group.g]\nmax_failures_in_row = 5\n",
    );
    let learned = policy.for_extension("learned");
    assert!(learned.deadline_learned);
    assert_eq!(learned.deadline_floor, Duration::from_millis(50));
    assert_eq!(learned.deadline_ceiling, Duration::from_micros(4_000_500));
    assert_eq!(learned.max_failures_in_row, 0);
    let fixed = policy.for_extension("fixed");
    assert!(!fixed.deadline_learned);
    assert_eq!(fixed.deadline, Duration::from_millis(300));
    assert_eq!(policy.for_group("g").max_failures_in_row, 5);
    assert!(policy.for_group("g").deadline_learned);
    assert!(!parse("[defaults]\ndeadline_ms = 10000\n").for_extension("x").deadline_learned);
}

#[test]
fn bad_learning_values_are_refused_with_their_line() {
    let (line, _, reason) = refused("[defaults]\n\ndeadline_floor_ms = 0\n");
    assert_eq!(line, 3);
    assert_eq!(reason, "deadline_floor_ms must be a positive number of milliseconds, got 0");
    let (line, _, reason) = refused("[group.g]\ndeadline_ceiling_ms = -1\n");
    assert_eq!(line, 2);
    assert!(reason.starts_with("deadline_ceiling_ms must be a positive"), "{reason}");
    let (line, _, reason) = refused("[extension.e]\nmax_failures_in_row = 1.5\n");
    assert_eq!(line, 2);
    assert!(reason.starts_with("max_failures_in_row must be a whole number"), "{reason}");
    let (_, _, reason) = refused("[extension.e]\nmax_failures_in_a_row = 2\n");
    assert!(reason.ends_with("did you mean `max_failures_in_row`?"), "{reason}");
}

#[test]
fn extension_overrides_defaults() {
    let policy = parse(
        r#"
[defaults]
isolation = "mpk"
deadline_ms = 2000
max_retries = 3
escalate_after = 5
[defaults.limits]
cpu_s = 5
open_files = 100

[extension.a]
isolation = "none"
on_fault = "fail"
heartbeat_ms = 0
escalate_after = 0
[extension.a.limits]
open_files = 10
"#,
    );
    let a = policy.for_extension("a");
    assert_eq!(a.isolation, Isolation::None);
    assert_eq!(a.on_fault, OnFault::Fail);
    assert_eq!(a.heartbeat, None);
    assert_eq!(a.deadline, Duration::from_secs(2));
    assert_eq!(a.max_retries, 3);
    assert_eq!(a.escalate_after, 0);
    assert_eq!(policy.for_extension("b").escalate_after, 5);
    assert_eq!(ExtensionPolicy::default().escalate_after, 3);
    assert_eq!(a.limits.cpu_s, 5);
    assert_eq!(a.limits.open_files, 10);
    assert_eq!(a.limits.address_space_mb, 1024);

    let b = policy.for_extension("b");
    assert_eq!(b.isolation, Isolation::Mpk);
    assert_eq!(b.on_fault, OnFault::Retry);
    assert_eq!(b.limits.open_files, 100);
}

#[test]
fn function_policy_lookup_and_default_function_policy() {
    let policy = parse(
        r#"
[defaults.function.shared_close]
destroys = true
retryable = false

[extension.e]
deadline_ms = 300
[extension.e.function.e_open]
state = true
[extension.e.function.e_slow]
deadline_ms = 2500.5
[extension.e.function.shared_close]
retryable = true
"#,
    );
    let e = policy.for_extension("e");
    let open = e.function("e_open");
    assert!(open.state);
    assert!(open.retryable);
    assert_eq!(open.deadline, None);
    assert!(!open.destroys);
    assert_eq!(e.deadline_for("e_open"), Duration::from_millis(300));
    assert_eq!(e.deadline_for("e_slow"), Duration::from_micros(2_500_500));
    let close = e.function("shared_close");
    assert!(close.destroys && close.retryable && !close.state);

    let unknown = e.function("not_listed");
    assert_eq!(unknown, FunctionPolicy::default());
    assert_eq!(unknown, FunctionPolicy::default());
    assert_eq!(e.deadline_for("not_listed"), Duration::from_millis(300));
}

#[test]
fn group_policy_applies_defaults_then_group_section() {
    let policy = parse(
        r#"
[defaults]
max_restarts = 4
wait = "poll"
on_fault = "fail"

[extension.x]
group = "g1"
zygote = false

[group.g1]
isolation = "auto"
restart_period_s = 2.5
wait = "sleep"
heartbeat_ms = 250
[group.g1.limits]
address_space_mb = 0
"#,
    );
    let g = policy.for_group("g1");
    assert_eq!(g.group.as_deref(), Some("g1"));
    assert_eq!(g.isolation, Isolation::Auto);
    assert_eq!(g.restart_period, Duration::from_millis(2500));
    assert_eq!(g.wait, WaitMode::Sleep);
    assert_eq!(g.heartbeat, Some(Duration::from_millis(250)));
    assert_eq!(g.limits.address_space_mb, 0);
    assert_eq!(g.max_restarts, 4);
    assert_eq!(g.on_fault, OnFault::Fail);
    // Extension sections do not leak into the group's domain policy.
    assert!(g.zygote);

    let other = policy.for_group("g2");
    assert_eq!(other.group.as_deref(), Some("g2"));
    assert_eq!(other.wait, WaitMode::Poll);
}

#[test]
fn group_section_refuses_extension_only_fields() {
    let (line, _, reason) = refused("[group.g]\nzygote = true\non_fault = \"fail\"\n");
    assert_eq!(line, 3);
    assert!(reason.starts_with("unknown field `on_fault`"), "{reason}");
    assert!(reason.ends_with("put it in [extension.NAME] or [defaults]"), "{reason}");
}

#[test]
fn backoff_sequence_and_cap() {
    let p = ExtensionPolicy::default();
    let ms = Duration::from_millis;
    assert_eq!(p.backoff(0), Duration::ZERO);
    assert_eq!(p.backoff(1), Duration::ZERO);
    assert_eq!(p.backoff(2), ms(1));
    assert_eq!(p.backoff(3), ms(2));
    assert_eq!(p.backoff(4), ms(4));
    assert_eq!(p.backoff(11), ms(512));
    assert_eq!(p.backoff(12), ms(1000));
    assert_eq!(p.backoff(13), ms(1000));
    assert_eq!(p.backoff(u32::MAX), ms(1000));

    let constant = ExtensionPolicy { backoff_factor: 1.0, backoff_initial: ms(7), ..ExtensionPolicy::default() };
    assert_eq!(constant.backoff(2), ms(7));
    assert_eq!(constant.backoff(1000), ms(7));

    let above_cap = ExtensionPolicy { backoff_initial: ms(5000), ..ExtensionPolicy::default() };
    assert_eq!(above_cap.backoff(2), ms(1000));

    let triple = ExtensionPolicy {
        backoff_factor: 3.0,
        backoff_initial: ms(10),
        backoff_max: ms(100),
        ..ExtensionPolicy::default()
    };
    let seq: Vec<_> = (1..=6).map(|n| triple.backoff(n)).collect();
    assert_eq!(seq, [ms(0), ms(10), ms(30), ms(90), ms(100), ms(100)]);
}

#[test]
fn unknown_key_at_top_level_gives_its_line() {
    let (line, column, reason) = refused("\n[defaults]\nspin = 1\n\n[defualts]\n");
    assert_eq!((line, column), (5, 2));
    assert!(reason.starts_with("unknown field `defualts`"), "{reason}");
    assert!(reason.contains("did you mean `defaults`?"), "{reason}");
}

#[test]
fn unknown_key_in_extension_gives_its_line() {
    let (line, column, reason) = refused("[extension.faulty]\ngroup = \"demo\"\n  dedline_ms = 500\n");
    assert_eq!((line, column), (3, 3));
    assert!(reason.starts_with("unknown field `dedline_ms`, expected one of"), "{reason}");
    assert!(reason.contains("`deadline_ms`"), "{reason}");
    assert!(reason.ends_with("did you mean `deadline_ms`?"), "{reason}");
}

#[test]
fn unknown_key_in_limits_gives_its_line() {
    let (line, _, reason) = refused("[extension.e]\n[extension.e.limits]\nopen_files = 3\nopen_file = 4\n");
    assert_eq!(line, 4);
    assert!(reason.starts_with("unknown field `open_file`"), "{reason}");
    let (line, _, _) = refused("[defaults.limits]\n\nstack_mb = 8\n");
    assert_eq!(line, 3);
}

#[test]
fn unknown_key_in_function_section_gives_its_line() {
    let (line, _, reason) =
        refused("[extension.e]\ndeadline_ms = 5\n[extension.e.function.f]\nstate = true\nidempotent = true\n");
    assert_eq!(line, 5);
    assert!(reason.starts_with("unknown field `idempotent`"), "{reason}");
    assert!(reason.contains("`retryable`"), "{reason}");
}

#[test]
fn bad_isolation_string_lists_valid_values() {
    let (line, column, reason) = refused("[defaults]\nisolation = \"vm\"\n");
    assert_eq!((line, column), (2, 13));
    assert_eq!(reason, r#"isolation must be one of "none", "process", "mpk", "auto", got "vm""#);
    let err = "vm".parse::<Isolation>().unwrap_err();
    for valid in ["none", "process", "mpk", "auto"] {
        assert!(err.to_string().contains(valid), "{err}");
    }
}

#[test]
fn deadline_ms_zero_refused_with_its_line() {
    let (line, _, reason) = refused("[extension.e]\ngroup = \"g\"\ndeadline_ms = 0\n");
    assert_eq!(line, 3);
    assert_eq!(reason, "deadline_ms must be a positive number of milliseconds, got 0");
    let (line, _, reason) = refused("[extension.e.function.f]\n\ndeadline_ms = 0.0\n");
    assert_eq!(line, 3);
    assert!(reason.starts_with("deadline_ms must be a positive"), "{reason}");
}

#[test]
fn wrong_type_refused() {
    let (line, _, reason) = refused("[defaults]\ndeadline_ms = \"10s\"\n");
    assert_eq!(line, 2);
    assert_eq!(reason, "deadline_ms must be a positive number of milliseconds, got \"10s\"");
    let (line, _, reason) = refused("[defaults]\nspin = 1\nzygote = \"yes\"\n");
    assert_eq!(line, 3);
    assert_eq!(reason, "zygote must be true or false, got \"yes\"");
    let (_, _, reason) = refused("[defaults]\nmax_restarts = 10.0\n");
    assert!(reason.ends_with("got 10.0"), "{reason}");
    let (_, _, reason) = refused("[defaults]\nwait = [1]\n");
    assert!(reason.ends_with("got an array"), "{reason}");
    let (_, _, reason) = refused("[defaults]\non_limit = 1979-05-27\n");
    assert!(reason.ends_with("got a date-time"), "{reason}");
    let (line, _, reason) = refused("[defaults]\nlimits = 3\n");
    assert_eq!(line, 2);
    assert!(reason.contains("resource limits"), "{reason}");
}

#[test]
fn bad_values_refused() {
    let cases = [
        ("heartbeat_ms = -1", "heartbeat_ms must be a non-negative"),
        ("restart_period_s = nan", "restart_period_s must be a positive"),
        ("restart_period_s = 0", "restart_period_s must be a positive"),
        ("backoff_initial_ms = -0.5", "backoff_initial_ms must be"),
        ("backoff_max_ms = inf", "backoff_max_ms must be"),
        ("deadline_ms = 1e300", "of at most"),
        ("backoff_factor = 0.5", "backoff_factor must be a number of at least 1.0"),
        ("max_retries = 101", "max_retries must be a whole number from 0 to 100"),
        ("escalate_after = -1", "escalate_after must be a whole number of faults from 0 (never) to 1000000"),
        ("max_restarts = -1", "max_restarts must be a whole number"),
        ("spin = 10000001", "spin must be a whole number from 0 to 10000000"),
        ("group = \"\"", "group must be non-empty"),
        ("group = \"a/b\"", "group must be non-empty"),
        ("init = \"9lives\"", "init must be a C function name"),
        ("on_fault = \"ignore\"", r#"one of "retry", "fail""#),
        ("limits.open_files = 0", "open_files must be a whole number of at least 1"),
        ("limits.cpu_s = -3", "cpu_s must be"),
    ];
    for (line, expected) in cases {
        let (n, _, reason) = refused(&format!("[defaults]\n{line}\n"));
        assert_eq!(n, 2, "{line}");
        assert!(reason.contains(expected), "{line}: {reason}");
    }
}

#[test]
fn bad_section_names_refused_at_the_name() {
    let (line, column, reason) = refused("[extension.ok]\n[extension.\"bad name\"]\n");
    assert_eq!((line, column), (2, 12));
    assert!(reason.starts_with("extension name must be"), "{reason}");
    let (line, _, reason) = refused("\n[group.\"\"]\n");
    assert_eq!(line, 2);
    assert!(reason.starts_with("group name must be"), "{reason}");
    let (line, _, reason) = refused("[extension.e.function.\"a-b\"]\n");
    assert_eq!(line, 1);
    assert!(reason.starts_with("function name must be"), "{reason}");
    // Dots and dashes are fine in extension and group names.
    let policy = parse("[extension.\"my-ext.v2\"]\n[group.g-1]\n");
    assert!(policy.extensions.contains_key("my-ext.v2"));
    assert!(policy.groups.contains_key("g-1"));
}

#[test]
fn float_and_integer_durations() {
    let policy = parse("[defaults]\nrestart_period_s = 1.5\nbackoff_initial_ms = 0.25\nbackoff_max_ms = 0\n");
    let p = policy.for_extension("x");
    assert_eq!(p.restart_period, Duration::from_millis(1500));
    assert_eq!(p.backoff_initial, Duration::from_micros(250));
    assert_eq!(p.backoff_max, Duration::ZERO);
    assert_eq!(p.backoff(5), Duration::ZERO);
}

#[test]
fn syntax_error_gives_its_line() {
    let (line, _, reason) = refused("[defaults]\nspin = \n");
    assert_eq!(line, 2);
    assert!(!reason.contains('\n') && !reason.is_empty(), "{reason}");
    let (line, _, reason) = refused("[defaults]\n\n[defaults]\n");
    assert_eq!(line, 3);
    assert!(reason.contains("duplicate key `defaults`"), "{reason}");
    let (_, _, reason) = refused("extension = 3\n");
    assert!(reason.ends_with("expected a table"), "{reason}");
}

#[test]
fn from_file_missing_path_names_the_path() {
    let path = std::env::temp_dir().join("ward-policy-test-does-not-exist/policy.toml");
    let err = Policy::from_file(&path).unwrap_err();
    assert!(matches!(&err, PolicyError::Read { path: p, .. } if *p == path));
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
}

#[test]
fn from_file_reads_and_names_origin() {
    let dir = std::env::temp_dir().join(format!("ward-policy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, EXAMPLE).unwrap();
    assert_eq!(Policy::from_file(&good).unwrap(), parse(EXAMPLE));
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[defaults]\nspin = -1\n").unwrap();
    let message = Policy::from_file(&bad).unwrap_err().to_string();
    assert!(message.starts_with(&format!("{}:2:", bad.display())), "{message}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn display_of_invalid_starts_with_origin_line_column() {
    let err = Policy::from_toml_str("[defaults]\ndeadline_ms = 0\n", "ward.toml").unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("ward.toml:2:15: "), "{text}");
    assert_eq!(text, "ward.toml:2:15: deadline_ms must be a positive number of milliseconds, got 0");
    let err = PolicyError::Invalid { origin: "o".into(), line: 0, column: 0, reason: "r".into() };
    assert_eq!(err.to_string(), "o:0:0: r");
}

#[test]
fn builder_overrides() {
    let mut policy = Policy::default();
    policy.set_default_isolation(Isolation::None);
    policy.extension_mut("a").deadline = Some(Duration::from_millis(20));
    policy
        .extension_mut("a")
        .functions
        .insert("a_open".into(), FunctionOverride { state: Some(true), ..FunctionOverride::default() });
    policy.group_mut("g").zygote = Some(false);
    let a = policy.for_extension("a");
    assert_eq!(a.isolation, Isolation::None);
    assert_eq!(a.deadline, Duration::from_millis(20));
    assert!(a.function("a_open").state);
    assert_eq!(policy.for_extension("b").deadline, Duration::from_secs(10));
    assert!(!policy.for_group("g").zygote);
    assert_eq!(policy.extensions.len(), 1);
}

#[test]
fn keywords_round_trip() {
    for iso in Isolation::ALL {
        assert_eq!(iso.as_str().parse::<Isolation>(), Ok(*iso));
        assert_eq!(iso.to_string(), iso.as_str());
    }
    for w in WaitMode::ALL {
        assert_eq!(w.as_str().parse::<WaitMode>(), Ok(*w));
    }
    for f in OnFault::ALL {
        assert_eq!(f.as_str().parse::<OnFault>(), Ok(*f));
    }
    for l in OnLimit::ALL {
        assert_eq!(l.as_str().parse::<OnLimit>(), Ok(*l));
    }
    assert!("Process".parse::<Isolation>().is_err());
}

#[test]
fn native_fallback_defaults_to_true_and_is_set_per_extension() {
    assert!(Policy::default().for_extension("x").native_fallback);
    let policy = parse("[defaults]\nnative_fallback = false\n[extension.trusted]\nnative_fallback = true\n");
    assert!(!policy.for_extension("x").native_fallback);
    assert!(policy.for_extension("trusted").native_fallback);
    let (line, _, reason) = refused("[defaults]\nnative_fallback = \"no\"\n");
    assert_eq!(line, 2);
    assert!(reason.contains("native_fallback must be true or false"), "{reason}");
    // Per extension: a group's domain has no say in it.
    let (_, _, reason) = refused("[group.g]\nnative_fallback = false\n");
    assert!(reason.contains("`native_fallback` is set per extension"), "{reason}");
}

#[test]
fn describe_cache_defaults_to_true_and_is_set_per_extension() {
    assert!(Policy::default().for_extension("x").describe_cache);
    let policy = parse("[defaults]\ndescribe_cache = false\n[extension.cached]\ndescribe_cache = true\n");
    assert!(!policy.for_extension("x").describe_cache);
    assert!(policy.for_extension("cached").describe_cache);
    let (_, _, reason) = refused("[defaults]\ndescribe_cache = 0\n");
    assert!(reason.contains("describe_cache must be true or false"), "{reason}");
    let (_, _, reason) = refused("[group.g]\ndescribe_cache = false\n");
    assert!(reason.contains("`describe_cache` is set per extension"), "{reason}");
}

#[test]
fn an_address_space_too_small_for_any_domain_is_refused() {
    for mb in [1, 15] {
        let (_, _, reason) = refused(&format!("[defaults.limits]\naddress_space_mb = {mb}\n"));
        assert!(reason.contains("less cannot hold a domain"), "{reason}");
    }
    for mb in [0, MIN_ADDRESS_SPACE_MB, 4096] {
        let policy = parse(&format!("[defaults.limits]\naddress_space_mb = {mb}\n"));
        assert_eq!(policy.for_extension("x").limits.address_space_mb, mb);
    }
}

#[test]
fn cgroup_limits_and_the_idle_cpu_budget_are_checked_and_inherited() {
    let defaults = Limits::default();
    assert_eq!((defaults.memory_mb, defaults.pids, defaults.cpu_percent, defaults.idle_cpu_ms), (1024, 128, 0, 100));
    for (key, bad, says) in [
        ("memory_mb", 8, "less cannot hold a domain"),
        ("pids", 3, "at least 8"),
        ("cpu_percent", 100_001, "at most 100000"),
        ("idle_cpu_ms", 1001, "at most 1000"),
    ] {
        let (line, _, reason) = refused(&format!("[defaults.limits]\n{key} = {bad}\n"));
        assert_eq!(line, 2);
        assert!(reason.contains(key) && reason.contains(says), "{reason}");
    }
    let policy = parse(
        "[defaults.limits]\nmemory_mb = 0\npids = 16\n[extension.x.limits]\ncpu_percent = 50\nidle_cpu_ms = 0\n\
         [group.g.limits]\nmemory_mb = 64\n",
    );
    let x = policy.for_extension("x").limits;
    assert_eq!((x.memory_mb, x.pids, x.cpu_percent, x.idle_cpu_ms), (0, 16, 50, 0));
    let y = policy.for_extension("y").limits;
    assert_eq!((y.memory_mb, y.pids, y.cpu_percent, y.idle_cpu_ms), (0, 16, 0, 100));
    assert_eq!(policy.for_group("g").limits.memory_mb, 64);
}

#[test]
fn from_file_refuses_devices_fifos_and_huge_files_unread() {
    let err = Policy::from_file(Path::new("/dev/zero")).unwrap_err();
    assert!(matches!(&err, PolicyError::NotAFile { .. }), "{err}");
    assert!(err.to_string().contains("/dev/zero"), "{err}");
    let dir = std::env::temp_dir().join(format!("ward-policy-special-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A FIFO nobody writes to: opening it to read would block for ever.
    let fifo = dir.join("fifo.toml");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("run mkfifo");
    assert!(made.success(), "mkfifo {}", fifo.display());
    assert!(matches!(Policy::from_file(&fifo), Err(PolicyError::NotAFile { .. })));
    // A sparse file of 8 GiB: refused by its size, not read.
    let big = dir.join("big.toml");
    std::fs::File::create(&big).unwrap().set_len(8 << 30).unwrap();
    let err = Policy::from_file(&big).unwrap_err();
    assert!(matches!(&err, PolicyError::TooLarge { len, .. } if *len == 8 << 30), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn line_column_counts_characters() {
    assert_eq!(line_column("", 0), (1, 1));
    assert_eq!(line_column("ab\ncd", 4), (2, 2));
    assert_eq!(line_column("é = 1\nx", 2), (1, 2));
    assert_eq!(line_column("é = 1\nx", 1), (1, 1));
    assert_eq!(line_column("ab", 99), (1, 3));
}

/// Every key of the file reaches its field of the effective policy: each is set here to a value other than its
/// default, and the policy read is the one written out by hand.
#[test]
fn every_key_reaches_the_effective_policy() {
    let text = r#"
[defaults]
wait = "poll"
[extension.e]
isolation = "mpk"
group = "g"
deadline_floor_ms = 20
deadline_ceiling_ms = 3000
max_failures_in_row = 7
heartbeat_ms = 50
max_restarts = 4
restart_period_s = 5
backoff_initial_ms = 2
backoff_max_ms = 30
backoff_factor = 1.5
on_fault = "fail"
max_retries = 2
escalate_after = 9
on_limit = "fail"
zygote = false
spin = 7
init = "e_init"
check_output = false
poison = true
history_mb = 3
read_past_input_kb = 8
history_replay_ms = 250
checkpoint_ms = 125
library_fault = "leak"
restart_from = "/lib/e2.so"
native_fallback = false
describe_cache = false
[extension.e.limits]
address_space_mb = 512
cpu_s = 9
open_files = 32
memory_mb = 128
pids = 16
cpu_percent = 50
idle_cpu_ms = 20
[extension.e.sandbox]
seccomp = false
landlock = false
pid_namespace = false
network = true
exec = true
fork = true
writable = ["/var/e"]
reason = " every protection off, for a test "
[extension.e.function.e_run]
state = true
retryable = false
deadline_ms = 40
destroys = true
history = true
"#;
    // Every key is set above (but deadline_ms, below): a key added to the list without a line here fails.
    let keys = ExtensionOverride::KEYS.len()
        + LimitsOverride::KEYS.len()
        + SandboxOverride::KEYS.len()
        + FunctionOverride::KEYS.len();
    let tables = ["limits", "sandbox", "function"].len();
    let set = text.lines().filter(|line| line.contains(" = ")).count();
    assert_eq!(set + 1, keys - tables, "a key of keys.rs is not set in this test");
    let policy = parse(text);
    let ms = Duration::from_millis;
    let expected = ExtensionPolicy {
        isolation: Isolation::Mpk,
        group: Some("g".into()),
        deadline_floor: ms(20),
        deadline_ceiling: ms(3000),
        max_failures_in_row: 7,
        heartbeat: Some(ms(50)),
        max_restarts: 4,
        restart_period: Duration::from_secs(5),
        backoff_initial: ms(2),
        backoff_max: ms(30),
        backoff_factor: 1.5,
        on_fault: OnFault::Fail,
        max_retries: 2,
        escalate_after: 9,
        on_limit: OnLimit::Fail,
        zygote: false,
        wait: WaitMode::Poll,
        spin: 7,
        init: Some("e_init".into()),
        check_output: false,
        poison: true,
        history_mb: 3,
        read_past_input_kb: 8,
        history_replay: ms(250),
        checkpoint: ms(125),
        library_fault: Some("leak".parse().expect("a library fault")),
        restart_from: Some("/lib/e2.so".into()),
        native_fallback: false,
        describe_cache: false,
        limits: Limits {
            address_space_mb: 512,
            cpu_s: 9,
            open_files: 32,
            memory_mb: 128,
            pids: 16,
            cpu_percent: 50,
            idle_cpu_ms: 20,
        },
        sandbox: SandboxPolicy {
            seccomp: false,
            landlock: false,
            pid_namespace: false,
            network: true,
            exec: true,
            fork: true,
            writable: vec!["/var/e".into()],
            reason: Some("every protection off, for a test".into()),
        },
        functions: [(
            "e_run".to_string(),
            FunctionPolicy {
                state: true,
                retryable: false,
                deadline: Some(ms(40)),
                destroys: true,
                history: true,
                ..FunctionPolicy::default()
            },
        )]
        .into(),
        ..ExtensionPolicy::default()
    };
    assert_eq!(policy.for_extension("e"), expected);
    // deadline_ms, the one key left: it fixes the deadlines.
    let fixed = parse("[extension.e]\ndeadline_ms = 70\n").for_extension("e");
    assert_eq!((fixed.deadline, fixed.deadline_learned), (ms(70), false));
}

#[test]
fn a_group_section_names_the_section_for_every_key_it_does_not_take() {
    for key in ["escalate_after = 1", "history_mb = 1", "history_replay_ms = 1", "max_retries = 1"] {
        let (line, _, reason) = refused(&format!("[group.g]\n{key}\n"));
        assert_eq!(line, 2, "{key}");
        assert!(reason.ends_with("is set per extension: put it in [extension.NAME] or [defaults]"), "{reason}");
    }
    let (_, _, reason) = refused("[group.g]\nrestart_from = \"x.so\"\n");
    assert!(reason.ends_with("`restart_from` is set per extension: put it in [extension.NAME]"), "{reason}");
}

#[test]
fn restart_from_in_defaults_is_refused_at_its_key() {
    // A comment that names the key comes first: the message points at the key, not at the comment.
    let (line, column, reason) = refused("# restart_from is per extension\n[defaults]\n  restart_from = \"x.so\"\n");
    assert_eq!((line, column), (3, 3));
    assert_eq!(reason, "restart_from is set per extension: put it in [extension.NAME], not [defaults]");
}

#[test]
fn sandbox_values_are_refused_in_the_policys_words_at_their_line() {
    let (line, _, reason) = refused("[extension.e.sandbox]\nreason = \"r\"\nnetwork = \"yes\"\n");
    assert_eq!(line, 3);
    assert_eq!(reason, "network must be true or false, got \"yes\"");
    let (line, _, reason) = refused("[extension.e.sandbox]\nreason = \"r\"\nwritable = [\"/a\", \"b\"]\n");
    assert_eq!(line, 3);
    assert_eq!(reason, "writable path `b` is not absolute");
    let (line, _, reason) = refused("[extension.e.sandbox]\nnetwork = true\n");
    assert_eq!(line, 1);
    assert_eq!(reason, "this sandbox section loosens the sandbox: say why in `reason = \"...\"`");
}
