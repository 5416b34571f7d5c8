//! Golden tests for `translate`: every `testdata/translate/<case>.in.yaml` (Kubernetes objects,
//! opening with a `#` comment that says what the case checks) is translated and compared with
//! `<case>.out.yaml` (config, statuses, per-Gateway Services, static content).
//!
//! A mismatch fails with a unified diff (`-` expected, `+` got) of every case that differs. The
//! directory holds only such pairs: an input without its output, an output without its input
//! (a case renamed or removed without its golden) or any other file fails the test.
//!
//! `SWEETY_BLESS=1 cargo test -p sweety-controller goldens` rewrites the `.out.yaml` files (and
//! writes the missing ones); it never deletes a file, so an orphan output is removed by hand.

use super::{translate, Params, Snapshot};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/translate")
}

/// Translate one input file to its golden text.
fn render(input: &Path) -> String {
    let text = std::fs::read_to_string(input).unwrap();
    assert!(
        text.starts_with('#'),
        "{} must open with a comment saying what it checks",
        input.display()
    );
    let (snapshot, overrides) =
        Snapshot::from_yaml(&text).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
    let params: Params = match overrides {
        Some(mut v) => {
            if let Some(m) = v.as_mapping_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            serde_yaml::from_value(v).unwrap_or_else(|e| panic!("{}: params: {e}", input.display()))
        }
        None => Params::default(),
    };
    let mut params = params;
    // The controller always has a default certificate (configured or generated): goldens use
    // a fixed one so the ingress-https listener shows it first.
    if params.default_certificate.is_none() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
        params.default_certificate = Some(super::DefaultCertificate {
            cert: std::fs::read_to_string(dir.join("default-cert.pem")).unwrap(),
            key: std::fs::read_to_string(dir.join("default-key.pem")).unwrap(),
        });
    }
    let out = translate(&snapshot, &params);
    // Pure: a second run gives byte-identical output.
    let again = translate(&snapshot, &params);
    let text = serde_yaml::to_string(&out).unwrap();
    assert_eq!(
        text,
        serde_yaml::to_string(&again).unwrap(),
        "translate is not deterministic"
    );
    // Whatever translate emits must be a valid dataplane config (files are checked by the dataplane).
    if let Err(errors) = out.config.validate_structure() {
        panic!(
            "{}: translate produced an invalid config: {errors:?}",
            input.display()
        );
    }
    text
}

const INPUT: &str = ".in.yaml";
const OUTPUT: &str = ".out.yaml";

/// The golden directory as case names, or the reasons it is not a set of pairs.
fn cases(dir: &Path) -> (Vec<String>, Vec<String>) {
    let mut inputs = BTreeSet::new();
    let mut outputs = BTreeSet::new();
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(case) = name.strip_suffix(INPUT) {
            inputs.insert(case.to_string());
        } else if let Some(case) = name.strip_suffix(OUTPUT) {
            outputs.insert(case.to_string());
        } else {
            problems.push(format!(
                "{name}: not a golden file (only <case>{INPUT} and <case>{OUTPUT} belong here)"
            ));
        }
    }
    for case in outputs.difference(&inputs) {
        problems.push(format!(
            "{case}{OUTPUT}: orphan output, no {case}{INPUT} (delete it, or restore the input)"
        ));
    }
    (inputs.into_iter().collect(), problems)
}

#[test]
fn goldens() {
    let bless = std::env::var_os("SWEETY_BLESS").is_some();
    let dir = testdata();
    let (cases, mut failures) = cases(&dir);
    assert!(!cases.is_empty(), "no golden inputs in {}", dir.display());
    for case in &cases {
        let input = dir.join(format!("{case}{INPUT}"));
        let expected_path = dir.join(format!("{case}{OUTPUT}"));
        let got = render(&input);
        if bless {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        match std::fs::read_to_string(&expected_path) {
            Ok(want) if want == got => {}
            Ok(want) => failures.push(format!(
                "{case}: output differs (SWEETY_BLESS=1 to regenerate)\n{}",
                unified_diff(
                    &want,
                    &got,
                    &format!("{case}{OUTPUT}"),
                    &format!("translate({case}{INPUT})")
                )
            )),
            Err(e) => failures.push(format!(
                "{case}{INPUT}: no expected output {case}{OUTPUT} ({e}; SWEETY_BLESS=1 writes it)"
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden problem(s) in {}:\n{}",
        failures.len(),
        dir.display(),
        failures.join("\n")
    );
}

/// One line of a line diff: kept, only in the old text, or only in the new one.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Same,
    Old,
    New,
}

/// A unified diff (3 lines of context) from `old` to `new`, for a test failure message.
/// Longest common subsequence over the lines left once the common prefix and suffix are cut:
/// quadratic in those, which golden files (hundreds of lines) afford.
fn unified_diff(old: &str, new: &str, old_name: &str, new_name: &str) -> String {
    const CONTEXT: usize = 3;
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    // lcs[i][j]: length of the longest common subsequence of am[i..] and bm[j..].
    let mut lcs = vec![vec![0u32; bm.len() + 1]; am.len() + 1];
    for i in (0..am.len()).rev() {
        for j in (0..bm.len()).rev() {
            lcs[i][j] = if am[i] == bm[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // (op, line index in `a`, line index in `b`) for every line of either text.
    let mut ops: Vec<(Op, usize, usize)> = (0..prefix).map(|k| (Op::Same, k, k)).collect();
    let (mut i, mut j) = (0, 0);
    while i < am.len() || j < bm.len() {
        let op = if i < am.len() && j < bm.len() && am[i] == bm[j] {
            Op::Same
        } else if j == bm.len() || (i < am.len() && lcs[i + 1][j] >= lcs[i][j + 1]) {
            Op::Old
        } else {
            Op::New
        };
        ops.push((op, prefix + i, prefix + j));
        i += usize::from(op != Op::New);
        j += usize::from(op != Op::Old);
    }
    ops.extend((0..suffix).map(|k| (Op::Same, a.len() - suffix + k, b.len() - suffix + k)));

    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != Op::Same).collect();
    if changed.is_empty() {
        out.push_str("(the texts differ only in line endings or the final newline)\n");
        return out;
    }
    // Hunks: changed lines with their context, merged where the contexts touch.
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for &k in &changed {
        let (start, end) = (k.saturating_sub(CONTEXT), (k + CONTEXT + 1).min(ops.len()));
        match hunks.last_mut() {
            Some(last) if start <= last.1 => last.1 = end,
            _ => hunks.push((start, end)),
        }
    }
    for (start, end) in hunks {
        let hunk = &ops[start..end];
        let old_len = hunk.iter().filter(|o| o.0 != Op::New).count();
        let new_len = hunk.iter().filter(|o| o.0 != Op::Old).count();
        // A side with no lines in the hunk names the line before it (diff -u's convention).
        let first = |len: usize, index: usize| if len == 0 { index } else { index + 1 };
        out.push_str(&format!(
            "@@ -{},{old_len} +{},{new_len} @@\n",
            first(old_len, hunk[0].1),
            first(new_len, hunk[0].2)
        ));
        for &(op, i, j) in hunk {
            let line = match op {
                Op::Same => format!(" {}", a[i]),
                Op::Old => format!("-{}", a[i]),
                Op::New => format!("+{}", b[j]),
            };
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

#[test]
fn unified_diff_shows_changed_lines_with_context() {
    let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\n";
    let new = "a\nb\nc\nD\ne\nf\ng\nh\ni\nj\nk\nl\nm\n";
    assert_eq!(
        unified_diff(old, new, "want", "got"),
        "--- want\n+++ got\n\
@@ -1,7 +1,7 @@\n a\n b\n c\n-d\n+D\n e\n f\n g\n\
@@ -10,3 +10,4 @@\n j\n k\n l\n+m\n"
    );
    // Changes whose contexts touch make one hunk; a pure deletion counts no new lines.
    assert_eq!(
        unified_diff("1\n2\n3\n4\n5\n", "1\n3\n5\n", "a", "b"),
        "--- a\n+++ b\n@@ -1,5 +1,3 @@\n 1\n-2\n 3\n-4\n 5\n"
    );
    assert_eq!(
        unified_diff("", "x\n", "a", "b"),
        "--- a\n+++ b\n@@ -0,0 +1,1 @@\n+x\n"
    );
    assert!(unified_diff("x", "x\n", "a", "b").contains("only in line endings"));
}

#[test]
fn cases_report_orphans_and_strays() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "ok.in.yaml",
        "ok.out.yaml",
        "new.in.yaml",
        "gone.out.yaml",
        "notes.txt",
    ] {
        std::fs::write(dir.path().join(name), "#\n").unwrap();
    }
    let (cases, mut problems) = cases(dir.path());
    problems.sort();
    // An input without output is a case (it fails in `goldens`, or is blessed).
    assert_eq!(cases, ["new", "ok"]);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("gone.out.yaml: orphan output"));
    assert!(problems[1].starts_with("notes.txt: not a golden file"));
}
