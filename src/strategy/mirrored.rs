//! Synchronous replicas that each hold a copy of the variables (mirrored): threads
//! of one process ([`Mirrored`]) or one replica per process ([`MultiWorkerMirrored`]).
//! Both run [`SyncReplica`]: compute, all-reduce the gradient sums, apply the
//! same mean on every copy, so the copies stay equal without being sent.

use std::ops::Range;
use std::time::Instant;

use super::base::{combine_local, on_each, ApplyFn, Reduction, Replica, StepFn, Strategy};
use super::elastic_state::{Joining, Recovery};
use super::tensors::{flatten, same_shapes, scale, unflatten, Tensors};
use crate::algorithm::Algorithm;
use crate::comm::Communicator;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::fusion::{FusedWork, Fuser, FusionConfig};
use crate::tuner::AlgoPolicy;
use crate::types::ReduceOp;

/// How [`Mirrored`] combines the replicas' gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CrossReplica {
    /// All-reduce through the fuser, the algorithm picked by the tuner (default).
    #[default]
    AllReduce,
    /// Hierarchical all-reduce: replicas in two groups (as GPUs on two switches),
    /// reduced inside each group, across, then copied back inside each group.
    Hierarchical,
    /// Reduce to replica 0, then broadcast from it (TensorFlow's
    /// `ReductionToOneDevice`).
    ReduceBroadcast,
}

/// One replica of a synchronous strategy: its communicator (inside a fuser) and
/// its copy of the variables.
pub(super) struct SyncReplica {
    pub(super) id: usize,
    fuser: Fuser,
    pub(super) vars: Tensors,
    how: CrossReplica,
    /// A number each replica adds into the step's loss all-reduce (no extra
    /// call), and the sum over replicas the last step got: how the elastic
    /// strategy's rank 0 tells the others that processes wait to join.
    pub(super) side: f64,
    pub(super) side_sum: f64,
}

impl SyncReplica {
    /// Every replica starts from replica 0's variables (broadcast), as
    /// `tf.distribute` mirrors them at creation.
    fn new(comm: Communicator, vars: Tensors, how: CrossReplica, fusion: FusionConfig) -> Result<SyncReplica> {
        let mut flat = flatten(&vars);
        comm.broadcast(&mut flat, 0)?;
        let vars = unflatten(&flat, &vars);
        Ok(SyncReplica::with_vars(comm, vars, how, fusion))
    }

    /// A replica over `comm` keeping `vars` as they are (equal on every replica).
    pub(super) fn with_vars(comm: Communicator, vars: Tensors, how: CrossReplica, fusion: FusionConfig) -> SyncReplica {
        SyncReplica { id: comm.rank(), fuser: Fuser::new(comm, fusion), vars, how, side: 0.0, side_sum: 0.0 }
    }

    pub(super) fn comm(&self) -> &Communicator {
        self.fuser.communicator()
    }

    pub(super) fn step(
        &mut self,
        share: Range<usize>,
        global_batch: usize,
        step: &StepFn<'_>,
        apply: &ApplyFn<'_>,
    ) -> Result<f64> {
        let started = self.comm().timeline_on().then(Instant::now);
        let replicas = self.comm().world_size();
        let g = step(&Replica { id: self.id, replicas, batch: share, vars: &self.vars });
        if !same_shapes(&g.grads, &self.vars) {
            // Still take part, so the other replicas fail on the mismatch instead
            // of waiting: the sizes differ and the collectives say so.
            let _ = self.comm().all_reduce_in_place(&mut flatten(&g.grads), ReduceOp::Sum);
            return Err(Error::InvalidArgument(format!(
                "replica {}: the step's gradients do not have the variables' shapes",
                self.id
            )));
        }
        let (mut grads, loss) = match self.how {
            CrossReplica::AllReduce | CrossReplica::Hierarchical => {
                let works: Vec<FusedWork<f32>> =
                    g.grads.into_iter().map(|t| self.fuser.all_reduce(t, ReduceOp::Sum)).collect();
                let loss = self.fuser.all_reduce(vec![g.loss, self.side], ReduceOp::Sum);
                self.fuser.flush();
                let grads = works.into_iter().map(FusedWork::wait).collect::<Result<Tensors>>()?;
                let sums = loss.wait()?;
                self.side_sum = sums[1];
                (grads, sums[0])
            }
            CrossReplica::ReduceBroadcast => {
                let comm = self.fuser.communicator();
                let mut flat = flatten(&g.grads);
                let mut loss = [g.loss, self.side];
                comm.reduce_in_place(&mut flat, ReduceOp::Sum, 0)?;
                comm.reduce_in_place(&mut loss, ReduceOp::Sum, 0)?;
                comm.broadcast(&mut flat, 0)?;
                comm.broadcast(&mut loss, 0)?;
                self.side_sum = loss[1];
                (unflatten(&flat, &g.grads), loss[0])
            }
        };
        scale(&mut grads, global_batch);
        apply(&mut self.vars, &grads);
        if let Some(t0) = started {
            let span = (t0, Instant::now());
            self.comm().timeline_span("step", "strategy", span, Some(("global_batch", global_batch as u64)));
        }
        Ok(loss / global_batch.max(1) as f64)
    }

    /// Sum of one value from every replica.
    fn sum(&self, value: f64) -> Result<f64> {
        let mut v = [value];
        self.comm().all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        Ok(v[0])
    }

    /// Take `vars` (from replica 0, so every copy ends equal).
    fn set(&mut self, vars: Tensors) -> Result<()> {
        if !same_shapes(&vars, &self.vars) {
            return Err(Error::InvalidArgument(format!(
                "replica {}: new variables do not have the old shapes",
                self.id
            )));
        }
        let mut flat = flatten(&vars);
        self.comm().broadcast(&mut flat, 0)?;
        self.vars = unflatten(&flat, &vars);
        Ok(())
    }
}

/// Replicas as threads of this process, joined by in-process links.
pub struct Mirrored {
    replicas: Vec<SyncReplica>,
}

/// The replicas' timeline file, read like the fusion settings (`BRAID_TIMELINE`).
fn timeline_from_env() -> Option<std::path::PathBuf> {
    std::env::var_os("BRAID_TIMELINE").filter(|f| !f.is_empty()).map(std::path::PathBuf::from)
}

impl Mirrored {
    /// `replicas` copies of `vars`, combining gradients with `how`; fusion
    /// settings from the environment (`BRAID_FUSION_BYTES`, `BRAID_FUSION_CYCLE`).
    pub fn new(replicas: usize, vars: Tensors, how: CrossReplica) -> Result<Mirrored> {
        let n = replicas.max(1);
        let comms = match how {
            CrossReplica::Hierarchical => {
                let mut cfg = Config::new(0, n);
                cfg.timeline = timeline_from_env();
                cfg.algorithms = AlgoPolicy::only(Algorithm::Hierarchical);
                let groups: Vec<usize> = (0..n).map(|r| r * 2 / n).collect();
                Communicator::in_process_on_hosts(cfg, &groups)?
            }
            _ => {
                let mut cfg = Config::new(0, n);
                cfg.timeline = timeline_from_env();
                Communicator::in_process_with(cfg)?
            }
        };
        let fusion = FusionConfig::from_env()?;
        let mut slots: Vec<Option<Communicator>> = comms.into_iter().map(Some).collect();
        let mut made = std::thread::scope(|s| {
            let handles: Vec<_> = slots
                .iter_mut()
                .map(|c| {
                    let (c, vars) = (c.take(), vars.clone());
                    s.spawn(move || match c {
                        Some(c) => SyncReplica::new(c, vars, how, fusion),
                        None => Err(Error::Broken("no communicator for a replica".into())),
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::Broken("a replica panicked".into()))))
                .collect::<Result<Vec<_>>>()
        })?;
        made.sort_by_key(|r| r.id);
        Ok(Mirrored { replicas: made })
    }
}

impl Strategy for Mirrored {
    fn name(&self) -> &'static str {
        "mirrored"
    }
    fn num_replicas_in_sync(&self) -> usize {
        self.replicas.len()
    }
    fn local_replicas(&self) -> Range<usize> {
        0..self.replicas.len()
    }
    fn step(&mut self, global_batch: usize, step: &StepFn<'_>, apply: &ApplyFn<'_>) -> Result<f64> {
        let shares = self.split_batch(global_batch);
        let losses = on_each(&mut self.replicas, |r| r.step(shares[r.id].clone(), global_batch, step, apply))?;
        Ok(losses[0])
    }
    fn reduce(&mut self, op: Reduction, local: &[f64]) -> Result<f64> {
        // Every replica is in this process: the sum needs no collective.
        combine_local("mirrored", op, local, self.replicas.len())
    }
    fn variables(&self) -> &Tensors {
        &self.replicas[0].vars
    }
    fn set_variables(&mut self, vars: Tensors) -> Result<()> {
        on_each(&mut self.replicas, |r| r.set(vars.clone())).map(drop)
    }
}

/// One replica per process (any hosts): the communicator is the job's, from the
/// environment (`braid run`, torchrun, mpirun, Slurm) or built by the caller.
///
/// With [`MultiWorkerMirrored::elastic`], losing a worker does not end training:
/// see [`super::elastic`].
pub struct MultiWorkerMirrored {
    pub(super) replica: SyncReplica,
    pub(super) fusion: FusionConfig,
    /// `Some(min_replicas)` when elastic.
    pub(super) elastic: Option<usize>,
    /// Steps this replica completed (applied), and the last one's mean loss.
    pub(super) steps_done: u64,
    pub(super) last_loss: f64,
    /// What each recovery did, in order.
    pub(super) recoveries: Vec<Recovery>,
    /// Where replacement processes wait to join, and how rank 0 looks for them.
    pub(super) joinable: Option<Joining>,
    /// Joiners taken in, per growth: (step, replicas before, after).
    pub(super) growths: Vec<(u64, usize, usize)>,
}

impl MultiWorkerMirrored {
    /// This process's replica over `comm`, starting from rank 0's `vars`, with
    /// gradients all-reduced through a fuser (settings from the environment).
    pub fn new(comm: Communicator, vars: Tensors) -> Result<MultiWorkerMirrored> {
        let fusion = FusionConfig::from_env()?;
        let replica = SyncReplica::new(comm, vars, CrossReplica::AllReduce, fusion)?;
        Ok(MultiWorkerMirrored::from_replica(replica, fusion))
    }

    /// A replica over `comm` keeping `vars` as given (the caller makes them equal).
    pub(super) fn new_unsynced(comm: Communicator, vars: Tensors) -> Result<MultiWorkerMirrored> {
        let fusion = FusionConfig::from_env()?;
        let replica = SyncReplica::with_vars(comm, vars, CrossReplica::AllReduce, fusion);
        Ok(MultiWorkerMirrored::from_replica(replica, fusion))
    }

    fn from_replica(replica: SyncReplica, fusion: FusionConfig) -> MultiWorkerMirrored {
        MultiWorkerMirrored {
            replica,
            fusion,
            elastic: None,
            steps_done: 0,
            last_loss: f64::NAN,
            recoveries: Vec::new(),
            joinable: None,
            growths: Vec::new(),
        }
    }

    /// [`MultiWorkerMirrored::new`] over [`Communicator::from_env`].
    pub fn from_env(vars: Tensors) -> Result<MultiWorkerMirrored> {
        MultiWorkerMirrored::new(Communicator::from_env()?, vars)
    }

    /// The job's communicator.
    pub fn communicator(&self) -> &Communicator {
        self.replica.comm()
    }
}

impl Strategy for MultiWorkerMirrored {
    fn name(&self) -> &'static str {
        "multi-worker"
    }
    fn num_replicas_in_sync(&self) -> usize {
        self.replica.comm().world_size()
    }
    fn local_replicas(&self) -> Range<usize> {
        self.replica.id..self.replica.id + 1
    }
    fn step(&mut self, global_batch: usize, step: &StepFn<'_>, apply: &ApplyFn<'_>) -> Result<f64> {
        let share = self.split_batch(global_batch)[self.replica.id].clone();
        self.replica.side = self.joiners_waiting()?;
        let loss = match self.replica.step(share, global_batch, step, apply) {
            Ok(loss) => self.stepped(loss),
            Err(e) => match self.elastic {
                Some(min) => self.recover(e, min, global_batch, step, apply)?,
                None => return Err(e),
            },
        };
        self.admit_joiners()?;
        Ok(loss)
    }
    fn reduce(&mut self, op: Reduction, local: &[f64]) -> Result<f64> {
        let [value] = local else {
            return Err(Error::InvalidArgument(format!(
                "multi-worker reduce: {} values for 1 local replica",
                local.len()
            )));
        };
        let sum = self.replica.sum(*value)?;
        Ok(match op {
            Reduction::Sum => sum,
            Reduction::Mean => sum / self.num_replicas_in_sync() as f64,
        })
    }
    fn variables(&self) -> &Tensors {
        &self.replica.vars
    }
    fn set_variables(&mut self, vars: Tensors) -> Result<()> {
        self.replica.set(vars)
    }
    fn save(&mut self, path: &std::path::Path, epoch: u64) -> Result<()> {
        // Rank 0 writes; the barrier keeps any rank from reading it early.
        let written = if self.replica.id == 0 {
            super::write_checkpoint(path, &super::Checkpoint { epoch, vars: self.replica.vars.clone() })
        } else {
            Ok(())
        };
        let ok = self.replica.sum(if written.is_ok() { 0.0 } else { 1.0 })?;
        written?;
        if ok != 0.0 {
            return Err(Error::Broken(format!("rank 0 could not write the checkpoint {}", path.display())));
        }
        Ok(())
    }
}
