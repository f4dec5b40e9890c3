//! The summary tables of reports, aligned for a terminal or as a Markdown pipe table for a
//! model card, and the short model names they show.

/// `rows` under `header`: columns padded (the first left-aligned, the others right-aligned),
/// or with `markdown` a pipe table with the same alignment.
pub fn render_table(header: &[&str], rows: &[Vec<String>], markdown: bool) -> String {
    let mut s = String::new();
    if markdown {
        s += &format!("| {} |\n", header.join(" | "));
        s += &format!("|---|{}\n", "---:|".repeat(header.len() - 1));
        for r in rows {
            s += &format!("| {} |\n", r.join(" | "));
        }
        return s;
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let mut line = String::new();
        for (c, cell) in cells.iter().enumerate() {
            let pad = " ".repeat(widths[c] - cell.chars().count());
            if c == 0 {
                line += &format!("{cell}{pad}");
            } else {
                line += &format!("  {pad}{cell}");
            }
        }
        line.trim_end().to_string() + "\n"
    };
    s += &line(header.to_vec());
    for r in rows {
        s += &line(r.iter().map(String::as_str).collect());
    }
    s
}

/// A model's name without its directory path (`/models/x/` -> `x`), for tables and plots.
pub fn short_name(name: &str) -> String {
    std::path::Path::new(name.trim_end_matches('/'))
        .file_name()
        .map_or(name.to_string(), |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_pipe() {
        let rows = vec![vec!["a".to_string(), "1.5".to_string()]];
        assert_eq!(
            render_table(&["Model", "PPL"], &rows, false),
            "Model  PPL\na      1.5\n"
        );
        assert_eq!(
            render_table(&["Model", "PPL"], &rows, true),
            "| Model | PPL |\n|---|---:|\n| a | 1.5 |\n"
        );
        assert_eq!(short_name("/models/x/"), "x");
    }
}
