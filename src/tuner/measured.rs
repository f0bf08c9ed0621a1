//! [`Measured`]: what a probe measured for one link class, in the one-line text
//! form the probe exchanges between ranks and the cache stores. Below both
//! `probe.rs` and `cache.rs`, which each use it (`probe` re-exports it).

use std::fmt;

use super::cost::AlgoFar;

/// What a leader measured for one class (None: not measured, keep the default).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    /// Seconds per message.
    pub alpha: f64,
    /// Seconds per byte on the wire, in cache.
    pub beta: f64,
    /// Seconds per byte reduced.
    pub gamma: Option<f64>,
    /// Slowdown past the cache.
    pub far: Option<f64>,
    /// Seconds a round costs on a host whose ranks outnumber its cores (fitted by
    /// the calibration of an oversubscribed one-host world; see `calibrate`).
    pub busy_round: Option<f64>,
    /// Per-algorithm factors past the cache (fitted by that calibration too).
    pub algo_far: AlgoFar,
}

impl fmt::Display for Measured {
    /// `alpha=A beta=B gamma=G far=F`, `-` for values not measured.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        write!(f, "alpha={} beta={} gamma={} far={}", self.alpha, self.beta, opt(self.gamma), opt(self.far))?;
        if let Some(b) = self.busy_round {
            write!(f, " busy_round={b}")?;
        }
        for (key, factor) in self.algo_far.entries() {
            write!(f, " {key}={factor}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Measured {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Measured, String> {
        let (mut alpha, mut beta, mut gamma, mut far, mut busy_round) = (None, None, None, None, None);
        let mut algo_far = AlgoFar::default();
        for field in s.split_whitespace() {
            let (name, value) = field.split_once('=').ok_or_else(|| format!("`{field}` is not name=value"))?;
            if let Some(set) = algo_far.set_entry(name, value.parse().unwrap_or(f64::NAN)) {
                value.parse::<f64>().map_err(|_| format!("`{field}`: not a number"))?;
                set?;
                continue;
            }
            let parsed = if value == "-" {
                None
            } else {
                let v: f64 = value.parse().map_err(|_| format!("`{field}`: not a number"))?;
                // Zero or negative is a measurement noise made (see `measure_pair`),
                // which `measured_cost` replaces; only what is not a number is garbage.
                if !v.is_finite() {
                    return Err(format!("`{field}`: not a finite number"));
                }
                Some(v)
            };
            let slot = match name {
                "alpha" => &mut alpha,
                "beta" => &mut beta,
                "gamma" => &mut gamma,
                "far" => &mut far,
                "busy_round" => &mut busy_round,
                _ => return Err(format!("unknown field `{name}`")),
            };
            *slot = Some(parsed);
        }
        let need = |v: Option<Option<f64>>, n: &str| v.flatten().ok_or_else(|| format!("`{n}` missing"));
        Ok(Measured {
            alpha: need(alpha, "alpha")?,
            beta: need(beta, "beta")?,
            gamma: gamma.flatten(),
            far: far.flatten(),
            busy_round: busy_round.flatten(),
            algo_far,
        })
    }
}
