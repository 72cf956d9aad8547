//! Experiment output: a text table (ours beside the seed's) and an optional SVG line plot.

use std::fmt::Write as _;

/// One curve of a plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// What an experiment prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
    pub plot: Option<Plot>,
}

impl Report {
    pub fn new(title: &str, header: &[&str]) -> Self {
        Self {
            title: title.to_string(),
            header: header.iter().map(|s| (*s).to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
            plot: None,
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as aligned text.
    pub fn to_text(&self) -> String {
        let cols = self.header.len();
        let mut width = vec![0; cols];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, c) in r.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.len());
            }
        }
        let mut s = format!("{}\n", self.title);
        for r in std::iter::once(&self.header).chain(&self.rows) {
            let cells: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{c:>w$}", w = width[i]))
                .collect();
            let _ = writeln!(s, "  {}", cells.join("  "));
        }
        for n in &self.notes {
            let _ = writeln!(s, "  note: {n}");
        }
        s
    }
}

/// Formats a fraction as a percentage.
pub fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

impl Plot {
    /// A self-contained SVG.
    pub fn to_svg(&self, title: &str) -> String {
        let (w, h, l, r, t, b) = (720.0, 460.0, 80.0, 180.0, 40.0, 60.0);
        let pts = self.series.iter().flat_map(|s| s.points.iter());
        let ty = |y: f64| if self.log_y { y.max(1e-9).log10() } else { y };
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(ty(y));
            y1 = y1.max(ty(y));
        }
        if !self.log_y {
            y0 = y0.min(0.0);
        }
        let (dx, dy) = ((x1 - x0).max(1e-12), (y1 - y0).max(1e-12));
        let px = |x: f64| l + (x - x0) / dx * (w - l - r);
        let py = |y: f64| h - b - (ty(y) - y0) / dy * (h - t - b);
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" \
             fill=\"white\"/>\n<text x=\"{l}\" y=\"24\" font-size=\"14\">{}</text>\n",
            escape(title)
        );
        let _ = writeln!(
            s,
            "<path d=\"M{l},{t} V{} H{}\" stroke=\"black\" fill=\"none\"/>",
            h - b,
            w - r
        );
        for i in 0..=4 {
            let fx = x0 + dx * f64::from(i) / 4.0;
            let fy = y0 + dy * f64::from(i) / 4.0;
            let ylab = if self.log_y { 10f64.powf(fy) } else { fy };
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                px(fx),
                h - b + 16.0,
                short(fx),
                l - 6.0,
                h - b - (fy - y0) / dy * (h - t - b) + 4.0,
                short(ylab)
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
             <text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">{}</text>",
            (l + w - r) / 2.0,
            h - 16.0,
            escape(&self.x_label),
            (t + h - b) / 2.0,
            (t + h - b) / 2.0,
            escape(&self.y_label)
        );
        let colors = [
            "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
        ];
        for (i, se) in self.series.iter().enumerate() {
            let c = colors[i % colors.len()];
            let d: Vec<String> = se
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" stroke=\"{c}\" fill=\"none\" stroke-width=\"2\"/>\
                 <text x=\"{}\" y=\"{}\" fill=\"{c}\">{}</text>",
                d.join(" "),
                w - r + 10.0,
                t + 18.0 * i as f64 + 10.0,
                escape(&se.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

fn short(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
