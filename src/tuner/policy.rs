//! `BRAID_ALGO`: which algorithms each collective may use, in NCCL's syntax.
//!
//! - `ring,tree`: every collective chooses among these, where they apply; a
//!   collective that none of them implements keeps its full choice;
//! - `allreduce:ring,tree;broadcast:chain`: per collective (op names as `braid perf
//!   --op` takes them, with or without hyphens), the others keep their full choice;
//! - `^tree` (globally or after `op:`): everything but these;
//! - `auto` or empty: every algorithm, the tuner decides.
//!
//! Naming an algorithm for a collective it cannot run is an error when the policy
//! is parsed, and so is excluding every algorithm of a collective: never a silent
//! fallback.

use std::fmt;
use std::str::FromStr;

use crate::algorithm::{algorithms_for, Algorithm};
use crate::types::OpKind;

/// One rule: which ops it covers (None: all), and the algorithms it allows or
/// (with `except`) excludes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    op: Option<OpKind>,
    except: bool,
    algorithms: Vec<Algorithm>,
}

/// Allowed algorithms per collective (see the module docs for the syntax).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlgoPolicy {
    rules: Vec<Rule>,
}

/// Collectives that have schedules.
fn collectives() -> impl Iterator<Item = OpKind> {
    OpKind::ALL.into_iter().filter(|op| !algorithms_for(*op).is_empty())
}

impl AlgoPolicy {
    /// Every algorithm for every collective.
    pub fn auto() -> AlgoPolicy {
        AlgoPolicy::default()
    }

    /// Exactly `a` wherever it applies (what `--algo NAME` means).
    pub fn only(a: Algorithm) -> AlgoPolicy {
        AlgoPolicy { rules: vec![Rule { op: None, except: false, algorithms: vec![a] }] }
    }

    /// Whether nothing is restricted.
    pub fn is_auto(&self) -> bool {
        self.rules.is_empty()
    }

    /// The algorithms `op` may use, in the planner's order of preference. Empty for
    /// point-to-point ops.
    pub fn allowed(&self, op: OpKind) -> Vec<Algorithm> {
        let all = algorithms_for(op);
        // The op's own rule wins over a global one.
        let rule = self.rules.iter().find(|r| r.op == Some(op)).or_else(|| self.rules.iter().find(|r| r.op.is_none()));
        let Some(rule) = rule else { return all.to_vec() };
        let picked: Vec<Algorithm> =
            all.iter().copied().filter(|a| rule.algorithms.contains(a) != rule.except).collect();
        if picked.is_empty() && rule.op.is_none() && !rule.except {
            // A global list that names nothing this op has leaves it alone.
            return all.to_vec();
        }
        picked
    }
}

impl FromStr for AlgoPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("auto") {
            return Ok(AlgoPolicy::auto());
        }
        let mut rules = Vec::new();
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (op, list) = match part.split_once(':') {
                Some((op, list)) => (Some(op.trim().parse::<OpKind>()?), list.trim()),
                None => (None, part),
            };
            if let Some(op) = op {
                if algorithms_for(op).is_empty() {
                    return Err(format!("`{part}`: {op} is point-to-point and has no algorithms"));
                }
                if rules.iter().any(|r: &Rule| r.op == Some(op)) {
                    return Err(format!("`{part}`: {op} is named twice"));
                }
            } else if rules.iter().any(|r: &Rule| r.op.is_none()) {
                return Err(format!("`{part}`: only one list may apply to every collective"));
            }
            let (except, list) = match list.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, list),
            };
            let algorithms = list
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::parse)
                .collect::<Result<Vec<_>, _>>()?;
            if algorithms.is_empty() {
                return Err(format!("`{part}`: no algorithm named"));
            }
            for a in &algorithms {
                match op {
                    Some(op) if !algorithms_for(op).contains(a) => {
                        let names: Vec<&str> = algorithms_for(op).iter().map(|a| a.name()).collect();
                        return Err(format!("`{part}`: {a} cannot run {op} (it can use {})", names.join(", ")));
                    }
                    None if !collectives().any(|o| algorithms_for(o).contains(a)) => {
                        return Err(format!("`{part}`: {a} runs no collective"));
                    }
                    _ => {}
                }
            }
            rules.push(Rule { op, except, algorithms });
        }
        let policy = AlgoPolicy { rules };
        for op in collectives() {
            if policy.allowed(op).is_empty() {
                return Err(format!("`{s}` leaves {op} no algorithm"));
            }
        }
        Ok(policy)
    }
}

impl fmt::Display for AlgoPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rules.is_empty() {
            return f.write_str("auto");
        }
        for (i, r) in self.rules.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            if let Some(op) = r.op {
                write!(f, "{}:", op.name().replace('-', ""))?;
            }
            if r.except {
                f.write_str("^")?;
            }
            let names: Vec<&str> = r.algorithms.iter().map(|a| a.name()).collect();
            f.write_str(&names.join(","))?;
        }
        Ok(())
    }
}
