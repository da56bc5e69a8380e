//! Plain aligned tables for `bcctl`'s default output.
//!
//! Whatever a cell holds — a name of any length, a node's message with NUL or ESC in it — the
//! printer neither panics nor sends a control character to the terminal: control characters and
//! the bidirectional formatting characters are written as escapes (`\u{1b}`), and padding is
//! computed here rather than through `format!`'s width, which panics past 65,535.

use std::borrow::Cow;

/// `s` with every character a terminal would interpret written as an escape: control characters
/// (C0, DEL, C1) as Rust writes them in a debug string (`\0`, `\n`, `\u{1b}`), and the
/// bidirectional and line-separator formatting characters as `\u{202e}`.
pub fn safe(s: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{200E}' | '\u{200F}' | '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else if unsafe_char(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Appends `cell` to `out`, padded with spaces to `width` characters.
fn push_padded(out: &mut String, cell: &str, width: usize) {
    out.push_str(cell);
    let len = cell.chars().count();
    out.extend(std::iter::repeat_n(' ', width.saturating_sub(len)));
}

/// Renders `rows` under `headers`, columns padded to their widest cell, two spaces apart. Cells
/// are shown through [`safe`].
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let headers: Vec<Cow<'_, str>> = headers.iter().map(|h| safe(h)).collect();
    let rows: Vec<Vec<Cow<'_, str>>> = rows
        .iter()
        .map(|r| r.iter().map(|c| safe(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[Cow<'_, str>]| {
        let mut text = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            push_padded(&mut text, c, widths.get(i).copied().unwrap_or(0));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&headers);
    for row in &rows {
        line(row);
    }
    out
}

/// Key/value pairs, keys padded; keys and values are shown through [`safe`].
pub fn render_kv(pairs: &[(&str, String)]) -> String {
    let pairs: Vec<(String, Cow<'_, str>)> = pairs
        .iter()
        .map(|(k, v)| (format!("{}:", safe(k)), safe(v)))
        .collect();
    let w = pairs
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (k, v) in &pairs {
        push_padded(&mut out, k, w);
        out.push(' ');
        out.push_str(v);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_to_widest_cell() {
        let t = render(
            &["ID", "STATE"],
            &[
                vec!["node_a".into(), "adopted".into()],
                vec!["n".into(), "x".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "ID      STATE");
        assert_eq!(lines[1], "node_a  adopted");
        assert_eq!(lines[2], "n       x");
    }

    #[test]
    fn a_cell_of_65536_characters_or_more_renders() {
        // `format!("{c:<w$}")` panics once the width passes u16::MAX (`bcctl pools list` exited
        // 101 on a 65,536-character pool name).
        let long = "n".repeat(70_000);
        let t = render(&["ID", "NAME"], &[vec!["pool_a".into(), long.clone()]]);
        assert!(t.lines().nth(1).is_some_and(|l| l.ends_with(&long)));
        let kv = render_kv(&[(long.as_str(), "v".to_owned())]);
        assert!(kv.starts_with(&long));
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        let t = render(&["NAME"], &[vec!["a\0b\u{1b}[2Jc\u{202e}d\ne".into()]]);
        assert!(!t.contains('\0') && !t.contains('\u{1b}') && !t.contains('\u{202e}'));
        assert!(t.contains("a\\0b\\u{1b}[2Jc\\u{202e}d\\ne"), "{t}");
        let kv = render_kv(&[("k\u{1b}", "v\u{7}".to_owned())]);
        assert_eq!(kv, "k\\u{1b}: v\\u{7}\n");
    }

    proptest::proptest! {
        #[test]
        fn any_string_renders_without_control_characters(
            cells in proptest::collection::vec(proptest::prelude::any::<String>(), 1..4),
            long in 0usize..70_000,
        ) {
            let mut row = cells.clone();
            row.push("x".repeat(long));
            let t = render(&["A", "B"], &[row, cells.clone()]);
            let only_newlines = t.chars().filter(|c| c.is_control()).all(|c| c == '\n');
            proptest::prop_assert!(only_newlines);
            proptest::prop_assert_eq!(t.lines().count(), 3);
            let kv = render_kv(&cells.iter().map(|c| (c.as_str(), c.clone())).collect::<Vec<_>>());
            proptest::prop_assert!(kv.chars().filter(|c| c.is_control()).all(|c| c == '\n'));
        }
    }
}
