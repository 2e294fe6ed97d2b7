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
use crate::stats::LAG_UNKNOWN;

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
    if let Some(why) = run_failed(&r, produce, consume) {
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

/// Why a run's numbers cannot stand, if they cannot: it measured nothing, or (`e2e`) its
/// consumers stopped before reading every acknowledged record, so its consumed counts and
/// e2e latencies leave records out.
fn run_failed(r: &RunResult, produce: bool, consume: bool) -> Option<String> {
    nothing_done(r, produce, consume).or_else(|| {
        (produce && consume)
            .then(|| r.consumers_behind.clone())
            .flatten()
    })
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
            row.failed = run_failed(&r, true, consume);
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
    /// How the search ended (`limit_reached` says whether it found the limit).
    #[serde(skip)]
    pub ended: SearchEnd,
    pub target_mbps: Option<f64>,
    /// Partitions (each its own shard's work) needed for the target at this per-partition
    /// rate, assuming partitions scale linearly until the node's limit (at most this many
    /// when the limit was not reached: the per-partition rate is then a lower bound).
    pub partitions_needed: Option<u64>,
    /// Whether the target fits one node at all (the whole-node sustainable rate measured);
    /// `None` when unknown (the target lies beyond a limit that was not reached).
    pub fits_one_node: Option<bool>,
}

/// Why the search of one record size stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SearchEnd {
    /// A step missed the SLO: the limit lies between it and the step before.
    Missed,
    /// Every step met the SLO and `--max-steps` ran out.
    #[default]
    StepsRanOut,
    /// A step failed (an error, nothing acknowledged, consumers that never caught up).
    StepFailed,
    /// A step had no lag sample: whether its lag stayed bounded is unknown.
    LagUnmeasured,
}

/// How the search of one record size ended.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Search {
    /// The highest rate that met the SLO (0: none did).
    best: f64,
    ended: SearchEnd,
    /// The topic's partitions as the last run that ran found them.
    partitions: Option<usize>,
}

impl Search {
    /// A step missed the SLO (rather than the steps running out, one failing or its lag
    /// going unmeasured).
    fn limit_reached(&self) -> bool {
        self.ended == SearchEnd::Missed
    }
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
    let reached = search.limit_reached();
    let fits = target_mbps.and_then(|t| (t <= mbps || reached).then_some(t <= mbps));
    Capacity {
        record_size: size,
        acks: acks.to_string(),
        partitions,
        sustainable_records_per_sec: search.best,
        sustainable_mb_per_sec: mbps,
        limit_reached: reached,
        ended: search.ended,
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

/// One record size: the highest rate that held, and how the search ended. A step that
/// fails (an error, nothing acknowledged, or no lag measured) is a failed row and ends the
/// search for this record size.
fn plan_steps(p: &Plan, l: &Load, rows: &mut Vec<Row>, runs: &mut Vec<RunReport>) -> Search {
    let mut rate = p.start_rate.max(1.0);
    let mut search = Search {
        best: 0.0,
        ended: SearchEnd::StepsRanOut,
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
                search.ended = SearchEnd::StepFailed;
                break;
            }
        };
        search.partitions = Some(r.partitions);
        let s = &r.summary;
        let verdict = step_verdict(p, rate, spec.duration, s, r.consumers_behind.is_some());
        println!(
            "{label}: {:.0} records/s, publish p99 {} ms, max lag {} → {}",
            s.records_per_sec,
            crate::stats::ms_text(s.publish_latency_ms.map(|l| l.p99)),
            report::lag_text(s.lag_max_records),
            verdict.text()
        );
        let mut row = Row::from_summary(&label, Some(rate), s);
        row.ok = (verdict != Verdict::LagUnmeasured).then_some(verdict == Verdict::Met);
        row.failed = nothing_done(&r, true, false);
        if row.failed.is_none() && verdict == Verdict::LagUnmeasured {
            row.failed = Some(lag_unmeasured(s.lag_unknown_samples));
        }
        let failed = row.failed.is_some();
        rows.push(row);
        runs.push(RunReport {
            label,
            summary: r.summary.clone(),
            publish_us: Some(r.publish_us),
            e2e_us: Some(r.e2e_us),
        });
        if failed {
            search.ended = match verdict {
                Verdict::LagUnmeasured => SearchEnd::LagUnmeasured,
                Verdict::Met | Verdict::Missed => SearchEnd::StepFailed,
            };
            break;
        }
        if verdict == Verdict::Missed {
            search.ended = SearchEnd::Missed;
            break;
        }
        search.best = rate;
        rate *= p.step_factor.max(1.05);
    }
    search
}

/// What one step of a plan showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Publish p99 within the SLO, lag measured and bounded, at least 95% of the offered
    /// records acknowledged, no error, and the consumers read every acknowledged record.
    Met,
    /// One of those failed: the limit.
    Missed,
    /// All of those held but no lag sample succeeded: the lag is unknown, neither
    /// bounded nor 0, so the step says nothing about the limit.
    LagUnmeasured,
}

impl Verdict {
    fn text(self) -> &'static str {
        match self {
            Verdict::Met => "ok",
            Verdict::Missed => "missed",
            Verdict::LagUnmeasured => "lag not measured",
        }
    }
}

/// A step's failure when no lag sample succeeded (`failed` of them failed).
fn lag_unmeasured(failed: u64) -> String {
    format!("lag not measured: no lag sample succeeded ({failed} failed)")
}

/// What one step at `rate` showed against the SLO (see [`Verdict`]). `behind`: its
/// consumers stopped before reading every acknowledged record.
fn step_verdict(
    p: &Plan,
    rate: f64,
    duration: Option<Duration>,
    s: &crate::stats::Summary,
    behind: bool,
) -> Verdict {
    // Delivering less than 95% of the offered records is a failure too (errors or a
    // client that cannot keep up); timeliness is the latency SLO's job.
    let offered = rate * duration.map_or(0.0, |d| d.as_secs_f64());
    let kept_up = s.records as f64 >= offered * 0.95;
    // No acks at all is no latency to meet the SLO with.
    let p99_ok = s.publish_latency_ms.is_some_and(|l| l.p99 <= p.slo_p99_ms);
    let lag_ok = s.lag_max_records.is_none_or(|l| l <= p.max_lag_records);
    // A failed lag sample is an error like any other, unless none succeeded: then the
    // lag is unknown, said as such, not taken for the limit.
    let errors = s
        .errors
        .keys()
        .any(|k| k != LAG_UNKNOWN || s.lag_max_records.is_some());
    if !(p99_ok && lag_ok && kept_up && !errors && !behind) {
        Verdict::Missed
    } else if s.lag_max_records.is_none() {
        Verdict::LagUnmeasured
    } else {
        Verdict::Met
    }
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
        t.push_str(match c.ended {
            SearchEnd::Missed => "",
            SearchEnd::StepsRanOut => {
                " (limit not reached: no step missed the SLO; raise --max-steps)"
            }
            SearchEnd::StepFailed => {
                " (limit not reached: a step failed before any missed the SLO; see its row)"
            }
            SearchEnd::LagUnmeasured => {
                " (limit not reached: a step's lag was not measured; see its row)"
            }
        });
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
        let ended = if limit_reached {
            SearchEnd::Missed
        } else {
            SearchEnd::StepsRanOut
        };
        Search {
            best,
            ended,
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
        assert!(!text.contains("raise --max-steps"), "{text}");
        // A step failed: the limit was not reached, and more steps would not have helped.
        let failed = Search {
            ended: SearchEnd::StepFailed,
            ..search(80_000.0, false)
        };
        let c = capacity(1024, "all", 2, &failed, Some(1000.0));
        let text = capacity_text(std::slice::from_ref(&c));
        assert!(text.contains("≥ 80000 records/s"), "{text}");
        assert!(text.contains("a step failed"), "{text}");
        assert!(!text.contains("raise --max-steps"), "{text}");
        assert!(!c.limit_reached);
    }

    fn plan() -> Plan {
        use clap::Parser;
        let cli = cli::Cli::parse_from(["weir-loadgen", "plan", "--slo-p99-ms", "50"]);
        let cli::Cmd::Plan(p) = cli.cmd else {
            unreachable!("parsed the plan subcommand")
        };
        p
    }

    /// A step of 1,000 records/s for 1 s that acknowledged them all within the SLO.
    fn step(lag: Option<i64>, errors: &[&str]) -> crate::stats::Summary {
        let p99 = crate::stats::Percentiles {
            p99: 10.0,
            ..Default::default()
        };
        crate::stats::Summary {
            records: 1_000,
            publish_latency_ms: Some(p99),
            lag_max_records: lag,
            lag_unknown_samples: errors.iter().filter(|e| **e == LAG_UNKNOWN).count() as u64,
            errors: errors.iter().map(|e| (e.to_string(), 1)).collect(),
            ..Default::default()
        }
    }

    /// A step without a lag sample is not the limit (its lag is unknown, not 0 and not
    /// unbounded) whether no sample was taken or every one failed; with a sample, a
    /// failed one is an error like any other. Consumers left behind miss the SLO.
    #[test]
    fn a_step_without_a_lag_sample_is_unmeasured_not_the_limit() {
        let (p, d) = (plan(), Some(Duration::from_secs(1)));
        let verdict = |s: &crate::stats::Summary, behind| step_verdict(&p, 1_000.0, d, s, behind);
        assert_eq!(verdict(&step(Some(10), &[]), false), Verdict::Met);
        assert_eq!(verdict(&step(None, &[]), false), Verdict::LagUnmeasured);
        assert_eq!(
            verdict(&step(None, &[LAG_UNKNOWN]), false),
            Verdict::LagUnmeasured
        );
        assert_eq!(
            verdict(&step(Some(10), &[LAG_UNKNOWN]), false),
            Verdict::Missed
        );
        assert_eq!(
            verdict(&step(None, &["NotLeaderOrFollower"]), false),
            Verdict::Missed
        );
        assert_eq!(verdict(&step(Some(10), &[]), true), Verdict::Missed);
        let over = step(Some(p.max_lag_records + 1), &[]);
        assert_eq!(verdict(&over, false), Verdict::Missed);
        assert!(lag_unmeasured(2).contains("lag not measured"));
        let unmeasured = Search {
            ended: SearchEnd::LagUnmeasured,
            ..search(0.0, false)
        };
        let c = capacity(1024, "all", 2, &unmeasured, None);
        let text = capacity_text(std::slice::from_ref(&c));
        assert!(!c.limit_reached);
        assert!(text.contains("lag was not measured"), "{text}");
        assert!(!text.contains("raise --max-steps"), "{text}");
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
