//! The message of the panic a thread is unwinding from, for telling peers why a
//! rank went away. Rust hands a panic's payload only to whoever catches it; a
//! communicator dropped while its thread unwinds sees no payload, so a panic hook
//! (installed once, chained in front of the hook that was there) notes each
//! thread's latest panic message and location.
//!
//! If the program replaces the hook after braid installed its own, nothing is
//! noted from then on, and a note from an earlier panic that was caught could be
//! read for a later one: [`take`] therefore only returns a note made within the
//! last [`FRESH`], which an unwinding drop reads at once.

use std::cell::RefCell;
use std::sync::Once;
use std::time::{Duration, Instant};

/// Longest note kept (a panic message can be any size; peers get a bounded reason).
const MAX_NOTE: usize = 512;
/// How old a note may be and still describe the panic now unwinding.
const FRESH: Duration = Duration::from_secs(10);

thread_local! {
    static NOTE: RefCell<Option<(String, Instant)>> = const { RefCell::new(None) };
}

/// The text of a panic payload (`&str` or `String`, as `panic!` makes them).
pub(crate) fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// `text` cut to at most `max` bytes on a character boundary.
fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

/// Install the noting hook (once per process), in front of the current hook.
pub(crate) fn install() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            let note = bounded(format!("{}{at}", payload_text(info.payload())), MAX_NOTE);
            // A thread being torn down has no thread-locals left: then no note.
            let _ = NOTE.try_with(|n| *n.borrow_mut() = Some((note, Instant::now())));
            previous(info);
        }));
    });
}

/// This thread's latest panic note, if fresh (see the module doc); taken, so it
/// is told once.
pub(crate) fn take() -> Option<String> {
    NOTE.try_with(|n| n.borrow_mut().take()).ok().flatten().filter(|(_, at)| at.elapsed() < FRESH).map(|(m, _)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_on_this_thread_is_noted_with_its_message_and_place_once() {
        install();
        let r = std::panic::catch_unwind(|| panic!("noted panic {}", 41 + 1));
        assert!(r.is_err());
        let note = take().expect("a note of the panic");
        assert!(note.starts_with("noted panic 42 at ") && note.contains("panic_note.rs"), "{note}");
        assert_eq!(take(), None, "taken once");
    }

    #[test]
    fn long_messages_are_bounded_on_a_character_boundary() {
        let long = "é".repeat(MAX_NOTE);
        let b = bounded(long, MAX_NOTE);
        assert!(b.len() <= MAX_NOTE + 3 && b.ends_with("..."), "{}", b.len());
        assert_eq!(payload_text(&"plain"), "plain");
        assert_eq!(payload_text(&String::from("owned")), "owned");
        assert_eq!(payload_text(&7u32), "a panic without a message");
    }
}
