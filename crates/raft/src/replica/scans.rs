//! Reads that never hold writes back for long: a range read, or a watch stream's read of history,
//! is taken a bounded part at a time ([`leasehold_mvcc::RangeScan`], [`leasehold_mvcc::EventsScan`]),
//! each part under the state lock and the lock let go between parts, so apply (which takes the
//! lock to write) waits for one part at most, not for a whole read of any size. Every part reads
//! at the revision the first one pinned, so the answer is the same as one read at that revision.
//!
//! What a read holds in memory is its answer, as in etcd; `--max-request-bytes` bounds no
//! answer there either. kube-apiserver pages its LISTs (or streams them, RangeStream), so its
//! reads are one page each.

use leasehold_mvcc::{Event, EventsFilter, RangeRequest, RangeResponse, ScanBudget};

use super::Replica;
use crate::replica::ReplicaError;
use crate::state_machine;

/// One part of a read (and of a watch history read): at most this many keys, or about this many
/// bytes of keys and values. Values are shared with the answer, not copied (leasehold-mvcc's
/// `KeyValue`), so a part under the lock is a walk of the index plus a reference count and a key
/// copy per key.
pub(crate) const RANGE_PART: ScanBudget = ScanBudget {
    keys: 1024,
    bytes: 1024 * 1024,
};

/// A read whose revision was compacted under it (and that asked for no revision of its own) starts
/// again at the newest revision this many times; then it reads in one part, which a compaction
/// cannot interrupt.
const RESTARTS_MAX: usize = 3;

impl Replica {
    /// Reads `req` from the applied state, a part at a time (see the module). A linearizable read
    /// first confirms leadership and waits until everything committed before it is applied (read
    /// index). The inner error is the store's answer: a compacted or future revision.
    pub async fn range(
        &self,
        linearizable: bool,
        req: RangeRequest,
    ) -> Result<Result<RangeResponse, leasehold_mvcc::Error>, ReplicaError> {
        if linearizable {
            self.ensure_linearizable().await?;
        }
        let mut restarts = 0;
        'scan: loop {
            if restarts == RESTARTS_MAX {
                // The whole read under one hold of the lock: nothing can compact it meanwhile.
                return Ok(state_machine::read(&self.shared, |s| s.range(&req)));
            }
            let mut scan = match state_machine::read(&self.shared, |s| s.range_scan(req.clone())) {
                Ok(scan) => scan,
                Err(e) => return Ok(Err(e)),
            };
            loop {
                match state_machine::read(&self.shared, |s| s.range_step(&mut scan, RANGE_PART)) {
                    // Released values are read back here, with the lock let go.
                    Ok(true) => return Ok(scan.finish()),
                    // Other tasks (and their reads) run between parts.
                    Ok(false) => tokio::task::yield_now().await,
                    // Compacted past the pinned revision since the read began: a read at "now"
                    // can be taken again at the new now; one at a named revision is answered as
                    // it would have been, had it come after the compaction.
                    Err(leasehold_mvcc::Error::Compacted) if req.revision <= 0 => {
                        restarts += 1;
                        continue 'scan;
                    }
                    Err(e) => return Ok(Err(e)),
                }
            }
        }
    }

    /// The watch history of revisions `from..=to` (at most `revisions_max` distinct ones, of
    /// the events `filter` lets through), read a part at a time. `compacted` is the compaction
    /// point the caller saw when it chose `from`. `Compacted` when the history was compacted
    /// past what is left to read since then (the caller looks at the compaction point again).
    pub async fn events(
        &self,
        from: i64,
        to: i64,
        revisions_max: usize,
        compacted: i64,
        filter: EventsFilter,
    ) -> Result<Vec<Event>, leasehold_mvcc::Error> {
        let mut scan = state_machine::read(&self.shared, |s| {
            s.events_scan(from, to, revisions_max, compacted)
        })
        .with_filter(filter);
        while !state_machine::read(&self.shared, |s| s.events_step(&mut scan, RANGE_PART))? {
            tokio::task::yield_now().await;
        }
        Ok(scan.finish())
    }
}
