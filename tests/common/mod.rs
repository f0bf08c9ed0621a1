//! Shared test harness: run a closure on every rank of a communicator whose ranks
//! are threads, over the in-process transport or over real TCP sockets.
#![allow(dead_code)]

pub mod bounded;
pub mod hosts;

use std::sync::Arc;
use std::time::Duration;

use braid::bootstrap::MemStore;
use braid::TransportKind;
use braid::{Communicator, Config};

/// Which links the rank threads use.
#[derive(Clone, Copy, Debug)]
pub enum Net {
    /// In-memory rings between threads.
    InProc,
    /// TCP sockets on the loopback interface.
    Tcp,
    /// Shared-memory segments (the ranks are threads, the links are the ones
    /// processes use).
    Shm,
}

/// Build `world` communicators over `net` (rooted calls check roots, the default).
pub fn comms(net: Net, world: usize, timeout: Duration) -> Vec<Communicator> {
    comms_checking_roots(net, world, timeout, true)
}

/// [`comms`], with rooted calls first agreeing on their signature when `check_roots`
/// (`BRAID_CHECK_ROOTS`).
pub fn comms_checking_roots(net: Net, world: usize, timeout: Duration, check_roots: bool) -> Vec<Communicator> {
    build_comms(net, world, timeout, check_roots, None)
}

/// [`comms`] with `plan`'s faults injected (`braid::fault`) and no tuner probe,
/// whose traffic would shift the frames a plan counts.
pub fn comms_with_fault(net: Net, world: usize, timeout: Duration, plan: braid::fault::FaultPlan) -> Vec<Communicator> {
    build_comms(net, world, timeout, true, Some(plan))
}

fn build_comms(
    net: Net,
    world: usize,
    timeout: Duration,
    check_roots: bool,
    plan: Option<braid::fault::FaultPlan>,
) -> Vec<Communicator> {
    match net {
        Net::InProc => {
            let mut cfg = Config::new(0, world);
            cfg.timeout = timeout;
            cfg.check_roots = check_roots;
            cfg.fault = plan;
            Communicator::in_process_with(cfg).expect("in-process communicators")
        }
        Net::Tcp | Net::Shm => {
            let kind = if matches!(net, Net::Tcp) { TransportKind::Tcp } else { TransportKind::Shm };
            let store: Arc<dyn braid::bootstrap::Store> = Arc::new(MemStore::new());
            let handles: Vec<_> = (0..world)
                .map(|rank| {
                    let (store, plan) = (store.clone(), plan.clone());
                    std::thread::spawn(move || {
                        let mut b = Communicator::builder(rank, world)
                            .store(store)
                            .socket_ifname("lo")
                            .transports(vec![kind])
                            .timeout(timeout)
                            .check_roots(check_roots);
                        if let Some(plan) = plan {
                            b = b.fault_plan(plan).tuner_probe(false);
                        }
                        b.build().expect("tcp communicator")
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("builder thread")).collect()
        }
    }
}

/// Run `f(comm)` on every rank in its own thread; returns each rank's result in rank order.
pub fn on_ranks<R: Send + 'static>(
    comms: Vec<Communicator>,
    f: impl Fn(&Communicator) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let f = f.clone();
            std::thread::Builder::new()
                .name(format!("rank-{}", c.rank()))
                .spawn(move || f(&c))
                .expect("spawn rank thread")
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
}

/// Every collective and send/recv, as the grids of tests drive them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    AllReduce,
    Broadcast,
    AllGather,
    ReduceScatter,
    Reduce,
    Barrier,
    AllToAll,
    SendRecv,
}

/// Every [`Call`].
pub const CALLS_ALL: [Call; 8] = [
    Call::AllReduce,
    Call::Broadcast,
    Call::AllGather,
    Call::ReduceScatter,
    Call::Reduce,
    Call::Barrier,
    Call::AllToAll,
    Call::SendRecv,
];

impl Call {
    /// The call's name, as `braid perf --op` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Call::AllReduce => "all-reduce",
            Call::Broadcast => "broadcast",
            Call::AllGather => "all-gather",
            Call::ReduceScatter => "reduce-scatter",
            Call::Reduce => "reduce",
            Call::Barrier => "barrier",
            Call::AllToAll => "all-to-all",
            Call::SendRecv => "send-recv",
        }
    }
}
