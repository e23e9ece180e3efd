//! What each request cost: CPU, Redis commands and PostgreSQL transactions.

use std::io::{self, Write};

use super::Row;

/// The CPU per request of every row.
pub(super) fn write_cpu(out: &mut impl Write, rows: &[Row]) -> io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "CPU per request (warm-up included): this process's server side (runtime, SQLite workers) and load generator; the machine's busy share; and the CPUs kept busy outside this process (databases, Redis, and anything else running on the machine)"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| scenario | mode | server CPU µs/req | load generator CPU µs/req | machine busy | CPUs busy outside this process |"
    )?;
    writeln!(out, "|---|---|---:|---:|---:|---:|")?;
    for row in rows {
        let n = row.measured.total.max(1) as f64;
        writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {:.0}% | {:.2} |",
            row.scenario,
            row.mode,
            row.cpu.server_ns as f64 / 1000.0 / n,
            row.cpu.load_ns as f64 / 1000.0 / n,
            row.cpu.machine_busy * 100.0,
            row.cpu.outside_cores,
        )?;
    }
    Ok(())
}

/// The Redis commands per request of the rows that counted them.
pub(super) fn write_redis(out: &mut impl Write, rows: &[Row]) -> io::Result<()> {
    let redis_rows: Vec<_> = rows.iter().filter(|r| r.redis.is_some()).collect();
    if !redis_rows.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "Redis, per request: commands the app sent, and what the server executed (`INFO`: Lua's `redis.call`s included)"
        )?;
        writeln!(out)?;
        writeln!(
            out,
            "| scenario | mode | sent by the app | executed by the server | by command (server) |"
        )?;
        writeln!(out, "|---|---|---:|---:|---|")?;
        for row in redis_rows {
            let Some(r) = &row.redis else { continue };
            let by: Vec<String> = r
                .breakdown
                .iter()
                .filter(|(_, n)| *n >= 0.005)
                .map(|(name, n)| format!("{name} {n:.2}"))
                .collect();
            writeln!(
                out,
                "| {} | {} | {:.2} | {:.2} | {} |",
                row.scenario,
                row.mode,
                r.client,
                r.server,
                by.join(", ")
            )?;
        }
    }
    Ok(())
}

/// The PostgreSQL transactions per request of the rows that counted them.
pub(super) fn write_sql(out: &mut impl Write, rows: &[Row]) -> io::Result<()> {
    let sql_rows: Vec<_> = rows.iter().filter(|r| r.sql.is_some()).collect();
    if !sql_rows.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "PostgreSQL, per request (`pg_stat_database` of the benchmark's database)"
        )?;
        writeln!(out)?;
        writeln!(out, "| scenario | mode | commits | rollbacks |")?;
        writeln!(out, "|---|---|---:|---:|")?;
        for row in sql_rows {
            let Some(s) = &row.sql else { continue };
            writeln!(
                out,
                "| {} | {} | {:.3} | {:.3} |",
                row.scenario, row.mode, s.commits, s.rollbacks
            )?;
        }
    }
    Ok(())
}
