//! Generates `include/braid.h` (at the repository root, committed) from this crate's
//! sources with cbindgen, and a pkg-config file for the build tree,
//! `target/<profile>/pkgconfig/braid.pc`.
//!
//! The header depends only on the sources and `cbindgen.toml` (no paths, dates or
//! versions of the build machine), so a fresh build reproduces the committed file
//! byte for byte; CI fails when it differs. A header that is already current is
//! not rewritten, and one that cannot be written (a read-only source tree) is a
//! warning, not an error.

use std::path::{Path, PathBuf};

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    // The header too: a hand edit is overwritten at the next build (and CI's
    // `git diff --exit-code include/braid.h` then fails).
    for input in ["src", "cbindgen.toml", "braid.pc.in", "build.rs", "../include/braid.h"] {
        println!("cargo:rerun-if-changed={}", dir.join(input).display());
    }
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("ffi/cbindgen.toml is valid");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut header = Vec::new();
    bindings.write(&mut header);
    let root = dir.parent().expect("ffi/ lies in the repository");
    let path = root.join("include/braid.h");
    if std::fs::read(&path).ok().as_deref() != Some(&header[..]) {
        let written = std::fs::create_dir_all(root.join("include")).and_then(|()| std::fs::write(&path, &header));
        if let Err(e) = written {
            println!("cargo:warning=cannot write {}: {e}", path.display());
        }
    }
    pkg_config(&dir, root);
}

/// `braid.pc` for the build tree: headers in `include/`, libraries in the profile
/// directory (`OUT_DIR` is `target/<profile>/build/braid-ffi-*/out`).
fn pkg_config(dir: &Path, root: &Path) {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let Some(profile_dir) = out.ancestors().nth(3) else { return };
    let template = std::fs::read_to_string(dir.join("braid.pc.in")).expect("ffi/braid.pc.in is readable");
    let text: String = template
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            l.replace("@includedir@", &root.join("include").display().to_string())
                .replace("@libdir@", &profile_dir.display().to_string())
                .replace("@version@", env!("CARGO_PKG_VERSION"))
                + "\n"
        })
        .collect();
    let pc_dir = profile_dir.join("pkgconfig");
    let written = std::fs::create_dir_all(&pc_dir).and_then(|()| std::fs::write(pc_dir.join("braid.pc"), text));
    if let Err(e) = written {
        println!("cargo:warning=cannot write {}: {e}", pc_dir.join("braid.pc").display());
    }
}
