//! A peer whose first published address does not answer, or answers as someone
//! else, is reached at its next one.

use super::*;
use crate::bootstrap::MemStore;
use std::net::TcpListener;

/// What a decoyed store puts in front of the real addresses (None: not yet).
type Extra<'a> = Box<dyn Fn(&MemStore) -> Option<String> + Send + Sync + 'a>;

/// The store as one rank sees it: the addresses of `target` come back with
/// `extra(store)` in front (None: not published yet).
struct Decoyed<'a> {
    inner: &'a MemStore,
    key: String,
    extra: Extra<'a>,
}

impl Store for Decoyed<'_> {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(key, value)
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let real = self.inner.get(key)?;
        if key != self.key {
            return Ok(real);
        }
        let (Some(real), Some(extra)) = (real, (self.extra)(self.inner)) else { return Ok(None) };
        Ok(Some(format!("{extra},{}", String::from_utf8_lossy(&real)).into_bytes()))
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.inner.wait(keys, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(key, delta)
    }
    fn delete(&self, key: &str) -> Result<bool> {
        self.inner.delete(key)
    }
}

fn opts(rank: usize, world: usize) -> MeshOptions {
    let mut o = MeshOptions::new(rank, world, "fo");
    o.ifname = Some("lo".into());
    o.timeout = Duration::from_secs(30);
    o.comm_id = 0xfa11;
    o
}

fn published(store: &MemStore, rank: usize) -> Vec<SocketAddr> {
    let raw = store.get(&address_key("fo", rank)).unwrap().unwrap();
    candidates::decode(&String::from_utf8(raw).unwrap()).unwrap()
}

/// Build a mesh of `world` where rank `viewer` sees `store` through `decoyed`.
fn mesh(world: usize, viewer: usize, store: &MemStore, decoyed: &Decoyed) -> Vec<Vec<Option<TcpLink>>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let view: &dyn Store = if r == viewer { decoyed } else { store };
                s.spawn(move || connect_mesh(&opts(r, world), view).unwrap_or_else(|e| panic!("rank {r}: {e}")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

#[test]
fn a_silent_and_a_refused_address_are_passed_over() {
    // Accepted by the kernel (the backlog), then never answered: without a deadline
    // per attempt, the connector would wait for the ack until the mesh's timeout.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let extra = format!("{},{refused}", silent.local_addr().unwrap());
    let store = MemStore::new();
    let decoyed = Decoyed { inner: &store, key: address_key("fo", 0), extra: Box::new(move |_| Some(extra.clone())) };
    let links = mesh(2, 1, &store, &decoyed);
    let real = published(&store, 0);
    let link = links[1][0].as_ref().expect("rank 1 linked to rank 0");
    assert_eq!(link.peer_addr(), real[0], "rank 1 must end up at rank 0's own address");
    // The silent listener really was tried (its backlog holds the abandoned connect).
    silent.set_nonblocking(true).unwrap();
    assert!(silent.accept().is_ok(), "the silent address was never tried");
}

#[test]
fn another_rank_listening_at_a_published_address_is_not_taken_for_the_peer() {
    // Rank 2 finds rank 1's listener first among rank 0's addresses, as a private
    // address present on every host would lead it to a stranger of the same job.
    let store = MemStore::new();
    let decoyed = Decoyed {
        inner: &store,
        key: address_key("fo", 0),
        extra: Box::new(|s: &MemStore| {
            let raw = s.get(&address_key("fo", 1)).unwrap()?;
            Some(String::from_utf8(raw).unwrap())
        }),
    };
    let links = mesh(3, 2, &store, &decoyed);
    let (zero, one) = (published(&store, 0), published(&store, 1));
    assert_eq!(links[2][0].as_ref().expect("rank 2 linked to rank 0").peer_addr(), zero[0]);
    assert_eq!(links[2][1].as_ref().expect("rank 2 linked to rank 1").peer_addr(), one[0]);
    // Every link is the right pair: what rank 0 accepted came from rank 2's socket to it.
    let from_two = links[0][2].as_ref().expect("rank 0 accepted rank 2");
    assert_eq!(from_two.peer_addr(), links[2][0].as_ref().unwrap().local_addr().unwrap());
}

#[test]
fn links_listen_on_the_route_to_the_store_and_publish_it_first() {
    let store = MemStore::new();
    let mut o = opts(0, 2);
    o.ifname = None;
    o.store_route = Some("127.0.0.1".parse().unwrap());
    o.spans_hosts = false;
    let mut p = o.clone();
    p.rank = 1;
    let meshes = std::thread::scope(|s| {
        let (a, b) = (s.spawn(|| connect_mesh(&o, &store)), s.spawn(|| connect_mesh(&p, &store)));
        [a.join().unwrap().unwrap(), b.join().unwrap().unwrap()]
    });
    assert_eq!(published(&store, 0), vec![meshes[1][0].as_ref().unwrap().peer_addr()]);
    assert!(published(&store, 0)[0].ip().is_loopback());
}
