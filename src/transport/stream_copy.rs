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
pub const PATTERNS: usize = crate::algorithm::Algorithm::ALL.len() + 2;
/// The pattern of a call on a buffer made of parts (the fuser's tensors where they
/// lie): many short transfers, whatever the algorithm.
pub const PARTS_PATTERN: usize = PATTERNS - 1;

/// A switch that a communicator's channels follow and its [`CallTuner`] sets before
/// each call of at least [`STREAM_MIN_BYTES`]: whether ring writers stream (under
/// [`StreamPolicy::Auto`]), or whether exchanges go single-copy (under
/// `BRAID_CMA=auto`).
#[derive(Clone, Debug, Default)]
pub struct TunerSwitch(Arc<SwitchState>);

#[derive(Debug, Default)]
struct SwitchState {
    on: AtomicBool,
    /// Whether a channel read it for a transfer it decides since the tuner last
    /// looked: a call that reads nothing has no choice worth timing.
    consulted: AtomicBool,
}

/// Two switches are equal when they are the same switch.
impl PartialEq for TunerSwitch {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TunerSwitch {}

impl TunerSwitch {
    /// Whether the switch is on now.
    pub fn get(&self) -> bool {
        self.0.on.load(Ordering::Relaxed)
    }

    /// Whether the switch is on now, read for a transfer it decides (the tuner
    /// learns which calls have one).
    pub fn consult(&self) -> bool {
        self.0.consulted.store(true, Ordering::Relaxed);
        self.get()
    }

    fn take_consulted(&self) -> bool {
        self.0.consulted.swap(false, Ordering::Relaxed)
    }

    pub(crate) fn set(&self, on: bool) {
        self.0.on.store(on, Ordering::Relaxed);
    }
}

/// How one ring writer decides: a fixed policy, or the communicator's switch.
#[derive(Clone, Debug)]
pub struct WriterStreaming {
    policy: StreamPolicy,
    switch: TunerSwitch,
}

impl WriterStreaming {
    /// Follow `policy`, and under `Auto` the state of `switch`.
    pub fn new(policy: StreamPolicy, switch: TunerSwitch) -> WriterStreaming {
        WriterStreaming { policy, switch }
    }

    /// Plain stores always.
    pub fn plain() -> WriterStreaming {
        WriterStreaming::new(StreamPolicy::Off, TunerSwitch::default())
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

/// The ways a call can move its bytes, as the bits of a kind: ring writes
/// streamed, and exchanges single-copy (when timed, see [`CallTuner::with_exchanges`]).
const STREAMED: usize = 1;
const SINGLE_COPY: usize = 2;
const KINDS: usize = 4;

/// Chooses, per size class of call, between plain and streaming ring writes (and,
/// with timed exchanges, between single-copy and ring exchanges) from the time
/// whole calls take: only that counts both the writer's copy and the
/// reader's (a writer timing its own copies finds streaming faster even where the
/// reader then loses more, fetching the data from memory instead of a cache).
/// A call whose writes outlast its reads (a broadcast's root returns once its data
/// is in the ring) is timed until its peers have read it all: the caller waits for
/// that before [`CallTuner::end`] (timed at the root alone, streaming looked 1.7x
/// faster for 1 MiB broadcasts that it made 1.7x slower).
///
/// Each rank chooses for what it sends, so ranks need not choose alike: a receiver
/// takes a frame as it comes, through the ring or out of the sender's memory.
#[derive(Debug)]
pub struct CallTuner {
    switch: TunerSwitch,
    /// With timed exchanges: the switch the channels' exchanges follow.
    exchanges: Option<TunerSwitch>,
    /// Per pattern and class, whether its calls have exchanges that can go
    /// single-copy (learned from the switch being consulted), and so four kinds
    /// to choose among instead of two.
    exchange_classes: Vec<bool>,
    /// The class of the latest call begun: the one a consulted switch speaks of.
    last_class: Option<usize>,
    /// The latest rates, bytes per second, of each kind (bits [`STREAMED`] and
    /// [`SINGLE_COPY`]) per pattern and class (`pattern * CLASSES + class`); 0
    /// where not yet measured.
    samples: Vec<[[f64; SAMPLES]; KINDS]>,
    /// The same, timed to the end of the rank's own work, before it waits for its
    /// peers to read what it wrote: what an exchange is chosen on. Through the ring
    /// a rank goes on once its writes are in (its peer reads them while it does
    /// other work); a single-copy exchange ends only once the peer has read, so
    /// waiting for the readers would charge the ring for work that overlaps the
    /// next call (2 ranks, 1 MiB all-gather: 100-115 µs a call timed so, where
    /// back-to-back calls took 40-50 µs).
    own_samples: Vec<[[f64; SAMPLES]; KINDS]>,
    calls: Vec<u32>,
}

/// A call being timed by [`CallTuner::begin`].
#[derive(Debug)]
pub struct Timed {
    class: usize,
    kind: usize,
    bytes: usize,
    started: Instant,
    /// How long the rank's own work took ([`Timed::own_work_done`]).
    own: Option<Duration>,
}

impl Timed {
    /// Mark the end of the rank's own work, before it waits for its readers.
    pub fn own_work_done(&mut self) {
        self.own = Some(self.started.elapsed());
    }
}

impl CallTuner {
    /// A tuner setting `switch`.
    pub fn new(switch: TunerSwitch) -> CallTuner {
        CallTuner {
            switch,
            exchanges: None,
            exchange_classes: vec![false; PATTERNS * CLASSES],
            last_class: None,
            samples: vec![[[0.0; SAMPLES]; KINDS]; PATTERNS * CLASSES],
            own_samples: vec![[[0.0; SAMPLES]; KINDS]; PATTERNS * CLASSES],
            calls: vec![0; PATTERNS * CLASSES],
        }
    }

    /// Also time exchanges both ways, setting `switch`, in the classes of calls
    /// whose exchanges read it.
    pub fn with_exchanges(mut self, switch: TunerSwitch) -> CallTuner {
        self.exchanges = Some(switch);
        self
    }

    /// How many kinds a call of `class` chooses among.
    fn kinds(&self, class: usize) -> usize {
        if self.exchange_classes[class] {
            KINDS
        } else {
            2
        }
    }

    /// Set the switches for `kind`; the exchange switch only where a call chooses
    /// among all [`KINDS`] (smaller calls have no single-copy exchange to choose).
    fn set(&self, kind: usize, kinds: usize) {
        self.switch.set(kind & STREAMED != 0);
        if let (Some(s), KINDS) = (&self.exchanges, kinds) {
            s.set(kind & SINGLE_COPY != 0);
        }
    }

    /// Choose for a call moving `bytes` per rank with access `pattern` (below
    /// [`PATTERNS`]; others share the last) and set the switches; `None` for calls
    /// too small to stream.
    pub fn begin(&mut self, bytes: usize, pattern: usize) -> Option<Timed> {
        if bytes < STREAM_MIN_BYTES {
            return None;
        }
        // A switch read since the last call began was read by that call.
        if let (Some(s), Some(last)) = (&self.exchanges, self.last_class) {
            if s.take_consulted() {
                self.exchange_classes[last] = true;
            }
        }
        let class = pattern.min(PATTERNS - 1) * CLASSES + class_of(bytes);
        self.last_class = Some(class);
        self.calls[class] = self.calls[class].wrapping_add(1);
        let n = self.calls[class];
        let kinds = self.kinds(class);
        // The first call of a class pays for cold caches and page faults whatever
        // the kind, so it is not timed.
        if n == 1 {
            self.set(0, kinds);
            return None;
        }
        // Then each kind is measured SAMPLES times, in turn; then the fastest,
        // timed now and then, with the others retried in turn now and then since
        // the machine changes under a job.
        // With four kinds, each of the other three is still retried about once in
        // EXPLORE_EVERY calls.
        let sampling = n <= 1 + (kinds * SAMPLES) as u32;
        let explore_every = if kinds == 2 { EXPLORE_EVERY } else { EXPLORE_EVERY / 4 };
        let exploring = !sampling && n.is_multiple_of(explore_every);
        let kind = if sampling {
            (n as usize - 2) % kinds
        } else {
            let best = self.best_kind(class, kinds);
            if exploring {
                (best + 1 + (n / explore_every) as usize % (kinds - 1)) % kinds
            } else {
                best
            }
        };
        self.set(kind, kinds);
        let every = if bytes < SMALL_CALL_BYTES { TIME_EVERY_SMALL } else { TIME_EVERY };
        (sampling || exploring || n.is_multiple_of(every)).then(|| Timed {
            class,
            kind,
            bytes,
            started: Instant::now(),
            own: None,
        })
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
        let rate = |d: Duration| t.bytes as f64 / d.as_secs_f64().max(1e-9);
        let all = rate(t.started.elapsed());
        let own = t.own.map_or(all, rate);
        self.record(t.class, t.kind, all, own);
        tracing::trace!(class = t.class, kind = t.kind, gbps = all / 1e9, own_gbps = own / 1e9, "timed a call");
    }

    fn record(&mut self, class: usize, kind: usize, sample: f64, own: f64) {
        for (table, x) in [(&mut self.samples, sample), (&mut self.own_samples, own)] {
            let kept = &mut table[class][kind];
            kept.rotate_right(1);
            kept[0] = x;
        }
    }

    fn best_of(table: &[[[f64; SAMPLES]; KINDS]], class: usize) -> [f64; KINDS] {
        table[class].map(|kept| kept.iter().copied().fold(0.0, f64::max))
    }

    fn best(&self, class: usize) -> [f64; KINDS] {
        Self::best_of(&self.samples, class)
    }

    /// The fastest of the first `kinds` kinds in `class` (the lower on a tie):
    /// with four, first the way of exchanging, on the rank's own work (see
    /// `own_samples`), then the stores, on whole calls.
    fn best_kind(&self, class: usize, kinds: usize) -> usize {
        let all = self.best(class);
        let own = Self::best_of(&self.own_samples, class);
        let exchange = if kinds == KINDS {
            let way = |base: usize| own[base].max(own[base | STREAMED]);
            if way(SINGLE_COPY) > way(0) {
                SINGLE_COPY
            } else {
                0
            }
        } else {
            0
        };
        if all[exchange | STREAMED] > all[exchange] {
            exchange | STREAMED
        } else {
            exchange
        }
    }

    /// The rates measured so far for calls of `bytes` with access `pattern`, per
    /// kind (plain, streaming, single-copy, both), bytes per second.
    #[cfg(test)]
    pub fn rates(&self, bytes: usize, pattern: usize) -> [f64; KINDS] {
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
        let switch = TunerSwitch::default();
        let mut t = CallTuner::new(switch.clone());
        let big = 4 * SMALL_CALL_BYTES;
        let (a, b) = (3, 1);
        assert!(t.begin(big, a).is_none());
        for rate in [1e9, 4e9, 1e9, 4e9, 1e9, 4e9] {
            let c = t.begin(big, a).unwrap();
            t.record(c.class, c.kind, rate, rate);
        }
        assert_eq!(t.rates(big, a), [1e9, 4e9, 0.0, 0.0]);
        assert_eq!(t.rates(big, b), [0.0; KINDS], "nothing measured for the other pattern");
        assert!(t.begin(big, b).is_none() && !switch.get(), "its first call is its own cold one");
        let c = t.begin(big, b).unwrap();
        assert_eq!(c.kind, 0, "and it samples plain first, whatever pattern {a} found");
        // Patterns past the table share its last slot instead of indexing out of it.
        assert!(t.begin(big, usize::MAX).is_none());
        assert!(t.begin(big, PATTERNS + 5).is_some());
    }

    #[test]
    fn the_tuner_measures_both_then_follows_the_faster_and_still_explores() {
        let switch = TunerSwitch::default();
        let mut t = CallTuner::new(switch.clone());
        assert!(t.begin(STREAM_MIN_BYTES - 1, 0).is_none(), "small calls are not tuned");
        let big = 4 * SMALL_CALL_BYTES;
        assert!(t.begin(big, 0).is_none() && !switch.get(), "the first call of a class is cold: plain, untimed");
        // Calls 2..=7 alternate plain and streaming; streaming measures 4x faster,
        // one slow outlier notwithstanding (the best of the kept samples counts).
        for (i, rate) in [1e9, 4e9, 1e9, 0.5e9, 1e9, 4e9].into_iter().enumerate() {
            let c = t.begin(big, 0).unwrap();
            assert_eq!(c.kind, i % 2, "call {}", i + 2);
            assert_eq!(switch.get(), c.kind == STREAMED);
            t.record(c.class, c.kind, rate, rate);
        }
        assert_eq!(t.rates(big, 0), [1e9, 4e9, 0.0, 0.0]);
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
            t.record(class_of(big), STREAMED, 1e8, 1e8);
        }
        assert_eq!(t.rates(big, 0), [1e9, 1e8, 0.0, 0.0]);
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
        assert_ne!(t.samples[class_of(big)], [[1e9; SAMPLES], [1e8; SAMPLES], [0.0; SAMPLES], [0.0; SAMPLES]]);
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

    /// With timed exchanges, the classes of calls whose exchanges read the switch
    /// choose among four kinds (streaming x single-copy), others among two; the
    /// exchange switch follows the fastest.
    #[test]
    fn timed_exchanges_measure_four_kinds_and_follow_the_fastest() {
        let (stream, exchange) = (TunerSwitch::default(), TunerSwitch::default());
        let mut t = CallTuner::new(stream.clone()).with_exchanges(exchange.clone());
        let big = 1 << 20;
        assert!(t.begin(big, 0).is_none() && !stream.get(), "a cold first call, plain");
        assert_eq!(t.kinds(class_of(big)), 2, "nothing known of its exchanges yet");
        // Its exchanges read the switch (as a channel deciding one does).
        assert!(!exchange.consult());
        // Calls 2..=13 take the kinds in turn; single-copy with plain writes is the
        // fastest.
        for i in 0..KINDS * SAMPLES {
            let c = t.begin(big, 0).unwrap();
            assert_eq!(c.kind, i % KINDS);
            assert_eq!((stream.get(), exchange.consult()), (c.kind & STREAMED != 0, c.kind & SINGLE_COPY != 0));
            let rate = [1e9, 2e9, 5e9, 3e9][c.kind];
            t.record(c.class, c.kind, rate, rate);
        }
        assert_eq!(t.rates(big, 0), [1e9, 2e9, 5e9, 3e9]);
        // Then single-copy and plain, with each other kind retried (and timed)
        // about once in EXPLORE_EVERY calls.
        let mut seen = [0u32; KINDS];
        for _ in 0..3 * EXPLORE_EVERY {
            let timed = t.begin(big, 0);
            let kind = usize::from(stream.get()) | usize::from(exchange.consult()) << 1;
            seen[kind] += 1;
            assert!(kind == 2 || timed.is_some(), "a retry is timed");
        }
        assert_eq!(seen, [4, 4, 3 * EXPLORE_EVERY - 12, 4]);
        // A class whose calls never read the switch chooses between plain and
        // streaming only, and leaves the exchange switch alone.
        let other = 4 << 20;
        let before = exchange.get();
        for _ in 0..1 + 2 * SAMPLES as u32 + 2 * EXPLORE_EVERY {
            if let Some(c) = t.begin(other, 0) {
                assert!(c.kind < 2);
            }
            assert_eq!(exchange.get(), before);
        }
        assert_eq!(t.kinds(class_of(other)), 2);
        // The way of exchanging is chosen on each rank's own work: whole calls
        // through the ring look slower (they wait for the peer to read), their own
        // work is faster, and the ring wins; then the faster stores within it.
        let class = CLASSES + class_of(big);
        for (kind, all, own) in [(0, 2e9, 8e9), (STREAMED, 2.5e9, 7e9), (SINGLE_COPY, 5e9, 5e9), (3, 4e9, 4e9)] {
            t.record(class, kind, all, own);
        }
        assert_eq!(t.best_kind(class, KINDS), STREAMED);
        assert_eq!(t.best_kind(class, 2), STREAMED, "two kinds: the stores alone");
    }

    #[test]
    fn writers_follow_their_policy_or_the_switch_and_policies_parse() {
        let switch = TunerSwitch::default();
        let auto = WriterStreaming::new(StreamPolicy::Auto, switch.clone());
        let on = WriterStreaming::new(StreamPolicy::On, TunerSwitch::default());
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
