//! PNG charts (plotters' bitmap backend): line charts of benchmark scaling curves (log-log,
//! one line per target) and grouped bar charts of workloads side by side (one bar per target). Text is drawn with a TrueType font read at run time from the usual system
//! places (Debian: fonts-dejavu-core), so no font library is linked.

use crate::failure::{CliResult, Failure};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];
const SIZE: (u32, u32) = (960, 600);

/// One chart: (x, y) points per named series.
pub struct Plot {
    /// File name (in the results directory).
    pub file: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

/// Register the first font found as "sans-serif" (once).
fn font() -> CliResult<()> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let (path, bytes) = FONTS.iter().find_map(|p| std::fs::read(p).ok().map(|b| (p, b))).ok_or_else(|| {
            format!("no TrueType font found (install fonts-dejavu-core; looked for {})", FONTS.join(", "))
        })?;
        // Registered fonts live as long as the program.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{path}: not a usable TrueType font"))
    })
    .clone()
    .map_err(|why| Failure::new("plot", why))
}

/// One grouped bar chart: a bar per series in every group (`None`: not measured).
pub struct Bars {
    pub title: String,
    pub y_label: String,
    pub groups: Vec<String>,
    pub series: Vec<(String, Vec<Option<f64>>)>,
}

fn failure(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> Failure + '_ {
    move |e| Failure::new(format!("plot {}", path.display()), e.to_string())
}

/// Bars on a log scale (workloads' figures span decades from tmpfs to FUSE servers).
pub fn bar_chart(path: &Path, b: &Bars) -> CliResult<()> {
    font()?;
    let fail = failure(path);
    let values = || b.series.iter().flat_map(|s| s.1.iter().flatten().copied());
    let (lo, hi) = values().fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi || lo <= 0.0 || b.groups.is_empty() {
        return Err(fail(&"no positive values to plot"));
    }
    let (floor, groups) = (lo * 0.5, b.groups.len());
    let root = canvas(path, &fail)?;
    let mut chart = framed(&root, &b.title)
        .build_cartesian_2d(0.0..groups as f64, (floor..hi * 3.0).log_scale())
        .map_err(|e| fail(&e))?;
    let names = b.groups.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups * 2 + 1)
        .x_label_formatter(&|x| {
            // Labels at group centres only.
            let i = (x - 0.5).round();
            match (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 {
                true => names.get(i as usize).cloned().unwrap_or_default(),
                false => String::new(),
            }
        })
        .y_desc(&b.y_label)
        .y_label_formatter(&|v| if *v >= 10.0 { format!("{v:.0}") } else { format!("{v:.2}") })
        .light_line_style(RGBColor(238, 238, 238))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| fail(&e))?;
    let width = 0.8 / b.series.len().max(1) as f64;
    for (i, (name, values)) in b.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let bars = values.iter().enumerate().filter_map(|(g, v)| {
            let x = g as f64 + 0.1 + i as f64 * width;
            v.map(|v| Rectangle::new([(x, floor), (x + width * 0.9, v)], color.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(|e| fail(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
    }
    legend_and_save(&mut chart, &root, SeriesLabelPosition::UpperLeft, &fail)
}

/// A white image of [`SIZE`] to be written to `path`.
fn canvas<'a>(
    path: &'a Path,
    fail: &impl Fn(&dyn std::fmt::Display) -> Failure,
) -> CliResult<DrawingArea<BitMapBackend<'a>, Shift>> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    Ok(root)
}

/// A chart on `root` with `title` and room for the axis labels.
fn framed<'a, 'b>(
    root: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, BitMapBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder.caption(title, ("sans-serif", 22)).margin(16).x_label_area_size(48).y_label_area_size(80);
    builder
}

/// Draw the legend of `chart` at `position`, then write the image out.
fn legend_and_save<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    root: &DrawingArea<BitMapBackend<'a>, Shift>,
    position: SeriesLabelPosition,
    fail: &impl Fn(&dyn std::fmt::Display) -> Failure,
) -> CliResult<()> {
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}

pub fn line_chart(path: &Path, p: &Plot) -> CliResult<()> {
    font()?;
    let fail = failure(path);
    let pts = p.series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 || y0 <= 0.0 {
        return Err(fail(&"no positive values to plot"));
    }
    let root = canvas(path, &fail)?;
    let mut chart = framed(&root, &p.title)
        .build_cartesian_2d((x0 * 0.9..x1 * 1.1).log_scale(), (y0 * 0.7..y1 * 1.5).log_scale())
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc(&p.x_label)
        .y_desc(&p.y_label)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| {
            if *v >= 100.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        })
        .light_line_style(RGBColor(238, 238, 238))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, (name, pts)) in p.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| fail(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&pt| Circle::new(pt, 4, color.filled()))).map_err(|e| fail(&e))?;
    }
    legend_and_save(&mut chart, &root, SeriesLabelPosition::UpperRight, &fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png() {
        if FONTS.iter().all(|f| !Path::new(f).is_file()) {
            return eprintln!("SKIPPED draws_a_png: no TrueType font installed");
        }
        let path = std::env::temp_dir().join(format!("ferrofs-plot-{}.png", std::process::id()));
        let p = Plot {
            file: "x.png".into(),
            title: "test".into(),
            x_label: "P".into(),
            y_label: "ops/s".into(),
            series: vec![
                ("a".into(), vec![(1.0, 10.0), (2.0, 20.0), (8.0, 30.0)]),
                ("b".into(), vec![(1.0, 5.0), (8.0, 50.0)]),
            ],
        };
        line_chart(&path, &p).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let b = Bars {
            title: "test".into(),
            y_label: "s".into(),
            groups: vec!["tar".into(), "rm".into()],
            series: vec![("a".into(), vec![Some(1.0), None]), ("b".into(), vec![Some(0.1), Some(30.0)])],
        };
        bar_chart(&path, &b).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let nothing = Bars { series: vec![("a".into(), vec![None, None])], ..b };
        assert!(bar_chart(&path, &nothing).is_err());
    }
}
