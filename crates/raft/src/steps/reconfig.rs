//! etcd's `--strict-reconfig-check`: the leader refuses a membership change that would leave the
//! cluster without a working quorum. Pure: the caller says which voters have started (published
//! their attributes) and for how long it has heard from each without a gap.

use std::time::Duration;

/// How long a peer must have been heard from without a gap to count as connected (etcd's
/// `HealthInterval`).
pub const RECONFIG_HEALTH_INTERVAL: Duration = Duration::from_secs(5);

/// A voting member as the check sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Voter {
    pub id: u64,
    /// It published its attributes (etcd lists a member that never did as unstarted).
    pub started: bool,
    /// For how long this member has heard from it without a gap; `None`: not lately.
    pub heard_for: Option<Duration>,
}

/// Why a change is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconfigRefusal {
    /// Too few voters would be started to make a quorum.
    NotEnoughStarted,
    /// Too few voters are connected to this member for the quorum the change leaves.
    Unhealthy,
}

fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

/// Voters connected to `me` for [`RECONFIG_HEALTH_INTERVAL`] (`me` included).
fn connected(voters: &[Voter], me: u64) -> usize {
    voters
        .iter()
        .filter(|v| v.id == me || v.heard_for.is_some_and(|d| d >= RECONFIG_HEALTH_INTERVAL))
        .count()
}

/// Whether `me`, leading `voters`, may add a member (a learner or a voter).
pub fn may_add(voters: &[Voter], me: u64, learner: bool) -> Result<(), ReconfigRefusal> {
    if !learner {
        // With the new member counted as not started; one started member of two is a cluster
        // being restored, which etcd lets grow.
        let members = voters.len() + 1;
        let started = voters.iter().filter(|v| v.started).count();
        if !(started == 1 && members == 2) && started < quorum(members) {
            return Err(ReconfigRefusal::NotEnoughStarted);
        }
    }
    // The new member counts as unavailable.
    if voters.len() > 1 && connected(voters, me) < quorum(voters.len() + 1) {
        return Err(ReconfigRefusal::Unhealthy);
    }
    Ok(())
}

/// Whether `me`, leading `voters`, may remove voter `id` (removing a learner is always safe).
pub fn may_remove(voters: &[Voter], me: u64, id: u64) -> Result<(), ReconfigRefusal> {
    let Some(removed) = voters.iter().find(|v| v.id == id) else {
        return Ok(());
    };
    let others: Vec<&Voter> = voters.iter().filter(|v| v.id != id).collect();
    let started = others.iter().filter(|v| v.started).count();
    if started < quorum(others.len()) {
        return Err(ReconfigRefusal::NotEnoughStarted);
    }
    // A member this one does not hear from is not part of the working quorum.
    if id != me && removed.heard_for.is_none() {
        return Ok(());
    }
    if connected(voters, me).saturating_sub(1) < quorum(voters.len() - 1) {
        return Err(ReconfigRefusal::Unhealthy);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voter(id: u64, heard_secs: Option<u64>) -> Voter {
        Voter {
            id,
            started: true,
            heard_for: heard_secs.map(Duration::from_secs),
        }
    }

    #[test]
    fn adding_to_a_cluster_just_started_is_unhealthy_until_peers_were_heard_for_a_while() {
        let young = [voter(1, None), voter(2, Some(1)), voter(3, Some(1))];
        assert_eq!(may_add(&young, 1, false), Err(ReconfigRefusal::Unhealthy));
        assert_eq!(may_add(&young, 1, true), Err(ReconfigRefusal::Unhealthy));
        let settled = [voter(1, None), voter(2, Some(6)), voter(3, Some(6))];
        assert_eq!(may_add(&settled, 1, false), Ok(()));
        // A single member may always grow.
        assert_eq!(may_add(&[voter(1, None)], 1, false), Ok(()));
    }

    #[test]
    fn adding_a_voter_needs_a_started_quorum() {
        let mut unstarted = [voter(1, None), voter(2, Some(6)), voter(3, Some(6))];
        unstarted[1].started = false;
        unstarted[2].started = false;
        assert_eq!(
            may_add(&unstarted, 1, false),
            Err(ReconfigRefusal::NotEnoughStarted)
        );
    }

    #[test]
    fn removing_the_only_member_or_from_a_young_cluster_is_refused() {
        assert_eq!(
            may_remove(&[voter(1, None)], 1, 1),
            Err(ReconfigRefusal::NotEnoughStarted)
        );
        let young = [voter(1, None), voter(2, Some(1)), voter(3, Some(1))];
        assert_eq!(may_remove(&young, 1, 3), Err(ReconfigRefusal::Unhealthy));
        let settled = [voter(1, None), voter(2, Some(6)), voter(3, Some(6))];
        assert_eq!(may_remove(&settled, 1, 3), Ok(()));
        // A member not heard from lately is safe to remove.
        let down = [voter(1, None), voter(2, Some(6)), voter(3, None)];
        assert_eq!(may_remove(&down, 1, 3), Ok(()));
    }
}
