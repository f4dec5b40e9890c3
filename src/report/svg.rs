//! A small self-contained SVG scatter plot (`compare --plot`).

/// Round tick positions covering `[lo, hi]`: steps of 1, 2 or 5 times a power of ten.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    // Integer multiples of the step, so ticks do not accumulate rounding error.
    let (i0, i1) = (
        (lo / step - 1e-9).ceil() as i64,
        (hi / step + 1e-9).floor() as i64,
    );
    (i0..=i1).map(|i| i as f64 * step).collect()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A small self-contained SVG scatter of `points` (label, x, y) with ticked axes.
pub fn svg_scatter(points: &[(String, f64, f64)], x_label: &str, y_label: &str) -> String {
    let (w, h) = (720.0, 440.0);
    let (left, right, top, bottom) = (80.0, 40.0, 30.0, 60.0);
    let range = |vals: Vec<f64>| {
        let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let pad = ((hi - lo) * 0.08).max(hi.abs() * 0.02).max(1e-6);
        (lo - pad, hi + pad)
    };
    let (x0, x1) = range(points.iter().map(|p| p.1).collect());
    let (y0, y1) = range(points.iter().map(|p| p.2).collect());
    let px = |x: f64| left + (x - x0) / (x1 - x0) * (w - left - right);
    let py = |y: f64| h - bottom - (y - y0) / (y1 - y0) * (h - top - bottom);
    let num = |v: f64| {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let (ax0, ax1, ay0, ay1) = (left, w - right, top, h - bottom);
    s += &format!("<path d=\"M{ax0} {ay0} V{ay1} H{ax1}\" fill=\"none\" stroke=\"black\"/>\n");
    for t in ticks(x0, x1) {
        let x = px(t);
        s += &format!(
            "<line x1=\"{x:.1}\" y1=\"{ay1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"black\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            ay1 + 5.0,
            ay1 + 19.0,
            num(t)
        );
    }
    for t in ticks(y0, y1) {
        let y = py(t);
        s += &format!(
            "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{ax0}\" y2=\"{y:.1}\" stroke=\"black\"/>\
             <line x1=\"{ax0}\" y1=\"{y:.1}\" x2=\"{ax1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            ax0 - 5.0,
            ax0 - 8.0,
            y + 4.0,
            num(t)
        );
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
        (ax0 + ax1) / 2.0,
        h - 15.0,
        xml_escape(x_label)
    );
    s += &format!(
        "<text transform=\"translate(20 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
        (ay0 + ay1) / 2.0,
        xml_escape(y_label)
    );
    for (label, x, y) in points {
        let (cx, cy) = (px(*x), py(*y));
        // Labels of points in the right half extend leftwards, so they stay inside the image.
        let (lx, anchor) = if cx > (ax0 + ax1) / 2.0 {
            (cx - 7.0, "end")
        } else {
            (cx + 7.0, "start")
        };
        s += &format!(
            "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"4\" fill=\"#1f77b4\"/>\
             <text x=\"{lx:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\">{}</text>\n",
            cy - 7.0,
            xml_escape(label)
        );
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(3.7, 33.1);
        assert_eq!(t.first(), Some(&5.0));
        assert_eq!(t.last(), Some(&30.0));
        let t = ticks(0.012, 0.018);
        assert!(
            t.len() >= 3
                && t.iter()
                    .all(|v| (0.012 - 1e-12..=0.018 + 1e-12).contains(v))
        );
    }

    #[test]
    fn svg_has_a_labelled_point_per_model() {
        let pts = vec![
            ("base <dense>".to_string(), 32.0, 10.0),
            ("w4".to_string(), 4.5, 11.5),
        ];
        let svg = svg_scatter(&pts, "bits per weight", "PPL");
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("base &lt;dense&gt;"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    }
}
