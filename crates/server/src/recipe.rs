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

use leasehold_mvcc::{self as mvcc, RangeRequest, SortOrder, SortTarget};
use leasehold_raft::{Applied, Command, LeaseId, ReplicaError};

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

/// Proposes a transaction and waits for its result.
pub async fn txn(
    ctx: &ServerContext,
    req: mvcc::TxnRequest,
) -> Result<mvcc::TxnResponse, ApiError> {
    match ctx.replica.write(Command::Txn(req)).await? {
        Applied::Txn(result) => Ok(result?),
        other => Err(ApiError::unexpected(&other)),
    }
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
/// caller's own key (created at `my_rev`) is gone. Re-checks after every applied revision, with
/// a point lookup of the one key it waits for.
pub async fn wait_for_turn(
    ctx: &ServerContext,
    recipe: Recipe,
    prefix: &[u8],
    my_key: &[u8],
    my_rev: i64,
) -> Result<(), RecipeError> {
    let mut revisions = ctx.replica.subscribe_revisions();
    loop {
        revisions.borrow_and_update();
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
        // Wait for that key (at that create revision) to go; then look for the next older one.
        loop {
            revisions
                .changed()
                .await
                .map_err(|_| ApiError::from(ReplicaError::Stopped))?;
            revisions.borrow_and_update();
            let (blocked, mine) = ctx
                .replica
                .read(false, |store| {
                    (
                        still_queued(store, &blocker.key, blocker.create_revision),
                        still_queued(store, my_key, my_rev),
                    )
                })
                .await?;
            if !mine {
                return Err(RecipeError::SessionExpired(recipe));
            }
            if !blocked {
                break;
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
        .read_at_lease_time(|store, leases, now_ms| {
            if !still_queued(store, key, my_rev) {
                return Err(RecipeError::SessionExpired(recipe));
            }
            let older = store
                .range(&predecessor(prefix, my_rev))
                .map_err(ApiError::from)?;
            if !older.kvs.is_empty() {
                return Err(RecipeError::SessionExpired(recipe));
            }
            match leases.record(lease) {
                Some(record) if record.deadline_ms > now_ms => Ok(store.current_revision()),
                _ => Err(RecipeError::SessionExpired(recipe)),
            }
        })
        .await?
}

/// Runs `release` (a transaction) if dropped while armed: a caller that gives up waiting (its
/// request cancelled) leaves no key queued behind it, as etcd's servers delete it too.
pub struct ReleaseOnDrop {
    ctx: Option<std::sync::Arc<ServerContext>>,
    release: Option<mvcc::TxnRequest>,
}

impl ReleaseOnDrop {
    pub fn arm(ctx: std::sync::Arc<ServerContext>, release: mvcc::TxnRequest) -> ReleaseOnDrop {
        ReleaseOnDrop {
            ctx: Some(ctx),
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
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = txn(&ctx, release).await {
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
}
