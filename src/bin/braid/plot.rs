//! Bus bandwidth against message size as an SVG: `braid perf --plot FILE.svg` draws its
//! own sweep, `braid plot OUT.svg RUNS.jsonl...` draws runs saved earlier with `--json`.
//! Both read the same JSON rows, so a sweep looks the same drawn live or from its file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use clap::Args;
use plotters::coord::ranged1d::{KeyPointHint, KeyPointWeight, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::prelude::*;

/// Arguments of `braid plot`.
#[derive(Args, Debug, Clone)]
pub struct PlotArgs {
    /// The SVG file to write.
    pub output: PathBuf,
    /// JSON-lines files written by `braid perf --json`; each run in them (a file may hold
    /// several, since `--json` appends) becomes one line of the plot.
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<PathBuf>,
}

/// One line of the plot: a run's busbw at each size it measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    /// `(bytes, busbw GB/s)`, sizes increasing.
    pub points: Vec<(u64, f64)>,
}

/// The fields of one `--json` row that a plot needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    op: String,
    ranks: u64,
    transport: String,
    dtype: String,
    algo: String,
    /// `out-of-place` or `in-place`; rows written before `braid perf` measured both
    /// have none.
    place: Option<String>,
    bytes: u64,
    busbw: f64,
}

impl Row {
    /// Reads a row as `braid perf --json` writes it; `Err` names the missing field.
    pub fn from_json(v: &serde_json::Value) -> Result<Row, String> {
        let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned).ok_or(format!("no text field `{k}`"));
        let int = |k: &str| v.get(k).and_then(|x| x.as_u64()).ok_or(format!("no whole-number field `{k}`"));
        Ok(Row {
            op: text("op")?,
            ranks: int("ranks")?,
            transport: text("transport")?,
            dtype: text("dtype")?,
            algo: text("algo")?,
            place: v.get("place").and_then(|x| x.as_str()).map(str::to_owned),
            bytes: int("bytes")?,
            busbw: v.get("busbw_gbps").and_then(|x| x.as_f64()).ok_or("no number field `busbw_gbps`")?,
        })
    }

    /// Rows of one run share these; a change of any of them starts another run.
    fn run_key(&self) -> (&str, u64, &str, &str, Option<&str>) {
        (&self.op, self.ranks, &self.transport, &self.dtype, self.place.as_deref())
    }
}

/// Splits rows, in the order they were written, into runs: a run ends where the
/// collective, world, transport or type changes, or where the size stops growing (the
/// next sweep appended to the same file). Sizes of 0 bytes (barrier) have no place on
/// a log axis and are left out.
pub fn series_from_rows(rows: &[Row]) -> Vec<Series> {
    let mut runs: Vec<Vec<&Row>> = Vec::new();
    for row in rows.iter().filter(|r| r.bytes > 0 && r.busbw.is_finite()) {
        // One sweep interleaves its modes (each size out of place, then in place):
        // a row continues the latest run of its own mode.
        let latest = runs.iter_mut().rev().find(|run| run.last().is_some_and(|prev| prev.place == row.place));
        match latest {
            Some(run) if run.last().is_some_and(|prev| prev.run_key() == row.run_key() && prev.bytes < row.bytes) => {
                run.push(row)
            }
            _ => runs.push(vec![row]),
        }
    }
    runs.into_iter()
        .map(|run| {
            // With `--algo auto` the chosen algorithm may change with size: name each once.
            let mut algos: Vec<&str> = Vec::new();
            for r in &run {
                if !algos.contains(&r.algo.as_str()) {
                    algos.push(&r.algo);
                }
            }
            let first = run[0];
            Series {
                label: format!(
                    "{} {} {} {} ranks {}{}",
                    first.op,
                    algos.join("/"),
                    first.transport,
                    first.ranks,
                    first.dtype,
                    first.place.as_deref().map(|p| format!(" {p}")).unwrap_or_default()
                ),
                points: run.iter().map(|r| (r.bytes, r.busbw)).collect(),
            }
        })
        .collect()
}

/// Reads a `--json` file; errors name the file and the line.
pub fn read_runs(path: &Path) -> Result<Vec<Series>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let rows = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| e.to_string())
                .and_then(|v| Row::from_json(&v))
                .map_err(|e| format!("{}:{}: not a `braid perf --json` row: {e}", path.display(), i + 1))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(series_from_rows(&rows))
}

/// Makes equal labels tell their lines apart: first by the file each came from, then
/// by their order.
fn distinguish(series: &mut [(Series, String)]) {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (s, _) in series.iter() {
        *seen.entry(s.label.clone()).or_default() += 1;
    }
    for (s, source) in series.iter_mut() {
        if seen[&s.label] > 1 {
            s.label = format!("{} ({source})", s.label);
        }
    }
    let mut count: HashMap<String, usize> = HashMap::new();
    for (s, _) in series.iter_mut() {
        let n = count.entry(s.label.clone()).or_default();
        *n += 1;
        if *n > 1 {
            s.label = format!("{} #{n}", s.label);
        }
    }
}

/// `2^exp` bytes the way sizes are written on the command line: 512, 1K, 64K, 1M, 64M, 1G.
fn size_label(exp: i32) -> String {
    let bytes = 2f64.powi(exp);
    let (value, suffix) = match exp {
        ..10 => (bytes, ""),
        10..20 => (bytes / 1024.0, "K"),
        20..30 => (bytes / 1024f64.powi(2), "M"),
        _ => (bytes / 1024f64.powi(3), "G"),
    };
    format!("{value}{suffix}")
}

/// The size axis: bytes, placed by their log2 between `2^lo` and `2^hi`.
struct SizeAxis {
    lo: i32,
    hi: i32,
}

impl Ranged for SizeAxis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = u64;

    fn map(&self, bytes: &u64, limit: (i32, i32)) -> i32 {
        let at = ((*bytes).max(1) as f64).log2() - f64::from(self.lo);
        let span = f64::from(self.hi - self.lo);
        limit.0 + (at / span * f64::from(limit.1 - limit.0)).round() as i32
    }

    /// Labelled ticks at every `step`-th power of two (step a power of two too, so
    /// they land on 1K, 64K, 1M, ...), as many as the hint allows and 10 at most;
    /// the light grid at every power of two.
    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<u64> {
        let most = hint.max_num_points().clamp(1, 10) as i32;
        let step = match hint.weight() {
            KeyPointWeight::Any if self.hi - self.lo < 40 => 1,
            _ => {
                let mut step = 1;
                while (self.hi - self.lo) / step + 1 > most {
                    step *= 2;
                }
                step
            }
        };
        (self.lo..=self.hi).filter(|e| e.rem_euclid(step) == 0).map(|e| 1u64 << e).collect()
    }

    fn range(&self) -> std::ops::Range<u64> {
        (1u64 << self.lo)..(1u64 << self.hi)
    }
}

impl ValueFormatter<u64> for SizeAxis {
    fn format(bytes: &u64) -> String {
        size_label((*bytes).max(1).ilog2() as i32)
    }
}

/// Distinct on white and for the colour-blind (Okabe and Ito's set, then grey).
const COLOURS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(120, 120, 120),
];

/// The SVG text of the plot. `Err` if there is nothing to draw or plotters fails.
pub fn render(series: &[Series]) -> Result<String, String> {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (Some(min), Some(max)) = (all().map(|p| p.0).min(), all().map(|p| p.0).max()) else {
        return Err("nothing to plot: no run measured a size above 0 bytes".into());
    };
    // Whole powers of two around the sizes (2^63 bytes at most, so `1 << hi` fits).
    let hi = ((max as f64).log2().ceil() as i32).clamp(1, 63);
    let lo = (min.ilog2() as i32).min(hi - 1);
    let top = all().map(|p| p.1).fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.1 } else { 1.0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 620)).into_drawing_area();
        let err = |e: DrawingAreaErrorKind<_>| format!("drawing the plot: {e}");
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("bus bandwidth against message size", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(SizeAxis { lo, hi }, 0.0..top)
            .map_err(err)?;
        chart.configure_mesh().x_desc("message size (bytes)").y_desc("busbw (GB/s)").draw().map_err(err)?;
        for (i, s) in series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), colour.stroke_width(2)))
                .map_err(err)?
                .label(s.label.as_str())
                // A swatch, not a stroke, so each run has exactly one line in the file.
                .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 16, y + 4)], colour.filled()));
            // Marks show the measured sizes (and a run of one size, which has no line).
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, colour.filled()))).map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Renders `series` into `path`; `Err` says why, naming the path.
pub fn write(path: &Path, series: &[Series]) -> Result<(), String> {
    let svg = render(series).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Fails early, before a sweep is spent, if `path` cannot be written; leaves an
/// existing file as it is.
pub fn check_writable(path: &Path) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(drop)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// `braid plot OUT.svg RUNS.jsonl...`.
pub fn main(args: PlotArgs) -> i32 {
    let mut series = Vec::new();
    for path in &args.runs {
        match read_runs(path) {
            Ok(runs) => {
                let source = path.file_stem().unwrap_or(path.as_os_str()).to_string_lossy().into_owned();
                series.extend(runs.into_iter().map(|s| (s, source.clone())));
            }
            Err(e) => {
                eprintln!("braid plot: {e}");
                return 1;
            }
        }
    }
    distinguish(&mut series);
    let series: Vec<Series> = series.into_iter().map(|(s, _)| s).collect();
    match write(&args.output, &series) {
        Ok(()) => {
            println!("# plot: {} line(s) in {}", series.len(), args.output.display());
            0
        }
        Err(e) => {
            eprintln!("braid plot: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks that `svg` is one `<svg>` element whose tags all close in order, with
    /// attributes quoted and no stray `<` or bare `&` in text.
    fn well_formed(svg: &str) -> Result<(), String> {
        let mut open: Vec<&str> = Vec::new();
        let mut roots = 0;
        let mut rest = svg;
        while let Some(start) = rest.find('<') {
            let text = &rest[..start];
            if text
                .split('&')
                .skip(1)
                .any(|t| !["amp;", "lt;", "gt;", "quot;", "apos;"].iter().any(|e| t.starts_with(e)))
            {
                return Err(format!("bare & in text {text:?}"));
            }
            let end = start + rest[start..].find('>').ok_or("a tag never closes")?;
            let tag = &rest[start + 1..end];
            rest = &rest[end + 1..];
            if tag.starts_with('?') || tag.starts_with('!') {
                continue;
            }
            if !tag.matches('"').count().is_multiple_of(2) || tag.contains('<') {
                return Err(format!("bad attributes in <{tag}>"));
            }
            if let Some(name) = tag.strip_prefix('/') {
                match open.pop() {
                    Some(o) if o == name.trim() => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
                continue;
            }
            let name = tag.split_whitespace().next().ok_or("empty tag")?.trim_end_matches('/');
            if open.is_empty() {
                roots += 1;
                if name != "svg" {
                    return Err(format!("root element <{name}>"));
                }
            }
            if !tag.ends_with('/') {
                open.push(name);
            }
        }
        if !open.is_empty() || roots != 1 || !rest.trim().is_empty() {
            return Err(format!("unclosed {open:?}, {roots} roots, trailing {rest:?}"));
        }
        Ok(())
    }

    /// `(stroke, number of points)` of every polyline not drawn black (the axes and
    /// ticks are), whatever its width: a run's line, or anything else in its colour.
    fn data_lines(svg: &str) -> Vec<(String, usize)> {
        let attr = |tag: &str, name: &str| {
            let at = tag.find(&format!(" {name}=\"")).map(|i| i + name.len() + 3)?;
            Some(tag[at..at + tag[at..].find('"')?].to_string())
        };
        svg.split("<polyline")
            .skip(1)
            .map(|t| &t[..t.find("/>").unwrap()])
            .filter(|t| attr(t, "stroke").as_deref() != Some("#000000"))
            .map(|t| (attr(t, "stroke").unwrap(), attr(t, "points").unwrap().split_whitespace().count()))
            .collect()
    }

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    fn row(op: &str, transport: &str, algo: &str, bytes: u64, busbw: f64) -> Row {
        Row {
            op: op.into(),
            ranks: 2,
            transport: transport.into(),
            dtype: "f32".into(),
            algo: algo.into(),
            place: None,
            bytes,
            busbw,
        }
    }

    #[test]
    fn two_runs_render_as_two_labelled_lines_in_well_formed_svg() {
        let series = [
            Series {
                label: "all-reduce ring shm 2 ranks f32".into(),
                points: vec![(1 << 10, 0.5), (1 << 16, 4.0), (1 << 20, 9.5), (64 << 20, 6.25)],
            },
            Series {
                label: "broadcast chain tcp 4 ranks bf16 (a&b)".into(),
                points: vec![(4 << 10, 0.1), (1 << 20, 1.0)],
            },
        ];
        let dir = std::env::temp_dir().join(format!("braid-plot-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("two.svg");
        write(&path, &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        well_formed(&svg).unwrap();
        assert!(svg.contains(">\nall-reduce ring shm 2 ranks f32\n<"), "first label");
        assert!(svg.contains(">\nbroadcast chain tcp 4 ranks bf16 (a&amp;b)\n<"), "second label, escaped");
        assert_eq!(data_lines(&svg), [(hex(COLOURS[0]), 4), (hex(COLOURS[1]), 2)], "one line a run, a point a size");
        // Sizes 1K..64M: ticks at every other power of two, written as sizes are.
        for tick in ["1K", "4K", "64K", "1M", "16M", "64M"] {
            assert!(svg.contains(&format!(">\n{tick}\n<")), "tick {tick}");
        }
        assert!(!svg.contains(">\n2K\n<"), "2K is between labelled ticks");
    }

    #[test]
    fn well_formed_rejects_what_it_should() {
        assert!(well_formed("<svg><g></svg></g>").is_err());
        assert!(well_formed("<svg><text>a & b</text></svg>").is_err());
        assert!(well_formed("<svg/><svg/>").is_err());
        assert!(well_formed("<svg><text>a &amp; b</text><line x=\"1\"/></svg>").is_ok());
    }

    #[test]
    fn appended_runs_and_changed_transports_become_separate_lines() {
        let rows = [
            row("all-reduce", "shm", "direct", 1024, 1.0),
            row("all-reduce", "shm", "ring", 4096, 2.0),
            // --json appended a second sweep: sizes start again.
            row("all-reduce", "shm", "ring", 1024, 1.5),
            row("all-reduce", "shm", "ring", 4096, 2.5),
            // Same sizes growing, other transport.
            row("all-reduce", "tcp", "ring", 8192, 0.5),
            // A barrier moves no bytes.
            row("barrier", "shm", "barrier", 0, 0.0),
        ];
        let series = series_from_rows(&rows);
        let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "all-reduce direct/ring shm 2 ranks f32",
                "all-reduce ring shm 2 ranks f32",
                "all-reduce ring tcp 2 ranks f32"
            ]
        );
        assert_eq!(series[0].points, [(1024, 1.0), (4096, 2.0)]);
        assert_eq!(series[1].points, [(1024, 1.5), (4096, 2.5)]);
        assert_eq!(series[2].points, [(8192, 0.5)]);
    }

    /// `braid perf` writes each size out of place, then in place: two lines, one per
    /// mode, and a second sweep appended after them two more.
    #[test]
    fn interleaved_modes_of_one_sweep_become_one_line_each() {
        let placed = |place: &str, bytes, busbw| Row {
            place: Some(place.into()),
            ..row("all-reduce", "shm", "ring", bytes, busbw)
        };
        let mut rows = Vec::new();
        for _sweep in 0..2 {
            for bytes in [1024, 4096] {
                rows.push(placed("out-of-place", bytes, 1.0));
                rows.push(placed("in-place", bytes, 2.0));
            }
        }
        let series = series_from_rows(&rows);
        let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "all-reduce ring shm 2 ranks f32 out-of-place",
                "all-reduce ring shm 2 ranks f32 in-place",
                "all-reduce ring shm 2 ranks f32 out-of-place",
                "all-reduce ring shm 2 ranks f32 in-place"
            ]
        );
        for s in &series {
            assert_eq!(s.points.len(), 2, "{s:?}");
        }
    }

    #[test]
    fn json_rows_are_read_back_and_bad_ones_named_by_file_and_line() {
        let dir = std::env::temp_dir().join(format!("braid-plot-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.jsonl");
        let line = |bytes: u64, bw: f64| {
            serde_json::json!({"op": "all-gather", "bytes": bytes, "count": bytes / 8, "dtype": "f32", "ranks": 2,
                "transport": "shm", "algo": "ring", "time_us": 1.0, "algbw_gbps": bw, "busbw_gbps": bw / 2.0,
                "wrong": null})
            .to_string()
        };
        std::fs::write(&good, format!("{}\n\n{}\n", line(1024, 2.0), line(2048, 3.0))).unwrap();
        let bad = dir.join("bad.jsonl");
        std::fs::write(&bad, format!("{}\n{{\"op\": \"all-gather\"}}\n", line(1024, 2.0))).unwrap();
        let read = read_runs(&good);
        let bad_err = read_runs(&bad).unwrap_err();
        let missing_err = read_runs(&dir.join("missing.jsonl")).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            read.unwrap(),
            [Series { label: "all-gather ring shm 2 ranks f32".into(), points: vec![(1024, 1.0), (2048, 1.5)] }]
        );
        assert!(bad_err.contains("bad.jsonl:2:") && bad_err.contains("`ranks`"), "{bad_err}");
        assert!(missing_err.contains("missing.jsonl"), "{missing_err}");
    }

    #[test]
    fn an_unwritable_path_is_an_error_naming_it() {
        let path = std::env::temp_dir().join(format!("braid-plot-no-such-dir-{}", std::process::id())).join("x.svg");
        let series = [Series { label: "x".into(), points: vec![(1024, 1.0)] }];
        let e = write(&path, &series).unwrap_err();
        assert!(e.contains(&path.display().to_string()), "{e}");
        let e = check_writable(&path).unwrap_err();
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(render(&[]).unwrap_err().contains("nothing to plot"));
    }

    #[test]
    fn sizes_are_labelled_as_on_the_command_line() {
        let labels: Vec<String> = [9, 10, 16, 20, 26, 30, 33].into_iter().map(size_label).collect();
        assert_eq!(labels, ["512", "1K", "64K", "1M", "64M", "1G", "8G"]);
    }

    #[test]
    fn equal_labels_are_told_apart_by_file_then_order() {
        let s = |label: &str| Series { label: label.into(), points: vec![(1024, 1.0)] };
        let mut series = vec![
            (s("a"), "before".to_string()),
            (s("a"), "after".to_string()),
            (s("b"), "before".to_string()),
            (s("c"), "after".to_string()),
            (s("c"), "after".to_string()),
        ];
        distinguish(&mut series);
        let labels: Vec<&str> = series.iter().map(|(s, _)| s.label.as_str()).collect();
        assert_eq!(labels, ["a (before)", "a (after)", "b", "c (after)", "c (after) #2"]);
    }
}
