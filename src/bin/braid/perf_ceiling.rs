//! The memory ceiling of `braid perf`: once per run, before the sweep, every rank
//! times copies and reductions over its own buffers at once, at the size each
//! row's work will have; every row then shows `bound / measured` (`bound%`). The bound per collective is
//! [`braid::ceiling`]'s.

use std::collections::BTreeMap;

use braid::ceiling::{bound_fraction, bound_seconds, memory_work, reps_for, Kernel, MemoryRates, MemoryWork, Probe};
use braid::{Communicator, OpKind, ReduceOp};

use crate::perf::{PerfArgs, Place};

/// Each kernel's trial covers at least this much per thread, so small sizes are
/// timed over many repetitions rather than one call's clock resolution.
const MIN_TRIAL_BYTES: usize = 16 << 20;
/// Untimed, then timed trials per kernel and size; the fastest timed one counts
/// (a ceiling is the best the host did: noise only ever slows a trial).
const WARMUP_TRIALS: usize = 2;
const TRIALS: usize = 5;

/// The measured rates, by probe size; empty where the buffers are not host memory.
pub(crate) struct Ceiling {
    ranks_timed: usize,
    rates: BTreeMap<usize, MemoryRates>,
    op: OpKind,
    ranks: usize,
}

/// The bytes a probe for a row of `bytes` covers: the larger half of the row's
/// work at even rates, which is what one rank's memory must move.
fn probe_size(op: OpKind, ranks: usize, bytes: usize, place: Place) -> usize {
    let even = MemoryRates { copy: 1.0, reduce: 1.0 };
    let w = memory_work(op, ranks, bytes, place == Place::InPlace, even);
    w.copy.max(w.reduce) as usize
}

impl Ceiling {
    /// Measures at every size the sweep will print. Every rank times the same
    /// kernel over its own buffers at the same moment (a barrier before each
    /// trial), so the rates are one rank's while all of them work, on the cores
    /// and memory the ranks run on; a trial's time is its slowest rank's, and the
    /// fastest of five trials counts, after two untimed ones. Device buffers and barriers get no ceiling.
    pub(crate) fn measure(
        comm: &Communicator,
        a: &PerfArgs,
        sizes: &[usize],
        places: &[Place],
    ) -> braid::Result<Ceiling> {
        let n = comm.world_size();
        let mut probes: Vec<usize> = Vec::new();
        if a.device == crate::perf_device::DeviceChoice::None && a.op != OpKind::Barrier {
            probes = sizes.iter().flat_map(|&s| places.iter().map(move |&p| probe_size(a.op, n, s, p))).collect();
            probes.retain(|&p| p > 0);
            probes.sort_unstable();
            probes.dedup();
        }
        let mut probe = Probe::new(probes.last().copied().unwrap_or(0));
        let kernels = [Kernel::Copy, Kernel::Reduce(a.dtype, a.reduce_op)];
        let mut rates = BTreeMap::new();
        for &size in &probes {
            let reps = reps_for(size, MIN_TRIAL_BYTES);
            let mut per_kernel = [0.0; 2];
            for (k, &kernel) in kernels.iter().enumerate() {
                // Untimed trials first: the first runs of a size were up to 1.8x slower
                // (a 2-rank copy of 32 MiB: 5.1, 3.9, 3.1, 2.7, 2.7 ms).
                let mut times = Vec::with_capacity(TRIALS);
                for trial in 0..WARMUP_TRIALS + TRIALS {
                    comm.barrier()?;
                    let t = probe.time(kernel, size, reps);
                    if trial >= WARMUP_TRIALS {
                        times.push(t);
                    }
                }
                comm.all_reduce_in_place(&mut times, ReduceOp::Max)?;
                let best = times.iter().copied().fold(f64::INFINITY, f64::min);
                per_kernel[k] = if best > 0.0 && best.is_finite() { (size * reps) as f64 / best } else { 0.0 };
            }
            rates.insert(size, MemoryRates { copy: per_kernel[0], reduce: per_kernel[1] });
        }
        Ok(Ceiling { ranks_timed: n, rates, op: a.op, ranks: n })
    }

    /// The header line: what was measured, at the largest size.
    pub(crate) fn describe(&self) -> String {
        match self.rates.iter().next_back() {
            Some((size, r)) => format!(
                "# memory ceiling: {} ranks at once, per rank at {}: copy {:.2} GB/s, reduce {:.2} GB/s; \
                 bound% = the collective's memory bound (src/ceiling.rs) / time",
                self.ranks_timed,
                human(*size),
                r.copy / 1e9,
                r.reduce / 1e9
            ),
            None => "# memory ceiling: not measured (device buffers or a barrier)".into(),
        }
    }

    /// The rates, work and fraction of a row measured in `seconds`.
    pub(crate) fn row(&self, bytes: usize, place: Place, seconds: f64) -> Option<RowBound> {
        // The probe ran at the requested sizes; a row's bytes may be a little less
        // (a whole count per rank), so the nearest probe stands for it.
        let want = probe_size(self.op, self.ranks, bytes, place);
        let below = self.rates.range(..=want).next_back();
        let above = self.rates.range(want..).next();
        let (_, &rates) = match (below, above) {
            (Some(b), Some(a)) => {
                if want - b.0 <= a.0 - want {
                    b
                } else {
                    a
                }
            }
            (b, a) => b.or(a)?,
        };
        let work = memory_work(self.op, self.ranks, bytes, place == Place::InPlace, rates);
        let fraction = bound_fraction(work, rates, seconds)?;
        Some(RowBound { rates, work, fraction })
    }
}

/// A row's bound.
pub(crate) struct RowBound {
    pub rates: MemoryRates,
    pub work: MemoryWork,
    pub fraction: f64,
}

impl RowBound {
    /// The bound's time in microseconds.
    pub(crate) fn bound_us(&self) -> f64 {
        bound_seconds(self.work, self.rates) * 1e6
    }
}

/// The `bound%` cell of a row.
pub(crate) fn cell(b: Option<&RowBound>) -> String {
    match b {
        Some(b) => {
            // Three significant digits: a small call's fraction is tiny, not zero.
            let pct = b.fraction * 100.0;
            let decimals = if pct > 0.0 { (2 - pct.log10().floor() as i32).clamp(1, 6) as usize } else { 1 };
            format!("{pct:>7.decimals$}")
        }
        None => format!("{:>7}", "-"),
    }
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
