//! SVG plots of a run, drawn with plotters' SVG backend (text as SVG `<text>`, no system fonts):
//! latency CDFs, mean TTFT per step of a task, generated-token throughput over time and cached
//! fraction per step. Each function returns the SVG document as a string.

use plotters::prelude::*;

use super::results::BenchResults;
use crate::driver::{CallOutcome, CallRecord};
use crate::stats::{cdf_points, sorted_finite};
use crate::BenchError;

/// One named line.
pub type Series = (String, Vec<(f64, f64)>);

const WIDTH: u32 = 640;
const HEIGHT: u32 = 360;

fn plot_err<E: std::fmt::Display>(e: E) -> BenchError {
    BenchError::Plot(e.to_string())
}

/// A line chart of `series` (points and lines), axes from the data; an empty chart says so.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    legend: SeriesLabelPosition,
) -> Result<String, BenchError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let points = series.iter().flat_map(|s| s.1.iter());
        let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY);
        for &(x, y) in points {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        if !x0.is_finite() {
            root.draw(&Text::new(
                format!("{title}: no data"),
                (20, HEIGHT as i32 / 2),
                ("sans-serif", 18),
            ))
            .map_err(plot_err)?;
            root.present().map_err(plot_err)?;
            drop(root);
            return Ok(svg);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let x0 = x0.min(0.0);
        let y1 = if y1 > 0.0 { y1 * 1.05 } else { 1.0 };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, 0.0..y1)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(plot_err)?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            if pts.len() <= 40 {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(plot_err)?;
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(legend)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

fn ok_calls(
    r: &BenchResults,
    target: usize,
) -> impl Iterator<Item = (&CallRecord, &crate::client::CallMetrics)> {
    r.calls
        .iter()
        .filter(move |c| c.target == target)
        .filter_map(|c| match &c.outcome {
            CallOutcome::Ok(m) => Some((c, m)),
            _ => None,
        })
}

fn per_target(r: &BenchResults, f: impl Fn(usize) -> Vec<(f64, f64)>) -> Vec<Series> {
    r.targets
        .iter()
        .enumerate()
        .map(|(i, t)| (t.target.name.clone(), f(i)))
        .collect()
}

/// CDF of call latency (ms).
pub fn e2e_cdf(r: &BenchResults) -> Result<String, BenchError> {
    let s = per_target(r, |i| {
        cdf_points(&sorted_finite(
            ok_calls(r, i).map(|(_, m)| m.e2e_s * 1000.0),
        ))
    });
    line_chart(
        "Call latency CDF",
        "latency (ms)",
        "fraction of calls",
        &s,
        SeriesLabelPosition::LowerRight,
    )
}

/// CDF of time to first token (ms).
pub fn ttft_cdf(r: &BenchResults) -> Result<String, BenchError> {
    let s = per_target(r, |i| {
        cdf_points(&sorted_finite(
            ok_calls(r, i)
                .filter_map(|(_, m)| m.ttft_s)
                .map(|x| x * 1000.0),
        ))
    });
    line_chart(
        "Time to first token CDF",
        "TTFT (ms)",
        "fraction of calls",
        &s,
        SeriesLabelPosition::LowerRight,
    )
}

/// Mean of `value` per step index (x = step + 1).
fn per_step(
    r: &BenchResults,
    i: usize,
    value: impl Fn(&crate::client::CallMetrics) -> Option<(f64, f64)>,
) -> Vec<(f64, f64)> {
    let mut sums: Vec<(f64, f64)> = Vec::new();
    for (c, m) in ok_calls(r, i) {
        if let Some((num, den)) = value(m) {
            let s = c.step as usize;
            if sums.len() <= s {
                sums.resize(s + 1, (0.0, 0.0));
            }
            sums[s].0 += num;
            sums[s].1 += den;
        }
    }
    sums.iter()
        .enumerate()
        .filter(|(_, (_, d))| *d > 0.0)
        .map(|(s, (n, d))| ((s + 1) as f64, n / d))
        .collect()
}

/// Mean TTFT (ms) per step of a task: prefix caching shows as a flat line while prompts grow.
pub fn ttft_per_step(r: &BenchResults) -> Result<String, BenchError> {
    let s = per_target(r, |i| {
        per_step(r, i, |m| m.ttft_s.map(|t| (t * 1000.0, 1.0)))
    });
    line_chart(
        "Mean TTFT per step of a task",
        "step",
        "TTFT (ms)",
        &s,
        SeriesLabelPosition::UpperLeft,
    )
}

/// Cached prompt fraction per step (calls that reported `cached_tokens` only).
pub fn cached_per_step(r: &BenchResults) -> Result<String, BenchError> {
    let mut s = per_target(r, |i| {
        per_step(r, i, |m| {
            let u = m.usage.as_ref()?;
            Some((u.cached_tokens()? as f64, u.prompt_tokens as f64))
        })
    });
    for (name, pts) in &mut s {
        if pts.is_empty() {
            name.push_str(" (not reported)");
        }
    }
    let title = if s.iter().all(|x| x.1.is_empty()) {
        "Cached prompt fraction per step (not reported by the server)"
    } else {
        "Cached prompt fraction per step"
    };
    line_chart(
        title,
        "step",
        "cached / prompt tokens",
        &s,
        SeriesLabelPosition::UpperLeft,
    )
}

/// Generated tokens per second over the run, in about 40 time buckets (by call end time).
pub fn throughput(r: &BenchResults) -> Result<String, BenchError> {
    let bucket_s = (r.wall_s / 40.0).max(0.25);
    let n = (r.wall_s / bucket_s).ceil().max(1.0) as usize;
    let s = per_target(r, |i| {
        let mut b = vec![0.0; n];
        for (c, m) in ok_calls(r, i) {
            let k = (((c.t_start_s + m.e2e_s) / bucket_s) as usize).min(n - 1);
            b[k] += m.completion_tokens() as f64;
        }
        b.iter()
            .enumerate()
            .map(|(k, tok)| ((k as f64 + 0.5) * bucket_s, tok / bucket_s))
            .collect()
    });
    line_chart(
        "Generated tokens per second",
        "time (s)",
        "tokens/s",
        &s,
        SeriesLabelPosition::UpperLeft,
    )
}
