//! lrec's command line: help, argument checks and the errors users meet first. None of
//! these load BPF, so they run without root.

use assert_cmd::Command;

fn lrec() -> Command {
    Command::cargo_bin("lrec").unwrap()
}

fn stderr_of(cmd: &mut Command) -> String {
    let out = cmd.assert().failure().get_output().clone();
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn help_teaches_with_examples() {
    let out = lrec().arg("--help").assert().success().get_output().clone();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("EXAMPLES"), "{help}");
    assert!(
        help.contains("lrec -p $(cat /run/nginx.pid) -d 30"),
        "{help}"
    );
    assert!(help.contains("--no-children"), "{help}");
    assert!(help.contains("lanalyze"), "{help}");
}

#[test]
fn nothing_to_record_is_an_error_that_says_what_to_give() {
    let err = stderr_of(&mut lrec());
    assert!(err.contains("-p PID or -- CMD"), "{err}");
}

#[test]
fn pid_and_command_exclude_each_other() {
    let err = stderr_of(lrec().args(["-p", "1", "--", "true"]));
    assert!(err.contains("cannot be used with"), "{err}");
}

#[test]
fn bad_numbers_are_refused() {
    let err = stderr_of(lrec().args(["--stack-size", "70000", "--", "true"]));
    assert!(
        err.contains("--stack-size must be between 1 and 65536"),
        "{err}"
    );
    let err = stderr_of(lrec().args(["-F", "0", "--", "true"]));
    assert!(err.contains("-F must be between 1 and"), "{err}");
    let err = stderr_of(lrec().args(["-d", "0", "--", "true"]));
    assert!(err.contains("-d must be a positive number"), "{err}");
    let err = stderr_of(lrec().args(["--ring-mib", "3", "--", "true"]));
    assert!(err.contains("power of two"), "{err}");
}

#[test]
fn a_missing_process_is_named() {
    let err = stderr_of(lrec().args(["-p", "2147483646", "-o", "/dev/null"]));
    assert!(err.contains("no such process: 2147483646"), "{err}");
}

#[test]
fn flight_needs_a_target_and_a_positive_window() {
    let out = lrec().args(["--flight", "5"]).assert().code(2);
    let err = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(err.contains("<--pid <PID>|CMD>"), "{err}");
    for bad in ["0", "-1", "inf", "soon"] {
        let out = lrec()
            .args([&format!("--flight={bad}"), "--", "true"])
            .assert()
            .code(2);
        let err = String::from_utf8(out.get_output().stderr.clone()).unwrap();
        assert!(
            err.contains("must be a positive number of seconds"),
            "{err}"
        );
    }
}

#[test]
fn help_explains_the_flight_recorder() {
    let out = lrec().arg("--help").assert().success().get_output().clone();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("--flight <SECS>"), "{help}");
    assert!(help.contains("kill -USR1"), "{help}");
    assert!(help.contains("out.1.lrec"), "{help}");
    assert!(help.contains("0600"), "{help}");
}
