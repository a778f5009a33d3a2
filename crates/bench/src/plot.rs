//! PNG line charts (plotters' bitmap backend) of benchmark scaling curves: log-log, one line
//! per target. Text is drawn with a TrueType font read at run time from the usual system
//! places (Debian: fonts-dejavu-core), so no font library is linked.

use crate::failure::{CliResult, Failure};
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

pub fn line_chart(path: &Path, p: &Plot) -> CliResult<()> {
    font()?;
    let fail = |e: &dyn std::fmt::Display| Failure::new(format!("plot {}", path.display()), e.to_string());
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
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&p.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
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
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
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
    }
}
