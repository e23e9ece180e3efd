//! The benchmark's in-process cases, run as `.ci/instructions` runs them
//! under valgrind: each answers every request as its case says (first
//! requests created and not replayed, replays replayed), or the process
//! exits non-zero. Being an integration test also makes `cargo test`
//! build `target/debug/idem-bench` with the tests' features, the binary
//! `.ci/instructions` counts, so CI builds it once.

use std::process::Command;

/// `idem-bench --instructions CASE --requests N`: its exit status and
/// what it wrote to stderr.
fn run(case: &str, requests: u32) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_idem-bench"))
        .args(["--instructions", case, "--requests", &requests.to_string()])
        .output()
        .expect("the benchmark's binary starts");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn every_in_process_case_answers_as_it_claims() {
    for case in [
        "bare",
        "idem-first",
        "idem-replay",
        "peer-first",
        "peer-replay",
    ] {
        let (success, stderr) = run(case, 20);
        assert!(success, "--instructions {case} failed: {stderr}");
    }
}

#[test]
fn an_unknown_case_is_refused_by_name() {
    let (success, stderr) = run("no-such-case", 1);
    assert!(!success, "an unknown case exited 0");
    assert!(
        stderr.contains("no case \"no-such-case\""),
        "no message naming the case: {stderr}"
    );
}
