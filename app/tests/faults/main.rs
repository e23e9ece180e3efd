//! The fault suite: real `orders` processes over a PostgreSQL and Redis
//! servers of the suite's own, a workload of operations each retried until
//! a final answer, faults injected while it runs, and a checker that
//! compares the ledger with the operations (exactly one effect each,
//! nothing acknowledged lost, every answer the stored order).
//!
//! `cargo test -p idem-app --test faults` runs every scenario, in two
//! lanes at once (`scenarios::LANES`; `-- --test-threads=1` one at a
//! time); `cargo test -p idem-app --test faults -- postgres-restart` one
//! (any name containing the argument). Each prints its row of the table in
//! RELIABILITY.md; with `IDEM_RELIABILITY_OUT=FILE` the table is written
//! there too. A run with a double, a lost effect, a wrong answer or an
//! unanswered operation fails.

mod apps;
mod checker;
mod scenarios;
mod topology;
mod workload;

use std::fmt::Write as _;

use scenarios::{LANES, Report, SCENARIOS, Scenario};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--list") {
        for scenario in SCENARIOS {
            eprintln!("{}: test", scenario.name);
        }
        return;
    }
    // Names to match: every argument but options and `--test-threads`'s value.
    let filters: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, arg)| !arg.starts_with('-') && (*i == 0 || args[i - 1] != "--test-threads"))
        .map(|(_, arg)| arg)
        .collect();
    let chosen: Vec<(usize, &Scenario)> = SCENARIOS
        .iter()
        .enumerate()
        .filter(|(_, s)| filters.is_empty() || filters.iter().any(|f| s.name.contains(f.as_str())))
        .collect();
    let lane = |lane: usize| -> Vec<(usize, &Scenario)> {
        chosen
            .iter()
            .copied()
            .filter(|(_, s)| s.lane == lane)
            .collect()
    };
    let mut reports: Vec<(usize, Report)> = if one_at_a_time(&args) {
        (0..LANES).flat_map(|n| run_lane(lane(n))).collect()
    } else {
        std::thread::scope(|scope| {
            let lanes: Vec<_> = (0..LANES)
                .map(|n| {
                    let scenarios = lane(n);
                    scope.spawn(move || run_lane(scenarios))
                })
                .collect();
            lanes
                .into_iter()
                .flat_map(|lane| lane.join().expect("a lane of the fault suite"))
                .collect()
        })
    };
    reports.sort_by_key(|(index, _)| *index);
    let reports: Vec<Report> = reports.into_iter().map(|(_, report)| report).collect();
    let mut table = String::from(Report::HEADER);
    for report in &reports {
        let _ = writeln!(table, "{}", report.row());
    }
    eprintln!("{table}");
    if let Ok(path) = std::env::var("IDEM_RELIABILITY_OUT") {
        std::fs::write(&path, &table).unwrap_or_else(|err| panic!("write {path}: {err}"));
    }
    let failed: Vec<String> = reports.iter().filter_map(Report::failure).collect();
    assert!(
        failed.is_empty(),
        "the fault suite failed:\n{}",
        failed.join("\n")
    );
}

/// Runs a lane's scenarios one after another, on a runtime and a
/// PostgreSQL of the lane's own (a scenario may block its thread, as when
/// it restarts the server; the other lane's timeline goes on).
fn run_lane(scenarios: Vec<(usize, &Scenario)>) -> Vec<(usize, Report)> {
    if scenarios.is_empty() {
        return Vec::new();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let Some(postgres) = idem_test_support::postgres::Postgres::start() else {
            return Vec::new();
        };
        let mut reports = Vec::new();
        for (index, scenario) in scenarios {
            eprintln!("fault suite: {} ({})", scenario.name, scenario.what);
            match (scenario.run)(&postgres).await {
                Some(report) => {
                    eprintln!("{}\n{}", report.row(), report.notes);
                    reports.push((index, report));
                }
                None => eprintln!("fault suite: {} skipped", scenario.name),
            }
        }
        reports
    })
}

/// Whether libtest's `--test-threads=1` (or `RUST_TEST_THREADS=1`) asks
/// for one scenario at a time.
fn one_at_a_time(args: &[String]) -> bool {
    let threads = args
        .iter()
        .position(|arg| arg == "--test-threads")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| {
            args.iter()
                .find_map(|arg| arg.strip_prefix("--test-threads=").map(str::to_owned))
        })
        .or_else(|| std::env::var("RUST_TEST_THREADS").ok());
    threads.is_some_and(|n| n.trim() == "1")
}
