//! The targets: ratios to the baselines, to PgStore alone and to the peer
//! crate that idem aims for, and whether its handler ran once per burst.

use std::io::{self, Write};

use super::{Baselines, BurstRow, Mode, ORDERS_PG, ORDERS_SQLITE, ORDERS_TIERED, Row, find, ratio};

/// One target: what it compares, the ratio measured (if both sides were)
/// and the ratio to reach.
type Target = (&'static str, Option<f64>, f64);

/// The targets, and whether idem ran the handler once per burst.
pub(super) fn write(
    out: &mut impl Write,
    rows: &[Row],
    bursts: &[BurstRow],
    baselines: &Baselines<'_>,
) -> io::Result<()> {
    writeln!(out)?;
    writeln!(out, "Targets")?;
    writeln!(out)?;
    for (what, got, goal) in targets(rows, baselines) {
        let verdict = match got {
            Some(g) if g >= goal => format!("{g:.2}x: met"),
            Some(g) => format!("{g:.2}x: NOT met"),
            None => "not measured".to_owned(),
        };
        writeln!(out, "- {what} >= {goal:.2}x: {verdict}")?;
    }
    write_handler_once(out, bursts)
}

/// Every target, in the order printed.
fn targets(rows: &[Row], baselines: &Baselines<'_>) -> [Target; 9] {
    let Baselines {
        bare,
        bare_get,
        orders_bare,
        orders_sqlite_bare,
    } = *baselines;
    let memory_first = find(rows, "idem: memory", Mode::First);
    let memory_dup = find(rows, "idem: memory", Mode::Duplicate);
    let tiered_dup = find(rows, "idem: Redis + PostgreSQL", Mode::Duplicate);
    let peer_dup = rows
        .iter()
        .find(|r| r.scenario.starts_with("axum-idempotent") && r.mode == Mode::Duplicate);
    let pg_first = find(rows, ORDERS_PG, Mode::First);
    [
        (
            "memory store, first requests, vs bare",
            memory_first.and_then(|r| ratio(r, bare)),
            0.85,
        ),
        (
            "memory store, replays, vs bare",
            memory_dup.and_then(|r| ratio(r, bare)),
            0.90,
        ),
        (
            "Redis + PostgreSQL, replays, vs bare + one Redis GET",
            tiered_dup.and_then(|r| ratio(r, bare_get)),
            0.80,
        ),
        (
            "memory store replays vs axum-idempotent replays (ahead = above 1)",
            memory_dup.and_then(|r| ratio(r, peer_dup)),
            1.0,
        ),
        (
            "Redis + PostgreSQL replays vs axum-idempotent replays (ahead = above 1)",
            tiered_dup.and_then(|r| ratio(r, peer_dup)),
            1.0,
        ),
        (
            "orders endpoint, idem transactional (PgStore), first requests, vs the bare endpoint",
            pg_first.and_then(|r| ratio(r, orders_bare)),
            0.75,
        ),
        (
            "orders endpoint behind the Redis gate, first requests, vs PgStore alone's",
            find(rows, ORDERS_TIERED, Mode::First).and_then(|r| ratio(r, pg_first)),
            0.95,
        ),
        (
            "orders endpoint behind the Redis gate, duplicates, vs PgStore alone's",
            find(rows, ORDERS_TIERED, Mode::Duplicate)
                .and_then(|r| ratio(r, find(rows, ORDERS_PG, Mode::Duplicate))),
            1.5,
        ),
        (
            "orders endpoint on SQLite, idem transactional, first requests, vs the bare endpoint on SQLite",
            find(rows, ORDERS_SQLITE, Mode::First).and_then(|r| ratio(r, orders_sqlite_bare)),
            0.75,
        ),
    ]
}

/// Whether idem ran the handler once in every burst, if any of its
/// scenarios was checked.
fn write_handler_once(out: &mut impl Write, bursts: &[BurstRow]) -> io::Result<()> {
    let idem_bursts: Vec<_> = bursts
        .iter()
        .filter(|b| {
            b.scenario.starts_with("idem")
                || [ORDERS_PG, ORDERS_TIERED, ORDERS_SQLITE].contains(&b.scenario)
        })
        .collect();
    if !idem_bursts.is_empty() {
        let once = idem_bursts
            .iter()
            .all(|b| b.handler_runs.iter().all(|&runs| runs == 1));
        writeln!(
            out,
            "- idem runs the handler once for simultaneous duplicates on every store: {}",
            if once { "yes" } else { "NO" }
        )?;
    }
    Ok(())
}
