//! Bootstrap: how ranks find each other. A key-value [`Store`] (TCP, file, prefix)
//! carries each link's endpoint as opaque bytes; [`crate::config::Config`] reads who
//! we are from the environment.

mod file_store;
mod mem_store;
mod prefix_store;
mod store;
mod tcp_store;
pub(crate) mod tf_config;

pub use file_store::FileStore;
pub use mem_store::MemStore;
pub use prefix_store::PrefixStore;
pub use store::{connect_store, Store};
pub use tcp_store::{StoreLimits, TcpStore, TcpStoreServer};
