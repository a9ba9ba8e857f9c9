//! Keeps the workspace's structure: every crate's top-level modules free of
//! import cycles, and production files and functions within their sizes
//! (below, *Sizes*).
//!
//! For each workspace member's `src/` (and each binary folder
//! `src/bin/<name>/`), a file `x.rs` or a folder `x/` is module `x`; the
//! crate roots (`lib.rs`, `main.rs`, the files of `src/bin/`) are not in the
//! graph. Module `x` depends on `y` when code of `x` names `crate::y`
//! (also inside `use crate::{…}`), or reaches `y` with as many `super::` as
//! the file lies deep. Comments, string literals and `#[cfg(test)]` modules
//! do not count. The test fails when modules depend on each other, directly
//! or through others, and lists each such cycle with a file behind every edge.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Top-level modules and, for each, the modules it depends on with one file
/// (relative to the crate root's folder) that shows it.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

#[test]
fn no_top_level_modules_import_each_other() {
    let workspace = workspace_root();
    let mut problems = Vec::new();
    for member in members(&workspace) {
        for (name, root) in crate_roots(&workspace.join(&member)) {
            let graph = module_graph(&root);
            for cycle in cycles(&graph) {
                problems.push(describe(&format!("{member} ({name})"), &graph, &cycle));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "top-level modules that import each other (move what both need into a module of its own, \
         below both):\n\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_graph_sees_paths_groups_and_supers_but_not_comments_strings_or_tests() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |path: &str, text: &str| {
        let path = src.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    };
    write("lib.rs", "mod a; mod b; mod c; mod d; mod e;");
    write("a.rs", "use crate::{b::X, c};\n");
    write("b/mod.rs", "mod inner;\n// crate::e in a comment\n");
    write("b/inner.rs", "fn f() { super::super::d::g() }\n");
    write(
        "c.rs",
        "const S: &str = \"crate::e\";\nconst C: char = '{';\n\
         #[cfg(test)]\nmod tests { use crate::e; }\n#[cfg(test)]\nmod more;\n",
    );
    write("c/more.rs", "use crate::e;\n");
    write(
        "d.rs",
        "fn g<'a>(x: &'a str) -> &'a str { crate::a::f(); x }\n",
    );
    write("e.rs", "");
    let edges = |m: &str| -> Vec<String> { module_graph(src)[m].keys().cloned().collect() };
    assert_eq!(edges("a"), ["b", "c"]);
    assert_eq!(edges("b"), ["d"]);
    assert!(edges("c").is_empty());
    assert_eq!(edges("d"), ["a"]);
    assert_eq!(
        cycles(&module_graph(src)),
        [vec!["a".to_owned(), "b".to_owned(), "d".to_owned()]]
    );
}

fn workspace_root() -> PathBuf {
    // Read at run time (cargo sets it), so the test can be pointed at
    // another checkout of the workspace.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest
        .parent()
        .expect("the server crate sits in the workspace")
        .to_owned()
}

/// The `members` of the workspace's `Cargo.toml`.
fn members(workspace: &Path) -> Vec<String> {
    let manifest = fs::read_to_string(workspace.join("Cargo.toml")).unwrap();
    let start = manifest.find("members").expect("a workspace manifest");
    let list = &manifest[start..];
    let list = &list[list.find('[').unwrap() + 1..list.find(']').unwrap()];
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The folders whose entries are a crate's top-level modules: `src/` (of
/// `lib.rs` and `main.rs`) and every `src/bin/<name>/`.
fn crate_roots(member: &Path) -> Vec<(String, PathBuf)> {
    let src = member.join("src");
    let mut roots = vec![("src".to_owned(), src.clone())];
    if let Ok(bins) = fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = bins.map(|e| e.unwrap().path()).collect();
        bins.sort();
        for bin in bins.into_iter().filter(|p| p.is_dir()) {
            let name = format!("src/bin/{}", bin.file_name().unwrap().to_string_lossy());
            roots.push((name, bin));
        }
    }
    roots
}

/// The top-level modules of the crate root folder `root` and their files.
fn modules(root: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in fs::read_dir(root).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() && name != "bin" {
            modules.entry(name).or_default().extend(rust_files(&path));
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" && stem != "main" {
                modules.entry(stem.to_owned()).or_default().push(path);
            }
        }
    }
    modules
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

fn module_graph(root: &Path) -> Graph {
    let modules = modules(root);
    let names: BTreeSet<&str> = modules.keys().map(String::as_str).collect();
    let mut graph = Graph::new();
    for (module, files) in &modules {
        let edges = graph.entry(module.clone()).or_default();
        // Code of each file, and the files that are `#[cfg(test)] mod x;`.
        let mut code = BTreeMap::new();
        let mut raw = BTreeMap::new();
        let mut test_files = BTreeSet::new();
        for file in files {
            let source = fs::read_to_string(file).unwrap();
            let (text, test_mods) = without_test_modules(&code_only(&source));
            raw.insert(file.clone(), source);
            let dir = if file.file_name().is_some_and(|n| n == "mod.rs") {
                file.parent().unwrap().to_owned()
            } else {
                file.with_extension("")
            };
            for m in test_mods {
                test_files.insert(dir.join(format!("{m}.rs")));
                test_files.insert(dir.join(&m));
            }
            code.insert(file.clone(), text);
        }
        // A test module's own `#[path = "…"]` modules are tests too
        // (`claim/tests.rs` takes `claim/tests_wait.rs` so).
        for (file, source) in &raw {
            if test_files.iter().any(|t| file.starts_with(t)) {
                for piece in source.split("#[path = \"").skip(1) {
                    if let Some((path, _)) = piece.split_once('"') {
                        test_files.insert(file.parent().unwrap().join(path));
                    }
                }
            }
        }
        for (file, text) in &code {
            if test_files.iter().any(|t| file.starts_with(t)) {
                continue;
            }
            let rel = file.strip_prefix(root).unwrap();
            let depth = rel.components().count()
                - usize::from(rel.file_name().is_some_and(|n| n == "mod.rs"));
            let prefixes = ["crate::".to_owned(), "super::".repeat(depth)];
            for prefix in &prefixes {
                for first in first_segments(text, prefix) {
                    if first != *module && names.contains(first.as_str()) {
                        edges
                            .entry(first)
                            .or_insert_with(|| rel.display().to_string());
                    }
                }
            }
        }
    }
    graph
}

/// `text` with comments blanked and string and char literals emptied, so
/// that only code is searched and braces balance.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev = if i == 0 { ' ' } else { chars[i - 1] };
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if let Some(hashes) = raw_string(&chars[i..]).filter(|_| !ident(prev)) {
            // A raw string: r"…", r#"…"#, br"…".
            i += usize::from(c == 'b') + 1 + hashes + 1;
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while i < chars.len() && !chars[i..].starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && next == Some('\\') {
            // An escaped char literal: '\n', '\'', '\u{…}'.
            i += 3;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push_str("' '");
        } else {
            // Code, lifetimes included.
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The number of `#` of the raw string (`r"…"`, `r#"…"#`, `br"…"`) that
/// `text` starts with, if it starts with one.
fn raw_string(text: &[char]) -> Option<usize> {
    let rest = text
        .strip_prefix(&['b'])
        .unwrap_or(text)
        .strip_prefix(&['r'])?;
    let hashes = rest.iter().take_while(|&&h| h == '#').count();
    (rest.get(hashes) == Some(&'"')).then_some(hashes)
}

/// `code` without its inline `#[cfg(test)] mod x { … }` modules, and the
/// names of its out-of-line `#[cfg(test)] mod x;` ones.
fn without_test_modules(code: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        match test_module(after) {
            Some((name, len)) => {
                if after[..len].ends_with(';') {
                    names.push(name);
                }
                rest = &after[len..];
            }
            None => {
                out.push_str("#[cfg(test)]");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    (out, names)
}

/// When `text` (what follows a `#[cfg(test)]`) starts with a module, its
/// name and the length of its declaration or body.
fn test_module(text: &str) -> Option<(String, usize)> {
    let mut i = 0;
    let skip_space = |i: &mut usize| {
        while text[*i..].starts_with(char::is_whitespace) {
            *i += text[*i..].chars().next().map_or(1, char::len_utf8);
        }
    };
    skip_space(&mut i);
    // Further attributes, then a visibility.
    while text[i..].starts_with("#[") {
        i += text[i..].find(']')? + 1;
        skip_space(&mut i);
    }
    if text[i..].starts_with("pub") {
        i += 3;
        if text[i..].starts_with('(') {
            i += text[i..].find(')')? + 1;
        }
        skip_space(&mut i);
    }
    let after_mod = text[i..].strip_prefix("mod")?;
    if !after_mod.starts_with(char::is_whitespace) {
        return None;
    }
    i += 3;
    skip_space(&mut i);
    let name: String = text[i..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    i += name.len();
    skip_space(&mut i);
    if text[i..].starts_with(';') {
        return Some((name, i + 1));
    }
    if !text[i..].starts_with('{') {
        return None;
    }
    let mut depth = 0;
    for (k, c) in text[i..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((name, i + k + 1));
                }
            }
            _ => {}
        }
    }
    None
}

/// The first path segment after every `prefix` (`crate::`, `super::…`) in
/// `code` that starts a path, the names at the top of a `prefix{…}` group
/// included.
fn first_segments(code: &str, prefix: &str) -> Vec<String> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        if code[..start].ends_with(|c: char| ident(c) || c == ':') {
            continue;
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut expect_name = true;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => expect_name = true,
                    c if depth == 1 && expect_name && ident(c) => {
                        let name: String = group[k..].chars().take_while(|&c| ident(c)).collect();
                        found.push(name);
                        expect_name = false;
                    }
                    c if depth == 1 && !c.is_whitespace() => expect_name = false,
                    _ => {}
                }
            }
        } else {
            found.push(rest.chars().take_while(|&c| ident(c)).collect());
        }
    }
    found
}

/// The strongly connected components of more than one module, each sorted
/// (Tarjan's algorithm).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            let graph = self.graph;
            for w in graph[v].keys() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().expect("v is on the stack");
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found.sort();
    walk.found
}

/// One cycle, its modules and the edges between them with a file each.
fn describe(krate: &str, graph: &Graph, cycle: &[String]) -> String {
    let mut text = format!(
        "{krate}: {} modules in one cycle: {}\n",
        cycle.len(),
        cycle.join(", ")
    );
    for from in cycle {
        for (to, file) in &graph[from] {
            if cycle.contains(to) {
                text.push_str(&format!("  {from} -> {to}  ({file})\n"));
            }
        }
    }
    text
}

// Sizes. Production code in pieces a reader can hold: no `.rs` file under a
// workspace member's `src/` over MAX_FILE_LINES lines, no function over
// MAX_FN_LINES, except the named exceptions of `docs/design.md` (section
// *Code layout*, *Sizes*), each with its reason. Test code does not count: files named
// `tests.rs`, `*_tests.rs` or `tests_*.rs` or in a `tests/` folder, inline `#[cfg(test)] mod … { … }`
// modules, and the harness crate `test-support`. A function runs from its
// `fn` line to the closing brace at the same indentation (the layout
// `rustfmt` writes; CI checks it with `cargo fmt --check`). An exception that
// no longer exceeds its limit fails the test too, so the list cannot rot.

/// The most lines a production file may have, its in-file tests included.
const MAX_FILE_LINES: usize = 600;
/// The most lines a production function may have, `fn` line to `}`.
const MAX_FN_LINES: usize = 80;
/// Members whose `src/` is not production code (for the size limits).
const NOT_PRODUCTION: &[&str] = &["test-support"];

#[test]
fn production_files_and_functions_stay_within_their_limits_or_are_named_exceptions() {
    let workspace = workspace_root();
    let design = fs::read_to_string(workspace.join("docs/design.md")).unwrap();
    let allowed = exceptions(&design);
    let mut found = BTreeSet::new();
    for member in members(&workspace) {
        if NOT_PRODUCTION.contains(&member.as_str()) {
            continue;
        }
        for file in rust_files(&workspace.join(&member).join("src")) {
            let rel = file.strip_prefix(&workspace).unwrap().display().to_string();
            if is_test_file(&file) {
                continue;
            }
            let text = fs::read_to_string(&file).unwrap();
            let lines = text.lines().count();
            if lines > MAX_FILE_LINES {
                found.insert((rel.clone(), String::new(), lines));
            }
            for (name, length) in long_functions(&text) {
                found.insert((rel.clone(), name, length));
            }
        }
    }
    let unlisted: Vec<String> = found
        .iter()
        .filter(|(file, name, _)| !allowed.contains(&(file.clone(), name.clone())))
        .map(|(file, name, lines)| describe_size(file, name, *lines))
        .collect();
    let stale: Vec<String> = allowed
        .iter()
        .filter(|(file, name)| !found.iter().any(|(f, n, _)| f == file && n == name))
        .map(|(file, name)| describe_size(file, name, 0))
        .collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "over {MAX_FILE_LINES} lines per file or {MAX_FN_LINES} per function (split them, or \
         name them with a reason in docs/design.md, section Sizes):\n{}\n\nnamed exceptions \
         that are within the limits now (remove them from the list):\n{}",
        unlisted.join("\n"),
        stale.join("\n")
    );
}

#[test]
fn functions_are_measured_from_fn_to_their_closing_brace_outside_tests() {
    let body = "        x += 1;\n".repeat(MAX_FN_LINES - 2);
    let text = format!(
        "pub fn short() {{}}\n\
         trait T {{\n    fn declared(\n        &self,\n    ) -> u8;\n}}\n\
         impl S {{\n    pub(crate) async fn long(&self) {{\n{body}        y\n    }}\n}}\n\
         fn exact() {{\n{}}}\n\
         #[cfg(test)]\nmod tests {{\n    fn in_a_test() {{\n{body}{body}    }}\n}}\n",
        "    x += 1;\n".repeat(MAX_FN_LINES - 2),
    );
    // `long` is its line, MAX_FN_LINES - 2 body lines, `y` and `}`.
    assert_eq!(
        long_functions(&text),
        vec![("long".to_owned(), MAX_FN_LINES + 1)]
    );
    assert!(is_test_file(Path::new("a/src/claim/tests.rs")));
    assert!(is_test_file(Path::new("a/src/embedded/loop_tests.rs")));
    assert!(is_test_file(Path::new("a/src/claim/tests_wait.rs")));
    assert!(is_test_file(Path::new("a/src/config/tests/etcd.rs")));
    assert!(!is_test_file(Path::new("a/src/claim/conformance.rs")));
}

#[test]
fn exceptions_are_read_from_the_sizes_table() {
    let design = "# x\n### Sizes\n\ntext\n\n| file | function | why |\n| --- | --- | --- |\n\
                  | `a/src/x.rs` | `run` | a reason |\n| `a/src/y.rs` | — | a table |\n\n\
                  ## Next\n| `b/src/z.rs` | `f` | not here |\n";
    let want: BTreeSet<(String, String)> = [
        ("a/src/x.rs".to_owned(), "run".to_owned()),
        ("a/src/y.rs".to_owned(), String::new()),
    ]
    .into();
    assert_eq!(exceptions(design), want);
}

fn describe_size(file: &str, name: &str, lines: usize) -> String {
    let what = if name.is_empty() {
        format!("  {file}")
    } else {
        format!("  {file}: fn {name}")
    };
    if lines == 0 {
        what
    } else {
        format!("{what} ({lines} lines)")
    }
}

/// The rows of the table under `### Sizes` (to the next heading): (file, function), the function
/// empty for a file exception (`—` or `-` in its column).
fn exceptions(design: &str) -> BTreeSet<(String, String)> {
    let Some(start) = design.find("\n### Sizes\n") else {
        return BTreeSet::new();
    };
    let section = &design[start + "\n### Sizes\n".len()..];
    let section = section.find("\n#").map_or(section, |end| &section[..end]);
    section
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().strip_prefix('|')?.split('|').collect();
            let file = cells.first()?.trim().strip_prefix('`')?.strip_suffix('`')?;
            let name = cells.get(1)?.trim().trim_matches('`');
            let name = if name == "—" || name == "-" {
                ""
            } else {
                name
            };
            Some((file.to_owned(), name.to_owned()))
        })
        .collect()
}

/// Functions of `text` over [`MAX_FN_LINES`] lines, with their lengths,
/// outside inline `#[cfg(test)]` modules.
fn long_functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = &line[..line.len() - line.trim_start().len()];
        if line.trim() == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|l| l.trim_start().starts_with("mod ") && l.ends_with('{'))
        {
            i = closing(&lines, i + 1, indent).map_or(lines.len(), |end| end + 1);
            continue;
        }
        if let Some(name) = fn_name(line) {
            if let Some(end) = body_end(&lines, i, indent) {
                let length = end - i + 1;
                if length > MAX_FN_LINES {
                    out.push((name, length));
                }
            }
        }
        i += 1;
    }
    out
}

/// The name of the function `line` starts, if it does.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    for qualifier in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(qualifier).unwrap_or(rest);
    }
    for qualifier in ["const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(qualifier).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The line of the closing brace of the function starting at `start`, or
/// `None` for a declaration without a body or a body on one line.
fn body_end(lines: &[&str], start: usize, indent: &str) -> Option<usize> {
    for (at, line) in lines.iter().enumerate().skip(start) {
        let line = line.trim_end();
        if line.ends_with('}') && at == start {
            return None;
        }
        if line.ends_with(';') && (at == start || line.trim_start().starts_with(')')) {
            return None;
        }
        if line.ends_with('{') {
            return closing(lines, at, indent);
        }
    }
    None
}

/// The first line after `from` that is `indent` and a closing brace.
fn closing(lines: &[&str], from: usize, indent: &str) -> Option<usize> {
    (from + 1..lines.len()).find(|&at| {
        lines[at]
            .strip_prefix(indent)
            .is_some_and(|rest| rest.starts_with('}'))
    })
}

/// A file of tests: `tests.rs`, `*_tests.rs`, `tests_*.rs`, or any file in
/// a `tests/` folder (the submodules of a `tests.rs`).
fn is_test_file(path: &Path) -> bool {
    let stem = path.file_stem().unwrap().to_string_lossy();
    let in_tests = path
        .parent()
        .is_some_and(|p| p.components().any(|c| c.as_os_str() == "tests"));
    stem == "tests" || stem.ends_with("_tests") || stem.starts_with("tests_") || in_tests
}
