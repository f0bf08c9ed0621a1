//! One copy of the variables, kept by replica 0 (TensorFlow's
//! `CentralStorageStrategy`: variables on the host, compute on every device):
//! replicas' gradient sums are reduced to it, the update is applied once, and the
//! new values are broadcast to the replicas' read copies.

use std::ops::Range;

use super::base::{combine_local, on_each, ApplyFn, Reduction, Replica, StepFn, Strategy};
use super::tensors::{flatten, same_shapes, scale, unflatten, Tensors};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::types::ReduceOp;

/// A replica's thread state: its communicator and its read copy of the variables
/// (replica 0's copy is the central one).
struct Worker {
    id: usize,
    comm: Communicator,
    view: Tensors,
}

/// Replicas as threads of this process around one copy of the variables.
pub struct CentralStorage {
    workers: Vec<Worker>,
}

impl CentralStorage {
    /// `replicas` threads computing on `vars`, which replica 0 stores.
    pub fn new(replicas: usize, vars: Tensors) -> Result<CentralStorage> {
        let comms = Communicator::in_process(replicas.max(1))?;
        let workers = comms.into_iter().map(|comm| Worker { id: comm.rank(), comm, view: vars.clone() }).collect();
        Ok(CentralStorage { workers })
    }
}

impl Worker {
    fn step(
        &mut self,
        share: Range<usize>,
        global_batch: usize,
        step: &StepFn<'_>,
        apply: &ApplyFn<'_>,
    ) -> Result<f64> {
        let replicas = self.comm.world_size();
        let g = step(&Replica { id: self.id, replicas, batch: share, vars: &self.view });
        let shaped = same_shapes(&g.grads, &self.view);
        // A bad shape still takes part (with its own length), so the others fail
        // on the size mismatch instead of waiting.
        let mut flat = flatten(&g.grads);
        let mut loss = [g.loss];
        self.comm.reduce_in_place(&mut flat, ReduceOp::Sum, 0)?;
        self.comm.reduce_in_place(&mut loss, ReduceOp::Sum, 0)?;
        if !shaped {
            return Err(Error::InvalidArgument(format!(
                "replica {}: the step's gradients do not have the variables' shapes",
                self.id
            )));
        }
        let mut vars = flatten(&self.view);
        if self.id == 0 {
            // The one update, on the central copy.
            let mut grads = unflatten(&flat, &self.view);
            scale(&mut grads, global_batch);
            apply(&mut self.view, &grads);
            vars = flatten(&self.view);
        }
        self.comm.broadcast(&mut vars, 0)?;
        self.comm.broadcast(&mut loss, 0)?;
        self.view = unflatten(&vars, &self.view);
        Ok(loss[0] / global_batch.max(1) as f64)
    }
}

impl Strategy for CentralStorage {
    fn name(&self) -> &'static str {
        "central-storage"
    }
    fn num_replicas_in_sync(&self) -> usize {
        self.workers.len()
    }
    fn local_replicas(&self) -> Range<usize> {
        0..self.workers.len()
    }
    fn step(&mut self, global_batch: usize, step: &StepFn<'_>, apply: &ApplyFn<'_>) -> Result<f64> {
        let shares = self.split_batch(global_batch);
        let losses = on_each(&mut self.workers, |w| w.step(shares[w.id].clone(), global_batch, step, apply))?;
        Ok(losses[0])
    }
    fn reduce(&mut self, op: Reduction, local: &[f64]) -> Result<f64> {
        combine_local("central-storage", op, local, self.workers.len())
    }
    fn variables(&self) -> &Tensors {
        &self.workers[0].view
    }
    fn set_variables(&mut self, vars: Tensors) -> Result<()> {
        if !same_shapes(&vars, &self.workers[0].view) {
            return Err(Error::InvalidArgument("central-storage: new variables do not have the old shapes".into()));
        }
        self.workers.iter_mut().for_each(|w| w.view = vars.clone());
        Ok(())
    }
}
