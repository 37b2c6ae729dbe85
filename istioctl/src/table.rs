//! Column alignment as Go's `text/tabwriter` does it for istioctl (pad character ' ', no
//! flags): every cell but the last of a line is padded to its column's widest cell plus
//! `padding`; the last cell is written as is.

/// Renders a header and rows; `padding` is 1 for most istioctl tables, 5 for certificates.
pub fn render(header: &[&str], rows: &[Vec<String>], padding: usize) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        for (i, cell) in row.iter().enumerate().take(columns) {
            out.push_str(cell);
            if i + 1 < columns {
                let pad = widths[i] + padding - cell.chars().count();
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_all_but_the_last_column() {
        let rows = vec![
            vec!["default".to_string(), "a".to_string(), "x".to_string()],
            vec!["ns".to_string(), "longer".to_string(), String::new()],
        ];
        let t = render(&["NAMESPACE", "NAME", "LAST"], &rows, 1);
        assert_eq!(
            t,
            "NAMESPACE NAME   LAST\ndefault   a      x\nns        longer \n"
        );
        let t = render(&["A", "B"], &[vec!["1".into(), "2".into()]], 5);
        assert_eq!(t, "A     B\n1     2\n");
    }
}
