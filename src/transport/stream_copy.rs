//! Copies into a shared-memory ring: plain (through the writer's cache) or with
//! non-temporal stores (straight to memory), chosen by what each achieves.
//!
//! Which is faster depends on where the two cores sit, and on a VM that changes
//! while a job runs. With the cores sharing a cache, a plain copy leaves the data
//! where the reader finds it at once. When the host moves the vCPUs apart (this
//! VM: a core-to-core round trip going from about 60 ns to 330 ns for tens of
//! seconds at a time), every line the reader pulls out of the writer's cache and
//! every line the writer takes back costs a remote transfer, and 2-rank all-reduce
//! fell from 7 to 1.3 GB/s at 64 MiB and from 19 to 2 GB/s at 1 MiB; streaming
//! stores measured 6.3–7.6 and 10–11.7 GB/s there (and 5 and 8 GB/s with the cores
//! together). The streaming copy is [`crate::reduce::copy_nontemporal`]. So
//! [`CallTuner`] times whole calls made each way and has the ring
//! writers use the faster, retrying the other now and then since the machine changes.
//! (results/stream-stores-2026-11-24.md)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::config::StreamPolicy;

/// Writes at least this long are candidates for streaming. Small ones too: with the
/// vCPUs apart, 2-rank all-gather over shared memory ran at 2.0 GB/s busbw at 64 KiB
/// with plain copies against 8.0 streaming, 1.8 against 4.8 at 16 KiB and 1.4
/// against 1.6 at 4 KiB, while with them together streaming lost about 2x at every
/// size (12.4 against 5.8 at 64 KiB): only timing tells
/// (results/small-streaming-2026-11-25.md). Below this a call is a few hundred
/// nanoseconds of fixed cost, and a 40-byte header alone is never streamed.
pub const STREAM_MIN_BYTES: usize = 1 << 10;
/// One call in this many (per size class) tries the kind of copy now losing: at
/// most about 2% of calls pay for a worse kind (it costs up to 2.3x here).
const EXPLORE_EVERY: u32 = 64;
/// Once both kinds are measured, one call in this many (per size class) is timed
/// (a multiple of it explores): a timed call waits until its peers have read what
/// it wrote, which the others need not.
const TIME_EVERY: u32 = 8;
/// The same for calls below [`SMALL_CALL_BYTES`], where a clock read and the wait
/// for the peers are a larger share of the call, and calls come often enough that
/// fewer samples still follow the machine within microseconds.
const TIME_EVERY_SMALL: u32 = 32;
/// Calls below this many bytes per rank are timed one in [`TIME_EVERY_SMALL`].
const SMALL_CALL_BYTES: usize = 256 << 10;
const _: () = assert!(EXPLORE_EVERY.is_multiple_of(TIME_EVERY) && EXPLORE_EVERY.is_multiple_of(TIME_EVERY_SMALL));
/// Samples kept per kind and size class; a kind's rate is the best of them, since
/// noise on a shared machine only ever slows a call down.
const SAMPLES: usize = 3;
/// Size classes: powers of two from [`STREAM_MIN_BYTES`] up to 2 GiB (the last
/// takes the rest).
const CLASSES: usize = 22;

fn class_of(bytes: usize) -> usize {
    ((bytes.max(STREAM_MIN_BYTES) / STREAM_MIN_BYTES).ilog2() as usize).min(CLASSES - 1)
}

/// Access patterns told apart: a schedule's algorithm code (0 for none), since
/// algorithms read and write memory differently at one size. Timed together, the
/// samples of one would choose for another: `braid perf --algo all` timed the
/// 16 MiB ring after direct at 4.4 ms with streaming stores chosen on direct's
/// samples, against 3.2 ms with plain stores (2 ranks).
pub const PATTERNS: usize = crate::algorithm::Algorithm::ALL.len() + 1;

/// The switch a communicator's ring writers follow under [`StreamPolicy::Auto`]:
/// set by its [`CallTuner`] before each call of at least [`STREAM_MIN_BYTES`].
#[derive(Clone, Debug, Default)]
pub struct StreamSwitch(Arc<AtomicBool>);

/// Two switches are equal when they are the same switch.
impl PartialEq for StreamSwitch {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for StreamSwitch {}

impl StreamSwitch {
    /// Whether writes of at least [`STREAM_MIN_BYTES`] stream now.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}

/// How one ring writer decides: a fixed policy, or the communicator's switch.
#[derive(Clone, Debug)]
pub struct WriterStreaming {
    policy: StreamPolicy,
    switch: StreamSwitch,
}

impl WriterStreaming {
    /// Follow `policy`, and under `Auto` the state of `switch`.
    pub fn new(policy: StreamPolicy, switch: StreamSwitch) -> WriterStreaming {
        WriterStreaming { policy, switch }
    }

    /// Plain stores always.
    pub fn plain() -> WriterStreaming {
        WriterStreaming::new(StreamPolicy::Off, StreamSwitch::default())
    }

    /// Whether a write of `len` bytes streams.
    pub fn pick(&self, len: usize) -> bool {
        len >= STREAM_MIN_BYTES
            && cfg!(target_arch = "x86_64")
            && match self.policy {
                StreamPolicy::On => true,
                StreamPolicy::Off => false,
                StreamPolicy::Auto => self.switch.get(),
            }
    }
}

/// Chooses, per size class of call, between plain and streaming ring writes from
/// the time whole calls take: only that counts both the writer's copy and the
/// reader's (a writer timing its own copies finds streaming faster even where the
/// reader then loses more, fetching the data from memory instead of a cache).
/// A call whose writes outlast its reads (a broadcast's root returns once its data
/// is in the ring) is timed until its peers have read it all: the caller waits for
/// that before [`CallTuner::end`] (timed at the root alone, streaming looked 1.7x
/// faster for 1 MiB broadcasts that it made 1.7x slower).
#[derive(Debug)]
pub struct CallTuner {
    switch: StreamSwitch,
    /// The latest rates, bytes per second, of each kind (index 0 plain, 1
    /// streaming) per pattern and class (`pattern * CLASSES + class`); 0 where not
    /// yet measured.
    samples: Vec<[[f64; SAMPLES]; 2]>,
    calls: Vec<u32>,
}

/// A call being timed by [`CallTuner::begin`].
#[derive(Debug)]
pub struct Timed {
    class: usize,
    streamed: bool,
    bytes: usize,
    started: Instant,
}

impl CallTuner {
    /// A tuner setting `switch`.
    pub fn new(switch: StreamSwitch) -> CallTuner {
        CallTuner { switch, samples: vec![[[0.0; SAMPLES]; 2]; PATTERNS * CLASSES], calls: vec![0; PATTERNS * CLASSES] }
    }

    /// Choose for a call moving `bytes` per rank with access `pattern` (below
    /// [`PATTERNS`]; others share the last) and set the switch; `None` for calls too
    /// small to stream.
    pub fn begin(&mut self, bytes: usize, pattern: usize) -> Option<Timed> {
        if bytes < STREAM_MIN_BYTES {
            return None;
        }
        let class = pattern.min(PATTERNS - 1) * CLASSES + class_of(bytes);
        self.calls[class] = self.calls[class].wrapping_add(1);
        let n = self.calls[class];
        // The first call of a class pays for cold caches and page faults whatever
        // the kind, so it is not timed.
        if n == 1 {
            self.switch.set(false);
            return None;
        }
        // Then each kind is measured SAMPLES times, alternating; then the faster,
        // timed now and then, with the other retried now and then since the
        // machine changes under a job.
        let sampling = n <= 1 + 2 * SAMPLES as u32;
        let streamed = if sampling {
            n % 2 == 1
        } else {
            let [plain, streaming] = self.best(class);
            (streaming > plain) != n.is_multiple_of(EXPLORE_EVERY)
        };
        self.switch.set(streamed);
        let every = if bytes < SMALL_CALL_BYTES { TIME_EVERY_SMALL } else { TIME_EVERY };
        (sampling || n.is_multiple_of(every)).then(|| Timed { class, streamed, bytes, started: Instant::now() })
    }

    /// How long after its own work a timed call may wait for its peers to read
    /// what it wrote before its sample is dropped instead (a late peer says
    /// nothing about the kind of copy): four times as long as the call took, and
    /// at least 1 ms for calls of [`SMALL_CALL_BYTES`] and more, 20 µs below. A
    /// short allowance would drop the samples of the kind whose writer finishes
    /// first (a broadcast root's plain writes end well before its peer has copied
    /// them out), and streaming would win by default. A rank whose peers are
    /// elsewhere waits at most this long once in
    /// [`TIME_EVERY`] (or [`TIME_EVERY_SMALL`]) calls.
    pub fn drain_allowance(t: &Timed) -> std::time::Duration {
        let floor = if t.bytes < SMALL_CALL_BYTES { Duration::from_micros(20) } else { Duration::from_millis(1) };
        (t.started.elapsed() * 4).max(floor)
    }

    /// Record a call that completed (and whose writes its peers have read).
    pub fn end(&mut self, t: Timed) {
        let rate = t.bytes as f64 / t.started.elapsed().as_secs_f64().max(1e-9);
        self.record(t.class, t.streamed, rate);
        tracing::trace!(class = t.class, streamed = t.streamed, gbps = rate / 1e9, best = ?self.best(t.class), "timed a call");
    }

    fn record(&mut self, class: usize, streamed: bool, sample: f64) {
        let kept = &mut self.samples[class][usize::from(streamed)];
        kept.rotate_right(1);
        kept[0] = sample;
    }

    fn best(&self, class: usize) -> [f64; 2] {
        self.samples[class].map(|kept| kept.iter().copied().fold(0.0, f64::max))
    }

    /// The rates measured so far for calls of `bytes` (plain, streaming) with
    /// access `pattern`, bytes per second.
    #[cfg(test)]
    pub fn rates(&self, bytes: usize, pattern: usize) -> [f64; 2] {
        self.best(pattern * CLASSES + class_of(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two access patterns of one size learn apart: streaming winning for one
    /// leaves the other measuring both kinds from scratch.
    #[test]
    fn patterns_keep_their_own_samples() {
        let switch = StreamSwitch::default();
        let mut t = CallTuner::new(switch.clone());
        let big = 4 * SMALL_CALL_BYTES;
        let (a, b) = (3, 1);
        assert!(t.begin(big, a).is_none());
        for rate in [1e9, 4e9, 1e9, 4e9, 1e9, 4e9] {
            let c = t.begin(big, a).unwrap();
            t.record(c.class, c.streamed, rate);
        }
        assert_eq!(t.rates(big, a), [1e9, 4e9]);
        assert_eq!(t.rates(big, b), [0.0, 0.0], "nothing measured for the other pattern");
        assert!(t.begin(big, b).is_none() && !switch.get(), "its first call is its own cold one");
        let c = t.begin(big, b).unwrap();
        assert!(!c.streamed, "and it samples plain first, whatever pattern {a} found");
        // Patterns past the table share its last slot instead of indexing out of it.
        assert!(t.begin(big, usize::MAX).is_none());
        assert!(t.begin(big, PATTERNS + 5).is_some());
    }

    #[test]
    fn the_tuner_measures_both_then_follows_the_faster_and_still_explores() {
        let switch = StreamSwitch::default();
        let mut t = CallTuner::new(switch.clone());
        assert!(t.begin(STREAM_MIN_BYTES - 1, 0).is_none(), "small calls are not tuned");
        let big = 4 * SMALL_CALL_BYTES;
        assert!(t.begin(big, 0).is_none() && !switch.get(), "the first call of a class is cold: plain, untimed");
        // Calls 2..=7 alternate plain and streaming; streaming measures 4x faster,
        // one slow outlier notwithstanding (the best of the kept samples counts).
        for (i, rate) in [1e9, 4e9, 1e9, 0.5e9, 1e9, 4e9].into_iter().enumerate() {
            let c = t.begin(big, 0).unwrap();
            assert_eq!(c.streamed, i % 2 == 1, "call {}", i + 2);
            assert_eq!(switch.get(), c.streamed);
            t.record(c.class, c.streamed, rate);
        }
        assert_eq!(t.rates(big, 0), [1e9, 4e9]);
        // Calls 8..=135: streaming, plain retried at 64 and 128 only; one call in
        // TIME_EVERY timed.
        let picks: Vec<(bool, bool)> = (0..EXPLORE_EVERY * 2)
            .map(|_| {
                let timed = t.begin(big, 0);
                (switch.get(), timed.is_some())
            })
            .collect();
        assert_eq!(picks.iter().filter(|p| !p.0).count(), 2, "plain retried once per {EXPLORE_EVERY}");
        assert_eq!(picks.iter().filter(|p| p.1).count() as u32, 2 * EXPLORE_EVERY / TIME_EVERY);
        assert!(picks.iter().filter(|p| !p.0).all(|p| p.1), "a retry is timed");
        // The machine changes: three slow streaming calls push out the fast samples.
        for _ in 0..SAMPLES {
            t.record(class_of(big), true, 1e8);
        }
        assert_eq!(t.rates(big, 0), [1e9, 1e8]);
        let picks: Vec<bool> = (0..EXPLORE_EVERY * 2)
            .map(|_| {
                t.begin(big, 0);
                switch.get()
            })
            .collect();
        assert_eq!(picks.iter().filter(|&&s| s).count(), 2);
        // Another size class knows nothing yet.
        assert!(t.begin(64 * STREAM_MIN_BYTES, 0).is_none());
        // A timed call records its own rate.
        let timed = std::iter::repeat_with(|| t.begin(big, 0)).flatten().next().unwrap();
        let before = t.rates(big, 0);
        t.end(timed);
        assert_ne!(t.samples[class_of(big)], [[1e9; SAMPLES], [1e8; SAMPLES]]);
        assert!(t.rates(big, 0)[0] >= before[0] && t.rates(big, 0)[1] >= before[1]);
        // Small calls are tuned alike, timed once in TIME_EVERY_SMALL calls once sampled.
        let small = 2 * STREAM_MIN_BYTES;
        let timed: Vec<bool> = (0..1 + 2 * SAMPLES as u32).map(|_| t.begin(small, 0).is_some()).collect();
        assert_eq!(
            timed.iter().filter(|&&x| x).count(),
            2 * SAMPLES,
            "the first call is cold, then every sample is timed"
        );
        let timed = (0..EXPLORE_EVERY * 2).filter(|_| t.begin(small, 0).is_some()).count() as u32;
        assert_eq!(timed, 2 * EXPLORE_EVERY / TIME_EVERY_SMALL);
    }

    #[test]
    fn writers_follow_their_policy_or_the_switch_and_policies_parse() {
        let switch = StreamSwitch::default();
        let auto = WriterStreaming::new(StreamPolicy::Auto, switch.clone());
        let on = WriterStreaming::new(StreamPolicy::On, StreamSwitch::default());
        assert!(!auto.pick(1 << 30));
        switch.set(true);
        assert_eq!(auto.pick(1 << 30), cfg!(target_arch = "x86_64"));
        assert!(!auto.pick(STREAM_MIN_BYTES - 1));
        assert_eq!(on.pick(STREAM_MIN_BYTES), cfg!(target_arch = "x86_64"));
        assert!(!WriterStreaming::plain().pick(1 << 30));
        assert_eq!("ON".parse::<StreamPolicy>(), Ok(StreamPolicy::On));
        assert_eq!("0".parse::<StreamPolicy>(), Ok(StreamPolicy::Off));
        assert_eq!("".parse::<StreamPolicy>(), Ok(StreamPolicy::Auto));
        assert!("sometimes".parse::<StreamPolicy>().is_err());
    }
}
