//! Where a communicator came from, which is what its children are built from,
//! and the id its frames carry. Plain data: making communicators from it is
//! the business of `builder.rs` and `split.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::bootstrap::Store;
use crate::config::Config;
use crate::transport::loopback::LoopbackLink;

/// Where a communicator came from.
pub(super) enum Origin {
    /// Built over a store, under a prefix.
    Store(Box<StoreOrigin>),
    /// Threads of one process joined by in-memory links.
    InProcess(Arc<InProcGroup>),
    /// Over links the caller connected.
    Links,
}

/// A store-built communicator's store, namespace and settings.
pub(super) struct StoreOrigin {
    pub(super) store: Arc<dyn Store>,
    pub(super) prefix: String,
    pub(super) cfg: Config,
    /// How errors name the store (its URL, or the object passed to the builder).
    pub(super) label: String,
}

/// One row of an in-process mesh: this rank's links to every other rank.
type Row = Vec<Option<LoopbackLink>>;
/// A sub-group being formed: its shared state and the rows not yet taken.
pub(super) type Forming = (Arc<InProcGroup>, Vec<Option<Row>>);

/// What the threads of one in-process group share: how to make sub-groups.
pub(super) struct InProcGroup {
    /// Namespace of this group (sub-groups extend it), unique in the process.
    pub(super) prefix: String,
    /// Random bytes of this process's first group: ids of groups of this process
    /// differ from those of another process with the same prefixes.
    pub(super) nonce: [u8; 16],
    pub(super) cfg: Config,
    /// Where the group's threads agree after a failure
    /// ([`Communicator::agree`](crate::Communicator::agree)), shared with its
    /// sub-groups (keys are under each group's prefix).
    pub(super) store: Arc<crate::bootstrap::MemStore>,
    /// Meshes of sub-groups being formed, by prefix: the first member to arrive
    /// creates the mesh; each takes its row; the last removes the entry.
    pub(super) forming: Mutex<HashMap<String, Forming>>,
}

impl InProcGroup {
    pub(super) fn new(
        prefix: String,
        nonce: [u8; 16],
        cfg: Config,
        store: Arc<crate::bootstrap::MemStore>,
    ) -> InProcGroup {
        InProcGroup { prefix, nonce, cfg, store, forming: Mutex::new(HashMap::new()) }
    }

    /// This group's namespace.
    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The id of this group's communicators.
    pub(super) fn id(&self) -> u32 {
        comm_id(&self.prefix, &self.nonce)
    }
}

/// 32-bit FNV-1a over `parts`, each followed by a zero byte.
pub(super) fn fnv32(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(0x811c_9dc5u32, |h, p| p.iter().chain(&[0u8]).fold(h, |h, b| (h ^ *b as u32).wrapping_mul(0x0100_0193)))
}

/// The id frames of the communicator under `prefix` with this nonce carry.
pub(super) fn comm_id(prefix: &str, nonce: &[u8]) -> u32 {
    fnv32(&[prefix.as_bytes(), nonce])
}
