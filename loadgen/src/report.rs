//! Output: the summary table, `--json`, and the self-contained `--report` HTML page.
//!
//! The HTML page embeds its SVG plots (drawn with `plotters`) inline: no scripts, no
//! external files, so it can be mailed or attached to an issue as one file.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::Serialize;

use crate::stats::{Percentiles, Summary, ms_text};

/// A lag in records for text output: `-` when none was measured (never 0).
pub fn lag_text(records: Option<i64>) -> String {
    records.map_or_else(|| "-".to_string(), |r| r.to_string())
}

const PLOT_W: u32 = 860;
const PLOT_H: u32 = 340;
/// Percentile axis: 0 = p0, 1 = p90, 2 = p99, ... 5 = p99.999 ("nines").
const NINES_MAX: f64 = 5.0;
const NINES_STEPS: u32 = 100;

/// One measured run as the report shows it.
pub struct RunReport {
    pub label: String,
    pub summary: Summary,
    pub publish_us: Option<Histogram<u64>>,
    pub e2e_us: Option<Histogram<u64>>,
}

/// One row of a sweep or plan comparison.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Row {
    pub label: String,
    /// Offered rate, records/s (`None` for closed loop "max").
    pub offered_per_sec: Option<f64>,
    pub records_per_sec: f64,
    pub mb_per_sec: f64,
    /// `None` (JSON null) when the run had no samples.
    pub publish_latency_ms: Option<Percentiles>,
    pub e2e_latency_ms: Option<Percentiles>,
    /// `None` (JSON null, `-` in the tables) when no lag was measured.
    pub lag_max_records: Option<i64>,
    /// Error occurrences, all names together (see [`Summary::errors`]).
    pub errors: u64,
    /// For plan: whether this step met the SLO.
    pub ok: Option<bool>,
    /// Highest follower lag after the warm-up (with `--metrics-url`), records and ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follower_lag_max_records: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follower_lag_max_ms: Option<f64>,
    /// Why this step failed (an error, or nothing acknowledged); absent if it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

impl Row {
    /// A row from a run's summary.
    pub fn from_summary(label: &str, offered_per_sec: Option<f64>, s: &Summary) -> Self {
        Self {
            label: label.to_string(),
            offered_per_sec,
            records_per_sec: s.records_per_sec,
            mb_per_sec: s.mb_per_sec,
            publish_latency_ms: s.publish_latency_ms,
            e2e_latency_ms: s.e2e_latency_ms,
            lag_max_records: s.lag_max_records,
            errors: s.errors.values().sum(),
            ok: None,
            follower_lag_max_records: s.follower_lag_max_records,
            follower_lag_max_ms: s.follower_lag_max_ms,
            failed: None,
        }
    }

    /// The row of a step that failed: no measurements, the reason.
    pub fn failed(label: &str, offered_per_sec: Option<f64>, why: String) -> Self {
        let mut r = Self::from_summary(label, offered_per_sec, &Summary::default());
        r.failed = Some(why);
        r
    }
}

/// The text summary of one run, printed at its end.
pub fn summary_text(s: &Summary) -> String {
    let mut t = String::new();
    let produced = s.records > 0 || s.consumed_records == 0;
    if produced {
        let _ = writeln!(
            t,
            "{} records acked in {:.1} s: {:.1} records/sec ({:.2} MB/sec)",
            s.records, s.duration_s, s.records_per_sec, s.mb_per_sec
        );
    }
    let p = |name: &str, x: &Option<Percentiles>| match x {
        Some(x) => format!(
            "{name:<8} latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  p99.99 {:.2}  max {:.2}\n",
            x.p50, x.p90, x.p99, x.p999, x.p9999, x.max
        ),
        None => format!("{name:<8} latency ms: - (no samples)\n"),
    };
    if produced {
        t.push_str(&p("publish", &s.publish_latency_ms));
    }
    if s.consumed_records > 0 {
        let _ = writeln!(
            t,
            "{} records consumed in {:.1} s: {:.1} records/sec ({:.2} MB/sec), max lag {}",
            s.consumed_records,
            s.consumed_duration_s,
            s.consumed_records_per_sec,
            s.consumed_mb_per_sec,
            s.lag_max_records
                .map_or_else(|| "- (no sample)".to_string(), |l| format!("{l} records"))
        );
        if s.lag_unknown_samples > 0 {
            let _ = writeln!(
                t,
                "lag unknown in {} samples (a partition's log end could not be read)",
                s.lag_unknown_samples
            );
        }
        if s.e2e_latency_ms.is_some() {
            t.push_str(&p("e2e", &s.e2e_latency_ms));
        }
    }
    let scrapes = s.follower_lag.iter().filter(|p| !p.warmup).count();
    let unknown = s.follower_lag_unknown_scrapes.unwrap_or(0);
    if let (Some(r), Some(ms)) = (s.follower_lag_max_records, s.follower_lag_max_ms) {
        let _ = writeln!(
            t,
            "follower lag max: {r} records, {ms:.0} ms since caught up ({scrapes} scrapes)",
        );
    } else if scrapes > 0 {
        let _ = writeln!(t, "follower lag max: - (no scrape reached every node)");
    }
    if unknown > 0 {
        let _ = writeln!(
            t,
            "follower lag unknown in {unknown} of {scrapes} scrapes (a node could not be scraped)"
        );
    }
    if s.failed_records > 0 {
        let _ = writeln!(t, "{} records given up on", s.failed_records);
    }
    if !s.errors.is_empty() {
        // One count per occurrence (a refused batch, a lost connection, ...), not records.
        let _ = writeln!(t, "errors: {:?}", s.errors);
    }
    t
}

/// A comparison table, one line per row, aligned for a terminal.
pub fn table_text(rows: &[Row]) -> String {
    let follower = rows.iter().any(|r| r.follower_lag_max_records.is_some());
    let mut t = format!(
        "{:<28} {:>11} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}{}\n",
        "config",
        "offered/s",
        "records/s",
        "MB/s",
        "pub p50",
        "pub p99",
        "pub p99.9",
        "e2e p99",
        "max lag",
        "errors",
        if follower {
            format!(" {:>11} {:>9}", "flw lag", "flw ms")
        } else {
            String::new()
        }
    );
    for r in rows {
        let offered = r
            .offered_per_sec
            .map_or("max".to_string(), |o| format!("{o:.0}"));
        let ok = match (&r.failed, r.ok) {
            (Some(why), _) => format!(" FAILED: {why}"),
            (None, Some(true)) => " ok".to_string(),
            (None, Some(false)) => " FAIL".to_string(),
            (None, None) => String::new(),
        };
        let flw = if follower {
            format!(
                " {:>11} {:>9}",
                r.follower_lag_max_records
                    .map_or("-".into(), |x| x.to_string()),
                r.follower_lag_max_ms
                    .map_or("-".into(), |x| format!("{x:.0}"))
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            t,
            "{:<28} {:>11} {:>12.1} {:>9.2} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}{flw}{ok}",
            r.label,
            offered,
            r.records_per_sec,
            r.mb_per_sec,
            ms_text(r.publish_latency_ms.map(|p| p.p50)),
            ms_text(r.publish_latency_ms.map(|p| p.p99)),
            ms_text(r.publish_latency_ms.map(|p| p.p999)),
            ms_text(r.e2e_latency_ms.map(|p| p.p99)),
            lag_text(r.lag_max_records),
            r.errors
        );
    }
    t
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes the self-contained HTML report.
pub fn write_html(path: &Path, title: &str, runs: &[RunReport], rows: &[Row]) -> Result<()> {
    let html = render_html(title, runs, rows)?;
    std::fs::write(path, html).with_context(|| format!("writing {}", path.display()))
}

fn render_html(title: &str, runs: &[RunReport], rows: &[Row]) -> Result<String> {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title><style>\
         body{{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;\
         padding:3px 8px;text-align:right}}th{{background:#f0f0f0}}td:first-child{{text-align:left}}\
         h2{{margin-top:2em}}svg{{display:block;margin:1em 0}}</style></head><body><h1>{t}</h1>\
         <p>Latency is measured from each record's intended send time (open loop) or its \
         creation (closed loop, rate max); warm-up is excluded from all totals.</p>",
        t = escape(title)
    );
    if !rows.is_empty() {
        h.push_str("<h2>Comparison</h2>");
        h.push_str(&rows_table_html(rows));
        h.push_str(&comparison_svg(rows)?);
    }
    if !runs.is_empty() {
        h.push_str("<h2>Latency percentile distribution</h2>");
        h.push_str(&percentile_svg(runs)?);
        h.push_str("<h2>Throughput over time</h2>");
        h.push_str(&timeline_svg(
            runs,
            "records/s",
            |s| Some(s.records_per_sec),
            true,
        )?);
        h.push_str("<h2>Consumer lag over time</h2>");
        h.push_str(&timeline_svg(
            runs,
            "lag (records)",
            // A second whose sample failed has no point (unknown is not 0).
            |s| s.lag_records.map(|l| l as f64),
            false,
        )?);
        if runs.iter().any(|r| !r.summary.follower_lag.is_empty()) {
            h.push_str(
                "<h2>Follower lag over time</h2><p>The laggiest follower of the topic over \
                 all scraped nodes, once a second: the leader's log end minus the \
                 follower's last fetch offset (<code>weir_follower_lag_records</code>), and \
                 the time since the follower's fetch last reached the leader's log end \
                 (<code>weir_follower_caught_up_age_seconds</code>, the lag \
                 <code>replica.lag.time.max.ms</code> is measured against).</p>",
            );
            // A scrape that missed a node has no point (unknown is not 0).
            h.push_str(&follower_lag_svg(runs, "follower lag (records)", |p| {
                p.lag_records_max.map(|r| r as f64)
            })?);
            h.push_str(&follower_lag_svg(runs, "follower lag (ms)", |p| {
                p.lag_ms_max
            })?);
        }
        for r in runs {
            let _ = write!(
                h,
                "<h2>{}</h2><pre>{}</pre>",
                escape(&r.label),
                escape(&summary_text(&r.summary))
            );
        }
    }
    h.push_str("</body></html>\n");
    Ok(h)
}

fn rows_table_html(rows: &[Row]) -> String {
    let follower = rows.iter().any(|r| r.follower_lag_max_records.is_some());
    let mut t = String::from(
        "<table><tr><th>config</th><th>offered/s</th><th>records/s</th><th>MB/s</th>\
         <th>publish p50 ms</th><th>p99</th><th>p99.9</th><th>e2e p99 ms</th>\
         <th>max lag</th><th>errors</th><th>SLO</th>",
    );
    if follower {
        t.push_str("<th>follower lag max</th><th>follower lag max ms</th>");
    }
    t.push_str("</tr>");
    for r in rows {
        let _ = write!(
            t,
            "<tr><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.2}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            escape(&r.label),
            r.offered_per_sec
                .map_or("max".into(), |o| format!("{o:.0}")),
            r.records_per_sec,
            r.mb_per_sec,
            ms_text(r.publish_latency_ms.map(|p| p.p50)),
            ms_text(r.publish_latency_ms.map(|p| p.p99)),
            ms_text(r.publish_latency_ms.map(|p| p.p999)),
            ms_text(r.e2e_latency_ms.map(|p| p.p99)),
            lag_text(r.lag_max_records),
            r.errors,
            match (&r.failed, r.ok) {
                (Some(why), _) => format!("failed: {}", escape(why)),
                (None, Some(true)) => "met".to_string(),
                (None, Some(false)) => "missed".to_string(),
                (None, None) => String::new(),
            }
        );
        if follower {
            let _ = write!(
                t,
                "<td>{}</td><td>{}</td>",
                r.follower_lag_max_records
                    .map_or("-".into(), |x| x.to_string()),
                r.follower_lag_max_ms
                    .map_or("-".into(), |x| format!("{x:.0}"))
            );
        }
        t.push_str("</tr>");
    }
    t.push_str("</table>");
    t
}

fn color(i: usize) -> RGBAColor {
    Palette99::pick(i).mix(1.0)
}

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting failed: {e:?}")
}

/// Latency (log y) against percentile in "nines" (x), one line per run and kind.
fn percentile_svg(runs: &[RunReport]) -> Result<String> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in runs {
        for (kind, hist) in [("publish", &r.publish_us), ("end-to-end", &r.e2e_us)] {
            if let Some(h) = hist.as_ref().filter(|h| !h.is_empty()) {
                series.push((format!("{}: {kind}", r.label), percentile_points(h)));
            }
        }
    }
    if series.is_empty() {
        return Ok("<p>No latencies recorded.</p>".into());
    }
    let ys = || series.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y));
    let y_max = ys().fold(0.01f64, f64::max) * 1.5;
    let y_min = ys().fold(f64::MAX, f64::min).clamp(0.001, y_max / 10.0) / 1.5;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (PLOT_W, PLOT_H)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .margin_right(40)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..NINES_MAX, (y_min..y_max).log_scale())
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("latency ms (log)")
            .x_labels(6)
            .x_label_formatter(&|x| nines_label(*x))
            .draw()
            .map_err(plot_err)?;
        for (i, (name, pts)) in series.into_iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(pts, c.stroke_width(2)))
                .map_err(plot_err)?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 3), (x + 20, y + 3)], c.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(buf)
}

fn nines_label(x: f64) -> String {
    match x.round() as i64 {
        0 => "p0".into(),
        1 => "p90".into(),
        2 => "p99".into(),
        3 => "p99.9".into(),
        4 => "p99.99".into(),
        5 => "p99.999".into(),
        _ => String::new(),
    }
}

/// (nines, latency ms) points: q = 1 - 10^-nines.
fn percentile_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    (0..=NINES_STEPS)
        .map(|k| {
            let nines = NINES_MAX * f64::from(k) / f64::from(NINES_STEPS);
            let q = 1.0 - 10f64.powf(-nines);
            let ms = (h.value_at_quantile(q) as f64 / 1000.0).max(0.001);
            (nines, ms)
        })
        .collect()
}

/// One value per second over time, one line per run.
fn timeline_svg(
    runs: &[RunReport],
    y_desc: &str,
    value: impl Fn(&crate::stats::Second) -> Option<f64>,
    with_consumed: bool,
) -> Result<String> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in runs {
        let pts: Vec<(f64, f64)> = r
            .summary
            .timeline
            .iter()
            .filter_map(|s| Some((s.t_s, value(s)?)))
            .collect();
        series.push((r.label.clone(), pts));
        if with_consumed && r.summary.consumed_records > 0 {
            let pts = r.summary.timeline.iter();
            let pts = pts.map(|s| (s.t_s, s.consumed_per_sec)).collect();
            series.push((format!("{} consumed", r.label), pts));
        }
    }
    lines_svg(series, y_desc)
}

/// Follower lag over time, one line per run that scraped metrics.
fn follower_lag_svg(
    runs: &[RunReport],
    y_desc: &str,
    value: impl Fn(&crate::scrape::LagPoint) -> Option<f64>,
) -> Result<String> {
    let series = runs
        .iter()
        .filter(|r| !r.summary.follower_lag.is_empty())
        .map(|r| {
            let pts = r.summary.follower_lag.iter();
            let pts = pts.filter_map(|p| Some((p.t_s, value(p)?)));
            (r.label.clone(), pts.collect())
        })
        .collect();
    lines_svg(series, y_desc)
}

/// Named lines of (seconds since start, value) on one chart.
fn lines_svg(series: Vec<(String, Vec<(f64, f64)>)>, y_desc: &str) -> Result<String> {
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(x, _)| x))
        .fold(1.0f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (PLOT_W, PLOT_H)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("seconds since start")
            .y_desc(y_desc)
            .draw()
            .map_err(plot_err)?;
        for (i, (name, pts)) in series.into_iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(pts, c.stroke_width(2)))
                .map_err(plot_err)?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 3), (x + 20, y + 3)], c.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(buf)
}

/// A named value of a comparison row.
type Metric = (&'static str, fn(&Row) -> f64);

/// Bars of MB/s per row, with publish p99 (ms) as points on a second chart below.
fn comparison_svg(rows: &[Row]) -> Result<String> {
    let labels: Vec<String> = rows.iter().map(|r| r.label.clone()).collect();
    let n = rows.len() as f64;
    let mut out = String::new();
    let metrics: [Metric; 2] = [
        ("MB/s", |r| r.mb_per_sec),
        // A row without acks has no bar (plotted at 0; the tables say "-").
        ("publish p99 ms", |r| {
            r.publish_latency_ms.map_or(0.0, |p| p.p99)
        }),
    ];
    for (mi, (desc, f)) in metrics.iter().enumerate() {
        let y_max = rows.iter().map(f).fold(0.001f64, f64::max) * 1.15;
        let mut buf = String::new();
        {
            let root = SVGBackend::with_string(&mut buf, (PLOT_W, PLOT_H)).into_drawing_area();
            root.fill(&WHITE).map_err(plot_err)?;
            let mut chart = ChartBuilder::on(&root)
                .margin(10)
                .x_label_area_size(45)
                .y_label_area_size(70)
                .build_cartesian_2d(0.0..n, 0.0..y_max)
                .map_err(plot_err)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .y_desc(*desc)
                .x_labels(rows.len() * 2 + 1)
                .x_label_formatter(&|x| bar_label(&labels, *x))
                .draw()
                .map_err(plot_err)?;
            let c = color(mi);
            chart
                .draw_series(rows.iter().enumerate().map(|(i, r)| {
                    let x = i as f64;
                    Rectangle::new([(x + 0.15, 0.0), (x + 0.85, f(r))], c.filled())
                }))
                .map_err(plot_err)?;
            root.present().map_err(plot_err)?;
        }
        out.push_str(&buf);
    }
    Ok(out)
}

/// The label of the bar whose centre is at `x` (bars sit on [i, i+1)).
fn bar_label(labels: &[String], x: f64) -> String {
    let centre = x - 0.5;
    if (centre - centre.round()).abs() > 0.01 || centre < 0.0 {
        return String::new();
    }
    labels
        .get(centre.round() as usize)
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Recorder;

    /// No lag sample (a produce-only run) is shown as "-" and null, never as 0.
    #[test]
    fn an_unmeasured_lag_is_a_dash_not_zero() {
        let rec = Recorder::new(0);
        rec.record_acks([0], 1_000_000, 100);
        let s = rec.summary(1_000_000_000);
        let row = Row::from_summary("acks=1", None, &s);
        assert_eq!(row.lag_max_records, None);
        let j = serde_json::to_value(&row).unwrap_or_default();
        assert!(j["lag_max_records"].is_null(), "{j}");
        let line = table_text(std::slice::from_ref(&row));
        let cells: Vec<&str> = line
            .lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        // config, offered, records/s, MB/s, p50, p99, p99.9, e2e p99, max lag, errors
        assert_eq!(cells.get(8), Some(&"-"), "{line}");
        let html = rows_table_html(&[row]);
        assert!(html.contains("<td>-</td><td>-</td><td>0</td>"), "{html}");
        let mut consumed = s.clone();
        consumed.consumed_records = 5;
        let text = summary_text(&consumed);
        assert!(text.contains("max lag - (no sample)"), "{text}");
    }

    #[test]
    fn html_report_is_self_contained_with_plots() {
        let rec = Recorder::new(0);
        for i in 1..=2000u64 {
            rec.record_acks([i * 1_000_000], i * 1_000_000 + i * 1_000, 1024);
            if i % 1000 == 0 {
                rec.tick(i * 1_000_000);
            }
        }
        let mut s = rec.summary(2_000_000_000);
        s.set_follower_lag(
            (0..3u32)
                .map(|i| crate::scrape::LagPoint {
                    t_s: f64::from(i),
                    warmup: false,
                    lag_records_max: Some(100 * u64::from(i)),
                    lag_ms_max: Some(2.0),
                    series: 3,
                })
                .collect(),
        );
        let run = RunReport {
            label: "acks=1".into(),
            publish_us: Some(rec.publish_histogram()),
            e2e_us: None,
            summary: s.clone(),
        };
        let rows = vec![Row::from_summary("acks=1 1024B", None, &s)];
        let html = render_html("test <report>", &[run], &rows).expect("render");
        assert!(html.contains("test &lt;report&gt;"));
        assert!(
            html.matches("<svg").count() >= 7,
            "comparison x2, percentiles, rate, lag, follower lag records and ms"
        );
        assert!(html.contains("Follower lag over time"));
        assert!(
            html.contains("<td>200</td><td>2</td>"),
            "follower lag maxima in the table"
        );
        assert!(!html.contains("<script"), "no scripts");
        assert!(!html.contains("src=\"http"), "no external resources");
        assert!(html.contains("acks=1 1024B"));
    }
}
