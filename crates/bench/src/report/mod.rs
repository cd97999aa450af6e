//! Results of a run and their renderings: aggregation (`results`), the text table (`table`), SVG
//! plots (`plots`) and the offline HTML report (`html`); `write_all` puts them in a directory.

pub mod html;
pub mod plots;
pub mod results;
pub mod table;

use std::path::{Path, PathBuf};

pub use results::{aggregate, BenchResults, TargetSummary};

use crate::BenchError;

/// Files written by [`write_all`].
#[derive(Clone, Debug)]
pub struct ReportFiles {
    pub json: PathBuf,
    pub table: PathBuf,
    pub html: PathBuf,
}

/// Writes `results.json`, `table.txt` and `report.html` into `dir` (created if missing).
pub fn write_all(dir: &Path, results: &BenchResults) -> Result<ReportFiles, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let files = ReportFiles {
        json: dir.join("results.json"),
        table: dir.join("table.txt"),
        html: dir.join("report.html"),
    };
    let json = serde_json::to_string_pretty(results)?;
    std::fs::write(&files.json, json).map_err(|e| BenchError::io(&files.json, e))?;
    std::fs::write(&files.table, table::render(results))
        .map_err(|e| BenchError::io(&files.table, e))?;
    std::fs::write(&files.html, html::render(results)?)
        .map_err(|e| BenchError::io(&files.html, e))?;
    Ok(files)
}
