//! The subcommands: produce, consume, e2e, sweep, plan, quickstart (verify has its own module).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::broker::{Broker, find_weir};
use crate::cli::{self, Load, Plan, Quickstart, Sweep, acks_label, parse_acks, parse_list};
use crate::client::consumer::{NoRecordSink, StartAt};
use crate::client::producer::NoSink;
use crate::report::{self, Row, RunReport};
use crate::run::{self, RunResult};
use crate::schedule::Rate;

/// Runs one load and prints/writes its results.
pub fn single(load: &Load, produce: bool, consume: bool, title: &str) -> Result<RunResult> {
    let start = if produce {
        StartAt::Latest
    } else {
        StartAt::Earliest
    };
    let spec = load.spec(start)?;
    let r = run::run(
        &spec,
        produce,
        consume,
        Arc::new(NoSink),
        Arc::new(NoRecordSink),
    )?;
    print!("{}", report::summary_text(&r.summary));
    if let Some(p) = &load.json {
        report::write_json(p, &r.summary)?;
    }
    if let Some(p) = &load.report {
        let run = RunReport {
            label: title.to_string(),
            summary: r.summary.clone(),
            publish_us: produce.then(|| r.publish_us.clone()),
            e2e_us: consume.then(|| r.e2e_us.clone()),
        };
        report::write_html(p, &format!("weir-loadgen {title}"), &[run], &[])?;
        println!("report written to {}", p.display());
    }
    if let Some(why) = nothing_done(&r, produce, consume) {
        bail!("{title}: {why}");
    }
    Ok(r)
}

/// Why a run measured nothing (no record acknowledged or none consumed), if it did not.
fn nothing_done(r: &RunResult, produce: bool, consume: bool) -> Option<String> {
    if produce && r.summary.records == 0 {
        Some("no record was acknowledged".to_string())
    } else if consume && r.summary.consumed_records == 0 {
        Some("no record was consumed".to_string())
    } else {
        None
    }
}

/// Fails a sweep or plan whose steps failed, after its table and files were written.
fn steps_failed(rows: &[Row]) -> Result<()> {
    let failed = rows.iter().filter(|r| r.failed.is_some()).count();
    if failed > 0 {
        bail!("{failed} of {} steps failed", rows.len());
    }
    Ok(())
}

/// The JSON of a sweep or plan: one row per configuration.
#[derive(Serialize)]
struct Table<'a, T: Serialize> {
    rows: &'a [Row],
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<T>,
}

/// Runs e2e (or produce) for every acks × record size; one table.
pub fn sweep(s: &Sweep) -> Result<Vec<Row>> {
    let acks = parse_list(&s.load.acks, parse_acks)?;
    let sizes = parse_list(&s.record_sizes, |x| Ok(x.parse::<usize>()?))?;
    let (rows, runs) = sweep_runs(&s.load, &acks, &sizes, !s.produce_only, s.settle_timeout);
    print!("{}", report::table_text(&rows));
    write_outputs(&s.load, "sweep", &rows, &runs, None::<()>)?;
    if run::interrupted() {
        bail!("interrupted");
    }
    steps_failed(&rows)?;
    Ok(rows)
}

fn sweep_runs(
    load: &Load,
    acks: &[i16],
    sizes: &[usize],
    consume: bool,
    settle_timeout: Duration,
) -> (Vec<Row>, Vec<RunReport>) {
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for &size in sizes {
        for &a in acks {
            if run::interrupted() {
                return (rows, runs);
            }
            if !runs.is_empty() && !load.metrics_urls.is_empty() {
                settle(&load.metrics_urls, &load.topic, settle_timeout);
            }
            let mut l = load.clone();
            l.acks = acks_label(a).to_string();
            l.record_size = size;
            l.json = None;
            l.report = None;
            let label = format!("acks={} {}B", acks_label(a), size);
            println!("== {label}");
            let offered = match l.rate {
                Rate::PerSec(x) => Some(x),
                Rate::Max => None,
            };
            // A failed step is a row saying so; the others still run.
            let r = l.spec(StartAt::Latest).and_then(|spec| {
                run::run(
                    &spec,
                    true,
                    consume,
                    Arc::new(NoSink),
                    Arc::new(NoRecordSink),
                )
            });
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    println!("{label}: failed: {e:#}");
                    rows.push(Row::failed(&label, offered, format!("{e:#}")));
                    continue;
                }
            };
            print!("{}", report::summary_text(&r.summary));
            let mut row = Row::from_summary(&label, offered, &r.summary);
            row.failed = nothing_done(&r, true, consume);
            rows.push(row);
            runs.push(RunReport {
                label,
                summary: r.summary,
                publish_us: Some(r.publish_us),
                e2e_us: consume.then_some(r.e2e_us),
            });
        }
    }
    (rows, runs)
}

/// Waits (bounded) until the scraped followers of `topic` have caught up, and says so.
fn settle(urls: &[String], topic: &str, timeout: Duration) {
    match crate::scrape::wait_caught_up(urls, topic, timeout) {
        Ok(waited) if waited > Duration::from_secs(1) => {
            println!("followers caught up after {:.1} s", waited.as_secs_f64());
        }
        Ok(_) => {}
        Err(e) => println!("followers not caught up: {e:#}; measuring anyway"),
    }
}

fn write_outputs<T: Serialize>(
    load: &Load,
    title: &str,
    rows: &[Row],
    runs: &[RunReport],
    capacity: Option<T>,
) -> Result<()> {
    if let Some(p) = &load.json {
        report::write_json(p, &Table { rows, capacity })?;
    }
    if let Some(p) = &load.report {
        report::write_html(p, &format!("weir-loadgen {title}"), runs, rows)?;
        println!("report written to {}", p.display());
    }
    Ok(())
}

/// The capacity answer of `plan` for one record size.
#[derive(Clone, Debug, Serialize)]
pub struct Capacity {
    pub record_size: usize,
    pub acks: String,
    /// The topic's partitions as the runs found them (`--partitions` only applies when
    /// the topic is created).
    pub partitions: i32,
    /// Highest offered rate that met the SLO and kept lag bounded (records/s); a lower
    /// bound when `limit_reached` is false.
    pub sustainable_records_per_sec: f64,
    pub sustainable_mb_per_sec: f64,
    /// Whether a step missed the SLO. False: every step that ran met it (the steps ran
    /// out, or one failed), so the capacity is at least `sustainable_records_per_sec`.
    pub limit_reached: bool,
    pub target_mbps: Option<f64>,
    /// Partitions (each its own shard's work) needed for the target at this per-partition
    /// rate, assuming partitions scale linearly until the node's limit (at most this many
    /// when the limit was not reached: the per-partition rate is then a lower bound).
    pub partitions_needed: Option<u64>,
    /// Whether the target fits one node at all (the whole-node sustainable rate measured);
    /// `None` when unknown (the target lies beyond a limit that was not reached).
    pub fits_one_node: Option<bool>,
}

/// How the search of one record size ended.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Search {
    /// The highest rate that met the SLO (0: none did).
    best: f64,
    /// A step missed the SLO (rather than the steps running out or one failing).
    limit_reached: bool,
    /// The topic's partitions as the last run that ran found them.
    partitions: Option<usize>,
}

/// The capacity of one record size from its search, for `partitions` partitions.
fn capacity(
    size: usize,
    acks: &str,
    partitions: i32,
    search: &Search,
    target_mbps: Option<f64>,
) -> Capacity {
    let mbps = search.best * size as f64 / crate::stats::BYTES_PER_MB;
    let per_partition = mbps / f64::from(partitions.max(1));
    let needed = target_mbps
        .filter(|_| per_partition > 0.0)
        .map(|t| (t / per_partition).ceil() as u64);
    // Beyond an unreached limit nothing was measured: fitting is then unknown.
    let fits = target_mbps.and_then(|t| (t <= mbps || search.limit_reached).then_some(t <= mbps));
    Capacity {
        record_size: size,
        acks: acks.to_string(),
        partitions,
        sustainable_records_per_sec: search.best,
        sustainable_mb_per_sec: mbps,
        limit_reached: search.limit_reached,
        target_mbps,
        partitions_needed: needed,
        fits_one_node: fits,
    }
}

/// The partition count capacity is per: the topic's own (what the runs measured), with
/// a note when it is not what `--partitions` said; the flag when no run found out.
fn plan_partitions(flag: i32, measured: Option<usize>, topic: &str) -> (i32, Option<String>) {
    let Some(n) = measured.and_then(|n| i32::try_from(n).ok()) else {
        return (flag, None);
    };
    let note = (n != flag).then(|| {
        format!(
            "topic {topic} has {n} partition(s), not --partitions {flag} (which applies only \
             when the topic is created): capacity is per {n} partition(s)"
        )
    });
    (n, note)
}

/// Raises the offered rate step by step until the SLO or bounded lag fails.
pub fn plan(p: &Plan) -> Result<Vec<Capacity>> {
    let sizes = parse_list(&p.record_sizes, |x| Ok(x.parse::<usize>()?))?;
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    let mut caps = Vec::new();
    let mut notes = Vec::new();
    for size in sizes {
        let mut l = p.load.clone();
        l.record_size = size;
        l.json = None;
        l.report = None;
        l.quiet = true;
        if l.duration.is_none() {
            l.duration = Some(Duration::from_secs(10));
        }
        let search = plan_steps(p, &l, &mut rows, &mut runs);
        let (partitions, note) = plan_partitions(l.partitions, search.partitions, &l.topic);
        if let Some(n) = note.filter(|n| !notes.contains(n)) {
            println!("{n}");
            notes.push(n);
        }
        caps.push(capacity(size, &l.acks, partitions, &search, p.target_mbps));
    }
    print!("{}", report::table_text(&rows));
    for n in &notes {
        println!("{n}");
    }
    print!("{}", capacity_text(&caps));
    write_outputs(&p.load, "plan", &rows, &runs, Some(&caps))?;
    steps_failed(&rows)?;
    Ok(caps)
}

/// One record size: the highest rate that held, and whether a step missed the SLO.
/// A step that fails (an error, or nothing acknowledged) is a failed row and ends the
/// search for this record size.
fn plan_steps(p: &Plan, l: &Load, rows: &mut Vec<Row>, runs: &mut Vec<RunReport>) -> Search {
    let mut rate = p.start_rate.max(1.0);
    let mut search = Search {
        best: 0.0,
        limit_reached: false,
        partitions: None,
    };
    for _ in 0..p.max_steps {
        let mut step = l.clone();
        step.rate = Rate::PerSec(rate);
        let label = format!("{}B @ {:.0}/s", step.record_size, rate);
        let run = step.spec(StartAt::Latest).and_then(|spec| {
            let r = run::run(&spec, true, true, Arc::new(NoSink), Arc::new(NoRecordSink))?;
            Ok((spec, r))
        });
        let (spec, r) = match run {
            Ok(x) => x,
            Err(e) => {
                println!("{label}: failed: {e:#}");
                let mut row = Row::failed(&label, Some(rate), format!("{e:#}"));
                row.ok = Some(false);
                rows.push(row);
                break;
            }
        };
        search.partitions = Some(r.partitions);
        let s = &r.summary;
        let ok = step_ok(p, rate, spec.duration, s);
        println!(
            "{label}: {:.0} records/s, publish p99 {} ms, max lag {} → {}",
            s.records_per_sec,
            crate::stats::ms_text(s.publish_latency_ms.map(|l| l.p99)),
            report::lag_text(s.lag_max_records),
            if ok { "ok" } else { "missed" }
        );
        let mut row = Row::from_summary(&label, Some(rate), s);
        row.ok = Some(ok);
        row.failed = nothing_done(&r, true, false);
        let failed = row.failed.is_some();
        rows.push(row);
        runs.push(RunReport {
            label,
            summary: r.summary.clone(),
            publish_us: Some(r.publish_us),
            e2e_us: Some(r.e2e_us),
        });
        if failed {
            break;
        }
        if !ok {
            search.limit_reached = true;
            break;
        }
        search.best = rate;
        rate *= p.step_factor.max(1.05);
    }
    search
}

/// Whether one step at `rate` met the SLO: publish p99 within it, a lag measured and
/// bounded, at least 95% of the offered records acknowledged, and no error.
fn step_ok(p: &Plan, rate: f64, duration: Option<Duration>, s: &crate::stats::Summary) -> bool {
    // Delivering less than 95% of the offered records is a failure too (errors or a
    // client that cannot keep up); timeliness is the latency SLO's job.
    let offered = rate * duration.map_or(0.0, |d| d.as_secs_f64());
    let kept_up = s.records as f64 >= offered * 0.95;
    // No acks at all is no latency to meet the SLO with; no lag sample is no lag shown
    // to be bounded.
    s.publish_latency_ms.is_some_and(|l| l.p99 <= p.slo_p99_ms)
        && s.lag_max_records.is_some_and(|l| l <= p.max_lag_records)
        && kept_up
        && s.errors.is_empty()
}

fn capacity_text(caps: &[Capacity]) -> String {
    let mut t = String::from("\ncapacity (highest rate meeting the SLO with bounded lag):\n");
    for c in caps {
        // Every step met the SLO: the capacity is at least this, not this.
        let at_least = if c.limit_reached { "" } else { "≥ " };
        t.push_str(&format!(
            "  {} B records, acks={}, {} partition(s): {at_least}{:.0} records/s = \
             {at_least}{:.2} MB/s",
            c.record_size,
            c.acks,
            c.partitions,
            c.sustainable_records_per_sec,
            c.sustainable_mb_per_sec
        ));
        if !c.limit_reached {
            t.push_str(" (limit not reached: no step missed the SLO; raise --max-steps)");
        }
        if let (Some(target), Some(n)) = (c.target_mbps, c.partitions_needed) {
            let (bound, why) = if c.limit_reached {
                ("≥ ", "")
            } else {
                ("≤ ", ", itself a lower bound")
            };
            t.push_str(&format!(
                "; for {target} MB/s: {bound}{n} partitions/shards at this per-partition rate{why}{}",
                match c.fits_one_node {
                    Some(false) => " — beyond what one node sustained here: more nodes",
                    None => " — beyond the rates tried: whether one node suffices is unknown",
                    Some(true) => "",
                }
            ));
        }
        t.push('\n');
    }
    t
}

/// Starts a temporary weir (or uses --bootstrap) and sweeps acks 0/1/all. Ctrl-C or
/// SIGTERM ends the sweep early and still removes the data dir and stops the broker (the
/// broker also gets SIGTERM if the loadgen dies without cleaning up).
pub fn quickstart(q: &Quickstart) -> Result<Vec<Row>> {
    run::stop_on_signals();
    let tmp;
    let _broker;
    let bootstrap = match &q.bootstrap {
        Some(b) => b.clone(),
        None if !q
            .security
            .security_protocol
            .eq_ignore_ascii_case("PLAINTEXT") =>
        {
            bail!("--security-protocol needs --bootstrap (the temporary weir is plaintext)")
        }
        None => {
            let weir = find_weir()?;
            // Under the system temp dir ($TMPDIR), not the current one.
            tmp = tempfile::Builder::new()
                .prefix("weir-quickstart-")
                .tempdir()
                .context("creating a data dir")?;
            println!(
                "starting {} (data in {})",
                weir.display(),
                tmp.path().display()
            );
            let b = Broker::start(&weir, tmp.path(), 1, &[])?;
            let addr = b.addr.clone();
            _broker = b;
            addr
        }
    };
    let load = quickstart_load(&bootstrap, q.duration, &q.report, q.json.as_deref());
    let s = Sweep {
        load,
        record_sizes: "1024".into(),
        produce_only: false,
        settle_timeout: Duration::from_secs(120),
    };
    sweep(&s)
}

fn quickstart_load(bootstrap: &str, d: Duration, report: &Path, json: Option<&Path>) -> Load {
    use clap::Parser;
    // The defaults of `weir-loadgen e2e`, then the quickstart's own choices.
    let cli = cli::Cli::parse_from(["weir-loadgen", "e2e"]);
    let cli::Cmd::E2e(mut l) = cli.cmd else {
        unreachable!("parsed the e2e subcommand")
    };
    l.bootstrap = bootstrap.to_string();
    l.topic = "weir-quickstart".into();
    l.acks = "0,1,all".into();
    l.duration = Some(d);
    l.warmup = Duration::from_secs(1);
    l.report = Some(report.to_path_buf());
    l.json = json.map(Path::to_path_buf);
    l.quiet = true;
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(best: f64, limit_reached: bool) -> Search {
        Search {
            best,
            limit_reached,
            partitions: Some(2),
        }
    }

    /// Every step met the SLO: the last rate tried is a lower bound, said so in the
    /// text ("≥") and the JSON (`limit_reached: false`), and whether a target beyond it
    /// fits one node is unknown, not "no".
    #[test]
    fn a_plan_whose_steps_all_passed_did_not_reach_the_limit() {
        let c = capacity(1024, "all", 2, &search(80_000.0, false), Some(1000.0));
        let text = capacity_text(std::slice::from_ref(&c));
        assert!(text.contains("≥ 80000 records/s = ≥ 78.12 MB/s"), "{text}");
        assert!(text.contains("limit not reached"), "{text}");
        assert!(text.contains("≤ 26 partitions"), "{text}");
        assert!(!text.contains("more nodes"), "{text}");
        let j = serde_json::to_value(&c).unwrap_or_default();
        assert_eq!(j["limit_reached"], false, "{j}");
        assert!(j["fits_one_node"].is_null(), "{j}");
        // A target within what was measured fits, limit or not.
        let c = capacity(1024, "all", 2, &search(80_000.0, false), Some(10.0));
        assert_eq!(c.fits_one_node, Some(true));
        // A step missed the SLO: the capacity is the highest rate that met it.
        let c = capacity(1024, "all", 2, &search(80_000.0, true), Some(1000.0));
        let text = capacity_text(std::slice::from_ref(&c));
        assert!(text.contains(": 80000 records/s = 78.12 MB/s"), "{text}");
        assert!(text.contains("≥ 26 partitions"), "{text}");
        assert!(text.contains("more nodes"), "{text}");
        assert_eq!(c.fits_one_node, Some(false));
        let j = serde_json::to_value(&c).unwrap_or_default();
        assert_eq!(j["limit_reached"], true, "{j}");
    }

    /// Capacity is per the topic's partitions, which the runs found: `--partitions` only
    /// applies when the topic is created, and a topic that already existed keeps its own.
    #[test]
    fn capacity_is_per_the_topics_own_partitions() {
        let (n, note) = plan_partitions(1, Some(4), "plan");
        assert_eq!(n, 4);
        let note = note.expect("the flag differs");
        assert!(
            note.contains("4 partition(s), not --partitions 1"),
            "{note}"
        );
        assert_eq!(plan_partitions(4, Some(4), "plan"), (4, None));
        assert_eq!(plan_partitions(3, None, "plan"), (3, None), "nothing ran");
        // 4 partitions at 8 MB/s together: 2 MB/s each, 50 for 100 MB/s.
        let rate = 8.0 * crate::stats::BYTES_PER_MB / 1000.0;
        let c = capacity(1000, "1", n, &search(rate, true), Some(100.0));
        assert_eq!((c.partitions, c.partitions_needed), (4, Some(50)));
    }
}
