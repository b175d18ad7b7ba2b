//! Request checks made before anything reaches the log, as etcd's `v3rpc/key.go` makes them, in
//! the same order (the first failure decides the error a client sees).

use leasehold_api::etcdserverpb as pb;
use pb::range_request::{SortOrder, SortTarget};
use pb::request_op::Request;
use prost::Message;

use crate::error::{ApiError, Invalid};

/// etcd's `--max-request-bytes` default: the largest request that may enter the log.
pub const REQUEST_BYTES_MAX_DEFAULT: usize = 1536 * 1024;
/// etcd's `--max-txn-ops` default.
pub const TXN_OPS_MAX_DEFAULT: usize = 128;
/// What etcd lets grpc-go accept on the wire beyond the request limit, before the request is
/// even decoded.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// A member's request limits, etcd's `--max-request-bytes` and `--max-txn-ops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest request that may enter the log.
    pub request_bytes_max: usize,
    /// The most operations in one txn (compares, or either branch).
    pub txn_ops_max: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            request_bytes_max: REQUEST_BYTES_MAX_DEFAULT,
            txn_ops_max: TXN_OPS_MAX_DEFAULT,
        }
    }
}

impl Limits {
    /// What grpc-go accepts on the wire: the request limit plus etcd's gRPC overhead allowance.
    pub fn grpc_message_bytes_max(&self) -> usize {
        self.request_bytes_max.saturating_add(GRPC_OVERHEAD_BYTES)
    }

    /// The transport-level size check, for every unary request.
    pub fn message_size(&self, msg: &impl Message) -> Result<(), ApiError> {
        let len = msg.encoded_len();
        let max = self.grpc_message_bytes_max();
        if len > max {
            return Err(ApiError::MessageTooLarge { len, max });
        }
        Ok(())
    }

    /// The size check for requests that enter the Raft log.
    pub fn proposal_size(&self, msg: &impl Message) -> Result<(), ApiError> {
        self.message_size(msg)?;
        if msg.encoded_len() > self.request_bytes_max {
            return Err(Invalid::RequestTooLarge.into());
        }
        Ok(())
    }
}

/// A requested lease TTL, checked against etcd's maximum and raised to the minimum (etcd raises
/// zero and negative TTLs too). Decided here, before proposing, so every member applies the same.
pub fn lease_ttl(ttl_secs: i64, ttl_secs_min: i64) -> Result<i64, ApiError> {
    if ttl_secs > leasehold_raft::LEASE_TTL_SECS_MAX {
        return Err(ApiError::LeaseTtlTooLarge);
    }
    Ok(ttl_secs.max(ttl_secs_min))
}

/// etcd's minimum lease TTL: one and a half election timeouts, counted in whole heartbeats and
/// rounded up to a second (2 s with the default 100 ms / 1000 ms).
pub fn lease_ttl_secs_min(heartbeat_ms: u64, election_timeout_ms: u64) -> i64 {
    let heartbeat_ms = heartbeat_ms.max(1);
    let election_ticks = election_timeout_ms / heartbeat_ms;
    let min_ms = (3 * election_ticks / 2) * heartbeat_ms;
    i64::try_from(min_ms.div_ceil(1000))
        .unwrap_or(i64::MAX)
        .max(1)
}

pub fn range(r: &pb::RangeRequest) -> Result<(), Invalid> {
    if r.key.is_empty() {
        return Err(Invalid::EmptyKey);
    }
    if SortOrder::try_from(r.sort_order).is_err() || SortTarget::try_from(r.sort_target).is_err() {
        return Err(Invalid::SortOption);
    }
    Ok(())
}

pub fn put(r: &pb::PutRequest) -> Result<(), Invalid> {
    if r.key.is_empty() {
        return Err(Invalid::EmptyKey);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(Invalid::ValueProvided);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(Invalid::LeaseProvided);
    }
    Ok(())
}

pub fn delete(r: &pb::DeleteRangeRequest) -> Result<(), Invalid> {
    if r.key.is_empty() {
        return Err(Invalid::EmptyKey);
    }
    Ok(())
}

/// The whole txn check: op counts (at most `ops_max`, `--max-txn-ops`) and per-op checks, then
/// the put/delete overlap rule.
pub fn txn(r: &pb::TxnRequest, ops_max: usize) -> Result<(), Invalid> {
    txn_ops(r, ops_max)?;
    overlaps(&r.success)?;
    overlaps(&r.failure)?;
    Ok(())
}

fn txn_ops(r: &pb::TxnRequest, ops_max: usize) -> Result<(), Invalid> {
    let ops = r.compare.len().max(r.success.len()).max(r.failure.len());
    if ops > ops_max {
        return Err(Invalid::TooManyOps);
    }
    if r.compare.iter().any(|c| c.key.is_empty()) {
        return Err(Invalid::EmptyKey);
    }
    for op in r.success.iter().chain(&r.failure) {
        match &op.request {
            Some(Request::RequestRange(r)) => range(r)?,
            Some(Request::RequestPut(r)) => put(r)?,
            Some(Request::RequestDeleteRange(r)) => delete(r)?,
            // A nested txn shares what is left of the op budget.
            Some(Request::RequestTxn(r)) => txn_ops(r, ops_max - ops)?,
            None => return Err(Invalid::EmptyOp),
        }
    }
    Ok(())
}

/// A key range `[start, end)`; a point when `end` is `None`. Compared as plain byte strings, as
/// etcd's interval tree does (so a from-key delete, `end == "\0"`, overlaps nothing).
struct Interval<'a> {
    start: &'a [u8],
    end: Option<&'a [u8]>,
}

impl Interval<'_> {
    fn contains(&self, key: &[u8]) -> bool {
        match self.end {
            None => self.start == key,
            Some(end) => self.start <= key && key < end,
        }
    }
}

/// etcd's rule: within the ops that may run together, no key is put twice and no put falls in a
/// deleted range. The two branches of a nested txn never run together, so they may put the same
/// key. Returns the keys put and the ranges deleted, for the level above.
fn overlaps(ops: &[pb::RequestOp]) -> Result<(Vec<&[u8]>, Vec<Interval<'_>>), Invalid> {
    let mut dels: Vec<Interval<'_>> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(Request::RequestDeleteRange(d)) => Some(Interval {
                start: &d.key,
                end: (!d.range_end.is_empty()).then_some(d.range_end.as_slice()),
            }),
            _ => None,
        })
        .collect();
    let mut puts: Vec<&[u8]> = Vec::new();
    let deleted = |dels: &[Interval<'_>], k: &[u8]| dels.iter().any(|d| d.contains(k));
    for op in ops {
        let Some(Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = overlaps(&t.success)?;
        let (puts_else, dels_else) = overlaps(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || deleted(&dels, k) {
                return Err(Invalid::DuplicateKey);
            }
            puts.push(k);
        }
        for k in &puts_else {
            if (puts.contains(k) && !puts_then.contains(k)) || deleted(&dels, k) {
                return Err(Invalid::DuplicateKey);
            }
            puts.push(k);
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let Some(Request::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key.as_slice()) || deleted(&dels, &p.key) {
            return Err(Invalid::DuplicateKey);
        }
        puts.push(&p.key);
    }
    Ok((puts, dels))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_op(k: &str) -> pb::RequestOp {
        pb::RequestOp {
            request: Some(Request::RequestPut(pb::PutRequest {
                key: k.into(),
                ..Default::default()
            })),
        }
    }

    fn del_op(k: &str, end: &str) -> pb::RequestOp {
        pb::RequestOp {
            request: Some(Request::RequestDeleteRange(pb::DeleteRangeRequest {
                key: k.into(),
                range_end: end.into(),
                ..Default::default()
            })),
        }
    }

    fn txn_op(success: Vec<pb::RequestOp>, failure: Vec<pb::RequestOp>) -> pb::RequestOp {
        pb::RequestOp {
            request: Some(Request::RequestTxn(pb::TxnRequest {
                compare: vec![],
                success,
                failure,
            })),
        }
    }

    fn check(success: Vec<pb::RequestOp>, expect: Result<(), Invalid>) {
        let r = pb::TxnRequest {
            compare: vec![],
            success,
            failure: vec![],
        };
        assert_eq!(txn(&r, TXN_OPS_MAX_DEFAULT), expect);
    }

    #[test]
    fn txn_overlap_rules() {
        check(vec![put_op("a"), put_op("b")], Ok(()));
        check(vec![put_op("a"), put_op("a")], Err(Invalid::DuplicateKey));
        check(
            vec![put_op("b"), del_op("a", "c")],
            Err(Invalid::DuplicateKey),
        );
        check(vec![put_op("c"), del_op("a", "c")], Ok(()));
        check(vec![put_op("b"), del_op("b", "\0")], Ok(()));
        check(vec![del_op("a", "z"), del_op("b", "")], Ok(()));
        check(
            vec![put_op("a"), txn_op(vec![put_op("a")], vec![])],
            Err(Invalid::DuplicateKey),
        );
        check(vec![txn_op(vec![put_op("a")], vec![put_op("a")])], Ok(()));
        check(
            vec![del_op("a", ""), txn_op(vec![put_op("a")], vec![])],
            Err(Invalid::DuplicateKey),
        );
        check(
            vec![txn_op(vec![del_op("a", "")], vec![]), put_op("a")],
            Err(Invalid::DuplicateKey),
        );
    }

    #[test]
    fn lease_ttl_bounds_match_etcd() {
        assert_eq!(lease_ttl_secs_min(100, 1000), 2);
        assert_eq!(lease_ttl_secs_min(500, 5000), 8);
        assert_eq!(lease_ttl(1, 2).unwrap(), 2);
        assert_eq!(lease_ttl(-5, 2).unwrap(), 2);
        assert_eq!(lease_ttl(9_000_000_000, 2).unwrap(), 9_000_000_000);
        assert!(matches!(
            lease_ttl(9_000_000_001, 2),
            Err(ApiError::LeaseTtlTooLarge)
        ));
    }

    #[test]
    fn txn_op_limits_and_empty_keys() {
        check((0..128).map(|i| put_op(&format!("k{i}"))).collect(), Ok(()));
        check(
            (0..129).map(|i| put_op(&format!("k{i}"))).collect(),
            Err(Invalid::TooManyOps),
        );
        check(vec![put_op("")], Err(Invalid::EmptyKey));
        check(vec![pb::RequestOp { request: None }], Err(Invalid::EmptyOp));
        // `--max-txn-ops` moves the bound.
        let three = pb::TxnRequest {
            success: (0..3).map(|i| put_op(&format!("k{i}"))).collect(),
            ..Default::default()
        };
        assert_eq!(txn(&three, 3), Ok(()));
        assert_eq!(txn(&three, 2), Err(Invalid::TooManyOps));
    }

    #[test]
    fn size_limits_follow_max_request_bytes() {
        let put = |n: usize| pb::PutRequest {
            key: b"k".to_vec(),
            value: vec![b'v'; n],
            ..Default::default()
        };
        let defaults = Limits::default();
        assert_eq!(defaults.grpc_message_bytes_max(), 2 * 1024 * 1024);
        assert!(defaults.proposal_size(&put(1024 * 1024)).is_ok());
        let small = Limits {
            request_bytes_max: 1000,
            ..defaults
        };
        assert!(small.proposal_size(&put(900)).is_ok());
        assert!(matches!(
            small.proposal_size(&put(1000)),
            Err(ApiError::Invalid(Invalid::RequestTooLarge))
        ));
        // Above the wire limit (request limit plus 512 KiB): grpc-go's error, not etcd's.
        assert!(matches!(
            small.message_size(&put(1000 + 512 * 1024)),
            Err(ApiError::MessageTooLarge { max, .. }) if max == 1000 + 512 * 1024
        ));
    }
}
