//! Kafka's checkpoint text format, shared by every checkpoint file weir keeps in Kafka's
//! shape (`leader-epoch-checkpoint`, `replication-offset-checkpoint`): a version line
//! (`0`), the entry count, then one line per entry of whitespace-separated fields. Each
//! file gives its entries' meaning; this module only frames them, and refuses any
//! deviation (as Kafka's reader does) so a damaged file is an error, never a guess.

/// The only version Kafka has written.
const VERSION: u32 = 0;

/// The whole file for `entries`, each already rendered as one line (no newline).
pub fn render(entries: &[String]) -> String {
    let mut out = format!("{VERSION}\n{}\n", entries.len());
    for entry in entries {
        out.push_str(entry);
        out.push('\n');
    }
    out
}

/// The entry lines of `text`, checked against the version, the count (at most `max`) and
/// the end of the file; each entry with its index for error messages.
pub fn entries(text: &str, max: usize) -> Result<Vec<(usize, &str)>, String> {
    let mut lines = text.lines();
    let version = lines.next().ok_or("empty file")?;
    if version.trim() != VERSION.to_string() {
        return Err(format!("unsupported version {version:?}"));
    }
    let count: usize = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or("no entry count")?;
    if count > max {
        return Err(format!("{count} entries, more than {max}"));
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let line = lines
            .next()
            .ok_or_else(|| format!("entry {i} of {count} missing"))?;
        out.push((i, line));
    }
    if lines.any(|l| !l.trim().is_empty()) {
        return Err(format!("more lines than the {count} entries"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_deviations_are_refused() {
        let text = render(&["a 1".into(), "b 2".into()]);
        assert_eq!(text, "0\n2\na 1\nb 2\n");
        assert_eq!(
            entries(&text, 10).expect("parses"),
            vec![(0, "a 1"), (1, "b 2")]
        );
        assert_eq!(entries("0\n0\n", 10).expect("empty").len(), 0);
        for bad in ["", "1\n0\n", "0\nx\n", "0\n3\na\nb\n", "0\n1\na\nb\n"] {
            assert!(entries(bad, 10).is_err(), "{bad:?} parsed");
        }
        assert!(entries("0\n11\n", 10).is_err(), "count above the bound");
    }
}
