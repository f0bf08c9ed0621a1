//! Job keys and the challenge-response that proves them.
//!
//! Every connection a job makes (data links and the TCP store) starts with both
//! ends sending a fresh random challenge; each end then answers the other's
//! challenge with an HMAC-SHA256 under the job key over a transcript that names
//! what is being connected (the context: a label, communicator, ranks) and both
//! challenges, the answerer's role first. The key never travels, an answer cannot
//! be replayed (the challenge is new each time) nor reflected back (roles differ).
//!
//! Without a configured key every end uses the empty key: the exchange then
//! proves nothing, but the wire format stays the same, so a rank with a key and
//! one without fail the handshake cleanly instead of misreading each other.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a challenge.
pub const CHALLENGE_LEN: usize = 32;
/// Bytes of an answer (an HMAC-SHA256 tag).
pub const PROOF_LEN: usize = 32;

/// A random challenge.
pub type Challenge = [u8; CHALLENGE_LEN];
/// An answer to a challenge.
pub type Proof = [u8; PROOF_LEN];

/// Which end of a connection answers: the end that opened it, or the end that accepted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The connecting (or segment-creating) end.
    Initiator,
    /// The accepting (or attaching) end.
    Responder,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Initiator => b"initiator",
            Role::Responder => b"responder",
        }
    }
}

/// The shared secret of one job. Cheap to clone; never printed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct JobKey(Option<Arc<[u8]>>);

impl JobKey {
    /// No key: handshakes still run, with the empty key, and prove nothing.
    pub fn none() -> JobKey {
        JobKey(None)
    }

    /// A key from its text (e.g. `BRAID_JOB_KEY`); the empty string means no key.
    pub fn from_text(text: &str) -> JobKey {
        if text.is_empty() {
            JobKey(None)
        } else {
            JobKey(Some(Arc::from(text.as_bytes())))
        }
    }

    /// A new random key, as hex text (what `braid run` hands its ranks).
    pub fn generate_text() -> String {
        random_bytes::<32>().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether a key is configured.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    fn bytes(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }

    fn mac(&self, role: Role, context: &[u8], ours: &Challenge, theirs: &Challenge) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(self.bytes()).expect("HMAC takes a key of any length");
        // Length-prefixed fields: no two transcripts encode to the same bytes.
        for field in [b"braid-auth-v1".as_slice(), role.label(), context, theirs, ours] {
            m.update(&(field.len() as u32).to_le_bytes());
            m.update(field);
        }
        m
    }

    /// The answer `role` gives to the peer's challenge `theirs`, having sent `ours`.
    pub(crate) fn prove(&self, role: Role, context: &[u8], ours: &Challenge, theirs: &Challenge) -> Proof {
        self.mac(role, context, ours, theirs).finalize().into_bytes().into()
    }

    /// Whether `proof` is the answer the peer in `peer_role` owes: it sent
    /// `theirs` and answers our challenge `ours`. Constant time.
    pub(crate) fn verify(
        &self,
        peer_role: Role,
        context: &[u8],
        ours: &Challenge,
        theirs: &Challenge,
        proof: &[u8],
    ) -> bool {
        self.mac(peer_role, context, theirs, ours).verify_slice(proof).is_ok()
    }
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_set() { "JobKey(<set>)" } else { "JobKey(<none>)" })
    }
}

/// `N` random bytes from the kernel (`getrandom`), falling back to std's
/// per-process random hasher keys mixed with the clock if that fails.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: writes at most N - got bytes into the tail of `out`.
        let r = unsafe { libc::getrandom(out[got..].as_mut_ptr() as *mut libc::c_void, N - got, 0) };
        if r <= 0 {
            if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        got += r as usize;
    }
    if got < N {
        use std::hash::{BuildHasher, Hasher};
        for (i, chunk) in out.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            h.write_u128(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
            );
            h.write_u32(std::process::id());
            let v = h.finish().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
    out
}

/// A fresh challenge.
pub fn challenge() -> Challenge {
    random_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_roles_prove_and_verify_with_the_same_key() {
        let k = JobKey::from_text("secret");
        let (a, b) = (challenge(), challenge());
        assert_ne!(a, b);
        // The initiator sent a, the responder b.
        let from_initiator = k.prove(Role::Initiator, b"ctx", &a, &b);
        let from_responder = k.prove(Role::Responder, b"ctx", &b, &a);
        assert!(k.verify(Role::Initiator, b"ctx", &b, &a, &from_initiator));
        assert!(k.verify(Role::Responder, b"ctx", &a, &b, &from_responder));
        // Reflection: the initiator's own answer does not pass as the responder's.
        assert!(!k.verify(Role::Responder, b"ctx", &a, &b, &from_initiator));
    }

    #[test]
    fn wrong_key_context_challenge_or_length_fails() {
        let k = JobKey::from_text("secret");
        let (a, b) = (challenge(), challenge());
        let p = k.prove(Role::Initiator, b"ctx", &a, &b);
        assert!(!JobKey::from_text("other").verify(Role::Initiator, b"ctx", &b, &a, &p));
        assert!(!JobKey::none().verify(Role::Initiator, b"ctx", &b, &a, &p));
        assert!(!k.verify(Role::Initiator, b"ctx2", &b, &a, &p));
        assert!(!k.verify(Role::Initiator, b"ctx", &challenge(), &a, &p));
        assert!(!k.verify(Role::Initiator, b"ctx", &b, &a, &p[..31]));
        // The empty key still works end to end (it just proves nothing).
        let n = JobKey::from_text("");
        assert!(!n.is_set());
        assert!(n.verify(Role::Initiator, b"c", &b, &a, &n.prove(Role::Initiator, b"c", &a, &b)));
    }

    #[test]
    fn generated_keys_differ_and_debug_hides_them() {
        let (x, y) = (JobKey::generate_text(), JobKey::generate_text());
        assert_eq!(x.len(), 64);
        assert_ne!(x, y);
        assert_eq!(format!("{:?}", JobKey::from_text(&x)), "JobKey(<set>)");
    }
}
