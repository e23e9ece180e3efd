//! The correctness table: what simultaneous copies of one fresh request
//! got, and how many times the handler ran.

use std::io::{self, Write};

use super::BurstRow;

/// The correctness table, if any check ran.
pub(super) fn write(out: &mut impl Write, bursts: &[BurstRow]) -> io::Result<()> {
    if bursts.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "Correctness: rounds of simultaneous copies of one fresh request, each copy on its own connection; responses of all rounds together"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| scenario | handler work | copies | handler runs per round | 201 | 201 replayed | 409 | other | errors |"
    )?;
    writeln!(out, "|---|---:|---:|---|---:|---:|---:|---:|---:|")?;
    for b in bursts {
        let s = &b.seen;
        let runs: Vec<String> = b.handler_runs.iter().map(usize::to_string).collect();
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            b.scenario,
            if b.delay.is_zero() {
                "none".to_owned()
            } else {
                humantime::format_duration(b.delay).to_string()
            },
            b.copies,
            runs.join(", "),
            s.created,
            s.replayed,
            s.conflict,
            s.other,
            s.errors
        )?;
    }
    Ok(())
}
