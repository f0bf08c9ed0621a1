//! Planner dispatch: validates a request, picks the default algorithm, and routes
//! to the per-algorithm planners. The helpers they share (element chunking and the
//! schedule builder) are in `builder`, below them, so that the planners do not
//! import their dispatcher.

use super::{
    bruck, chain, dbtree, direct, gather, halving_doubling, hier_gather, hierarchical, ordered, pairwise, ring, tree,
    vblocks,
};
use super::{Algorithm, PlanParams, PlanRequest, Schedule};
use crate::types::OpKind;

/// The algorithm used when a request names none: a pure function of the op, the
/// world size and the message size, with every threshold in [`PlanParams`] so a
/// tuner can replace the rule wholesale.
///
/// - all-reduce, all-gather, reduce-scatter: `Direct` when the bytes each rank sends
///   (`count * elem_size * (world - 1)`) are at most `direct_max_bytes` and
///   `world <= direct_max_world`, else `Ring`;
/// - broadcast, reduce: `Tree` up to `tree_max_bytes` (`count * elem_size`), else
///   `Chain`;
/// - gather, scatter: `Direct` while the world is at most `direct_max_world` or the
///   root's whole buffer (`count * elem_size * world`) exceeds `tree_max_bytes`
///   (the tree forwards blocks through intermediate ranks, so it saves latency
///   only), else `Tree`;
/// - barrier: `Dissemination`; all-to-all: `Pairwise`.
///
/// Errors for point-to-point ops, which have no schedule.
pub fn default_algorithm(req: &PlanRequest<'_>, params: &PlanParams) -> Result<Algorithm, String> {
    let bytes = req.count.saturating_mul(req.elem_size);
    Ok(match req.op {
        OpKind::AllReduce | OpKind::AllGather | OpKind::ReduceScatter => {
            let sent = bytes.saturating_mul(req.world.saturating_sub(1));
            if sent <= params.direct_max_bytes && req.world <= params.direct_max_world {
                Algorithm::Direct
            } else {
                Algorithm::Ring
            }
        }
        OpKind::Broadcast | OpKind::Reduce => {
            if bytes <= params.tree_max_bytes {
                Algorithm::Tree
            } else {
                Algorithm::Chain
            }
        }
        OpKind::Gather | OpKind::Scatter => {
            if req.world <= params.direct_max_world || bytes.saturating_mul(req.world) > params.tree_max_bytes {
                Algorithm::Direct
            } else {
                Algorithm::Tree
            }
        }
        // The blocks' sizes are the caller's; the total prices them as all-gather's.
        OpKind::AllGatherV | OpKind::ReduceScatterV => {
            let per_rank = bytes / req.world.max(1);
            if per_rank.saturating_mul(req.world - 1) <= params.direct_max_bytes && req.world <= params.direct_max_world
            {
                Algorithm::Direct
            } else {
                Algorithm::Ring
            }
        }
        OpKind::Barrier => Algorithm::Dissemination,
        OpKind::AllToAll | OpKind::AllToAllV => Algorithm::Pairwise,
        OpKind::Send | OpKind::Recv => {
            return Err(format!("{} is point-to-point and has no collective schedule", req.op))
        }
    })
}

/// Validate, choose, plan.
pub(crate) fn plan(req: &PlanRequest<'_>, params: &PlanParams) -> Result<Schedule, String> {
    if req.world == 0 {
        return Err(format!("{}: world size must be at least 1", req.op));
    }
    if req.rank >= req.world {
        return Err(format!("{}: rank {} outside world of {}", req.op, req.rank, req.world));
    }
    if !req.hosts.is_empty() {
        if req.hosts.len() != req.world {
            return Err(format!("{}: {} host entries for a world of {}", req.op, req.hosts.len(), req.world));
        }
        // Hosts numbered by their lowest rank: each new host takes the next number.
        let mut next = 0;
        for (r, &h) in req.hosts.iter().enumerate() {
            if h > next {
                return Err(format!("{}: rank {r} is on host {h}, but hosts must be numbered by lowest rank", req.op));
            }
            next = next.max(h + 1);
        }
    }
    if req.elem_size == 0 {
        return Err(format!("{}: element size must be at least 1 byte", req.op));
    }
    if req.op.rooted() && req.root >= req.world {
        return Err(format!("{}: root {} outside world of {}", req.op, req.root, req.world));
    }
    // Buffer sizes must be representable; everything below multiplies freely.
    if req.count.checked_mul(req.elem_size).and_then(|b| b.checked_mul(req.world.max(2))).is_none() {
        return Err(format!("{}: count {} x {} bytes overflows", req.op, req.count, req.elem_size));
    }
    if req.op.varies() {
        if let Some(why) = vblocks::invalid(req) {
            return Err(why);
        }
    }
    let alg = match req.algorithm {
        Some(a) => a,
        None => default_algorithm(req, params)?,
    };
    let unsupported = || {
        let names: Vec<&str> = super::algorithms_for(req.op).iter().map(|a| a.name()).collect();
        let expected = if names.is_empty() { "none; it is point-to-point".to_string() } else { names.join(", ") };
        Err(format!("algorithm `{alg}` does not implement {} (available: {expected})", req.op))
    };
    if params.deterministic && ordered::applies(req.op) {
        if !super::algorithms_for(req.op).contains(&alg) {
            return unsupported();
        }
        return Ok(ordered::plan(req, alg));
    }
    match (req.op, alg) {
        (OpKind::AllReduce, Algorithm::Ring) => Ok(ring::all_reduce(req)),
        (OpKind::AllReduce, Algorithm::Direct) => Ok(direct::all_reduce(req)),
        (OpKind::AllGather, Algorithm::Ring) => Ok(ring::all_gather(req)),
        (OpKind::AllGather, Algorithm::Direct) => Ok(direct::all_gather(req)),
        (OpKind::ReduceScatter, Algorithm::Ring) => Ok(ring::reduce_scatter(req)),
        (OpKind::ReduceScatter, Algorithm::Direct) => Ok(direct::reduce_scatter(req)),
        (OpKind::Broadcast, Algorithm::Chain) => Ok(chain::broadcast(req, params)),
        (OpKind::Broadcast, Algorithm::Tree) => Ok(tree::broadcast(req)),
        (OpKind::Reduce, Algorithm::Chain) => Ok(chain::reduce(req, params)),
        (OpKind::Reduce, Algorithm::Tree) => Ok(tree::reduce(req)),
        (OpKind::AllReduce, Algorithm::Tree) => Ok(dbtree::all_reduce(req, params)),
        (OpKind::AllReduce, Algorithm::Doubling) => Ok(halving_doubling::all_reduce_doubling(req)),
        (OpKind::AllReduce, Algorithm::HalvingDoubling) => Ok(halving_doubling::all_reduce(req)),
        (OpKind::ReduceScatter, Algorithm::HalvingDoubling) => Ok(halving_doubling::reduce_scatter(req)),
        (OpKind::AllGather, Algorithm::Doubling) => Ok(bruck::all_gather_doubling(req)),
        (OpKind::AllGather, Algorithm::Bruck) => Ok(bruck::all_gather(req)),
        (OpKind::AllReduce, Algorithm::Hierarchical) => Ok(hierarchical::all_reduce(req, params)),
        (OpKind::AllGather, Algorithm::Hierarchical) => Ok(hierarchical::all_gather(req, params)),
        (OpKind::ReduceScatter, Algorithm::Hierarchical) => Ok(hierarchical::reduce_scatter(req, params)),
        (OpKind::Broadcast, Algorithm::Hierarchical) => Ok(hierarchical::broadcast(req, params)),
        (OpKind::Reduce, Algorithm::Hierarchical) => Ok(hierarchical::reduce(req, params)),
        (OpKind::Barrier, Algorithm::Dissemination) => Ok(pairwise::barrier(req)),
        (OpKind::AllToAll, Algorithm::Pairwise) => Ok(pairwise::all_to_all(req)),
        (OpKind::Gather, Algorithm::Direct) => Ok(gather::gather_direct(req)),
        (OpKind::Scatter, Algorithm::Direct) => Ok(gather::scatter_direct(req)),
        (OpKind::Gather, Algorithm::Tree) => Ok(gather::gather_tree(req)),
        (OpKind::Scatter, Algorithm::Tree) => Ok(gather::scatter_tree(req)),
        (OpKind::Gather, Algorithm::Hierarchical) => Ok(hier_gather::gather(req, params)),
        (OpKind::Scatter, Algorithm::Hierarchical) => Ok(hier_gather::scatter(req, params)),
        (OpKind::AllGatherV, Algorithm::Ring) => Ok(vblocks::all_gather_ring(req)),
        (OpKind::AllGatherV, Algorithm::Direct) => Ok(vblocks::all_gather_direct(req)),
        (OpKind::ReduceScatterV, Algorithm::Ring) => Ok(vblocks::reduce_scatter_ring(req)),
        (OpKind::ReduceScatterV, Algorithm::Direct) => Ok(vblocks::reduce_scatter_direct(req)),
        (OpKind::AllToAllV, Algorithm::Pairwise) => Ok(vblocks::all_to_all_pairwise(req)),
        _ => unsupported(),
    }
}
