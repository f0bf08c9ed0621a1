//! Bootstrap: how ranks find each other. A key-value [`Store`] (TCP, file, prefix)
//! carries each link's endpoint as opaque bytes; [`crate::config::Config`] reads who
//! we are from the environment.

pub mod file_store;
pub mod mem_store;
pub mod prefix_store;
pub mod store;
pub mod tcp_store;

pub use file_store::FileStore;
pub use mem_store::MemStore;
pub use prefix_store::PrefixStore;
pub use store::{connect_store, Store};
pub use tcp_store::{TcpStore, TcpStoreServer};
