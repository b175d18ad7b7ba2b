//! Conversion between the etcd wire messages and the core's types, one function per message
//! family. Sentinels (lease 0) become `Option` here and nowhere else. Requests are validated
//! (`validate.rs`) before they are converted, so conversion cannot fail.

use leasehold_api::etcdserverpb as pb;
use leasehold_api::mvccpb;
use leasehold_mvcc as mvcc;
use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::range_request::{SortOrder, SortTarget};

/// Builds response headers: the member's identity plus the revision and term of this response.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub cluster_id: u64,
    pub member_id: u64,
    pub raft_term: u64,
}

impl Header {
    pub fn at(&self, revision: i64) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.raft_term,
        })
    }

    /// The header of services that report no revision (etcd's Cluster service).
    pub fn without_revision(&self) -> Option<pb::ResponseHeader> {
        self.at(0)
    }
}

/// The header of a response nested in a txn: etcd fills in only the revision.
fn nested_header(revision: i64) -> Option<pb::ResponseHeader> {
    Some(pb::ResponseHeader {
        revision,
        ..Default::default()
    })
}

pub fn key_value(kv: mvcc::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: mvcc::LeaseId::to_wire(kv.lease),
    }
}

/// A watch event; the previous key-value only if the watcher asked for it.
pub fn event(ev: &mvcc::Event, with_prev_kv: bool) -> mvccpb::Event {
    mvccpb::Event {
        r#type: match ev.kind {
            mvcc::EventKind::Put => mvccpb::event::EventType::Put as i32,
            mvcc::EventKind::Delete => mvccpb::event::EventType::Delete as i32,
        },
        kv: Some(key_value(ev.kv.clone())),
        prev_kv: if with_prev_kv {
            ev.prev_kv.clone().map(key_value)
        } else {
            None
        },
    }
}

pub fn range_request(r: pb::RangeRequest) -> mvcc::RangeRequest {
    let sort_order = match SortOrder::try_from(r.sort_order) {
        Ok(SortOrder::None) | Err(_) => mvcc::SortOrder::None,
        Ok(SortOrder::Ascend) => mvcc::SortOrder::Ascend,
        Ok(SortOrder::Descend) => mvcc::SortOrder::Descend,
    };
    let sort_target = match SortTarget::try_from(r.sort_target) {
        Ok(SortTarget::Key) | Err(_) => mvcc::SortTarget::Key,
        Ok(SortTarget::Version) => mvcc::SortTarget::Version,
        Ok(SortTarget::Create) => mvcc::SortTarget::Create,
        Ok(SortTarget::Mod) => mvcc::SortTarget::Mod,
        Ok(SortTarget::Value) => mvcc::SortTarget::Value,
    };
    mvcc::RangeRequest {
        key: r.key,
        range_end: r.range_end,
        limit: r.limit,
        revision: r.revision,
        sort_order,
        sort_target,
        serializable: r.serializable,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    }
}

pub fn range_response(
    header: Option<pb::ResponseHeader>,
    r: mvcc::RangeResponse,
) -> pb::RangeResponse {
    pb::RangeResponse {
        header,
        kvs: r.kvs.into_iter().map(key_value).collect(),
        more: r.more,
        count: r.count,
    }
}

pub fn put_request(r: pb::PutRequest) -> mvcc::PutRequest {
    mvcc::PutRequest {
        key: r.key,
        value: r.value,
        lease: mvcc::LeaseId::from_wire(r.lease),
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

pub fn put_response(header: Option<pb::ResponseHeader>, r: mvcc::PutResponse) -> pb::PutResponse {
    pb::PutResponse {
        header,
        prev_kv: r.prev_kv.map(key_value),
    }
}

pub fn delete_request(r: pb::DeleteRangeRequest) -> mvcc::DeleteRangeRequest {
    mvcc::DeleteRangeRequest {
        key: r.key,
        range_end: r.range_end,
        prev_kv: r.prev_kv,
    }
}

pub fn delete_response(
    header: Option<pb::ResponseHeader>,
    r: mvcc::DeleteRangeResponse,
) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header,
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(key_value).collect(),
    }
}

pub fn compare(c: pb::Compare) -> mvcc::Compare {
    let result = match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) | Err(_) => mvcc::CompareResult::Equal,
        Ok(CompareResult::Greater) => mvcc::CompareResult::Greater,
        Ok(CompareResult::Less) => mvcc::CompareResult::Less,
        Ok(CompareResult::NotEqual) => mvcc::CompareResult::NotEqual,
    };
    // etcd reads the operand only from the oneof arm matching the target; any other arm counts
    // as zero (or empty).
    let u = c.target_union;
    let int = |pick: fn(&TargetUnion) -> Option<i64>| u.as_ref().and_then(pick).unwrap_or(0);
    let target = match CompareTarget::try_from(c.target) {
        Ok(CompareTarget::Version) | Err(_) => mvcc::CompareTarget::Version(int(|u| match u {
            TargetUnion::Version(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Create) => mvcc::CompareTarget::Create(int(|u| match u {
            TargetUnion::CreateRevision(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Mod) => mvcc::CompareTarget::Mod(int(|u| match u {
            TargetUnion::ModRevision(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Lease) => mvcc::CompareTarget::Lease(int(|u| match u {
            TargetUnion::Lease(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Value) => mvcc::CompareTarget::Value(match &u {
            Some(TargetUnion::Value(v)) => v.clone(),
            _ => Vec::new(),
        }),
    };
    mvcc::Compare {
        result,
        target,
        key: c.key,
        range_end: c.range_end,
    }
}

pub fn txn_request(r: pb::TxnRequest) -> mvcc::TxnRequest {
    mvcc::TxnRequest {
        compare: r.compare.into_iter().map(compare).collect(),
        success: r.success.into_iter().filter_map(request_op).collect(),
        failure: r.failure.into_iter().filter_map(request_op).collect(),
    }
}

/// Empty ops are rejected by validation, so `None` never reaches the store.
fn request_op(op: pb::RequestOp) -> Option<mvcc::RequestOp> {
    use pb::request_op::Request;
    Some(match op.request? {
        Request::RequestRange(r) => mvcc::RequestOp::Range(range_request(r)),
        Request::RequestPut(r) => mvcc::RequestOp::Put(put_request(r)),
        Request::RequestDeleteRange(r) => mvcc::RequestOp::DeleteRange(delete_request(r)),
        Request::RequestTxn(r) => mvcc::RequestOp::Txn(txn_request(r)),
    })
}

pub fn txn_response(header: Option<pb::ResponseHeader>, r: mvcc::TxnResponse) -> pb::TxnResponse {
    use pb::response_op::Response;
    let responses = r
        .responses
        .into_iter()
        .map(|op| pb::ResponseOp {
            response: Some(match op {
                mvcc::ResponseOp::Range(r) => {
                    Response::ResponseRange(range_response(nested_header(r.revision), r))
                }
                mvcc::ResponseOp::Put(r) => {
                    Response::ResponsePut(put_response(nested_header(r.revision), r))
                }
                mvcc::ResponseOp::DeleteRange(r) => {
                    Response::ResponseDeleteRange(delete_response(nested_header(r.revision), r))
                }
                mvcc::ResponseOp::Txn(r) => {
                    Response::ResponseTxn(txn_response(nested_header(r.revision), r))
                }
            }),
        })
        .collect();
    pb::TxnResponse {
        header,
        succeeded: r.succeeded,
        responses,
    }
}
