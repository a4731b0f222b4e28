//! "Did you mean" hints: the known name closest to a misspelt one. Shared by `parse`
//! (unknown fields, enum values) and `validate` (port names), so neither imports the
//! other for it.

/// The candidate closest to `word` by edit distance, if close enough to be a typo.
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    if word.chars().count() > 64 {
        return None;
    }
    let lower = word.to_ascii_lowercase();
    candidates
        .map(|c| (edit_distance(&lower, c), c))
        .filter(|(d, c)| *d <= (c.len() / 3).clamp(1, 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("cmdlin", "cmdline"), 1);
        assert_eq!(edit_distance("intsances", "instances"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn closest_suggests_only_plausible_typos() {
        let names = ["cmdline", "name", "daemon"];
        assert_eq!(closest("cmdlne", names.iter().copied()), Some("cmdline"));
        assert_eq!(closest("Name", names.iter().copied()), Some("name"));
        assert_eq!(closest("zzzzzz", names.iter().copied()), None);
    }
}
