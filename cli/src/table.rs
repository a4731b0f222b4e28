//! Plain-text tables for people: columns padded to their widest cell, two spaces
//! apart, the last column not padded.

/// A table being built row by row.
#[derive(Clone, Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Table {
        Table {
            rows: vec![headers.iter().map(|h| h.to_string()).collect()],
        }
    }

    /// Adds a row; missing cells are empty.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Whether only the header is there.
    pub fn is_empty(&self) -> bool {
        self.rows.len() <= 1
    }

    /// The table as text, one line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                if i + 1 == columns {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    let pad = width - cell.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let mut table = Table::new(&["A", "LONGER", "C"]);
        table.row(vec!["wide cell".into(), "x".into(), "last".into()]);
        table.row(vec!["y".into()]);
        assert_eq!(
            table.render(),
            "A          LONGER  C\nwide cell  x       last\ny\n"
        );
    }
}
