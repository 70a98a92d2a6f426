//! The report's pictures, drawn as plain SVG: panels of horizontal bars on a log axis, each
//! bar with its value printed at its end, grouped under headings, one colour per series
//! (ours, the bare-host twin, the QEMU peer, the seed) with a legend. A ratio panel marks 1x
//! with a line and may shade a tolerance band or paint bars past a goal red. Nothing but
//! rectangles, lines and text: any browser shows it, and `tests` renders every chart the
//! report writes (resvg) so that a broken one fails.

use std::fmt::Write as _;

/// What a panel's numbers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A ratio: `12.3x`; the axis marks 1x.
    Ratio,
    /// Nanoseconds, shown as ns, µs or ms.
    Nanos,
    /// Milliseconds, shown as µs, ms or s.
    Millis,
    /// A count per operation (exits): `0.25`.
    Count,
}

impl Unit {
    /// `v` as a person reads it.
    pub fn show(self, v: f64) -> String {
        let num = |x: f64| {
            if x >= 100.0 {
                format!("{x:.0}")
            } else if x >= 10.0 {
                format!("{x:.1}")
            } else {
                format!("{x:.2}")
            }
        };
        match self {
            Self::Ratio => format!("{}x", num(v)),
            Self::Count => num(v),
            Self::Nanos | Self::Millis => {
                let ns = if self == Self::Nanos { v } else { v * 1e6 };
                if ns >= 1e9 {
                    format!("{} s", num(ns / 1e9))
                } else if ns >= 1e6 {
                    format!("{} ms", num(ns / 1e6))
                } else if ns >= 1e3 {
                    format!("{} µs", num(ns / 1e3))
                } else {
                    format!("{} ns", num(ns))
                }
            }
        }
    }
}

impl Unit {
    /// An axis tick at `v` (a power of ten): `0.1x`, `1x`, `100 ns`, `10 µs`.
    pub fn tick(self, v: f64) -> String {
        let s = self.show(v);
        let end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        match s[..end].parse::<f64>() {
            Ok(n) => format!("{n}{}", &s[end..]),
            Err(_) => s,
        }
    }
}

/// A row label cut to what fits left of the bars.
fn fit(label: &str) -> String {
    const MAX: usize = 46;
    if label.chars().count() <= MAX {
        label.to_string()
    } else {
        let mut s: String = label.chars().take(MAX - 1).collect();
        s.push('…');
        s
    }
}

/// One labelled row: a value per series (None: no bar).
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Shown left of the bars.
    pub label: String,
    /// One per series, in the panel's series order.
    pub values: Vec<Option<f64>>,
}

/// Rows under a heading.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The heading ("" for none).
    pub title: String,
    /// Its rows.
    pub rows: Vec<Row>,
}

/// One chart panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    /// Its title.
    pub title: String,
    /// What the values are.
    pub unit: Unit,
    /// The series: (name, colour), in the order of each row's values.
    pub series: Vec<(String, &'static str)>,
    /// The groups, top to bottom.
    pub groups: Vec<Group>,
    /// A shaded band (a tolerance), on the value axis.
    pub band: Option<(f64, f64)>,
    /// Bars of the first series above this are painted red (a goal missed).
    pub goal: Option<f64>,
    /// Said when there is nothing to draw.
    pub empty_note: String,
}

/// Ours.
pub const BLUE: &str = "#1f5fbf";
/// The bare-host twin.
pub const GREY: &str = "#8c8c8c";
/// The QEMU peer.
pub const ORANGE: &str = "#e08a1e";
/// The seed's figure.
pub const LIGHT: &str = "#c8c8c8";
/// A goal missed.
pub const RED: &str = "#c62828";

const WIDTH: f64 = 960.0;
const LABEL_W: f64 = 300.0;
const VALUE_W: f64 = 90.0;
const BAR_H: f64 = 13.0;
const ROW_GAP: f64 = 6.0;
const HEAD_H: f64 = 22.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Panel {
    fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.groups
            .iter()
            .flat_map(|g| g.rows.iter())
            .flat_map(|r| r.values.iter().flatten().copied())
            .filter(|v| v.is_finite() && *v > 0.0)
    }

    /// The axis: whole decades around every value (and 1x for a ratio).
    fn decades(&self) -> (i32, i32) {
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for v in self.values() {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if self.unit == Unit::Ratio {
            lo = lo.min(1.0);
            hi = hi.max(1.0);
        }
        if let Some((a, b)) = self.band {
            lo = lo.min(a);
            hi = hi.max(b);
        }
        if !lo.is_finite() {
            return (0, 1);
        }
        let (mut a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        if self.unit == Unit::Ratio {
            // A decade below 1x, so a ratio just above it (the seed's 1.07x) is a bar
            // one sees, not a sliver at the axis.
            a = a.min(-1);
        }
        (a, b.max(a + 1))
    }

    fn height(&self) -> f64 {
        let rows: usize = self.groups.iter().map(|g| g.rows.len()).sum();
        let heads = self.groups.iter().filter(|g| !g.title.is_empty()).count();
        let per_row = BAR_H * self.series.len().max(1) as f64 + ROW_GAP;
        70.0 + heads as f64 * HEAD_H + rows.max(1) as f64 * per_row + 30.0
    }

    /// Draws the panel with its top at `y0`; returns the SVG.
    fn draw(&self, y0: f64) -> String {
        let mut o = String::new();
        let (d0, d1) = self.decades();
        let x0 = LABEL_W;
        let x1 = WIDTH - VALUE_W;
        let x = |v: f64| {
            let t = (v.max(10f64.powi(d0)).log10() - d0 as f64) / (d1 - d0) as f64;
            x0 + t.clamp(0.0, 1.0) * (x1 - x0)
        };
        let h = self.height();
        let _ = writeln!(
            o,
            r#"<text x="10" y="{:.1}" font-size="15" font-weight="bold">{}</text>"#,
            y0 + 20.0,
            esc(&self.title)
        );
        // Legend.
        let mut lx = 10.0;
        for (name, colour) in &self.series {
            let _ = writeln!(
                o,
                r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{colour}"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
                y0 + 30.0,
                lx + 16.0,
                y0 + 40.0,
                esc(name)
            );
            lx += 30.0 + 7.0 * name.chars().count() as f64;
        }
        let top = y0 + 55.0;
        let bottom = y0 + h - 30.0;
        if let Some((a, b)) = self.band {
            let _ = writeln!(
                o,
                r##"<rect class="band" x="{:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="#d5ecd5"/>"##,
                x(a),
                x(b) - x(a),
                bottom - top
            );
        }
        // Decades: a grid line and a label each.
        for d in d0..=d1 {
            let v = 10f64.powi(d);
            let gx = x(v);
            let _ = writeln!(
                o,
                r##"<line x1="{gx:.1}" y1="{top:.1}" x2="{gx:.1}" y2="{bottom:.1}" stroke="#e4e4e4"/><text class="tick" x="{gx:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
                bottom + 14.0,
                self.unit.tick(v)
            );
        }
        let mut y = top;
        let k = self.series.len().max(1) as f64;
        let mut drawn = 0;
        for g in &self.groups {
            if !g.title.is_empty() {
                let _ = writeln!(
                    o,
                    r#"<text x="10" y="{:.1}" font-size="13" font-weight="bold">{}</text>"#,
                    y + 15.0,
                    esc(&g.title)
                );
                y += HEAD_H;
            }
            for r in &g.rows {
                let _ = writeln!(
                    o,
                    r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"#,
                    x0 - 8.0,
                    y + BAR_H * k / 2.0 + 4.0,
                    esc(&fit(&r.label))
                );
                for (j, v) in r.values.iter().enumerate() {
                    let by = y + BAR_H * j as f64;
                    let Some(v) = v.filter(|v| v.is_finite() && *v > 0.0) else {
                        continue;
                    };
                    let colour = match self.goal {
                        Some(goal) if j == 0 && v > goal => RED,
                        _ => self.series.get(j).map_or(BLUE, |s| s.1),
                    };
                    let w = (x(v) - x0).max(1.0);
                    let _ = writeln!(
                        o,
                        r#"<rect class="bar" x="{x0:.1}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="{colour}"/><text class="value" x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
                        by + 1.0,
                        BAR_H - 2.0,
                        x0 + w + 4.0,
                        by + BAR_H - 2.5,
                        self.unit.show(v)
                    );
                    drawn += 1;
                }
                y += BAR_H * k + ROW_GAP;
            }
        }
        if drawn == 0 {
            let _ = writeln!(
                o,
                r##"<text x="{x0:.1}" y="{:.1}" font-size="12" fill="#555">{}</text>"##,
                top + 16.0,
                esc(&self.empty_note)
            );
        }
        if self.unit == Unit::Ratio {
            let one = x(1.0);
            let _ = writeln!(
                o,
                r#"<line class="one" x1="{one:.1}" y1="{top:.1}" x2="{one:.1}" y2="{bottom:.1}" stroke="black" stroke-width="1.5"/><text x="{one:.1}" y="{:.1}" font-size="11" text-anchor="middle" font-weight="bold">1x</text>"#,
                top - 3.0
            );
        }
        let _ = writeln!(
            o,
            r#"<line x1="{x0:.1}" y1="{bottom:.1}" x2="{x1:.1}" y2="{bottom:.1}" stroke="black"/>"#
        );
        o
    }
}

/// Panels stacked top to bottom as one SVG document.
pub fn svg(panels: &[Panel]) -> String {
    let h: f64 = panels.iter().map(Panel::height).sum::<f64>() + 10.0;
    let mut o = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH:.0}" height="{h:.0}" viewBox="0 0 {WIDTH:.0} {h:.0}" font-family="sans-serif">"#
    );
    o.push('\n');
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let mut y = 0.0;
    for p in panels {
        o.push_str(&p.draw(y));
        y += p.height();
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panel(values: &[f64]) -> Panel {
        Panel {
            title: "t".into(),
            unit: Unit::Ratio,
            series: vec![("ours".into(), BLUE), ("seed".into(), LIGHT)],
            groups: vec![Group {
                title: "g".into(),
                rows: values
                    .iter()
                    .map(|v| Row {
                        label: format!("r{v}"),
                        values: vec![Some(*v), Some(v * 2.0)],
                    })
                    .collect(),
            }],
            band: None,
            goal: Some(100.0),
            empty_note: "nothing".into(),
        }
    }

    #[test]
    fn values_read_as_people_write_them() {
        assert_eq!(Unit::Ratio.show(1.234), "1.23x");
        assert_eq!(Unit::Ratio.show(3000.0), "3000x");
        assert_eq!(Unit::Nanos.show(231.0), "231 ns");
        assert_eq!(Unit::Nanos.show(92_454.0), "92.5 µs");
        assert_eq!(Unit::Millis.show(21.8), "21.8 ms");
        assert_eq!(Unit::Millis.show(0.5), "500 µs");
        assert_eq!(Unit::Ratio.tick(0.1), "0.1x");
        assert_eq!(Unit::Ratio.tick(1000.0), "1000x");
        assert_eq!(Unit::Nanos.tick(10_000.0), "10 µs");
        assert_eq!(Unit::Millis.tick(1.0), "1 ms");
        assert_eq!(fit("short"), "short");
        assert_eq!(fit(&"x".repeat(60)).chars().count(), 46);
    }

    #[test]
    fn the_axis_spans_whole_decades_and_holds_1x() {
        assert_eq!(panel(&[3.0, 3000.0]).decades(), (-1, 4));
        assert_eq!(panel(&[0.02]).decades(), (-2, 0));
        // 1x is always on a ratio axis, with a decade below it.
        assert_eq!(panel(&[5.0]).decades(), (-1, 1));
        let mut ns = panel(&[231.0, 92_454.0]);
        ns.unit = Unit::Nanos;
        assert_eq!(ns.decades(), (2, 6));
    }

    #[test]
    fn every_bar_has_its_value_and_a_missed_goal_is_red() {
        let s = svg(&[panel(&[2.0, 500.0])]);
        assert_eq!(s.matches(r#"class="bar""#).count(), 4);
        for v in ["2.00x", "4.00x", "500x", "1000x"] {
            assert!(s.contains(&format!(">{v}</text>")), "{v} missing: {s}");
        }
        assert_eq!(s.matches(RED).count(), 1, "{s}");
        assert!(s.contains(r#"class="one""#) && s.contains(">1x</text>"));
        let empty = svg(&[panel(&[])]);
        assert!(empty.contains(">nothing</text>"));
        assert!(!empty.contains(r#"class="bar""#));
    }
}
