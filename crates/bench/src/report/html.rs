//! The self-contained HTML report: run parameters, the results table, error counts and the SVG
//! plots inline. No scripts, fonts or links to fetch, so it opens offline.

use super::plots;
use super::results::BenchResults;
use super::table;
use crate::BenchError;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub fn render(r: &BenchResults) -> Result<String, BenchError> {
    let mut h = String::from(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>agentkv bench report</title>\
         <style>body{font-family:sans-serif;max-width:1400px;margin:1em auto}\
         table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}\
         td:first-child{text-align:left}.plots{display:flex;flex-wrap:wrap;gap:8px}</style></head><body>\n",
    );
    h.push_str("<h1>Agent workload benchmark</h1>\n<ul>");
    h.push_str(&format!("<li>source: {}</li>", esc(&r.source)));
    if let Some(w) = &r.workload {
        h.push_str(&format!(
            "<li>workload: {} ({} agents × {} tasks, steps {}, tool latency {}, seed {})</li>",
            esc(&format!("{:?}", w.kind).to_lowercase()),
            w.num_agents,
            w.tasks_per_agent,
            w.steps_per_task
                .map_or("by shape".into(), |s| s.to_string()),
            w.tool_latency_ms
                .map_or("none".into(), |(a, b)| format!("{a}–{b} ms")),
            w.seed
        ));
    }
    h.push_str(&format!("<li>wall time: {:.1} s</li>", r.wall_s));
    for t in &r.targets {
        h.push_str(&format!(
            "<li>{}: {} (model {})</li>",
            esc(&t.target.name),
            esc(&t.target.base_url),
            esc(&t.target.model)
        ));
    }
    h.push_str("</ul>\n<table><tr><th>metric</th>");
    let (header, rows) = table::rows(r);
    for c in &header {
        h.push_str(&format!("<th>{}</th>", esc(c)));
    }
    let two = header.len() == 2;
    if two {
        h.push_str(&format!(
            "<th>{} / {}</th>",
            esc(&header[1]),
            esc(&header[0])
        ));
    }
    h.push_str("</tr>\n");
    for (label, cells, ratio) in rows {
        h.push_str(&format!("<tr><td>{}</td>", esc(&label)));
        for c in cells {
            h.push_str(&format!("<td>{}</td>", esc(&c)));
        }
        if two {
            h.push_str(&format!(
                "<td>{}</td>",
                ratio.map_or(String::new(), |x| format!("{x:.2}×"))
            ));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    for t in &r.targets {
        for (kind, n) in &t.errors {
            h.push_str(&format!(
                "<p>errors on {}: {} × {}</p>\n",
                esc(&t.target.name),
                n,
                esc(kind)
            ));
        }
    }
    h.push_str("<div class=\"plots\">\n");
    for svg in [
        plots::e2e_cdf(r)?,
        plots::ttft_cdf(r)?,
        plots::ttft_per_step(r)?,
        plots::throughput(r)?,
        plots::cached_per_step(r)?,
    ] {
        h.push_str("<div>");
        h.push_str(svg.trim_start_matches(|c| c != '<'));
        h.push_str("</div>\n");
    }
    h.push_str("</div>\n</body></html>\n");
    Ok(h)
}
