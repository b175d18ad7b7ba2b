//! etcd's corruption checks over members' KV hashes (`Replica::member_hash`, `peer_hashes`):
//!
//! - the initial check (`--experimental-initial-corrupt-check`): before a member serves clients
//!   it compares its hash with every reachable peer's at its own revision, and refuses to start
//!   when one that kept the same compaction point hashes differently;
//! - the periodic check (`--experimental-corrupt-check-time`): every interval the leader hashes
//!   its store, asks every peer for its hash at that revision, hashes again after a
//!   linearizable read, and raises CORRUPT through the log for the first member found
//!   inconsistent, by etcd 3.4's rules ([`suspect`]).
//!
//! Peers that cannot answer (down, behind, compacted further) are skipped, as etcd skips them.

use std::sync::Arc;
use std::time::Duration;

use leasehold_raft::{Alarm, AlarmChange, AlarmMember, MemberHash, Replica, ReplicaError};
use tokio::sync::watch;

/// The member a periodic check finds inconsistent, by etcd 3.4's rules, from the leader's hash
/// before (`own`) and after (`own_after`) asking the peers and what they answered for `own`'s
/// revision. Only the first finding counts (etcd raises one alarm a check):
/// - the leader's own hash changed while its revision and compaction point did not: the leader;
/// - a peer ahead of the leader's revision, or compacted further than the leader: that peer;
/// - a peer with the leader's compaction point but another hash: that peer.
pub fn suspect(own: MemberHash, own_after: MemberHash, peers: &[MemberHash]) -> Option<u64> {
    if own_after.hash != own.hash
        && own_after.revision == own.revision
        && own_after.compact_revision == own.compact_revision
    {
        return Some(own.member);
    }
    peers
        .iter()
        .find(|p| {
            p.revision > own_after.revision
                || p.compact_revision > own_after.compact_revision
                || (p.compact_revision == own.compact_revision && p.hash != own.hash)
        })
        .map(|p| p.member)
}

/// The peers that answered, each failure logged as etcd logs it.
fn answered(peers: Vec<(u64, Result<Option<MemberHash>, ReplicaError>)>) -> Vec<MemberHash> {
    peers
        .into_iter()
        .filter_map(|(id, answer)| match answer {
            Ok(Some(hash)) => Some(hash),
            Ok(None) => {
                tracing::warn!(
                    peer = %format!("{id:x}"),
                    "cannot fetch hash from remote peer: it is behind, or compacted further"
                );
                None
            }
            Err(e) => {
                tracing::warn!(peer = %format!("{id:x}"), "cannot fetch hash from remote peer: {e}");
                None
            }
        })
        .collect()
}

/// etcd's initial check: `Err` with etcd's words when a peer with the same compaction point
/// hashes this member's revision differently.
pub async fn initial_check(replica: &Replica, member_id: u64) -> Result<(), String> {
    tracing::info!("starting initial corruption check");
    let Some(own) = replica.member_hash(0) else {
        return Ok(());
    };
    let mut mismatched = 0;
    for peer in answered(replica.peer_hashes(own.revision).await) {
        if peer.hash == own.hash {
            continue;
        }
        let fields = format!(
            "local hash {} at revision {} (compacted {}), peer {:x} hash {} (compacted {})",
            own.hash,
            own.revision,
            own.compact_revision,
            peer.member,
            peer.hash,
            peer.compact_revision
        );
        if peer.compact_revision == own.compact_revision {
            tracing::warn!("found different hash values from remote peer: {fields}");
            mismatched += 1;
        } else {
            tracing::warn!("found different compact revision values from remote peer: {fields}");
        }
    }
    if mismatched > 0 {
        return Err(format!("{member_id:x} found data inconsistency with peers"));
    }
    tracing::info!("initial corruption checking passed; no corruption");
    Ok(())
}

/// One periodic check on the leader; the member it raised CORRUPT for, if any.
pub async fn check_once(replica: &Replica) -> Result<Option<u64>, ReplicaError> {
    let Some(own) = replica.member_hash(0) else {
        return Ok(None);
    };
    let peers = answered(replica.peer_hashes(own.revision).await);
    // As etcd: hash again once everything committed so far is applied here.
    replica.read(true, |_| ()).await?;
    let Some(own_after) = replica.member_hash(0) else {
        return Ok(None);
    };
    let Some(member) = suspect(own, own_after, &peers) else {
        tracing::info!(
            peers_checked = peers.len(),
            "finished peer corruption check"
        );
        return Ok(None);
    };
    tracing::warn!(
        member = %format!("{member:x}"),
        ?own,
        ?own_after,
        ?peers,
        "found hash mismatch; raising the CORRUPT alarm"
    );
    replica
        .propose(AlarmChange {
            activate: true,
            alarm: AlarmMember {
                member,
                alarm: Alarm::Corrupt,
            },
        })
        .await?;
    Ok(Some(member))
}

/// Runs [`check_once`] every `every` while this member leads, until `stop` turns true.
pub async fn drive_corruption_checks(
    replica: Arc<Replica>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if !replica.is_leader() {
            continue;
        }
        if let Err(e) = check_once(&replica).await {
            tracing::warn!("failed to check hash KV: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(member: u64, revision: i64, compact_revision: i64, hash: u32) -> MemberHash {
        MemberHash {
            member,
            revision,
            compact_revision,
            hash,
        }
    }

    #[test]
    fn suspects_follow_etcds_rules() {
        let own = hash(1, 10, 4, 7);
        // Everyone agrees; a peer behind (it answered for the asked revision) is fine too.
        assert_eq!(
            suspect(own, own, &[hash(2, 10, 4, 7), hash(3, 10, 4, 7)]),
            None
        );
        // Another hash at the same compaction point.
        assert_eq!(
            suspect(own, own, &[hash(2, 10, 4, 7), hash(3, 10, 4, 8)]),
            Some(3)
        );
        // Another hash after another compaction point (the leader compacted since): not judged.
        assert_eq!(suspect(own, own, &[hash(2, 10, 2, 9)]), None);
        // Ahead of the leader, or compacted further.
        assert_eq!(suspect(own, own, &[hash(2, 11, 4, 7)]), Some(2));
        assert_eq!(suspect(own, own, &[hash(2, 10, 5, 7)]), Some(2));
        // The leader's own hash changed under the same revision: the leader.
        let changed = hash(1, 10, 4, 99);
        assert_eq!(suspect(own, changed, &[hash(2, 10, 4, 8)]), Some(1));
        // It moved on (a write): its new hash says nothing; the peers are judged against the
        // first one.
        let moved = hash(1, 11, 4, 99);
        assert_eq!(suspect(own, moved, &[hash(2, 11, 4, 7)]), None);
        // Only the first finding counts.
        assert_eq!(
            suspect(own, own, &[hash(2, 10, 4, 8), hash(3, 10, 4, 9)]),
            Some(2)
        );
    }
}
