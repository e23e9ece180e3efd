//! The targets: ratios to the baselines, to PgStore alone and to the peer
//! crate that idem aims for, and whether its handler ran once per burst.

use std::borrow::Cow;
use std::io::{self, Write};

use super::{
    Baselines, BurstRow, Mode, ORDERS_MYSQL, ORDERS_MYSQL_HAND, ORDERS_PG, ORDERS_PG_HAND,
    ORDERS_SQLITE, ORDERS_SQLITE_HAND, ORDERS_SQLITE_SOLE, ORDERS_TIERED, Row, find, ratio,
};

/// idem's transactional row and the hand-written one, on each database.
const AGAINST_HAND: [(&str, &str, &str); 3] = [
    ("PostgreSQL", ORDERS_PG, ORDERS_PG_HAND),
    ("MySQL", ORDERS_MYSQL, ORDERS_MYSQL_HAND),
    ("SQLite", ORDERS_SQLITE, ORDERS_SQLITE_HAND),
];

/// How far above the hand-written row's p50 idem's may be, in
/// milliseconds.
const P50_WITHIN_MS: f64 = 0.2;

/// One target: what it compares, the ratio measured (if both sides were)
/// and the ratio to reach.
type Target = (Cow<'static, str>, Option<f64>, f64);

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
    write_p50s(out, rows)?;
    write_handler_once(out, bursts)
}

/// idem's p50 against the hand-written row's, first requests, on each
/// database (the target is with `--net-delay 500us`).
fn write_p50s(out: &mut impl Write, rows: &[Row]) -> io::Result<()> {
    for (db, idem, hand) in AGAINST_HAND {
        let (Some(idem), Some(hand)) =
            (find(rows, idem, Mode::First), find(rows, hand, Mode::First))
        else {
            continue;
        };
        let p50 = |row: &Row| row.measured.latency.value_at_quantile(0.50) as f64 / 1000.0;
        let over = p50(idem) - p50(hand);
        let verdict = if over <= P50_WITHIN_MS {
            "met"
        } else {
            "NOT met"
        };
        writeln!(
            out,
            "- {db}, first requests, idem's p50 within {P50_WITHIN_MS} ms of the hand-written row's: {over:+.2} ms: {verdict}"
        )?;
    }
    Ok(())
}

/// Every target, in the order printed.
fn targets(rows: &[Row], baselines: &Baselines<'_>) -> Vec<Target> {
    let mut all = Vec::from(earlier_targets(rows, baselines));
    for (db, idem, hand) in AGAINST_HAND {
        let of = |mode| find(rows, idem, mode).and_then(|r| ratio(r, find(rows, hand, mode)));
        all.push((
            format!("{db}: idem transactional, first requests, vs the hand-written dedup's").into(),
            of(Mode::First),
            0.95,
        ));
        all.push((
            format!("{db}: idem transactional, duplicates, vs the hand-written dedup's").into(),
            of(Mode::Duplicate),
            1.0,
        ));
    }
    all.push((
        "SQLite: idem transactional with sole_writer(true), first requests, vs the bare endpoint on SQLite".into(),
        find(rows, ORDERS_SQLITE_SOLE, Mode::First)
            .and_then(|r| ratio(r, baselines.orders_sqlite_bare)),
        0.9,
    ));
    all
}

/// The targets of the earlier issues.
fn earlier_targets(rows: &[Row], baselines: &Baselines<'_>) -> [Target; 9] {
    let Baselines {
        bare,
        bare_get,
        orders_bare,
        orders_sqlite_bare,
        ..
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
            "memory store, first requests, vs bare".into(),
            memory_first.and_then(|r| ratio(r, bare)),
            0.85,
        ),
        (
            "memory store, replays, vs bare".into(),
            memory_dup.and_then(|r| ratio(r, bare)),
            0.90,
        ),
        (
            "Redis + PostgreSQL, replays, vs bare + one Redis GET".into(),
            tiered_dup.and_then(|r| ratio(r, bare_get)),
            0.80,
        ),
        (
            "memory store replays vs axum-idempotent replays (ahead = above 1)".into(),
            memory_dup.and_then(|r| ratio(r, peer_dup)),
            1.0,
        ),
        (
            "Redis + PostgreSQL replays vs axum-idempotent replays (ahead = above 1)".into(),
            tiered_dup.and_then(|r| ratio(r, peer_dup)),
            1.0,
        ),
        (
            "orders endpoint, idem transactional (PgStore), first requests, vs the bare endpoint".into(),
            pg_first.and_then(|r| ratio(r, orders_bare)),
            0.75,
        ),
        (
            "orders endpoint behind the Redis gate, first requests, vs PgStore alone's".into(),
            find(rows, ORDERS_TIERED, Mode::First).and_then(|r| ratio(r, pg_first)),
            0.95,
        ),
        (
            "orders endpoint behind the Redis gate, duplicates, vs PgStore alone's".into(),
            find(rows, ORDERS_TIERED, Mode::Duplicate)
                .and_then(|r| ratio(r, find(rows, ORDERS_PG, Mode::Duplicate))),
            1.5,
        ),
        (
            "orders endpoint on SQLite, idem transactional, first requests, vs the bare endpoint on SQLite".into(),
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
                || [
                    ORDERS_PG,
                    ORDERS_TIERED,
                    ORDERS_SQLITE,
                    ORDERS_SQLITE_SOLE,
                    ORDERS_MYSQL,
                ]
                .contains(&b.scenario)
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
    let hand_bursts: Vec<_> = bursts
        .iter()
        .filter(|b| AGAINST_HAND.iter().any(|(_, _, hand)| *hand == b.scenario))
        .collect();
    if !hand_bursts.is_empty() {
        let once = hand_bursts
            .iter()
            .all(|b| b.handler_runs.iter().all(|&runs| runs == 1));
        writeln!(
            out,
            "- the hand-written dedup runs the handler once for simultaneous duplicates on every database: {}",
            if once { "yes" } else { "NO" }
        )?;
    }
    Ok(())
}
