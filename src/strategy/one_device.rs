//! One replica, no communication: the reference every other strategy is checked
//! against.

use std::ops::Range;

use super::base::{combine_local, ApplyFn, Reduction, Replica, StepFn, Strategy};
use super::tensors::{same_shapes, scale, Tensors};
use crate::error::{Error, Result};

/// Training on one device: the step function sees the whole global batch.
pub struct OneDevice {
    vars: Tensors,
}

impl OneDevice {
    /// A strategy holding `vars`.
    pub fn new(vars: Tensors) -> OneDevice {
        OneDevice { vars }
    }
}

impl Strategy for OneDevice {
    fn name(&self) -> &'static str {
        "one-device"
    }
    fn num_replicas_in_sync(&self) -> usize {
        1
    }
    fn local_replicas(&self) -> Range<usize> {
        0..1
    }
    fn step(&mut self, global_batch: usize, step: &StepFn<'_>, apply: &ApplyFn<'_>) -> Result<f64> {
        let mut g = step(&Replica { id: 0, replicas: 1, batch: 0..global_batch, vars: &self.vars });
        if !same_shapes(&g.grads, &self.vars) {
            return Err(Error::InvalidArgument("one-device step: gradients do not have the variables' shapes".into()));
        }
        scale(&mut g.grads, global_batch);
        apply(&mut self.vars, &g.grads);
        Ok(g.loss / global_batch.max(1) as f64)
    }
    fn reduce(&mut self, op: Reduction, local: &[f64]) -> Result<f64> {
        combine_local("one-device", op, local, 1)
    }
    fn variables(&self) -> &Tensors {
        &self.vars
    }
    fn set_variables(&mut self, vars: Tensors) -> Result<()> {
        if !same_shapes(&vars, &self.vars) {
            return Err(Error::InvalidArgument("one-device: new variables do not have the old shapes".into()));
        }
        self.vars = vars;
        Ok(())
    }
}
