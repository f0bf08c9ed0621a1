//! The memory ceiling of `braid perf`: after the sweep, every rank times copies
//! and reductions over its own buffers at once, at the size each row's work has;
//! a block of `# bound` lines then gives every row's `bound / measured` (`bound%`). The bound per collective is
//! [`braid::ceiling`]'s.

use std::collections::BTreeMap;

use braid::ceiling::{bound_fraction, bound_seconds, memory_work, reps_for, Kernel, MemoryRates, MemoryWork, Probe};
use braid::{Communicator, DType, OpKind, ReduceOp};

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
    on: bool,
    ranks: usize,
    rates: BTreeMap<usize, MemoryRates>,
    op: OpKind,
    dtype: DType,
    reduce_op: ReduceOp,
}

/// The bytes a probe for a row of `bytes` covers: the larger half of the row's
/// work at even rates, which is what one rank's memory must move.
fn probe_size(op: OpKind, ranks: usize, bytes: usize, place: Place) -> usize {
    let even = MemoryRates { copy: 1.0, reduce: 1.0 };
    let w = memory_work(op, ranks, bytes, place == Place::InPlace, even);
    w.copy.max(w.reduce) as usize
}

impl Ceiling {
    /// Nothing measured yet; device buffers and barriers get no ceiling.
    pub(crate) fn new(comm: &Communicator, a: &PerfArgs) -> Ceiling {
        let on = a.device == crate::perf_device::DeviceChoice::None && a.op != OpKind::Barrier;
        Ceiling {
            on,
            ranks: comm.world_size(),
            rates: BTreeMap::new(),
            op: a.op,
            dtype: a.dtype,
            reduce_op: a.reduce_op,
        }
    }

    /// Measures the rates for a size of `bytes` in each of `places` (after the
    /// sweep: ranks that disagree on the call have failed on it, naming it). Every
    /// rank times the same kernel over its own buffers at the same moment (a
    /// barrier before each trial), so the rates are one rank's while all of them
    /// work, on the cores and memory the ranks run on; a trial's time is its
    /// slowest rank's, and the fastest of five trials counts, after two untimed
    /// ones.
    pub(crate) fn measure(&mut self, comm: &Communicator, bytes: usize, places: &[Place]) -> braid::Result<()> {
        if !self.on {
            return Ok(());
        }
        let mut sizes: Vec<usize> = places.iter().map(|&p| probe_size(self.op, self.ranks, bytes, p)).collect();
        sizes.retain(|&s| s > 0);
        sizes.sort_unstable();
        sizes.dedup();
        let mut probe = Probe::new(sizes.last().copied().unwrap_or(0));
        // The copy rate is the faster of a plain and a non-temporal copy (the
        // executor streams large copies), measured apart.
        let kernels = [Kernel::Copy, Kernel::StreamCopy, Kernel::Reduce(self.dtype, self.reduce_op)];
        for size in sizes {
            let reps = reps_for(size, MIN_TRIAL_BYTES);
            let mut per_kernel = [0.0; 3];
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
            self.rates.insert(size, MemoryRates { copy: per_kernel[0].max(per_kernel[1]), reduce: per_kernel[2] });
        }
        Ok(())
    }

    /// The header of the bound block: what `bound%` is, and its columns.
    pub(crate) fn header(&self) -> String {
        if self.on {
            format!(
                "#\n# Memory bound: the least time the collective's memory work takes at the copy and reduce rates \
                 all ranks measured at once after the sweep (braid::ceiling), over the row's time\n\
                 # bound {:>12} {:>12} {:>16} {:>10} {:>10} {:>8}",
                "size", "place", "algo", "time(us)", "bound(us)", "bound%"
            )
        } else {
            "#\n# Memory bound: none (device buffers or a barrier)".into()
        }
    }

    /// The footer line: the rates at the largest size measured.
    pub(crate) fn footer(&self) -> Option<String> {
        let (size, r) = self.rates.iter().next_back()?;
        Some(format!(
            "# Memory ceiling       : per rank, {} ranks at once, over {}: copy {:.2} GB/s, reduce {:.2} GB/s",
            self.ranks,
            human(*size),
            r.copy / 1e9,
            r.reduce / 1e9
        ))
    }

    /// The rates, work and fraction of a row measured in `seconds`.
    pub(crate) fn row(&self, bytes: usize, place: Place, seconds: f64) -> Option<RowBound> {
        // `measure` ran at every row's own bytes and place, so the size is there.
        let rates = *self.rates.get(&probe_size(self.op, self.ranks, bytes, place))?;
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

/// The `# bound` line of a row (its JSON), or None where it has no bound.
pub(crate) fn line(row: &serde_json::Value, b: Option<&RowBound>) -> Option<String> {
    let b = b?;
    // Three significant digits: a small call's fraction is tiny, not zero.
    let pct = b.fraction * 100.0;
    let decimals = if pct > 0.0 { (2 - pct.log10().floor() as i32).clamp(1, 6) as usize } else { 1 };
    Some(format!(
        "# bound {:>12} {:>12} {:>16} {:>10.2} {:>10.2} {pct:>8.decimals$}",
        row["bytes"].as_u64()?,
        row["place"].as_str()?,
        row["algo"].as_str()?,
        row["time_us"].as_f64()?,
        b.bound_us(),
    ))
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
