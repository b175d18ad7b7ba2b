//! Fenced writes under a lock: the pattern docs/locks.md explains.
//!
//! A lease-based lock can be lost without its holder noticing (a long GC pause, a SIGSTOP, a
//! slow disk): the lease expires, the next waiter gets the lock, and the old holder wakes up
//! believing it still holds it. So every write the lock protects carries the lock's fencing
//! token — the create revision of the lock key — and is made by a transaction that commits only
//! while that key still exists at that revision.
//!
//! Run against a server on 127.0.0.1:2379 (three fenced increments, then the counter):
//!
//! ```text
//! cargo run -p leasehold --example fenced_counter -- 127.0.0.1:2379 3
//! ```

use etcd_client::{Client, Compare, CompareOp, LockOptions, Txn, TxnOp};

pub const LOCK_NAME: &str = "examples/counter-lock";
pub const COUNTER_KEY: &str = "examples/counter";

/// What happened to one increment.
#[derive(Debug, PartialEq, Eq)]
pub enum Increment {
    /// The write committed: the counter now holds this value.
    Written(u64),
    /// The lock was lost before the write: nothing was written.
    Fenced,
}

/// Holds the lock named [`LOCK_NAME`] with `lease` and returns the lock key and its fencing
/// token (the key's create revision).
pub async fn lock(client: &mut Client, lease: i64) -> Result<(Vec<u8>, i64), etcd_client::Error> {
    let locked = client
        .lock(LOCK_NAME, Some(LockOptions::new().with_lease(lease)))
        .await?;
    let key = locked.key().to_vec();
    let token = client
        .get(key.clone(), None)
        .await?
        .kvs()
        .first()
        .map(|kv| kv.create_revision())
        // The key is gone already: the lock was lost at once. No write can pass with token 0.
        .unwrap_or(0);
    Ok((key, token))
}

/// Reads the counter (missing counts as 0).
pub async fn read_counter(client: &mut Client) -> Result<u64, etcd_client::Error> {
    let resp = client.get(COUNTER_KEY, None).await?;
    Ok(resp
        .kvs()
        .first()
        .and_then(|kv| kv.value_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

/// Writes `value` only if the lock key still exists with create revision `token`.
pub async fn fenced_write(
    client: &mut Client,
    lock_key: &[u8],
    token: i64,
    value: u64,
) -> Result<Increment, etcd_client::Error> {
    let txn = Txn::new()
        .when([Compare::create_revision(
            lock_key.to_vec(),
            CompareOp::Equal,
            token,
        )])
        .and_then([TxnOp::put(COUNTER_KEY, value.to_string(), None)]);
    let resp = client.txn(txn).await?;
    Ok(if resp.succeeded() {
        Increment::Written(value)
    } else {
        Increment::Fenced
    })
}

/// One increment under the lock: lock, read, fenced write, unlock.
pub async fn increment(client: &mut Client, lease: i64) -> Result<Increment, etcd_client::Error> {
    let (key, token) = lock(client, lease).await?;
    let value = read_counter(client).await?;
    let outcome = fenced_write(client, &key, token, value + 1).await?;
    client.unlock(key).await?;
    Ok(outcome)
}

#[allow(dead_code)] // The tests include this file for the functions above, not for `main`.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().unwrap_or_else(|| "127.0.0.1:2379".to_owned());
    let count: u32 = args.next().map_or(Ok(3), |c| c.parse())?;
    let mut client = Client::connect([endpoint], None).await?;
    let lease = client.lease_grant(10, None).await?.id();
    for _ in 0..count {
        println!("{:?}", increment(&mut client, lease).await?);
    }
    client.lease_revoke(lease).await?;
    println!("counter = {}", read_counter(&mut client).await?);
    Ok(())
}
