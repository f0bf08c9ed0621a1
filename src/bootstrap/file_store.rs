//! File store (stub until implemented).
use crate::error::Result;
/// A store in a shared directory.
pub struct FileStore;
impl FileStore {
    /// Open or create the store directory.
    pub fn open(_path: &str) -> Result<FileStore> {
        Err(crate::Error::Unsupported("file store not yet implemented".into()))
    }
}
impl crate::bootstrap::Store for FileStore {
    fn set(&self, _: &str, _: &[u8]) -> Result<()> { unimplemented!() }
    fn get(&self, _: &str) -> Result<Option<Vec<u8>>> { unimplemented!() }
    fn wait(&self, _: &[&str], _: std::time::Duration) -> Result<()> { unimplemented!() }
    fn add(&self, _: &str, _: i64) -> Result<i64> { unimplemented!() }
    fn delete(&self, _: &str) -> Result<bool> { unimplemented!() }
}
