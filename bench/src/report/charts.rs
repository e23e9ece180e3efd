//! The charts written beside the report (`--charts DIR`), as SVG with
//! plotters: each row's throughput as a ratio to its baseline (the "vs
//! bare" column), and each row's latency percentiles.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::{Baselines, Mode, Row, ratio, vs_bare};

/// Width of a chart, and of the area of its row labels, in pixels.
const WIDTH: u32 = 1200;
const LABELS: u32 = 520;
/// Height of one row's band.
const BAND: u32 = 26;

/// Writes `throughput.svg` and `latency.svg` in `dir` (created if
/// missing), `title` naming the run; the files written.
pub(crate) fn write(dir: &Path, rows: &[Row], title: &str) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let baselines = Baselines::find(rows);
    let ratios: Vec<(String, f64)> = rows
        .iter()
        .filter(|row| row.mode != Mode::Baseline)
        .filter_map(|row| Some((label(row), ratio(row, vs_bare(row, &baselines))?)))
        .collect();
    let throughput = dir.join("throughput.svg");
    bars(
        &throughput,
        &format!("Throughput vs the bare endpoint on the same store ({title})"),
        "ratio (1.0 = the bare endpoint)",
        &ratios,
        Some(1.0),
    )?;
    let latencies: Vec<(String, [f64; 3])> = rows
        .iter()
        .map(|row| {
            let at = |q| row.measured.latency.value_at_quantile(q) as f64 / 1000.0;
            (label(row), [at(0.50), at(0.90), at(0.99)])
        })
        .collect();
    let latency = dir.join("latency.svg");
    percentiles(
        &latency,
        &format!("Latency percentiles, ms ({title})"),
        &latencies,
    )?;
    Ok(vec![throughput, latency])
}

/// A row's label: its scenario and mode.
fn label(row: &Row) -> String {
    format!("{} ({})", row.scenario, row.mode)
}

/// A horizontal bar per `(label, value)`, and a vertical line at `mark`.
fn bars(
    path: &Path,
    title: &str,
    axis: &str,
    values: &[(String, f64)],
    mark: Option<f64>,
) -> Result<(), String> {
    let n = values.len().max(1);
    let height = 120 + BAND * u32::try_from(n).unwrap_or(u32::MAX / BAND);
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let top = values
        .iter()
        .map(|(_, v)| *v)
        .fold(mark.unwrap_or(0.0), f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(LABELS)
        .build_cartesian_2d(0.0..top.max(0.1), (0..n).into_segmented())
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(axis)
        .y_labels(n)
        .y_label_formatter(&|at| match at {
            SegmentValue::CenterOf(i) => values.get(*i).map(|(l, _)| l.clone()).unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| fail(&e))?;
    chart
        .draw_series(values.iter().enumerate().map(|(i, (_, v))| {
            let mut bar = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(i)),
                    (*v, SegmentValue::Exact(i + 1)),
                ],
                BLUE.mix(0.6).filled(),
            );
            bar.set_margin(3, 3, 0, 0);
            bar
        }))
        .map_err(|e| fail(&e))?;
    chart
        .draw_series(values.iter().enumerate().map(|(i, (_, v))| {
            Text::new(
                format!("{v:.2}"),
                (*v, SegmentValue::CenterOf(i)),
                ("sans-serif", 12),
            )
        }))
        .map_err(|e| fail(&e))?;
    if let Some(mark) = mark {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![
                    (mark, SegmentValue::Exact(0)),
                    (mark, SegmentValue::Exact(n)),
                ],
                RED.stroke_width(2),
            )))
            .map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))
}

/// Per row, three bars: p50, p90 and p99.
fn percentiles(path: &Path, title: &str, values: &[(String, [f64; 3])]) -> Result<(), String> {
    let n = values.len().max(1);
    let height = 140 + BAND * u32::try_from(n).unwrap_or(u32::MAX / BAND);
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let top = values
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(LABELS)
        .build_cartesian_2d(0.0..top.max(0.1), (0..n).into_segmented())
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("milliseconds")
        .y_labels(n)
        .y_label_formatter(&|at| match at {
            SegmentValue::CenterOf(i) => values.get(*i).map(|(l, _)| l.clone()).unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| fail(&e))?;
    let shades = [
        ("p50", BLUE.mix(0.8)),
        ("p90", BLUE.mix(0.5)),
        ("p99", BLUE.mix(0.25)),
    ];
    // Widest first, so that each narrower bar stays visible on top.
    for (k, (name, color)) in shades.into_iter().enumerate().rev() {
        chart
            .draw_series(values.iter().enumerate().map(|(i, (_, v))| {
                let mut bar = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (v[k], SegmentValue::Exact(i + 1)),
                    ],
                    color.filled(),
                );
                bar.set_margin(3, 3, 0, 0);
                bar
            }))
            .map_err(|e| fail(&e))?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}
