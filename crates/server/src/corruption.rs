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
//! - the compaction hash check (`--experimental-compact-hash-check-enabled` or the
//!   `CompactHashCheck` feature gate, every `--compact-hash-check-time`): the leader asks every
//!   peer for its hash at each of its own latest compaction revisions not yet checked, newest
//!   first, and compares those of the peers that compacted at the same point; a minority that
//!   differs from a majority gets CORRUPT, and with no majority member 0 does (the whole
//!   cluster), by etcd 3.6's rules ([`compaction_suspects`]).
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
    raise_corrupt(replica, member).await?;
    Ok(Some(member))
}

/// Runs [`check_once`] every `every` while this member leads, until `stop` turns true.
pub async fn drive_corruption_checks(
    replica: Arc<Replica>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    while leading_after(&replica, every, &mut stop).await {
        if let Err(e) = check_once(&replica).await {
            tracing::warn!("failed to check hash KV: {e}");
        }
    }
}

/// Waits until this member leads (woken by the leadership change, not a timer), then `every`;
/// `true` if it still leads then, `false` once `stop` turns true. What both periodic checks run
/// on: only the leader checks, and a follower sleeps until it leads.
async fn leading_after(
    replica: &Replica,
    every: Duration,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    loop {
        tokio::select! {
            () = replica.until_leading() => {}
            _ = stop.wait_for(|s| *s) => return false,
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return false,
        }
        if replica.is_leader() {
            return true;
        }
    }
}

/// Raises CORRUPT for `member` through the log (0: the whole cluster).
async fn raise_corrupt(replica: &Replica, member: u64) -> Result<(), ReplicaError> {
    replica
        .propose(AlarmChange {
            activate: true,
            alarm: AlarmMember {
                member,
                alarm: Alarm::Corrupt,
            },
        })
        .await?;
    Ok(())
}

/// What one compaction revision's check found, from the leader's hash at it and the peers'
/// answers there (`None`: no answer).
#[derive(Debug, PartialEq, Eq)]
pub enum CompactionVerdict {
    /// Every peer answered and agrees: this revision and those below it need no check again.
    Consistent,
    /// Those that answered agree, but some peers could not be compared: try an older revision.
    Incomplete,
    /// Hashes differ: the members to raise CORRUPT for (`[0]`: no majority, the whole cluster).
    Corrupt(Vec<u64>),
}

/// etcd's judgement of one compaction revision: peers that compacted elsewhere (or did not
/// answer) are skipped; the members are grouped by hash, the leader among them; a group that is
/// a majority of all members is right and every other member is suspect; without one, member 0.
pub fn compaction_suspects(
    leader: MemberHash,
    peers: &[(u64, Option<MemberHash>)],
) -> CompactionVerdict {
    let mut groups: Vec<(u32, Vec<u64>)> = vec![(leader.hash, vec![leader.member])];
    let mut checked = 0;
    for (id, answer) in peers {
        let Some(peer) = answer.filter(|p| p.compact_revision == leader.compact_revision) else {
            tracing::warn!(
                "peer-id" = %format!("{id:x}"),
                "reason" = if answer.is_none() { "no response" } else { "its compact revision differs from the leader's" },
                "Skipped peer's hash"
            );
            continue;
        };
        checked += 1;
        match groups.iter_mut().find(|(hash, _)| *hash == peer.hash) {
            Some((_, ids)) => ids.push(*id),
            None => groups.push((peer.hash, vec![*id])),
        }
    }
    if groups.len() == 1 {
        return if checked == peers.len() {
            CompactionVerdict::Consistent
        } else {
            CompactionVerdict::Incomplete
        };
    }
    let members = peers.len() + 1;
    let quorum = members / 2 + 1;
    match groups.iter().position(|(_, ids)| ids.len() >= quorum) {
        Some(majority) => {
            let mut suspects: Vec<u64> = groups
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != majority)
                .flat_map(|(_, (_, ids))| ids.iter().copied())
                .collect();
            suspects.sort_unstable();
            CompactionVerdict::Corrupt(suspects)
        }
        None => CompactionVerdict::Corrupt(vec![0]),
    }
}

/// One compaction hash check on the leader; `checked` is the newest compaction revision found
/// consistent on the whole cluster so far, moved on when a newer one is. The members it raised
/// CORRUPT for, if any.
pub async fn compaction_check_once(
    replica: &Replica,
    checked: &mut i64,
) -> Result<Vec<u64>, ReplicaError> {
    tracing::info!("starting compact hash check");
    let hashes: Vec<MemberHash> = replica
        .compaction_hashes()
        .into_iter()
        .filter(|h| h.revision > *checked)
        .collect();
    let mut looked = 0;
    for own in &hashes {
        looked += 1;
        let peers: Vec<(u64, Option<MemberHash>)> = replica
            .peer_hashes(own.revision)
            .await
            .into_iter()
            .map(|(id, answer)| (id, answer.ok().flatten()))
            .collect();
        if peers.is_empty() {
            continue;
        }
        match compaction_suspects(*own, &peers) {
            CompactionVerdict::Consistent => {
                tracing::info!(
                    "number-of-peers-checked" = peers.len(),
                    "revision" = own.revision,
                    "compactRevision" = own.compact_revision,
                    "successfully checked hash on whole cluster"
                );
                *checked = (*checked).max(own.revision);
                break;
            }
            CompactionVerdict::Incomplete => {
                tracing::warn!(
                    "revision" = own.revision,
                    "skipped revision in compaction hash check; was not able to check all peers"
                );
            }
            CompactionVerdict::Corrupt(members) => {
                tracing::error!(
                    "leader-revision" = own.revision,
                    "leader-compact-revision" = own.compact_revision,
                    "leader-hash" = own.hash,
                    "peer-ids" = %members.iter().map(|m| format!("{m:x}")).collect::<Vec<_>>().join(","),
                    "Detected compaction hash mismatch"
                );
                for &member in &members {
                    raise_corrupt(replica, member).await?;
                }
                tracing::info!(
                    "number-of-hashes-checked" = looked,
                    "finished compaction hash check"
                );
                return Ok(members);
            }
        }
    }
    tracing::info!(
        "number-of-hashes-checked" = looked,
        "finished compaction hash check"
    );
    Ok(Vec::new())
}

/// Runs [`compaction_check_once`] every `every` while this member leads, until `stop` turns
/// true.
pub async fn drive_compaction_hash_checks(
    replica: Arc<Replica>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut checked = 0;
    while leading_after(&replica, every, &mut stop).await {
        if let Err(e) = compaction_check_once(&replica, &mut checked).await {
            tracing::warn!("compaction hash check: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_hashes_are_judged_by_etcds_rules() {
        let at = |member, compact_revision, hash| MemberHash {
            member,
            revision: 10,
            compact_revision,
            hash,
        };
        let leader = at(1, 4, 7);
        // All agree.
        assert_eq!(
            compaction_suspects(leader, &[(2, Some(at(2, 4, 7))), (3, Some(at(3, 4, 7)))]),
            CompactionVerdict::Consistent
        );
        // One did not answer, one compacted elsewhere: nothing to say, try an older one.
        assert_eq!(
            compaction_suspects(leader, &[(2, None), (3, Some(at(3, 2, 9)))]),
            CompactionVerdict::Incomplete
        );
        // A minority differs from a majority: the minority, the leader included if it is.
        assert_eq!(
            compaction_suspects(leader, &[(2, Some(at(2, 4, 7))), (3, Some(at(3, 4, 8)))]),
            CompactionVerdict::Corrupt(vec![3])
        );
        assert_eq!(
            compaction_suspects(leader, &[(2, Some(at(2, 4, 8))), (3, Some(at(3, 4, 8)))]),
            CompactionVerdict::Corrupt(vec![1])
        );
        // Three hashes among three members: no majority, the whole cluster.
        assert_eq!(
            compaction_suspects(leader, &[(2, Some(at(2, 4, 8))), (3, Some(at(3, 4, 9)))]),
            CompactionVerdict::Corrupt(vec![0])
        );
    }

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
