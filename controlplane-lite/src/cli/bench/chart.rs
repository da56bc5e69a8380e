//! The restart-storm chart: connected (reconnected) and unreachable nodes against seconds since
//! the control plane was killed, drawn with plotters into a PNG.
//!
//! plotters draws text with ab_glyph from a TrueType file we register at run time, so the binary
//! needs no fontconfig or freetype: the font comes from `--font` or the usual DejaVu paths.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use serde_json::Value;

/// Where a DejaVu Sans (or any TrueType sans) usually is.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
];

/// What went wrong drawing the chart.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// No font file was given and none of [`FONT_CANDIDATES`] exists.
    #[error(
        "no TrueType font found (tried {tried}); pass --font FILE.ttf (Debian: fonts-dejavu-core)"
    )]
    NoFont { tried: String },
    /// A file given to read (the font, a result file) could not be read.
    #[error("reading {what} {path}: {source}")]
    Read {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    /// The font file is not a font ab_glyph can parse.
    #[error("{path} is not a TrueType/OpenType font")]
    FontInvalid { path: PathBuf },
    /// A result file holds no `reconnectSeries` (it is not a `bcctl bench restart -o json`).
    #[error("{what}: no reconnectSeries (run `bcctl bench restart -o json`)")]
    NoSeries { what: String },
    /// A file given to read is larger than it can be (a font, a result file).
    #[error("{path} is over {max} bytes; not a {what}")]
    TooLarge {
        path: PathBuf,
        max: u64,
        what: &'static str,
    },
    /// The output is not something this writes: a `.png` path in an existing directory.
    #[error("--chart {path}: {reason}")]
    BadOutput { path: PathBuf, reason: String },
    /// plotters failed (drawing or PNG encoding, e.g. the output dir is missing).
    #[error("drawing {path}: {message}")]
    Draw { path: PathBuf, message: String },
}

/// One run's curves: label, then `(seconds since SIGKILL, reconnected, unreachable)` samples.
#[derive(Debug, Clone, PartialEq)]
pub struct RestartSeries {
    pub label: String,
    pub points: Vec<(f64, u64, u64)>,
}

impl RestartSeries {
    /// Reads the series of a `bcctl bench restart -o json` result. Samples are `[t, reconnected]`
    /// or `[t, reconnected, unreachable]` (the latter since the chart was added).
    pub fn from_result(label: String, result: &Value) -> Result<Self, ChartError> {
        let Some(raw) = result.get("reconnectSeries").and_then(Value::as_array) else {
            return Err(ChartError::NoSeries { what: label });
        };
        let points = raw
            .iter()
            .filter_map(|p| {
                let p = p.as_array()?;
                let t = p.first()?.as_f64()?;
                let up = p.get(1)?.as_u64()?;
                let down = p.get(2).and_then(Value::as_u64).unwrap_or(0);
                Some((t, up, down))
            })
            .collect();
        Ok(Self { label, points })
    }
}

/// Largest font file read, bytes (DejaVu Sans is 0.7 MB; CJK fonts reach ~20 MB).
const MAX_FONT_BYTES: u64 = 64 << 20;

/// Reads at most `max` bytes of `path`; a larger file (or an endless one such as `/dev/zero`)
/// is [`ChartError::TooLarge`], not an allocation without bound.
pub fn read_capped(path: &Path, max: u64, what: &'static str) -> Result<Vec<u8>, ChartError> {
    use std::io::Read;
    let read_err = |source| ChartError::Read {
        path: path.to_path_buf(),
        what,
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > max {
        return Err(ChartError::TooLarge {
            path: path.to_path_buf(),
            max,
            what,
        });
    }
    Ok(bytes)
}

/// Checks what `bcctl bench ... --chart` needs before a run that may take minutes: the output is
/// a `.png` in an existing directory, and the font loads.
pub fn prepare(out: &Path, font: Option<&Path>) -> Result<(), ChartError> {
    let bad = |reason: &str| ChartError::BadOutput {
        path: out.to_path_buf(),
        reason: reason.to_owned(),
    };
    let is_png = out
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !is_png {
        return Err(bad("the chart is a PNG: give a file name ending in .png"));
    }
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(bad("its directory does not exist"));
    }
    load_font(font)
}

fn load_font(font: Option<&Path>) -> Result<(), ChartError> {
    let path = match font {
        Some(p) => p.to_path_buf(),
        None => FONT_CANDIDATES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| ChartError::NoFont {
                tried: FONT_CANDIDATES.join(", "),
            })?,
    };
    let bytes = read_capped(&path, MAX_FONT_BYTES, "font")?;
    // plotters keeps registered fonts for the life of the process; a CLI draws once, so leaking
    // one font file is the intended use of its 'static API.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| ChartError::FontInvalid { path })
}

/// Draws `runs` (one pair of curves each) into a `width`×`height` PNG at `out`, titled `title`.
pub fn draw(
    runs: &[RestartSeries],
    title: &str,
    out: &Path,
    font: Option<&Path>,
) -> Result<(), ChartError> {
    prepare(out, font)?;
    let err = |e: &dyn std::fmt::Display| ChartError::Draw {
        path: out.to_path_buf(),
        message: e.to_string(),
    };
    let x_max = runs
        .iter()
        .flat_map(|r| r.points.iter().map(|p| p.0))
        .fold(1.0_f64, f64::max)
        * 1.05;
    let y_max = runs
        .iter()
        .flat_map(|r| r.points.iter().map(|p| p.1.max(p.2)))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.08;
    let root = BitMapBackend::new(out, (1000, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds since SIGKILL of bcctl serve")
        .y_desc("nodes")
        .label_style(("sans-serif", 14))
        .x_label_formatter(&|v| {
            if x_max < 10.0 {
                format!("{v:.1}")
            } else {
                format!("{v:.0}")
            }
        })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    let palette = [BLUE, RGBColor(0, 140, 0), MAGENTA, RGBColor(230, 120, 0)];
    for (i, run) in runs.iter().enumerate() {
        let color = palette[i % palette.len()];
        chart
            .draw_series(LineSeries::new(
                run.points.iter().map(|p| (p.0, p.1 as f64)),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!("{}: reconnected", run.label))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        if run.points.iter().any(|p| p.2 > 0) {
            chart
                .draw_series(LineSeries::new(
                    run.points.iter().map(|p| (p.0, p.2 as f64)),
                    RED.stroke_width(2),
                ))
                .map_err(|e| err(&e))?
                .label(format!("{}: marked unreachable", run.label))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 14))
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_read_from_old_and_new_results() -> Result<(), ChartError> {
        let v = serde_json::json!({"reconnectSeries": [[0.5, 10], [1.0, 20, 3], ["junk"]]});
        let s = RestartSeries::from_result("run".into(), &v)?;
        assert_eq!(s.points, vec![(0.5, 10, 0), (1.0, 20, 3)]);
        assert!(matches!(
            RestartSeries::from_result("x".into(), &serde_json::json!({})),
            Err(ChartError::NoSeries { .. })
        ));
        Ok(())
    }

    #[test]
    fn a_png_is_drawn_when_a_font_exists() -> Result<(), Box<dyn std::error::Error>> {
        let Some(font) = FONT_CANDIDATES.iter().map(Path::new).find(|p| p.is_file()) else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true and no DejaVu font: .ci/run installs fonts-dejavu-core"
            );
            eprintln!("SKIPPED LOUDLY: no DejaVu font on this machine; the chart test did not run");
            return Ok(());
        };
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("restart.png");
        let run = RestartSeries {
            label: "1,000 nodes".into(),
            points: vec![(0.0, 0, 0), (1.0, 400, 0), (2.0, 1000, 5), (3.0, 1000, 0)],
        };
        draw(&[run], "restart storm", &out, Some(font))?;
        let png = std::fs::read(&out)?;
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert!(
            png.len() > 5_000,
            "a 1000x560 chart with text: {} bytes",
            png.len()
        );
        let missing = draw(&[], "t", &out, Some(Path::new("/nonexistent/font.ttf")));
        assert!(matches!(
            missing,
            Err(ChartError::Read { what: "font", .. })
        ));
        Ok(())
    }

    #[test]
    fn bad_outputs_and_endless_files_are_refused_up_front() {
        let font = Some(Path::new("/nonexistent/font.ttf"));
        for (out, why) in [
            ("/tmp/chart.jpg", ".png"),
            ("/tmp/chart", ".png"),
            ("/nonexistent-dir/chart.png", "directory"),
        ] {
            match prepare(Path::new(out), font) {
                Err(ChartError::BadOutput { reason, .. }) => {
                    assert!(reason.contains(why), "{out}: {reason}")
                }
                other => panic!("{out}: {other:?}"),
            }
        }
        assert!(matches!(
            read_capped(Path::new("/dev/zero"), 1024, "font"),
            Err(ChartError::TooLarge { max: 1024, .. })
        ));
        // A PNG path in an existing dir gets as far as loading the font.
        assert!(matches!(
            prepare(Path::new("/tmp/chart.PNG"), font),
            Err(ChartError::Read { what: "font", .. })
        ));
    }
}
