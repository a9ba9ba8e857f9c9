//! Keeps docs/configuration.md true to the binary: the flag table lists
//! exactly the flags `snowkeep-server --help` prints, each beside the
//! `SNOWKEEP_*` variable `--help` shows for it, and the exit-code table lists
//! exactly the codes `server/src/main.rs` can return. A flag added to the
//! binary and not to the page fails here, by name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("server/ has a parent")
        .to_path_buf()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The lines of one `## ` section of a markdown page, heading excluded.
fn section<'a>(page: &'a str, heading: &str) -> Vec<&'a str> {
    let mut lines = page.lines().skip_while(|l| *l != heading);
    assert!(lines.next().is_some(), "no heading {heading:?}");
    lines.take_while(|l| !l.starts_with("## ")).collect()
}

/// The first two cells of each row of the section's tables whose first cell
/// starts with `prefix` (backticks stripped), in order.
fn rows(lines: &[&str], prefix: &str) -> Vec<(String, String)> {
    let clean = |cell: &str| cell.trim().trim_matches('`').to_string();
    lines
        .iter()
        .filter(|l| l.starts_with(&format!("| `{prefix}")))
        .map(|l| {
            let cells: Vec<&str> = l.splitn(4, '|').collect();
            assert!(cells.len() == 4, "a table row with too few cells: {l}");
            (clean(cells[1]), clean(cells[2]))
        })
        .collect()
}

/// Every long flag `snowkeep-server --help` lists, with the variable it
/// shows for it (`[env: SNOWKEEP_…=]`), if any.
fn help_flags() -> BTreeMap<String, Option<String>> {
    let out = Command::new(env!("CARGO_BIN_EXE_snowkeep-server"))
        .arg("--help")
        // A variable set where the test runs must not change what --help shows.
        .env_clear()
        .output()
        .expect("run snowkeep-server --help");
    assert!(out.status.success(), "--help exited {}", out.status);
    let help = String::from_utf8(out.stdout).expect("--help prints UTF-8");
    let mut flags = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let line = trimmed;
        // An option line (`--flag <VALUE>`, or `-h, --help`) is indented less
        // than the descriptions, which may start with a flag's name too.
        let option = match line.strip_prefix('-').filter(|_| indent < 8) {
            Some(rest) if rest.starts_with('-') => Some(line),
            Some(rest) if rest.chars().nth(1) == Some(',') => {
                rest.split_once(", ").map(|(_, long)| long)
            }
            _ => None,
        };
        if let Some(option) = option {
            let flag: String = option
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '=' && *c != '[')
                .collect();
            assert!(flag.starts_with("--"), "not a long flag: {line}");
            flags.insert(flag.clone(), None);
            last = Some(flag);
        } else if let Some(rest) = line.split_once("[env: ").map(|(_, r)| r) {
            let var: String = rest.chars().take_while(|c| *c != '=').collect();
            let flag = last
                .clone()
                .unwrap_or_else(|| panic!("{var} before any flag"));
            flags.insert(flag, Some(var));
        }
    }
    assert!(
        flags.len() > 20,
        "too few flags parsed from --help:\n{help}"
    );
    flags
}

#[test]
fn the_flag_table_lists_every_flag_of_help_with_its_variable() {
    let page = read("docs/configuration.md");
    let table = rows(&section(&page, "## Flags"), "--");
    let mut documented = BTreeMap::new();
    for (flag, var) in &table {
        assert!(
            documented.insert(flag.clone(), var.clone()).is_none(),
            "docs/configuration.md lists {flag} twice"
        );
    }
    let help = help_flags();

    let in_help: BTreeSet<&String> = help.keys().collect();
    let in_doc: BTreeSet<&String> = documented.keys().collect();
    let missing: Vec<_> = in_help.difference(&in_doc).collect();
    let extra: Vec<_> = in_doc.difference(&in_help).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/configuration.md's flag table and `snowkeep-server --help` differ: \
         missing from the table: {missing:?}; in the table but not in --help: {extra:?}"
    );

    for (flag, var) in &help {
        let cell = &documented[flag];
        match var {
            Some(var) => assert_eq!(
                cell, var,
                "docs/configuration.md: {flag} has the variable {var} in --help"
            ),
            None => assert_eq!(
                cell, "—",
                "docs/configuration.md: {flag} has no variable in --help"
            ),
        }
    }
}

/// The exit codes `server/src/main.rs` returns: `ExitCode::SUCCESS`,
/// `ExitCode::FAILURE` and `ExitCode::from(CONST)` with `const CONST: u8`.
fn exit_codes_in_main() -> BTreeSet<u8> {
    let main = read("server/src/main.rs");
    let constant = |name: &str| -> u8 {
        let decl = format!("const {name}: u8 = ");
        let (_, rest) = main
            .split_once(&decl)
            .unwrap_or_else(|| panic!("main.rs has no {decl}…"));
        rest.split(';')
            .next()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("main.rs: {name} is not a u8 literal"))
    };
    let mut codes = BTreeSet::new();
    for (_, rest) in main
        .match_indices("ExitCode::")
        .map(|(i, _)| main.split_at(i + 10))
    {
        if rest.starts_with("SUCCESS") {
            codes.insert(0);
        } else if rest.starts_with("FAILURE") {
            codes.insert(1);
        } else if let Some(arg) = rest.strip_prefix("from(") {
            let arg = arg.split(')').next().unwrap_or_default().trim();
            codes.insert(arg.parse().unwrap_or_else(|_| constant(arg)));
        } else {
            panic!(
                "main.rs returns an exit code this test cannot read: ExitCode::{}",
                rest.lines().next().unwrap_or_default()
            );
        }
    }
    codes
}

#[test]
fn the_exit_code_table_lists_the_codes_main_returns() {
    let page = read("docs/configuration.md");
    let documented: BTreeSet<u8> = rows(&section(&page, "## Exit codes"), "")
        .into_iter()
        .map(|(code, _)| {
            code.parse()
                .unwrap_or_else(|_| panic!("not an exit code: {code}"))
        })
        .collect();
    assert_eq!(
        documented,
        exit_codes_in_main(),
        "docs/configuration.md's exit codes (left) and server/src/main.rs (right)"
    );
}
