//! File store (stub until implemented).
use crate::error::Result;
/// A store in a shared directory.
pub struct TcpStore;
impl TcpStore {
    /// Open or create the store directory.
    pub fn connect_or_host(_addr: &str, _host: bool, _t: std::time::Duration) -> Result<TcpStore> {
        Err(crate::Error::Unsupported("tcp store not yet implemented".into()))
    }
}
impl crate::bootstrap::Store for TcpStore {
    fn set(&self, _: &str, _: &[u8]) -> Result<()> { unimplemented!() }
    fn get(&self, _: &str) -> Result<Option<Vec<u8>>> { unimplemented!() }
    fn wait(&self, _: &[&str], _: std::time::Duration) -> Result<()> { unimplemented!() }
    fn add(&self, _: &str, _: i64) -> Result<i64> { unimplemented!() }
    fn delete(&self, _: &str) -> Result<bool> { unimplemented!() }
}
/// Server side of the TCP store.
pub struct TcpStoreServer;
