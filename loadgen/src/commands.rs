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
    pub partitions: i32,
    /// Highest offered rate that met the SLO and kept lag bounded (records/s).
    pub sustainable_records_per_sec: f64,
    pub sustainable_mb_per_sec: f64,
    pub target_mbps: Option<f64>,
    /// Partitions (each its own shard's work) needed for the target at this per-partition
    /// rate, assuming partitions scale linearly until the node's limit.
    pub partitions_needed: Option<u64>,
    /// Whether the target fits one node at all (the whole-node sustainable rate measured).
    pub fits_one_node: Option<bool>,
}

/// Raises the offered rate step by step until the SLO or bounded lag fails.
pub fn plan(p: &Plan) -> Result<Vec<Capacity>> {
    let sizes = parse_list(&p.record_sizes, |x| Ok(x.parse::<usize>()?))?;
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    let mut caps = Vec::new();
    for size in sizes {
        let mut l = p.load.clone();
        l.record_size = size;
        l.json = None;
        l.report = None;
        l.quiet = true;
        if l.duration.is_none() {
            l.duration = Some(Duration::from_secs(10));
        }
        let best = plan_steps(p, &l, &mut rows, &mut runs);
        let mbps = best * size as f64 / crate::stats::BYTES_PER_MB;
        let per_partition = mbps / f64::from(l.partitions.max(1));
        let needed = p
            .target_mbps
            .filter(|_| per_partition > 0.0)
            .map(|t| (t / per_partition).ceil() as u64);
        caps.push(Capacity {
            record_size: size,
            acks: l.acks.clone(),
            partitions: l.partitions,
            sustainable_records_per_sec: best,
            sustainable_mb_per_sec: mbps,
            target_mbps: p.target_mbps,
            partitions_needed: needed,
            fits_one_node: p.target_mbps.map(|t| t <= mbps),
        });
    }
    print!("{}", report::table_text(&rows));
    print!("{}", capacity_text(&caps));
    write_outputs(&p.load, "plan", &rows, &runs, Some(&caps))?;
    steps_failed(&rows)?;
    Ok(caps)
}

/// One record size: returns the highest rate that held.
/// A step that fails (an error, or nothing acknowledged) is a failed row and ends the
/// search for this record size.
fn plan_steps(p: &Plan, l: &Load, rows: &mut Vec<Row>, runs: &mut Vec<RunReport>) -> f64 {
    let mut rate = p.start_rate.max(1.0);
    let mut best = 0.0;
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
        let s = &r.summary;
        // Delivering less than 95% of the offered records is a failure too (errors or a
        // client that cannot keep up); timeliness is the latency SLO's job.
        let offered = rate * spec.duration.map_or(0.0, |d| d.as_secs_f64());
        let kept_up = s.records as f64 >= offered * 0.95;
        let p99 = s.publish_latency_ms.map(|l| l.p99);
        // No acks at all is no latency to meet the SLO with.
        let ok = p99.is_some_and(|l| l <= p.slo_p99_ms)
            && s.lag_max_records <= p.max_lag_records
            && kept_up
            && s.errors.is_empty();
        println!(
            "{label}: {:.0} records/s, publish p99 {} ms, max lag {} → {}",
            s.records_per_sec,
            crate::stats::ms_text(p99),
            s.lag_max_records,
            if ok { "ok" } else { "missed" }
        );
        let mut row = Row::from_summary(&label, Some(rate), s);
        row.ok = Some(ok);
        row.failed = nothing_done(&r, true, false);
        rows.push(row);
        runs.push(RunReport {
            label,
            summary: r.summary.clone(),
            publish_us: Some(r.publish_us),
            e2e_us: Some(r.e2e_us),
        });
        if !ok {
            break;
        }
        best = rate;
        rate *= p.step_factor.max(1.05);
    }
    best
}

fn capacity_text(caps: &[Capacity]) -> String {
    let mut t = String::from("\ncapacity (highest rate meeting the SLO with bounded lag):\n");
    for c in caps {
        t.push_str(&format!(
            "  {} B records, acks={}, {} partition(s): {:.0} records/s = {:.2} MB/s",
            c.record_size,
            c.acks,
            c.partitions,
            c.sustainable_records_per_sec,
            c.sustainable_mb_per_sec
        ));
        if let (Some(target), Some(n)) = (c.target_mbps, c.partitions_needed) {
            t.push_str(&format!(
                "; for {target} MB/s: ≥ {n} partitions/shards at this per-partition rate{}",
                if c.fits_one_node == Some(false) {
                    " — beyond what one node sustained here: more nodes"
                } else {
                    ""
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
