//! The fault suite: real `orders` processes over one PostgreSQL and one
//! Redis of the suite's own, a workload of operations each retried until a
//! final answer, faults injected while it runs, and a checker that compares
//! the ledger with the operations (exactly one effect each, nothing
//! acknowledged lost, every answer the stored order).
//!
//! `cargo test -p idem-app --test faults` runs every scenario;
//! `cargo test -p idem-app --test faults -- postgres-restart` one (any
//! name containing the argument). Each prints its row of the table in
//! RELIABILITY.md; with `IDEM_RELIABILITY_OUT=FILE` the table is written
//! there too. A run with a double, a lost effect, a wrong answer or an
//! unanswered operation fails.

mod apps;
mod checker;
mod scenarios;
mod topology;
mod workload;

use std::fmt::Write as _;

use scenarios::{Report, SCENARIOS};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--list") {
        for scenario in SCENARIOS {
            eprintln!("{}: test", scenario.name);
        }
        return;
    }
    let filters: Vec<&String> = args.iter().filter(|arg| !arg.starts_with('-')).collect();
    let chosen: Vec<_> = SCENARIOS
        .iter()
        .filter(|s| filters.is_empty() || filters.iter().any(|f| s.name.contains(f.as_str())))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    let reports = runtime.block_on(async {
        let Some(postgres) = idem_test_support::postgres::Postgres::start() else {
            return Vec::new();
        };
        let mut reports = Vec::new();
        for scenario in chosen {
            eprintln!("fault suite: {} ({})", scenario.name, scenario.what);
            match (scenario.run)(&postgres).await {
                Some(report) => {
                    eprintln!("{}\n{}", report.row(), report.notes);
                    reports.push(report);
                }
                None => eprintln!("fault suite: {} skipped", scenario.name),
            }
        }
        reports
    });
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
