//! Where the state machine stands in the Raft log, and the membership it applied: what the
//! file, a snapshot and the replica keep of Raft besides the log itself.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One log entry's place: its term and index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogPosition {
    pub(crate) term: u64,
    pub(crate) index: u64,
}

/// A member as the applied membership has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Member {
    pub(crate) peer_url: String,
    pub(crate) learner: bool,
}

/// Voters and learners by id.
pub(crate) type Members = BTreeMap<u64, Member>;

/// A new cluster's members: every one a voter.
pub(crate) fn voters(urls: &BTreeMap<u64, String>) -> Members {
    urls.iter()
        .map(|(id, url)| {
            (
                *id,
                Member {
                    peer_url: url.clone(),
                    learner: false,
                },
            )
        })
        .collect()
}
