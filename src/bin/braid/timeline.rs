//! `braid timeline FILE... -o OUT.svg`: draw the ranks' timelines (`BRAID_TIMELINE`,
//! Chrome trace events) as one picture: a lane per rank (and communicator), each
//! call a box coloured by collective, its rounds as a strip beneath, on a shared
//! time axis. A straggler shows as the lane whose boxes start late while the
//! others' stretch waiting for it. `--merge FILE` also writes all events into one
//! trace file for Perfetto or chrome://tracing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;

/// `braid timeline` arguments.
#[derive(Args, Debug)]
pub struct TimelineArgs {
    /// Timeline files (one per rank), or directories holding them (`*.json`)
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The SVG to write
    #[arg(short, long)]
    pub output: PathBuf,
    /// Also write every event into this one trace file
    #[arg(long)]
    pub merge: Option<PathBuf>,
}

/// One complete event.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: String,
    pub cat: String,
    pub ts: f64,
    pub dur: f64,
    pub pid: u64,
    pub tid: u64,
}

/// The events of a trace file's text: a JSON array, or one cut short by a crash
/// (no closing `]`, a trailing comma), as the viewers accept.
pub fn parse(text: &str) -> Result<Vec<Value>, String> {
    let trimmed = text.trim_end();
    let parsed = serde_json::from_str::<Vec<Value>>(trimmed).or_else(|_| {
        let body = trimmed.trim_end_matches(',');
        serde_json::from_str::<Vec<Value>>(&format!("{body}]"))
    });
    parsed.map_err(|e| format!("not a trace event array: {e}"))
}

/// The complete (`"ph": "X"`) events among `events`.
pub fn spans(events: &[Value]) -> Vec<Span> {
    events
        .iter()
        .filter(|e| e["ph"] == "X")
        .filter_map(|e| {
            Some(Span {
                name: e["name"].as_str()?.to_string(),
                cat: e["cat"].as_str().unwrap_or("").to_string(),
                ts: e["ts"].as_f64()?,
                dur: e["dur"].as_f64().unwrap_or(0.0).max(0.0),
                pid: e["pid"].as_u64()?,
                tid: e["tid"].as_u64().unwrap_or(0),
            })
        })
        .collect()
}

fn files_of(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .flatten()
                .map(|e| e.path())
                .filter(|f| f.extension().is_some_and(|x| x == "json"))
                .collect();
            found.sort();
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// A colour per collective name, stable across runs.
fn colour(name: &str) -> &'static str {
    const PALETTE: [&str; 8] = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"];
    let h = name.bytes().fold(5381u32, |h, b| h.wrapping_mul(33) ^ b as u32);
    PALETTE[h as usize % PALETTE.len()]
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The picture of `spans`: an SVG document.
pub fn svg(spans: &[Span]) -> String {
    const WIDTH: f64 = 1200.0;
    const LEFT: f64 = 130.0;
    const LANE: f64 = 34.0;
    const TOP: f64 = 40.0;
    let lanes: BTreeMap<(u64, u64), usize> = {
        let mut keys: Vec<(u64, u64)> = spans.iter().map(|s| (s.pid, s.tid)).collect();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter().enumerate().map(|(i, k)| (k, i)).collect()
    };
    let comms = lanes.keys().map(|k| k.1).collect::<std::collections::BTreeSet<_>>().len();
    let t0 = spans.iter().map(|s| s.ts).fold(f64::INFINITY, f64::min);
    let t1 = spans.iter().map(|s| s.ts + s.dur).fold(f64::NEG_INFINITY, f64::max);
    let span_us = if t1 > t0 { t1 - t0 } else { 1.0 };
    let x = |t: f64| LEFT + (t - t0) / span_us * (WIDTH - LEFT - 20.0);
    let height = TOP + LANE * lanes.len() as f64 + 40.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="8" y="20">braid timeline: {} spans over {:.3} ms</text>"#,
        spans.len(),
        span_us / 1000.0
    );
    for (&(pid, tid), &i) in &lanes {
        let y = TOP + LANE * i as f64;
        let label = if comms > 1 { format!("rank {pid} ({tid:08x})") } else { format!("rank {pid}") };
        let _ = writeln!(out, r#"<text x="8" y="{:.1}">{}</text>"#, y + LANE * 0.6, escape(&label));
        let _ = writeln!(out, r##"<line x1="{LEFT}" x2="{WIDTH}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/>"##);
    }
    for s in spans {
        let lane = lanes[&(s.pid, s.tid)];
        let y = TOP + LANE * lane as f64;
        let (x0, x1) = (x(s.ts), x(s.ts + s.dur));
        let w = (x1 - x0).max(0.5);
        let (dy, h, fill, opacity) = match s.cat.as_str() {
            "call" => (4.0, 18.0, colour(&s.name), 0.9),
            "round" => (24.0, 6.0, "#555", 0.5),
            "transfer" => (27.0, 3.0, "#c44e52", 0.6),
            "fusion" => (1.0, 3.0, "#8a2be2", 0.8),
            "strategy" => (31.0, 3.0, "#2a7f62", 0.8),
            _ => (1.0, 3.0, "#222", 0.8),
        };
        let _ = writeln!(
            out,
            r#"<rect x="{x0:.2}" y="{:.2}" width="{w:.2}" height="{h}" fill="{fill}" fill-opacity="{opacity}"><title>{} ({}) {:.1} us</title></rect>"#,
            y + dy,
            escape(&s.name),
            escape(&s.cat),
            s.dur
        );
    }
    // The time axis, in milliseconds from the first event.
    let axis_y = TOP + LANE * lanes.len() as f64 + 12.0;
    let _ = writeln!(
        out,
        r#"<line x1="{LEFT}" x2="{:.1}" y1="{axis_y:.1}" y2="{axis_y:.1}" stroke="black"/>"#,
        WIDTH - 20.0
    );
    for k in 0..=5 {
        let t = t0 + span_us * k as f64 / 5.0;
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}">{:.3} ms</text>"#,
            x(t) - 30.0,
            axis_y + 16.0,
            (t - t0) / 1000.0
        );
    }
    let mut names: Vec<&str> = spans.iter().filter(|s| s.cat == "call").map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut legend: Vec<(&str, &str)> = names.iter().map(|n| (*n, colour(n))).collect();
    for (cat, label, fill) in [("fusion", "fusion bucket", "#8a2be2"), ("strategy", "strategy step", "#2a7f62")] {
        if spans.iter().any(|s| s.cat == cat) {
            legend.push((label, fill));
        }
    }
    for (i, (n, fill)) in legend.iter().enumerate() {
        let lx = 320.0 + 150.0 * i as f64;
        let _ = writeln!(out, r#"<rect x="{lx:.1}" y="8" width="12" height="12" fill="{fill}"/>"#);
        let _ = writeln!(out, r#"<text x="{:.1}" y="19">{}</text>"#, lx + 16.0, escape(n));
    }
    out.push_str("</svg>\n");
    out
}

fn run_inner(a: &TimelineArgs) -> Result<String, String> {
    let files = files_of(&a.files)?;
    let mut events = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        events.extend(parse(&text).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    let spans = spans(&events);
    if spans.is_empty() {
        return Err(format!("no spans in {} file(s)", files.len()));
    }
    write(&a.output, &svg(&spans))?;
    if let Some(m) = &a.merge {
        write(m, &serde_json::to_string(&events).map_err(|e| e.to_string())?)?;
    }
    let ranks = spans.iter().map(|s| s.pid).collect::<std::collections::BTreeSet<_>>().len();
    Ok(format!(
        "braid timeline: {} spans of {ranks} rank(s) from {} file(s) drawn in {}",
        spans.len(),
        files.len(),
        a.output.display()
    ))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Run `braid timeline`; the exit code.
pub fn main(a: TimelineArgs) -> i32 {
    match run_inner(&a) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            eprintln!("braid timeline: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_cut_short_still_parses() {
        let whole = r#"[{"name":"all-reduce","cat":"call","ph":"X","ts":1.0,"dur":2.0,"pid":0,"tid":7},
{"name":"process_name","ph":"M","pid":0,"args":{"name":"rank 0"}}]"#;
        assert_eq!(parse(whole).unwrap().len(), 2);
        let cut =
            "[\n{\"name\":\"all-reduce\",\"cat\":\"call\",\"ph\":\"X\",\"ts\":1.0,\"dur\":2.0,\"pid\":3,\"tid\":7},\n";
        let s = spans(&parse(cut).unwrap());
        assert_eq!(s, vec![Span { name: "all-reduce".into(), cat: "call".into(), ts: 1.0, dur: 2.0, pid: 3, tid: 7 }]);
        assert!(parse("{}").is_err());
    }

    #[test]
    fn every_span_is_drawn_in_its_rank_lane() {
        let span = |pid, ts, cat: &str| Span { name: "broadcast".into(), cat: cat.into(), ts, dur: 5.0, pid, tid: 1 };
        let picture = svg(&[span(0, 0.0, "call"), span(1, 10.0, "call"), span(1, 11.0, "round")]);
        assert_eq!(picture.matches("<title>").count(), 3);
        assert!(picture.contains(">rank 0<") && picture.contains(">rank 1<"));
        assert!(picture.contains(colour("broadcast")));
        assert!(picture.starts_with("<svg") && picture.trim_end().ends_with("</svg>"));
    }
}
