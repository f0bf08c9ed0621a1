//! A client of a store server this process hosts: what a launcher's rank 0 returns
//! when it hosts the job's store ([`super::mpi`], [`super::pmix`], [`super::slurm`]).

use std::time::Duration;

use crate::bootstrap::store::Store;
use crate::bootstrap::tcp_store::{TcpStore, TcpStoreServer};
use crate::error::Result;

/// A client of a store server this process hosts; the server stops when it drops.
pub struct HostedStore {
    // Declared first: the client's connections close before the server stops.
    client: TcpStore,
    _server: TcpStoreServer,
}

impl HostedStore {
    /// Keep `server` alive as long as `client`.
    pub fn new(client: TcpStore, server: TcpStoreServer) -> HostedStore {
        HostedStore { client, _server: server }
    }
}

impl Store for HostedStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.client.set(key, value)
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.client.get(key)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.client.wait(keys, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.client.add(key, delta)
    }
    fn delete(&self, key: &str) -> Result<bool> {
        self.client.delete(key)
    }
    fn set_if_absent(&self, key: &str, value: &[u8]) -> Result<Vec<u8>> {
        self.client.set_if_absent(key, value)
    }
}
