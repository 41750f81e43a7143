//! The speed figure: coil's and llama.cpp's prompt and generation tokens/s
//! per benchmark file, as horizontal bars in two panels, written as a
//! plain SVG (no fonts or scripts embedded; the same input gives the same
//! bytes).
//!
//! Input: the `summary.json` of `scripts/bench-vs-llamacpp.sh` — an array
//! of objects with `model`, `type` and `[mean, std]` pairs `coil_pp`,
//! `llama_pp`, `coil_tg`, `llama_tg` — or an object `{"title", "note",
//! "results": [...]}` holding such an array with the figure's title and a
//! line naming the run.

use serde_json::Value;
use std::fmt::Write;

/// One benchmark file's four means (tokens/s).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// `model type`, e.g. `qwen35-0.8b-like Q4_K_M`.
    pub label: String,
    pub coil_pp: f64,
    pub llama_pp: f64,
    pub coil_tg: f64,
    pub llama_tg: f64,
}

/// What the figure shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub title: String,
    /// A line under the title naming the run (date, commit, command).
    pub note: String,
    pub entries: Vec<Entry>,
}

/// Reads a summary (see the module comment). `title` replaces the file's own.
pub fn parse(json: &str, title: Option<&str>) -> Result<Figure, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let (file_title, note, results) = match &v {
        Value::Array(a) => (None, String::new(), a.as_slice()),
        Value::Object(o) => {
            let results = o
                .get("results")
                .and_then(Value::as_array)
                .ok_or("an object summary needs a \"results\" array")?;
            let text = |k: &str| o.get(k).and_then(Value::as_str).map(str::to_string);
            (
                text("title"),
                text("note").unwrap_or_default(),
                results.as_slice(),
            )
        }
        _ => return Err("a summary is an array of results or an object with \"results\"".into()),
    };
    if results.is_empty() {
        return Err("the summary has no results".into());
    }
    let entries = results
        .iter()
        .enumerate()
        .map(|(i, r)| entry(r).map_err(|e| format!("result {i}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let title = title
        .map(str::to_string)
        .or(file_title)
        .unwrap_or_else(|| "coil and llama.cpp, tokens/s".to_string());
    Ok(Figure {
        title,
        note,
        entries,
    })
}

fn entry(r: &Value) -> Result<Entry, String> {
    let text = |k: &str| {
        r.get(k)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("no string field \"{k}\""))
    };
    // `[mean, std]` as the harness writes it (a bare number is taken too).
    let mean = |k: &str| {
        let v = r.get(k).ok_or_else(|| format!("no field \"{k}\""))?;
        let m = match v {
            Value::Array(a) => a.first().and_then(Value::as_f64),
            other => other.as_f64(),
        };
        match m {
            Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
            _ => Err(format!(
                "\"{k}\" is not [mean, std] with a finite mean >= 0"
            )),
        }
    };
    Ok(Entry {
        label: format!("{} {}", text("model")?, text("type")?),
        coil_pp: mean("coil_pp")?,
        llama_pp: mean("llama_pp")?,
        coil_tg: mean("coil_tg")?,
        llama_tg: mean("llama_tg")?,
    })
}

const WIDTH: f64 = 1000.0;
const LABEL_W: f64 = 190.0;
const PANEL_W: f64 = 330.0;
const GAP: f64 = 60.0;
const TOP: f64 = 92.0;
const ROW_H: f64 = 34.0;
const BAR_H: f64 = 12.0;
const COIL: &str = "#2563eb";
const LLAMA: &str = "#9ca3af";

/// The smallest of 1, 2, 2.5, 5 × 10^k at or above `x`: the axis' end.
fn nice_ceiling(x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&c| c >= x)
        .unwrap_or(10.0 * p)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Tokens/s as printed on the bars: three significant digits at most.
fn tps(x: f64) -> String {
    if x == 0.0 {
        "0".to_string()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// The figure as an SVG document.
pub fn svg(fig: &Figure) -> String {
    let n = fig.entries.len() as f64;
    let height = TOP + n * ROW_H + 36.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="16" y="24" font-size="15" font-weight="bold">{}</text>"#,
        esc(&fig.title)
    );
    if !fig.note.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="16" y="42" fill="#4b5563" font-size="10">{}</text>"##,
            esc(&fig.note)
        );
    }
    // Legend.
    let _ = writeln!(
        s,
        r#"<rect x="{LABEL_W}" y="52" width="14" height="10" fill="{COIL}"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="61">coil (ratio to llama.cpp)</text>"#,
        LABEL_W + 20.0
    );
    let _ = writeln!(
        s,
        r#"<rect x="{}" y="52" width="14" height="10" fill="{LLAMA}"/>"#,
        LABEL_W + 200.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="61">llama.cpp</text>"#,
        LABEL_W + 220.0
    );

    type Pick = fn(&Entry) -> (f64, f64);
    let panels: [(&str, Pick); 2] = [
        ("prompt, pp512 (tokens/s)", |e| (e.coil_pp, e.llama_pp)),
        ("generation, tg128 (tokens/s)", |e| (e.coil_tg, e.llama_tg)),
    ];
    for (p, (name, pick)) in panels.iter().enumerate() {
        let x0 = LABEL_W + p as f64 * (PANEL_W + GAP);
        let max = fig
            .entries
            .iter()
            .map(|e| {
                let (c, l) = pick(e);
                c.max(l)
            })
            .fold(0.0, f64::max);
        let top = nice_ceiling(max);
        let scale = PANEL_W / top;
        let _ = writeln!(
            s,
            r#"<text x="{x0}" y="{}" font-weight="bold">{}</text>"#,
            TOP - 14.0,
            esc(name)
        );
        for k in 0..=4 {
            let v = top * k as f64 / 4.0;
            let x = x0 + v * scale;
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#e5e7eb"/>"##,
                TOP - 6.0,
                TOP + n * ROW_H
            );
            let _ = writeln!(
                s,
                r##"<text x="{x:.1}" y="{}" fill="#6b7280" font-size="10" text-anchor="middle">{}</text>"##,
                TOP + n * ROW_H + 14.0,
                tps(v)
            );
        }
        for (i, e) in fig.entries.iter().enumerate() {
            let y = TOP + i as f64 * ROW_H;
            let (c, l) = pick(e);
            let ratio = if l > 0.0 {
                format!(" ({:.2}×)", c / l)
            } else {
                String::new()
            };
            for (j, (v, fill, text)) in
                [(c, COIL, format!("{}{ratio}", tps(c))), (l, LLAMA, tps(l))]
                    .into_iter()
                    .enumerate()
            {
                let yb = y + 3.0 + j as f64 * (BAR_H + 2.0);
                let w = v * scale;
                let _ = writeln!(
                    s,
                    r#"<rect x="{x0}" y="{yb:.1}" width="{w:.1}" height="{BAR_H}" fill="{fill}"/>"#
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" font-size="10">{}</text>"#,
                    x0 + w + 4.0,
                    yb + BAR_H - 2.0,
                    esc(&text)
                );
            }
        }
    }
    for (i, e) in fig.entries.iter().enumerate() {
        let y = TOP + i as f64 * ROW_H + 19.0;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{y:.1}" text-anchor="end">{}</text>"#,
            LABEL_W - 10.0,
            esc(&e.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const HARNESS: &str = r#"[
      {"model": "m", "type": "Q8_0", "coil_pp": [300.0, 4.0], "llama_pp": [100.0, 2.0],
       "coil_tg": [30.0, 1.0], "llama_tg": [20.0, 1.0], "pp_paired": [3.0]}
    ]"#;

    #[test]
    fn reads_the_harness_summary_as_written() {
        let f = parse(HARNESS, Some("t")).unwrap();
        assert_eq!(f.title, "t");
        assert_eq!(
            f.entries,
            vec![Entry {
                label: "m Q8_0".into(),
                coil_pp: 300.0,
                llama_pp: 100.0,
                coil_tg: 30.0,
                llama_tg: 20.0
            }]
        );
        let svg = svg(&f);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("300 (3.00×)") && svg.contains("30.0 (1.50×)"));
    }

    #[test]
    fn bad_summaries_are_named() {
        assert!(parse("{}", None).unwrap_err().contains("results"));
        assert!(parse("[]", None).unwrap_err().contains("no results"));
        let e = parse(
            r#"[{"model": "m", "type": "F16", "coil_pp": [1, 0]}]"#,
            None,
        )
        .unwrap_err();
        assert!(e.contains("result 0") && e.contains("llama_pp"), "{e}");
        let e = parse(
            r#"[{"model": "m", "type": "F16", "coil_pp": [null, 0], "llama_pp": 1, "coil_tg": 1, "llama_tg": 1}]"#,
            None,
        )
        .unwrap_err();
        assert!(e.contains("coil_pp"), "{e}");
    }

    #[test]
    fn axis_ends_are_round() {
        assert_eq!(nice_ceiling(458.3), 500.0);
        assert_eq!(nice_ceiling(54.6), 100.0);
        assert_eq!(nice_ceiling(19.6), 20.0);
        assert_eq!(nice_ceiling(21.0), 25.0);
    }
}
