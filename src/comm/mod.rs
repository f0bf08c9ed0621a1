//! The communicator: the collective API on top of the executor.
//!
//! Calls run in the order they were issued on this rank, whether synchronous (on
//! the calling thread) or asynchronous (on one worker thread per communicator):
//! each call takes a ticket when issued and runs when its turn comes, so async
//! work overlaps the caller's computation without reordering the collectives that
//! every rank must issue in the same order.
//!
//! Communicators coexist: each has its own id (a hash of its store namespace and a
//! nonce rank 0 draws), carried and checked in every frame, so several can share a
//! store and a process, one after another or at once (see [`CommunicatorBuilder`]
//! for the store keys), and [`Communicator::split`], [`Communicator::dup`] and
//! [`Communicator::new_group`] make sub-communicators with their own ids and
//! links. [`Communicator::abort`] stops every pending and later call on any
//! thread; a call that panics passes its turn on and leaves the communicator
//! broken, so no later call waits for it. [`Communicator::destroy`] closes a
//! communicator and reports a rank that did not close it in order.
//!
//! Files: `mod.rs` these docs and the public names; `communicator.rs` the
//! communicator, its own calls and its async worker; `calls.rs` argument checks and buffer layout;
//! `turn.rs` issue-order ticketing and abort; `engine.rs` running one call on the
//! links; `builder.rs` building over a store; `split.rs` sub-communicators
//! (split, dup, new_group); `origin.rs` where a communicator came from and its
//! id; `binding.rs` binding a communicator to a device (single-copy peers), and
//! `device_binding.rs` what a bound communicator holds.

mod any_source;
mod async_borrowed;
mod async_vcollectives;
mod binding;
mod borrowed;
mod builder;
mod calls;
mod communicator;
mod device_binding;
mod device_calls;
mod engine;
mod grow;
mod origin;
mod p2p_group;
mod panic_note;
#[cfg(test)]
mod parts_tests;
mod rooted_raw;
mod shrink;
mod split;
#[cfg(test)]
pub(crate) mod tests;
mod turn;
mod vcollectives;
mod vcollectives_raw;

pub use async_borrowed::{Scope, ScopedWork};
pub use builder::CommunicatorBuilder;
pub use communicator::{Communicator, Work};
pub use p2p_group::P2p;
pub use shrink::Agreement;
