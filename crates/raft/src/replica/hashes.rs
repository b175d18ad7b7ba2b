//! Members' KV hashes, for corruption checks: this member's own at a revision, and every other
//! member's at the same revision, asked over the peer transport (etcd asks its peers'
//! `/members/hashkv`). What a mismatch means is the caller's (`leasehold-server`).

use std::time::Duration;

use super::Replica;
use super::error::ReplicaError;
use super::forward::MemberHash;
use crate::state_machine;

/// How long a member is given to answer with its hash.
const PEER_HASH_TIMEOUT: Duration = Duration::from_secs(5);

impl Replica {
    /// This member's KV hash at `revision` (0: the current one), from its applied state.
    /// `None`: that revision is compacted, or not applied here yet.
    pub fn member_hash(&self, revision: i64) -> Option<MemberHash> {
        state_machine::read(&self.shared, |store| {
            store.hash_kv(revision).ok().map(|h| MemberHash {
                member: self.member_id,
                revision: store.current_revision(),
                compact_revision: h.compact_revision,
                hash: h.hash,
            })
        })
    }

    /// The hashes this member's latest compactions took (at most ten, newest first): what the
    /// compaction hash check compares with the peers' answers at each compaction revision.
    pub fn compaction_hashes(&self) -> Vec<MemberHash> {
        state_machine::read(&self.shared, |store| {
            let mut hashes: Vec<MemberHash> = store
                .compaction_hashes()
                .into_iter()
                .map(|h| MemberHash {
                    member: self.member_id,
                    revision: h.hash_revision,
                    compact_revision: h.compact_revision,
                    hash: h.hash,
                })
                .collect();
            hashes.reverse();
            hashes
        })
    }

    /// Every other member's hash at `revision`, asked at once, each within a bound: what it
    /// answered (`Ok(None)`: it cannot hash that revision), or why it did not.
    pub async fn peer_hashes(
        &self,
        revision: i64,
    ) -> Vec<(u64, Result<Option<MemberHash>, ReplicaError>)> {
        let asks = self
            .members()
            .into_iter()
            .filter(|m| m.id != self.member_id)
            .map(|m| {
                let ask = self.forwarder.hash_kv(m.id, m.peer_url, revision);
                async move {
                    let answer = tokio::time::timeout(PEER_HASH_TIMEOUT, ask)
                        .await
                        .unwrap_or(Err(ReplicaError::NoLeader));
                    (m.id, answer)
                }
            });
        futures::future::join_all(asks).await
    }
}
