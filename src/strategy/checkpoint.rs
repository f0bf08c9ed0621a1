//! Checkpoint files: the variables and the epoch they follow, written atomically
//! (a temporary file renamed over the old one, so a crash mid-save keeps the last
//! good checkpoint) and read as untrusted input (a regular file no longer than
//! the model's tensors make, every length checked against the file before
//! anything is allocated, and a checksum over the whole).
//!
//! Layout, little-endian: the line `braid checkpoint 1\n`; the epoch (u64); the
//! number of tensors (u64); each tensor's length in elements (u64); every tensor's
//! f32 values, end to end; an FNV-1a 64 checksum of everything before it.

use std::collections::hash_map::RandomState;
use std::fs::{File, OpenOptions};
use std::hash::BuildHasher;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::tensors::{same_shapes, Tensors};
use crate::error::{Error, Result};

const MAGIC: &[u8] = b"braid checkpoint 1\n";

/// What a checkpoint holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Epochs finished when it was written.
    pub epoch: u64,
    /// The variables.
    pub vars: Tensors,
}

fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The bytes of `c` in the file layout.
pub fn encode(c: &Checkpoint) -> Vec<u8> {
    let elems: usize = c.vars.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(MAGIC.len() + 16 + 8 * c.vars.len() + 4 * elems + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&c.epoch.to_le_bytes());
    out.extend_from_slice(&(c.vars.len() as u64).to_le_bytes());
    c.vars.iter().for_each(|t| out.extend_from_slice(&(t.len() as u64).to_le_bytes()));
    c.vars.iter().flatten().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
    let sum = fnv64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Parse the file layout; `what` names the source in errors.
pub fn decode(bytes: &[u8], what: &str) -> Result<Checkpoint> {
    let bad = |why: String| Error::InvalidArgument(format!("checkpoint {what}: {why}"));
    let body = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("not a braid checkpoint (no `braid checkpoint 1` header)".into()))?;
    if body.len() < 24 {
        return Err(bad(format!("{} bytes: too short", bytes.len())));
    }
    let (content, sum) = bytes.split_at(bytes.len() - 8);
    if fnv64(content) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err(bad("checksum mismatch (truncated or corrupted)".into()));
    }
    let mut words = body[..body.len() - 8].chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
    let epoch = words.next().ok_or_else(|| bad("no epoch".into()))?;
    let count = words.next().ok_or_else(|| bad("no tensor count".into()))?;
    let rest = body.len() - 8 - 16;
    // Each tensor needs at least its 8-byte length: a count past that is a lie.
    if count > (rest / 8) as u64 {
        return Err(bad(format!("{count} tensors cannot fit in {rest} bytes")));
    }
    let lens: Vec<u64> = words.by_ref().take(count as usize).collect();
    let data = &body[16 + 8 * lens.len()..body.len() - 8];
    let total = lens.iter().try_fold(0u64, |a, &l| a.checked_add(l)).and_then(|e| e.checked_mul(4));
    if total != Some(data.len() as u64) {
        return Err(bad(format!("tensor lengths {lens:?} do not match the {} bytes of values", data.len())));
    }
    let mut values = data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")));
    let vars = lens.iter().map(|&l| values.by_ref().take(l as usize).collect()).collect();
    Ok(Checkpoint { epoch, vars })
}

/// Write `c` to `path` atomically: into a new file of a name nobody can guess
/// beside it, then renamed over it.
pub fn write_checkpoint(path: &Path, c: &Checkpoint) -> Result<()> {
    let io = |what: &str, e| Error::io(format!("{what} checkpoint {}", path.display()), e);
    let (tmp, mut f) = create_beside(path).map_err(|e| io("creating a temporary file for", e))?;
    let written = f
        .write_all(&encode(c))
        .and_then(|()| f.sync_all())
        .map_err(|e| io("writing", e))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| io("renaming into", e)));
    if written.is_err() {
        // Best effort: the error that matters is the one returned.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Create a new file beside `path` (same directory, so the rename stays on one
/// file system) under a name no other writer picks: the target's name, the
/// process, a per-process count and random bits. Created exclusively, so an
/// existing file or a symlink planted under that name is never followed or
/// truncated.
fn create_beside(path: &Path) -> io::Result<(PathBuf, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let mut last = None;
    for _ in 0..8 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // Hash keys are seeded from the OS's randomness, so these bits cannot be guessed.
        let salt = RandomState::new().hash_one(n);
        let mut tmp = std::ffi::OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".{}.{n}.{salt:016x}.tmp", std::process::id()));
        let tmp = dir.join(tmp);
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

/// The largest checkpoint [`read_checkpoint`] reads without a model to compare
/// with (16 GiB); with one, exactly the size its tensors make.
const MAX_CHECKPOINT_BYTES: u64 = 16 << 30;

/// The size of a checkpoint holding tensors of the shapes of `vars`.
fn encoded_len(vars: &Tensors) -> u64 {
    let elems: u64 = vars.iter().map(|t| t.len() as u64).sum();
    (MAGIC.len() + 16 + 8) as u64 + 8 * vars.len() as u64 + 4 * elems
}

/// The bytes of the regular file at `path`, refused before reading when it is
/// something else (a FIFO would block, a device never end) or longer than `cap`
/// (`why_cap` says where that limit comes from).
pub(super) fn read_capped(path: &Path, cap: u64, why_cap: &dyn Fn() -> String) -> Result<Vec<u8>> {
    let what = path.display();
    let io = |e| Error::io(format!("reading checkpoint {what}"), e);
    let too_long =
        |len: &str| Error::InvalidArgument(format!("checkpoint {what}: {len}, more than {cap} bytes ({})", why_cap()));
    // Non-blocking, so opening a FIFO with no writer returns instead of waiting.
    let f = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(Error::InvalidArgument(format!("checkpoint {what}: not a regular file")));
    }
    if meta.len() > cap {
        return Err(too_long(&format!("{} bytes", meta.len())));
    }
    // The file may grow after the look: never read more than the cap allows.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(cap.saturating_add(1)).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > cap {
        return Err(too_long("grew while read"));
    }
    Ok(bytes)
}

/// Read a checkpoint from `path`; with `like`, its tensors must have those shapes.
pub fn read_checkpoint(path: &Path, like: Option<&Tensors>) -> Result<Checkpoint> {
    let what = path.display().to_string();
    let shape = |t: &Tensors| t.iter().map(Vec::len).collect::<Vec<_>>();
    let bytes = match like {
        Some(like) => read_capped(path, encoded_len(like), &|| {
            format!("the size of the model's tensors of lengths {:?}", shape(like))
        })?,
        None => read_capped(path, MAX_CHECKPOINT_BYTES, &|| "the largest checkpoint read without a model".into())?,
    };
    let c = decode(&bytes, &what)?;
    if let Some(like) = like {
        if !same_shapes(&c.vars, like) {
            return Err(Error::InvalidArgument(format!(
                "checkpoint {what}: tensors of lengths {:?}, the model has {:?}",
                shape(&c.vars),
                shape(like)
            )));
        }
    }
    Ok(c)
}
