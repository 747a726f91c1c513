//! libtess as a whole, from the build tree's `tess.pc`:
//! - the header set is `tess.h` and exactly the five headers it includes;
//! - every function those headers declare is a defined dynamic symbol of `libtess.so`, and the
//!   library exports no other function (a `#[no_mangle]` function of a crate that nothing names
//!   would be left out by the linker, and an export without a declaration is a header gap);
//! - a program that includes only `tess.h` compiles with `pkg-config --cflags --libs tess` and
//!   runs, linked against the shared library and against the static one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use tess_testkit::c_lib::{self, Link};

/// The headers `tess.h` includes, in its order.
fn umbrella_includes(include_dir: &Path) -> Vec<String> {
    let tess_h = std::fs::read_to_string(include_dir.join("tess.h")).expect("read tess.h");
    tess_h
        .lines()
        .filter_map(|l| l.strip_prefix("#include \""))
        .map(|l| l.trim_end_matches('"').to_string())
        .collect()
}

/// The functions a cbindgen header declares. With `args = "horizontal"` each prototype is one
/// line at column 0, `RETURN-TYPE NAME(ARGUMENTS);`; typedefs of function pointers, struct
/// fields (indented), comments and preprocessor lines are not prototypes.
fn declared_functions(header: &str) -> Vec<String> {
    header
        .lines()
        .filter(|l| l.ends_with(");") && !l.starts_with("typedef"))
        .filter(|l| l.starts_with(|c: char| c.is_ascii_alphabetic()))
        .filter_map(|l| {
            let before = &l[..l.find('(')?];
            let start = before
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            Some(before[start..].to_string()).filter(|name| !name.is_empty())
        })
        .collect()
}

/// The functions (`T`) a shared library defines in its dynamic symbol table.
fn exported_functions(lib: &Path) -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("run nm (binutils)");
    assert!(
        out.status.success(),
        "nm -D {}: {}",
        lib.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [_, "T", name] => Some(name.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_header_set_is_tess_h_and_the_five_it_includes() {
    let include_dir = c_lib::variable("includedir");
    let mut included = umbrella_includes(&include_dir);
    assert_eq!(
        included,
        [
            "tess_channel.h",
            "tess_ns.h",
            "tess_runtime.h",
            "tess_heartbeat.h",
            "tess_pulse.h"
        ]
    );
    included.push("tess.h".into());
    let mut present: Vec<String> = std::fs::read_dir(&include_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".h"))
        .collect();
    present.sort();
    included.sort();
    assert_eq!(
        present,
        included,
        "{} holds headers tess.h does not include",
        include_dir.display()
    );
}

#[test]
fn libtess_so_exports_every_function_the_headers_declare_and_no_other() {
    let include_dir = c_lib::variable("includedir");
    let mut declared = BTreeSet::new();
    for header in umbrella_includes(&include_dir) {
        let text = std::fs::read_to_string(include_dir.join(&header)).unwrap();
        let functions = declared_functions(&text);
        // Each header declares several functions: an empty list means the parser went wrong.
        assert!(functions.len() >= 5, "{header}: only {functions:?}");
        for f in functions {
            assert!(declared.insert(f.clone()), "{f} is declared twice");
        }
    }
    let lib: PathBuf = c_lib::variable("libdir").join("libtess.so");
    let exported = exported_functions(&lib);
    let missing: Vec<_> = declared.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "{} does not export {missing:?}: is the crate that defines them named in \
         crates/tess-ffi/src/lib.rs?",
        lib.display()
    );
    let undeclared: Vec<_> = exported.difference(&declared).collect();
    assert!(
        undeclared.is_empty(),
        "{} exports {undeclared:?}, which no header declares",
        lib.display()
    );
}

#[test]
fn a_program_including_tess_h_builds_with_pkg_config_and_runs() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/umbrella.c");
    let dir = std::env::temp_dir().join(format!("tess-ffi-umbrella-{}", std::process::id()));
    for (link, name) in [
        (Link::Shared, "umbrella-shared"),
        (Link::Static, "umbrella-static"),
    ] {
        let exe = dir.join(name);
        c_lib::compile(&[&source], &exe, link);
        let out = Command::new(&exe).output().expect("run umbrella");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name} failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            text,
            "channel: hello across\nns: no such service\nruntime: invalid argument\n\
             heartbeat: refused a nameless heartbeat\npulse: invalid argument\n"
        );
        let needed = Command::new("readelf")
            .arg("-d")
            .arg(&exe)
            .output()
            .unwrap();
        let dynamic = String::from_utf8_lossy(&needed.stdout);
        assert_eq!(
            dynamic.contains("[libtess.so]"),
            link == Link::Shared,
            "{name}: {dynamic}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
