//! Checkpoint files: the variables and the epoch they follow, written atomically
//! (a temporary file renamed over the old one, so a crash mid-save keeps the last
//! good checkpoint) and read as untrusted input (every length checked against the
//! file before anything is allocated, and a checksum over the whole).
//!
//! Layout, little-endian: the line `braid checkpoint 1\n`; the epoch (u64); the
//! number of tensors (u64); each tensor's length in elements (u64); every tensor's
//! f32 values, end to end; an FNV-1a 64 checksum of everything before it.

use std::io::Write;
use std::path::Path;

use super::{same_shapes, Tensors};
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

/// Write `c` to `path` atomically.
pub fn write_checkpoint(path: &Path, c: &Checkpoint) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let io = |what: &str, e| Error::io(format!("{what} checkpoint {}", path.display()), e);
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("creating", e))?;
    f.write_all(&encode(c)).and_then(|()| f.sync_all()).map_err(|e| io("writing", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("renaming into", e))
}

/// Read a checkpoint from `path`; with `like`, its tensors must have those shapes.
pub fn read_checkpoint(path: &Path, like: Option<&Tensors>) -> Result<Checkpoint> {
    let what = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| Error::io(format!("reading checkpoint {what}"), e))?;
    let c = decode(&bytes, &what)?;
    if let Some(like) = like {
        if !same_shapes(&c.vars, like) {
            let shape = |t: &Tensors| t.iter().map(Vec::len).collect::<Vec<_>>();
            return Err(Error::InvalidArgument(format!(
                "checkpoint {what}: tensors of lengths {:?}, the model has {:?}",
                shape(&c.vars),
                shape(like)
            )));
        }
    }
    Ok(c)
}
