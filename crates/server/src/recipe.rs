//! What the lock and election services share: a queue of keys under `<name>/`, one per lease,
//! ordered by create revision. The key created first owns the name; every other key waits for
//! the key created just before it to go away (so a release wakes one waiter, not all of them).
//!
//! etcd runs these recipes through an in-process client; leasehold runs them on the replica
//! directly, and adds one check etcd does not make (its Jepsen finding, etcd#11456): before a
//! caller is told it owns the name, the server checks — in one read of the applied state — that
//! the caller's key is still there at the revision it was created with, that no older key is
//! queued, and that the caller's lease has not run out on the leader's lease clock. The key's
//! create revision is then a fencing token: a write guarded by
//! `Compare(CreateRevision(key) == token)` fails once the lock has passed on.

use leasehold_auth::Caller;
use leasehold_mvcc::{self as mvcc, RangeRequest, SortOrder, SortTarget};
use leasehold_raft::LeaseId;

use crate::context::ServerContext;
use crate::error::{ApiError, Recipe, RecipeError};
use crate::lease;

/// The TTL of the lease the server grants when a caller names none (etcd's session default; the
/// server never renews it).
pub const SESSION_TTL_SECS: i64 = 60;

/// The key a lease owns under `prefix`: the lease id in lowercase hex without padding, with a
/// minus sign for negative ids (Go's `%x` of an int64).
pub fn lease_key(prefix: &[u8], lease: LeaseId) -> Vec<u8> {
    let id = lease.get();
    let hex = if id < 0 {
        format!("-{:x}", id.unsigned_abs())
    } else {
        format!("{id:x}")
    };
    let mut key = prefix.to_vec();
    key.extend_from_slice(hex.as_bytes());
    key
}

/// `name` + `/`: the prefix all keys queued for `name` share.
pub fn queue_prefix(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The caller's lease, or a fresh unrenewed one of [`SESSION_TTL_SECS`] when it named none
/// (lease 0), as etcd's servers do.
pub async fn session_lease(ctx: &ServerContext, lease: i64) -> Result<LeaseId, ApiError> {
    if let Some(id) = LeaseId::from_wire(lease) {
        return Ok(id);
    }
    let id = ctx.lease_ids.next_id();
    let ttl_secs = SESSION_TTL_SECS.max(ctx.lease_ttl_secs_min);
    lease::grant(ctx, id, ttl_secs).await?;
    Ok(id)
}

/// Proposes a transaction on behalf of the lock or election caller and waits for its result.
pub async fn txn(
    ctx: &ServerContext,
    caller: Option<&Caller>,
    req: mvcc::TxnRequest,
) -> Result<mvcc::TxnResponse, ApiError> {
    Ok(ctx.replica.propose_as(caller.cloned(), req).await??)
}

/// A transaction deleting `key` — only while its create revision is `guard`, if given (a
/// resignation must not delete a successor's key).
pub fn delete_txn(key: &[u8], guard: Option<i64>) -> mvcc::TxnRequest {
    mvcc::TxnRequest {
        compare: guard
            .map(|rev| create_revision_is(key, rev))
            .into_iter()
            .collect(),
        success: vec![mvcc::RequestOp::DeleteRange(mvcc::DeleteRangeRequest {
            key: key.to_vec(),
            ..mvcc::DeleteRangeRequest::default()
        })],
        failure: Vec::new(),
    }
}

pub fn create_revision_is(key: &[u8], revision: i64) -> mvcc::Compare {
    mvcc::Compare {
        result: mvcc::CompareResult::Equal,
        target: mvcc::CompareTarget::Create(revision),
        key: key.to_vec(),
        range_end: Vec::new(),
    }
}

pub fn get(key: &[u8]) -> mvcc::RequestOp {
    mvcc::RequestOp::Range(RangeRequest {
        key: key.to_vec(),
        ..RangeRequest::default()
    })
}

/// The first-created key under `prefix` (etcd's `WithFirstCreate`).
pub fn first_created(prefix: &[u8]) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: mvcc::prefix_range_end(prefix),
        limit: 1,
        sort_order: SortOrder::Ascend,
        sort_target: SortTarget::Create,
        ..RangeRequest::default()
    }
}

/// The newest key under `prefix` created before `revision`: the one a caller queued at
/// `revision` waits for.
fn predecessor(prefix: &[u8], revision: i64) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: mvcc::prefix_range_end(prefix),
        limit: 1,
        sort_order: SortOrder::Descend,
        sort_target: SortTarget::Create,
        max_create_revision: revision - 1,
        ..RangeRequest::default()
    }
}

/// The live version of `key`, if any.
pub fn lookup(store: &mvcc::Store, key: &[u8]) -> Option<mvcc::KeyValue> {
    store
        .range(&RangeRequest {
            key: key.to_vec(),
            ..RangeRequest::default()
        })
        .ok()
        .and_then(|r| r.kvs.into_iter().next())
}

fn still_queued(store: &mvcc::Store, key: &[u8], create_revision: i64) -> bool {
    lookup(store, key).is_some_and(|kv| kv.create_revision == create_revision)
}

/// Waits until no key under `prefix` created before `my_rev` is left, failing as soon as the
/// caller's own key (created at `my_rev`) is gone. Waits for exactly two things, the key just
/// before its own (at its create revision) and its own key, to be deleted: writes to any other
/// key wake nobody, and a release wakes only the waiter queued behind it (etcd's `waitDelete`).
pub async fn wait_for_turn(
    ctx: &ServerContext,
    recipe: Recipe,
    prefix: &[u8],
    my_key: &[u8],
    my_rev: i64,
) -> Result<(), RecipeError> {
    let (reads, _) = tokio::sync::watch::channel(0);
    wait_for_turn_counting(ctx, recipe, prefix, my_key, my_rev, &reads).await
}

/// [`wait_for_turn`], counting its reads of the store in `reads` (the seam a test watches: a
/// waiter reads once, and then once each time the key it waits for goes).
async fn wait_for_turn_counting(
    ctx: &ServerContext,
    recipe: Recipe,
    prefix: &[u8],
    my_key: &[u8],
    my_rev: i64,
    reads: &tokio::sync::watch::Sender<usize>,
) -> Result<(), RecipeError> {
    loop {
        reads.send_modify(|n| *n += 1);
        let blocker = ctx
            .replica
            .read(false, |store| {
                if !still_queued(store, my_key, my_rev) {
                    return Err(RecipeError::SessionExpired(recipe));
                }
                let found = store
                    .range(&predecessor(prefix, my_rev))
                    .map_err(ApiError::from)?;
                Ok(found.kvs.into_iter().next())
            })
            .await??;
        let Some(blocker) = blocker else {
            return Ok(());
        };
        // Wait for that key (at that create revision) to go, then look for the next older one.
        // `key_gone` looks at the store after it registers, so a delete applied since the read
        // above is seen, not missed.
        tokio::select! {
            gone = ctx.replica.key_gone(&blocker.key, blocker.create_revision) => gone?,
            gone = ctx.replica.key_gone(my_key, my_rev) => {
                gone?;
                return Err(RecipeError::SessionExpired(recipe));
            }
        }
    }
}

/// The fencing check, in one linearizable read of the applied state: `key` is still the one
/// created at `my_rev`, nothing older is queued under `prefix`, and `lease` has time left on the
/// leader's lease clock (not merely "not yet revoked"). Returns the store revision read at.
pub async fn confirm_owner(
    ctx: &ServerContext,
    recipe: Recipe,
    prefix: &[u8],
    key: &[u8],
    my_rev: i64,
    lease: LeaseId,
) -> Result<i64, RecipeError> {
    ctx.replica
        .read_at_lease_time(|store, leases, at| {
            if !still_queued(store, key, my_rev) {
                return Err(RecipeError::SessionExpired(recipe));
            }
            let older = store
                .range(&predecessor(prefix, my_rev))
                .map_err(ApiError::from)?;
            if !older.kvs.is_empty() {
                return Err(RecipeError::SessionExpired(recipe));
            }
            // On the leader, the deadline its holder was told, not the cover beyond it.
            match at.deadline_ms(leases, lease) {
                Some(deadline_ms) if deadline_ms > at.now_ms => Ok(store.current_revision()),
                _ => Err(RecipeError::SessionExpired(recipe)),
            }
        })
        .await?
}

/// Runs `release` (a transaction) if dropped while armed: a caller that gives up waiting (its
/// request cancelled) leaves no key queued behind it, as etcd's servers delete it too. Not while
/// the member stops (see `Drop`).
pub struct ReleaseOnDrop {
    ctx: Option<std::sync::Arc<ServerContext>>,
    caller: Option<Caller>,
    release: Option<mvcc::TxnRequest>,
}

impl ReleaseOnDrop {
    pub fn arm(
        ctx: std::sync::Arc<ServerContext>,
        caller: Option<Caller>,
        release: mvcc::TxnRequest,
    ) -> ReleaseOnDrop {
        ReleaseOnDrop {
            ctx: Some(ctx),
            caller,
            release: Some(release),
        }
    }

    pub fn disarm(mut self) {
        self.release = None;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let (Some(ctx), Some(release)) = (self.ctx.take(), self.release.take()) else {
            return;
        };
        let caller = self.caller.take();
        if ctx.replica.is_stopping() {
            // The caller was told this member stopped and may retry elsewhere with the same
            // lease, so the same key at the same create revision: a late delete from here could
            // take the lock it gets there. The key belongs to the caller's lease; it stays.
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = txn(&ctx, caller.as_ref(), release).await {
                    tracing::warn!("releasing an abandoned queue key: {e:?}");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_go_hex_of_the_lease_id() {
        let id = |n| LeaseId::from_wire(n).unwrap();
        assert_eq!(lease_key(b"mylock/", id(1001)), b"mylock/3e9".to_vec());
        assert_eq!(lease_key(b"el/", id(3001)), b"el/bb9".to_vec());
        assert_eq!(lease_key(b"n/", id(-7)), b"n/-7".to_vec());
        assert_eq!(
            lease_key(b"n/", id(i64::MIN)),
            b"n/-8000000000000000".to_vec()
        );
        assert_eq!(queue_prefix(b"mylock"), b"mylock/".to_vec());
    }

    /// A single-member replica on a temporary data dir, and a context around it.
    async fn single_member(dir: &std::path::Path) -> std::sync::Arc<ServerContext> {
        let config = crate::test_support::one_member_config(dir, leasehold_raft::system_clock());
        let replica = leasehold_raft::Replica::start(config).await.unwrap();
        std::sync::Arc::new(ServerContext {
            metrics: std::sync::Arc::new(crate::Metrics::new(replica.clone(), false)),
            replica,
            cluster_id: 1,
            member_id: 1,
            name: "test".into(),
            client_urls: Vec::new(),
            peer_urls: Vec::new(),
            lease_ttl_secs_min: 1,
            lease_ids: crate::lease_ids::LeaseIdGenerator::new(1, 0),
            watch_progress_interval: std::time::Duration::from_secs(600),
            cluster_token: String::new(),
            member_names: Default::default(),
            limits: crate::Limits::default(),
            keepalive: crate::GrpcKeepalive::default(),
            json_gateway: true,
            bcrypt_cost: 4,
            tokens: crate::jwt::TokenMode::Simple,
        })
    }

    async fn put(ctx: &ServerContext, key: &str) -> i64 {
        let put = ctx
            .replica
            .propose(mvcc::PutRequest {
                key: key.into(),
                ..mvcc::PutRequest::default()
            })
            .await
            .unwrap()
            .unwrap();
        put.revision
    }

    async fn delete(ctx: &ServerContext, key: &str) {
        txn(ctx, None, delete_txn(key.as_bytes(), None))
            .await
            .unwrap();
    }

    /// Waits (bounded) until a waiter has read the store `n` times.
    async fn reads_reach(reads: &mut tokio::sync::watch::Receiver<usize>, n: usize) {
        let reached = reads.wait_for(|r| *r >= n);
        let within = std::time::Duration::from_secs(10);
        tokio::time::timeout(within, reached)
            .await
            .unwrap()
            .unwrap();
    }

    /// Item 8 of issue 11: waiters used to wake (and read the store) on every revision of the
    /// whole store. Now a waiter reads once when it queues and once each time the key it waits
    /// for goes; writes to other keys (including newer keys of the same queue, and deletes of
    /// other keys) wake nobody, and a release wakes exactly the next waiter.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_wakes_only_the_next_waiter() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = single_member(dir.path()).await;
        put(&ctx, "lk/a").await;
        let mut waiters = Vec::new();
        for key in ["lk/b", "lk/c", "lk/d"] {
            let rev = put(&ctx, key).await;
            let (count, mut reads) = tokio::sync::watch::channel(0);
            let task = tokio::spawn({
                let ctx = ctx.clone();
                async move {
                    let prefix = b"lk/";
                    let me = key.as_bytes();
                    wait_for_turn_counting(&ctx, Recipe::Lock, prefix, me, rev, &count).await
                }
            });
            reads_reach(&mut reads, 1).await;
            waiters.push((task, reads));
        }
        let reads = |waiters: &[(_, tokio::sync::watch::Receiver<usize>)]| {
            waiters
                .iter()
                .map(|(_, r)| *r.borrow())
                .collect::<Vec<usize>>()
        };
        for i in 0..30 {
            put(&ctx, &format!("other/{i}")).await;
            delete(&ctx, &format!("other/{i}")).await;
        }
        // A newer key in the same queue waits behind the others; it blocks nobody.
        put(&ctx, "lk/z").await;
        delete(&ctx, "lk/z").await;
        assert_eq!(reads(&waiters), [1, 1, 1], "woken by writes to other keys");

        // The holder releases: the next waiter (b) wakes, reads once and has its turn.
        delete(&ctx, "lk/a").await;
        let (b, b_reads) = waiters.remove(0);
        b.await.unwrap().unwrap();
        assert_eq!(
            *b_reads.borrow(),
            2,
            "b: one read to queue, one when a went"
        );
        // d's own key goes (its session ended): d wakes, without waking c.
        delete(&ctx, "lk/d").await;
        let (d, d_reads) = waiters.pop().unwrap();
        let expired = d.await.unwrap();
        assert_eq!(
            *d_reads.borrow(),
            1,
            "d: its own key's delete needs no read"
        );
        assert!(
            matches!(expired, Err(RecipeError::SessionExpired(Recipe::Lock))),
            "{expired:?}"
        );
        assert_eq!(
            reads(&waiters),
            [1],
            "c woke for a release or an exit not its own"
        );
        // b releases: c's turn, after one more read.
        delete(&ctx, "lk/b").await;
        let (c, mut c_reads) = waiters.pop().unwrap();
        c.await.unwrap().unwrap();
        assert_eq!(*c_reads.borrow_and_update(), 2);
        ctx.replica.shutdown().await;
    }
}
