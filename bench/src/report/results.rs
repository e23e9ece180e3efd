//! The results table: throughput, latency and the ratios to the baselines,
//! then the bad responses by status.

use std::io::{self, Write};

use super::{
    Baselines, ORDERS_BARE, ORDERS_MYSQL_BARE, ORDERS_SQLITE_BARE, Row, orders, ratio, times,
    vs_bare,
};

/// Microseconds as milliseconds, two decimals.
fn ms(micros: u64) -> String {
    format!("{:.2}", micros as f64 / 1000.0)
}

/// The results table (with a line on the orders endpoint's ratios, if it
/// was measured), and the bad responses.
pub(super) fn write(
    out: &mut impl Write,
    rows: &[Row],
    baselines: &Baselines<'_>,
) -> io::Result<()> {
    if rows.iter().any(orders) {
        writeln!(
            out,
            "The orders endpoint's rows: \"vs bare\" is against the bare orders endpoint on the same database (\"{ORDERS_BARE}\", \"{ORDERS_MYSQL_BARE}\", \"{ORDERS_SQLITE_BARE}\")."
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "| scenario | mode | req/s | req/s, all rounds | p50 ms | p99 ms | vs bare | vs bare + Redis GET | Redis cmds/req | SQL commits/req | handler runs | bad responses |"
    )?;
    writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    for row in rows {
        write_row(out, row, baselines)?;
    }
    write_bad_responses(out, rows)
}

/// One row of the results table.
fn write_row(out: &mut impl Write, row: &Row, baselines: &Baselines<'_>) -> io::Result<()> {
    let m = &row.measured;
    let vs_bare = vs_bare(row, baselines);
    let vs_get =
        if row.redis.is_some() && row.scenario != "bare handler + 1 Redis GET" && !orders(row) {
            times(ratio(row, baselines.bare_get))
        } else {
            "–".to_owned()
        };
    let redis = row
        .redis
        .as_ref()
        .map_or("–".to_owned(), |r| format!("{:.2}", r.client));
    let sql = row
        .sql
        .as_ref()
        .map_or("–".to_owned(), |s| format!("{:.2}", s.commits));
    let bad = m.unexpected + m.errors;
    writeln!(
        out,
        "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        row.scenario,
        row.mode,
        m.throughput(),
        row.spread
            .map_or("–".to_owned(), |(lo, hi)| format!("{lo:.0}-{hi:.0}")),
        ms(m.latency.value_at_quantile(0.50)),
        ms(m.latency.value_at_quantile(0.99)),
        times(ratio(row, vs_bare)),
        vs_get,
        redis,
        sql,
        row.handler_calls,
        bad,
    )
}

/// The rows with responses that were not what their load expected, by
/// status.
fn write_bad_responses(out: &mut impl Write, rows: &[Row]) -> io::Result<()> {
    let bad_rows: Vec<_> = rows
        .iter()
        .filter(|r| !r.measured.unexpected_by.is_empty())
        .collect();
    if !bad_rows.is_empty() {
        writeln!(out)?;
        writeln!(out, "Bad responses by status (`+r`: marked as a replay)")?;
        writeln!(out)?;
        for row in bad_rows {
            let by: Vec<String> = row
                .measured
                .unexpected_by
                .iter()
                .map(|(status, n)| format!("{status} x {n}"))
                .collect();
            writeln!(out, "- {} ({}): {}", row.scenario, row.mode, by.join(", "))?;
        }
    }
    Ok(())
}
