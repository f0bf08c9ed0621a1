//! [`Tensors`], a model's variables or gradients, and the few operations on them
//! every strategy shares. The bottom of `strategy/`: it imports no sibling.

/// A model's variables, or their gradients: a list of f32 tensors.
pub type Tensors = Vec<Vec<f32>>;

/// `grads / count`, in place: the mean gradient from the summed one.
pub(super) fn scale(grads: &mut Tensors, count: usize) {
    let k = 1.0 / count.max(1) as f32;
    grads.iter_mut().flatten().for_each(|g| *g *= k);
}

/// Every tensor of `t`, end to end.
pub(super) fn flatten(t: &Tensors) -> Vec<f32> {
    t.iter().flatten().copied().collect()
}

/// Cut `flat` back into tensors of the shapes of `like`.
pub(super) fn unflatten(flat: &[f32], like: &Tensors) -> Tensors {
    let mut off = 0;
    like.iter()
        .map(|t| {
            let v = flat[off..off + t.len()].to_vec();
            off += t.len();
            v
        })
        .collect()
}

/// Whether `a` and `b` have the same shapes.
pub(super) fn same_shapes(a: &Tensors, b: &Tensors) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.len() == y.len())
}
