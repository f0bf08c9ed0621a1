//! Generates `include/braid.h` (at the repository root, committed) from this crate's
//! sources with cbindgen, and a pkg-config file for the build tree,
//! `target/<profile>/pkgconfig/braid.pc`.
//!
//! That is in the repository (`ffi/` of a git checkout). A packaged copy (the build
//! that `cargo package` and `cargo publish` verify, a registry download) has no
//! repository around it, and its build writes nothing outside `OUT_DIR`: the header
//! goes to `$OUT_DIR/include/braid.h` and the pkg-config file, naming that header, to
//! `$OUT_DIR/pkgconfig/braid.pc`.
//!
//! The header depends only on the sources and `cbindgen.toml` (no paths, dates or
//! versions of the build machine), so a fresh build reproduces the committed file
//! byte for byte; CI fails when it differs. A header that is already current is
//! not rewritten, and one that cannot be written (a read-only source tree) is a
//! warning, not an error.

use std::path::{Path, PathBuf};

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let repo = repository(&dir);
    for input in ["src", "cbindgen.toml", "braid.pc.in", "build.rs"] {
        println!("cargo:rerun-if-changed={}", dir.join(input).display());
    }
    if let Some(root) = repo {
        // The header too: a hand edit is overwritten at the next build (and CI's
        // `git diff --exit-code include/braid.h` then fails).
        println!("cargo:rerun-if-changed={}", root.join("include/braid.h").display());
    }
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("ffi/cbindgen.toml is valid");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut header = Vec::new();
    bindings.write(&mut header);
    let include = repo.unwrap_or(&out).join("include");
    let path = include.join("braid.h");
    if std::fs::read(&path).ok().as_deref() != Some(&header[..]) {
        let written = std::fs::create_dir_all(&include).and_then(|()| std::fs::write(&path, &header));
        if let Err(e) = written {
            println!("cargo:warning=cannot write {}: {e}", path.display());
        }
    }
    pkg_config(&dir, &out, &include, repo.is_some());
}

/// The repository's root when this crate is its `ffi/` directory: the parent holds
/// `.git` (a directory, or a file in a worktree) and a `Cargo.toml`. `None` for a
/// packaged copy, whose parent is `target/package/` or a registry's source cache.
fn repository(dir: &Path) -> Option<&Path> {
    let root = dir.parent()?;
    let ours = dir.file_name().is_some_and(|n| n == "ffi");
    (ours && root.join(".git").exists() && root.join("Cargo.toml").is_file()).then_some(root)
}

/// `braid.pc`: headers in `include` (the repository's, or `OUT_DIR`'s), libraries in
/// the profile directory (`OUT_DIR` is `target/<profile>/build/braid-ffi-*/out`).
/// Written to `target/<profile>/pkgconfig/` in the repository, else into `OUT_DIR`.
fn pkg_config(dir: &Path, out: &Path, include: &Path, in_repository: bool) {
    let Some(profile_dir) = out.ancestors().nth(3) else { return };
    let template = std::fs::read_to_string(dir.join("braid.pc.in")).expect("ffi/braid.pc.in is readable");
    let text: String = template
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            l.replace("@includedir@", &include.display().to_string())
                .replace("@libdir@", &profile_dir.display().to_string())
                .replace("@version@", env!("CARGO_PKG_VERSION"))
                + "\n"
        })
        .collect();
    let pc_dir = if in_repository { profile_dir } else { out }.join("pkgconfig");
    let written = std::fs::create_dir_all(&pc_dir).and_then(|()| std::fs::write(pc_dir.join("braid.pc"), text));
    if let Err(e) = written {
        println!("cargo:warning=cannot write {}: {e}", pc_dir.join("braid.pc").display());
    }
}
