//! Asynchronous training with parameter servers (TensorFlow's
//! `ParameterServerStrategy`): ranks `0..servers` own contiguous shards of the
//! flattened variables, the other ranks are workers. A worker's step pulls fresh
//! values from every server, computes on its share of the global batch and pushes
//! its mean gradient; each server applies a push the moment it arrives, without
//! waiting for the other workers. An optional staleness bound holds back a worker
//! that runs more than that many steps ahead of the slowest live one.
//!
//! Every server talks to every worker over a two-rank communicator of their own
//! (made by splits at start-up, the only collective calls), served by a thread of
//! its own: a worker that dies ends only its threads' links (the server logs it
//! and drops the worker from the staleness bound), and the others train on. A
//! link's deadline (`BRAID_TIMEOUT`) also ends a worker that stays silent longer.
//!
//! Messages on a link, worker to server: `[PULL, step]` answered with the shard;
//! `[PUSH, step]` then the shard's gradient; `[DONE, step]`.

use std::ops::Range;
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard};

use super::base::{split_batch, ApplyFn, Reduction, Replica, StepFn, Strategy};
use super::tensors::{flatten, same_shapes, unflatten, Tensors};
use crate::comm::Communicator;
use crate::error::{Error, Result};

const PULL: i64 = 0;
const PUSH: i64 = 1;
const DONE: i64 = 2;

/// What a server's links share: its shard and every worker's progress.
struct Shard {
    values: Vec<f32>,
    /// Steps each worker has pushed.
    steps: Vec<u64>,
    /// Workers still training (not done, not lost).
    live: Vec<bool>,
    lost: Vec<usize>,
}

/// How a server's service ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeReport {
    /// Workers that finished (sent done).
    pub finished: Vec<usize>,
    /// Workers whose link failed (died, or silent past the deadline).
    pub lost: Vec<usize>,
}

/// One rank of a parameter-server job: a server or a worker.
pub struct ParameterServer {
    rank: usize,
    servers: usize,
    workers: usize,
    /// Links to the other role: a server's to every worker, a worker's to every server.
    links: Vec<Communicator>,
    /// Where shard `j` lies in the flattened variables.
    shards: Vec<Range<usize>>,
    /// A worker's latest pull (a server's: the initial values of the model).
    vars: Tensors,
    pub(super) steps: u64,
    staleness: Option<u64>,
    /// The job communicator, kept for its store and links' lifetime.
    _world: Communicator,
}

impl ParameterServer {
    /// Set up over the job communicator `world` (collective: every rank calls it):
    /// ranks `0..servers` serve, the rest work; the variables start as rank 0's
    /// `vars`. `staleness`: how many steps a worker may run ahead of the slowest.
    pub fn new(world: Communicator, servers: usize, vars: Tensors, staleness: Option<u64>) -> Result<ParameterServer> {
        let (n, rank) = (world.world_size(), world.rank());
        if servers == 0 || servers >= n {
            return Err(Error::InvalidArgument(format!(
                "parameter server: {servers} servers in a job of {n} ranks (need at least one of each)"
            )));
        }
        let mut flat = flatten(&vars);
        world.broadcast(&mut flat, 0)?;
        let vars = unflatten(&flat, &vars);
        let shards = split_batch(flat.len(), servers);
        let workers = n - servers;
        let mut links = Vec::new();
        for j in 0..servers {
            for w in 0..workers {
                let member = rank == j || rank == servers + w;
                // Key = rank: the server is rank 0 of every link, the worker rank 1.
                if let Some(link) = world.split(member.then_some(0), rank as u32)? {
                    links.push(link);
                }
            }
        }
        Ok(ParameterServer { rank, servers, workers, links, shards, vars, steps: 0, staleness, _world: world })
    }

    /// [`ParameterServer::new`] over [`Communicator::from_env`].
    pub fn from_env(servers: usize, vars: Tensors, staleness: Option<u64>) -> Result<ParameterServer> {
        ParameterServer::new(Communicator::from_env()?, servers, vars, staleness)
    }

    /// Whether this rank serves (else it works).
    pub fn is_server(&self) -> bool {
        self.rank < self.servers
    }

    fn worker_id(&self) -> usize {
        self.rank.saturating_sub(self.servers)
    }

    fn not_a(&self, role: &str, what: &str) -> Error {
        Error::InvalidArgument(format!("parameter server: rank {} is not a {role}: {what}", self.rank))
    }

    /// Serve this rank's shard until every worker is done or lost, applying each
    /// push with `apply` (on the shard alone, as one tensor). Servers only.
    pub fn serve(&mut self, apply: &ApplyFn<'_>) -> Result<ServeReport> {
        if !self.is_server() {
            return Err(self.not_a("server", "serve"));
        }
        let range = self.shards[self.rank].clone();
        let shard = Mutex::new(Shard {
            values: flatten(&self.vars)[range].to_vec(),
            steps: vec![0; self.workers],
            live: vec![true; self.workers],
            lost: Vec::new(),
        });
        let moved = Condvar::new();
        let (shard, moved, staleness, rank) = (&shard, &moved, self.staleness, self.rank);
        std::thread::scope(|s| {
            for (w, link) in self.links.iter().enumerate() {
                s.spawn(move || {
                    let r = serve_worker(link, w, shard, moved, staleness, apply);
                    let mut st = lock(shard);
                    st.live[w] = false;
                    if let Err(e) = r {
                        tracing::warn!("parameter server {rank}: worker {w} lost: {e}");
                        st.lost.push(w);
                    }
                    moved.notify_all();
                });
            }
        });
        let st = lock(shard);
        let lost = st.lost.clone();
        let finished = (0..self.workers).filter(|w| !lost.contains(w)).collect();
        let values = st.values.clone();
        drop(st);
        let mut flat = flatten(&self.vars);
        flat[self.shards[self.rank].clone()].copy_from_slice(&values);
        self.vars = unflatten(&flat, &self.vars);
        Ok(ServeReport { finished, lost })
    }

    /// Fetch every shard's current values into this worker's copy.
    fn pull(&mut self) -> Result<()> {
        let mut flat = flatten(&self.vars);
        for (j, link) in self.links.iter().enumerate() {
            link.send(&[PULL, self.steps as i64], 0)?;
            link.recv(&mut flat[self.shards[j].clone()], 0)?;
        }
        self.vars = unflatten(&flat, &self.vars);
        Ok(())
    }

    /// Tell every server this worker is done (also on drop).
    pub fn finish(&mut self) -> Result<()> {
        if self.is_server() {
            return Ok(());
        }
        let links = std::mem::take(&mut self.links);
        let mut first = Ok(());
        for link in &links {
            if let Err(e) = link.send(&[DONE, self.steps as i64], 0) {
                first = first.and(Err(e));
            }
        }
        first
    }
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One server thread: answer worker `w` until it is done; an error ends it.
fn serve_worker(
    link: &Communicator,
    w: usize,
    shard: &Mutex<Shard>,
    moved: &Condvar,
    staleness: Option<u64>,
    apply: &ApplyFn<'_>,
) -> Result<()> {
    let len = lock(shard).values.len();
    let mut grad = vec![0.0f32; len];
    let deadline = link.timeout();
    loop {
        let mut msg = [0i64; 2];
        link.recv(&mut msg, 1)?;
        let step = u64::try_from(msg[1]).map_err(|_| Error::InvalidArgument(format!("worker {w}: step {}", msg[1])))?;
        match msg[0] {
            PULL => {
                let mut st = lock(shard);
                // Hold a worker that is too far ahead of the slowest live one, for
                // at most half the link's deadline: the waiting worker's own receive
                // must not time out first, and a slowest worker silent that long is
                // likely gone (its thread drops it at the deadline). After that the
                // bound gives way instead of holding the fast ones.
                let since = std::time::Instant::now();
                while let Some(bound) = staleness {
                    let slowest =
                        (0..st.steps.len()).filter(|&o| st.live[o]).map(|o| st.steps[o]).min().unwrap_or(step);
                    let left = (deadline / 2).saturating_sub(since.elapsed());
                    if step <= slowest.saturating_add(bound) || left.is_zero() {
                        break;
                    }
                    st = moved.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
                }
                let values = st.values.clone();
                drop(st);
                link.send(&values, 1)?;
            }
            PUSH => {
                link.recv(&mut grad, 1)?;
                let mut st = lock(shard);
                let mut one = vec![std::mem::take(&mut st.values)];
                apply(&mut one, &vec![std::mem::take(&mut grad)]);
                st.values = one.pop().unwrap_or_default();
                grad = vec![0.0; len];
                st.steps[w] = st.steps[w].max(step + 1);
                moved.notify_all();
            }
            DONE => return Ok(()),
            other => return Err(Error::InvalidArgument(format!("worker {w} sent message kind {other}"))),
        }
    }
}

impl Strategy for ParameterServer {
    fn name(&self) -> &'static str {
        "parameter-server"
    }
    /// The workers (each steps on its own; none waits for the others).
    fn num_replicas_in_sync(&self) -> usize {
        self.workers
    }
    fn local_replicas(&self) -> Range<usize> {
        if self.is_server() {
            0..0
        } else {
            self.worker_id()..self.worker_id() + 1
        }
    }
    /// Pull, compute on this worker's share, push the share's mean gradient (the
    /// servers apply it); returns the share's mean loss. `apply` runs on the servers.
    fn step(&mut self, global_batch: usize, step: &StepFn<'_>, _apply: &ApplyFn<'_>) -> Result<f64> {
        if self.is_server() {
            return Err(self.not_a("worker", "step"));
        }
        let w = self.worker_id();
        let share = split_batch(global_batch, self.workers)[w].clone();
        self.pull()?;
        let count = share.len();
        let g = step(&Replica { id: w, replicas: self.workers, batch: share, vars: &self.vars });
        if !same_shapes(&g.grads, &self.vars) {
            return Err(Error::InvalidArgument(format!(
                "worker {w}: the step's gradients do not have the variables' shapes"
            )));
        }
        if count > 0 {
            let k = 1.0 / count as f32;
            let flat: Vec<f32> = flatten(&g.grads).into_iter().map(|x| x * k).collect();
            for (j, link) in self.links.iter().enumerate() {
                link.send(&[PUSH, self.steps as i64], 0)?;
                link.send(&flat[self.shards[j].clone()], 0)?;
            }
        }
        self.steps += 1;
        Ok(g.loss / count.max(1) as f64)
    }
    /// Workers do not meet: there is nothing to reduce across them.
    fn reduce(&mut self, _op: Reduction, _local: &[f64]) -> Result<f64> {
        Err(Error::Unsupported("parameter-server workers do not meet: reduce values on one worker or a server".into()))
    }
    fn variables(&self) -> &Tensors {
        &self.vars
    }
    /// A worker pulls the servers' current values.
    fn sync(&mut self) -> Result<()> {
        if self.is_server() {
            Ok(())
        } else {
            self.pull()
        }
    }
    fn set_variables(&mut self, vars: Tensors) -> Result<()> {
        if !same_shapes(&vars, &self.vars) {
            return Err(Error::InvalidArgument("parameter server: new variables do not have the old shapes".into()));
        }
        if !self.is_server() {
            return Err(self.not_a("server", "variables are set on the servers (restore before serving)"));
        }
        self.vars = vars;
        Ok(())
    }
    /// Worker 0 pulls and writes the whole model (every server's shard); other
    /// ranks write nothing.
    fn save(&mut self, path: &Path, epoch: u64) -> Result<()> {
        if self.rank != self.servers {
            return Ok(());
        }
        self.pull()?;
        super::write_checkpoint(path, &super::Checkpoint { epoch, vars: self.vars.clone() })
    }
    /// A server takes its shard from the file (before serving); a worker only
    /// learns the epoch and the values, which it pulls anyway.
    fn restore(&mut self, path: &Path) -> Result<u64> {
        let c = super::read_checkpoint(path, Some(&self.vars))?;
        self.vars = c.vars;
        Ok(c.epoch)
    }
}

impl Drop for ParameterServer {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}
