//! Bootstrap: how ranks find each other. A key-value [`Store`] (TCP, file, prefix)
//! carries each link's endpoint as opaque bytes; [`crate::config::Config`] reads who
//! we are from the environment.

mod file_store;
mod mem_store;
mod prefix_store;
#[cfg(feature = "redis")]
mod redis_store;
mod store;
mod tcp_store;
pub(crate) mod tf_config;

pub use file_store::FileStore;
pub use mem_store::MemStore;
pub use prefix_store::PrefixStore;
#[cfg(feature = "redis")]
pub use redis_store::RedisStore;
pub use store::{connect_store, redact_store_url, Store};
pub use tcp_store::{StoreLimits, TcpStore, TcpStoreServer};
