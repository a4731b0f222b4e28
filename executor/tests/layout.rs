//! The executor's code layout (`executor/layout/hot.ld`, docs/executor.md "Memory")
//! still matches the code: every pattern of the linker script that names a function
//! of this crate names one the current binary has.
//!
//! The script is generated from a profile of a release build (`layout/profile.py`),
//! and nothing else notices when a hot function is renamed or moved to another module:
//! the linker then silently leaves it in the cold part, where each such function can
//! cost a settled executor one more 64 KiB window of resident code. Functions of this
//! crate keep their symbols in a debug build (nothing of ours is inlined away
//! there), so the debug binary the tests build tells, in a second, whether a
//! pattern went stale. What it cannot tell (a new hot function that no pattern names
//! yet) is what `executor_bench memory` measures; see docs/testing.md.

use std::path::Path;
use std::process::Command;

/// The section patterns of `hot.ld`: the first of each `*(.text.PATTERN ...)` line,
/// without `.text.`.
fn patterns(script: &str) -> Vec<String> {
    script
        .lines()
        .filter_map(|l| l.trim().strip_prefix("*(.text."))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(|p| p.trim_end_matches(')').to_string())
        .collect()
}

/// Whether `name` matches the linker glob `pattern` (`*` any run, `?` one character;
/// the layout uses no other wildcard).
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == name[n]) {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some(p);
            mark = n;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            mark += 1;
            n = mark;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// The function symbols of `binary` (`nm`).
fn functions(binary: &Path) -> Vec<String> {
    let out = Command::new("nm")
        .arg(binary)
        .output()
        .expect("nm (binutils, installed by scripts/setup.sh) runs");
    assert!(out.status.success(), "nm {}: {:?}", binary.display(), out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let (_, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
            matches!(kind, "t" | "T" | "w" | "W").then(|| name.to_string())
        })
        .collect()
}

#[test]
fn glob_matches_like_the_linker() {
    assert!(glob(b"_ZN3foo3bar17h*E", b"_ZN3foo3bar17h0123abcdE"));
    assert!(!glob(b"_ZN3foo3bar17h*E", b"_ZN3foo3baz17h0123abcdE"));
    assert!(glob(b"a*b*c", b"aXXbYYc"));
    assert!(!glob(b"a*b*c", b"aXXbYY"));
    assert!(glob(b"a?c", b"abc"));
}

#[test]
fn every_hot_function_of_the_executor_in_the_layout_still_exists() {
    // None may be stale: a function removed on purpose is taken out of `hot.ld` (or
    // the layout regenerated).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(dir.join("layout/hot.ld")).unwrap();
    let ours: Vec<String> = patterns(&script)
        .into_iter()
        .filter(|p| p.contains("drover_executor"))
        .collect();
    assert!(
        ours.len() >= 20,
        "hot.ld names only {} functions of drover_executor: is it the generated layout?",
        ours.len()
    );
    let symbols = functions(Path::new(env!("CARGO_BIN_EXE_drover-executor")));
    let stale: Vec<&String> = ours
        .iter()
        .filter(|p| !symbols.iter().any(|s| glob(p.as_bytes(), s.as_bytes())))
        .collect();
    assert!(
        stale.is_empty(),
        "{} of the {} executor functions executor/layout/hot.ld places in the hot part no \
         longer exist (renamed or moved?), so release builds leave them in the cold part: \
         regenerate the layout (docs/executor.md, \"Memory\") or rename them in hot.ld:\n{}",
        stale.len(),
        ours.len(),
        stale
            .iter()
            .map(|s| format!("  {s}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
