//! A line diff of two texts for `drover job diff` (a multi-line `cmdline` shown as
//! the lines that changed, not the whole script twice as one escaped string): the
//! longest common subsequence of lines, printed `- old`, `+ new`, `  same`.

/// Above this many lines on either side the diff is not computed (quadratic).
const MAX_LINES: usize = 2_000;

/// One line of the diff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line<'a> {
    Same(&'a str),
    Removed(&'a str),
    Added(&'a str),
}

/// The lines of `old` and `new`, in order, each kept, removed or added; None when
/// either has more than [`MAX_LINES`] lines.
pub fn diff<'a>(old: &'a str, new: &'a str) -> Option<Vec<Line<'a>>> {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    if a.len() > MAX_LINES || b.len() > MAX_LINES {
        return None;
    }
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::with_capacity(a.len().max(b.len()));
    while i < a.len() && j < b.len() {
        if a[i] == b[j] {
            out.push(Line::Same(a[i]));
            i += 1;
            j += 1;
        } else if lcs[i + 1][j] >= lcs[i][j + 1] {
            out.push(Line::Removed(a[i]));
            i += 1;
        } else {
            out.push(Line::Added(b[j]));
            j += 1;
        }
    }
    out.extend(a[i..].iter().map(|l| Line::Removed(l)));
    out.extend(b[j..].iter().map(|l| Line::Added(l)));
    Some(out)
}

/// The diff as text lines with `indent`: `- `, `+ `, `  ` prefixes.
pub fn render(lines: &[Line<'_>], indent: &str) -> String {
    let mut out = String::new();
    for line in lines {
        let (mark, text) = match line {
            Line::Same(t) => (' ', t),
            Line::Removed(t) => ('-', t),
            Line::Added(t) => ('+', t),
        };
        out.push_str(indent);
        out.push(mark);
        out.push(' ');
        out.push_str(text);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_changed_lines_are_marked() {
        let old = "set -e\necho start\nsleep 100\necho done\n";
        let new = "set -e\necho start\nsleep 200\necho done\necho bye\n";
        let lines = diff(old, new).unwrap();
        assert_eq!(
            render(&lines, "    "),
            "      set -e\n      echo start\n    - sleep 100\n    + sleep 200\n      echo done\n    + echo bye\n"
        );
    }

    #[test]
    fn huge_texts_are_not_diffed() {
        let big = "x\n".repeat(MAX_LINES + 1);
        assert!(diff(&big, "x").is_none());
    }
}
