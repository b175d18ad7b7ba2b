//! `KV/Txn` with txns nested as deep as etcd takes them.
//!
//! prost refuses any message nested more than 100 levels, and a nested txn costs two (the
//! `RequestOp`, then its `TxnRequest`), so from 50 txns deep tonic's generated route answered
//! `INTERNAL: failed to decode Protobuf message`. etcd's decoder goes to 10,000 levels, and
//! etcd's own check then refuses a txn nested deeper than `--max-txn-ops` allows (each level's
//! ops count against the levels below it) with `etcdserver: too many operations in txn request`.
//!
//! This route decodes a `TxnRequest` itself, one nesting level per call, with prost decoding
//! only the flat messages (compares, ranges, puts, deletes). A txn nested more than
//! `--max-txn-ops` + 1 deep is always refused by that check at a shallower level, before the
//! check looks deeper, so levels below that are not decoded: an empty txn stands in for them,
//! and the answer is etcd's. The stand-in never reaches the log. Only when `--max-txn-ops` is
//! set so high that the limit passes [`DEPTH_DECODED_MAX`] does a deeper txn get the decode
//! refusal instead (the server's stack bounds how deep it follows).

use std::sync::Arc;

use bytes::{Buf, Bytes};
use leasehold_api::etcdserverpb as pb;
use leasehold_api::etcdserverpb::kv_server::Kv;
use pb::request_op::Request as Op;
use prost::Message;
use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::{Request, Response, Status};

/// The deepest txn nesting decoded, whatever `--max-txn-ops` says.
const DEPTH_DECODED_MAX: usize = 160;

/// The path this route takes over from tonic's generated KV service.
pub(crate) const PATH: &str = "/etcdserverpb.KV/Txn";

/// How deep a request's txns are decoded, and whether what lies deeper is refused by the ops
/// check anyway: one level past the deepest etcd's check can accept under `txn_ops_max`, so that
/// the check itself refuses anything deeper; at most [`DEPTH_DECODED_MAX`].
fn depth_decoded(txn_ops_max: usize) -> (usize, bool) {
    match txn_ops_max.checked_add(2) {
        Some(depth) if depth <= DEPTH_DECODED_MAX => (depth, true),
        _ => (DEPTH_DECODED_MAX, false),
    }
}

/// Why a message could not be decoded here: it is not what prost would accept either (prost then
/// gives the error), or it nests deeper than [`DEPTH_DECODED_MAX`] allows.
enum Refused {
    Malformed,
    TooDeep,
}

/// A length-delimited field's bytes.
fn delimited(buf: &mut Bytes, wire_type: WireType) -> Result<Bytes, Refused> {
    if wire_type != WireType::LengthDelimited {
        return Err(Refused::Malformed);
    }
    let len = decode_varint(buf).map_err(|_| Refused::Malformed)?;
    let len = usize::try_from(len).map_err(|_| Refused::Malformed)?;
    if len > buf.remaining() {
        return Err(Refused::Malformed);
    }
    Ok(buf.split_to(len))
}

fn flat<M: Message + Default>(bytes: Bytes) -> Result<M, Refused> {
    M::decode(bytes).map_err(|_| Refused::Malformed)
}

/// One txn level; `depth` is its own (the request itself is 1).
fn txn(mut buf: Bytes, depth: usize, decoded: (usize, bool)) -> Result<pb::TxnRequest, Refused> {
    let mut txn = pb::TxnRequest::default();
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|_| Refused::Malformed)?;
        match tag {
            1 => txn.compare.push(flat(delimited(&mut buf, wire_type)?)?),
            2 => txn
                .success
                .push(op(delimited(&mut buf, wire_type)?, depth, decoded)?),
            3 => txn
                .failure
                .push(op(delimited(&mut buf, wire_type)?, depth, decoded)?),
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                .map_err(|_| Refused::Malformed)?,
        }
    }
    Ok(txn)
}

/// One operation of a txn at `depth`.
fn op(mut buf: Bytes, depth: usize, decoded: (usize, bool)) -> Result<pb::RequestOp, Refused> {
    let mut request = None;
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|_| Refused::Malformed)?;
        request = Some(match tag {
            1 => Op::RequestRange(flat(delimited(&mut buf, wire_type)?)?),
            2 => Op::RequestPut(flat(delimited(&mut buf, wire_type)?)?),
            3 => Op::RequestDeleteRange(flat(delimited(&mut buf, wire_type)?)?),
            4 => {
                let inner = delimited(&mut buf, wire_type)?;
                let (decoded_max, cut_by_ops) = decoded;
                if depth < decoded_max {
                    Op::RequestTxn(txn(inner, depth + 1, decoded)?)
                } else if cut_by_ops {
                    // Never checked: the level above already breaks `--max-txn-ops`.
                    Op::RequestTxn(pb::TxnRequest::default())
                } else {
                    return Err(Refused::TooDeep);
                }
            }
            _ => {
                skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                    .map_err(|_| Refused::Malformed)?;
                continue;
            }
        });
    }
    Ok(pb::RequestOp { request })
}

/// Decodes a whole `TxnRequest` as described in the module docs; on bytes prost would refuse,
/// prost's own error, as tonic reports it.
fn decode(bytes: Bytes, txn_ops_max: usize) -> Result<pb::TxnRequest, Status> {
    match txn(bytes.clone(), 1, depth_decoded(txn_ops_max)) {
        Ok(txn) => Ok(txn),
        Err(Refused::Malformed) => {
            pb::TxnRequest::decode(bytes).map_err(|e| Status::internal(e.to_string()))
        }
        Err(Refused::TooDeep) => Err(Status::internal(
            "failed to decode Protobuf message: recursion limit reached",
        )),
    }
}

/// The route's codec: prost's encoder for the answer, [`decode`] for the request.
#[derive(Clone, Copy)]
struct TxnCodec {
    txn_ops_max: usize,
}

struct TxnDecoder {
    txn_ops_max: usize,
}

impl Decoder for TxnDecoder {
    type Item = pb::TxnRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<pb::TxnRequest>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        decode(bytes, self.txn_ops_max).map(Some)
    }
}

impl Codec for TxnCodec {
    type Encode = pb::TxnResponse;
    type Decode = pb::TxnRequest;
    type Encoder = <tonic_prost::ProstCodec<pb::TxnResponse, pb::TxnRequest> as Codec>::Encoder;
    type Decoder = TxnDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstCodec::<pb::TxnResponse, pb::TxnRequest>::default().encoder()
    }

    fn decoder(&mut self) -> TxnDecoder {
        TxnDecoder {
            txn_ops_max: self.txn_ops_max,
        }
    }
}

/// The KV service's own `txn`, as a unary gRPC method.
struct TxnMethod(Arc<crate::kv::KvService>);

impl tonic::server::UnaryService<pb::TxnRequest> for TxnMethod {
    type Response = pb::TxnResponse;
    type Future = futures::future::BoxFuture<'static, Result<Response<pb::TxnResponse>, Status>>;

    fn call(&mut self, request: Request<pb::TxnRequest>) -> Self::Future {
        let kv = self.0.clone();
        Box::pin(async move { kv.txn(request).await })
    }
}

/// Serves one `KV/Txn` call, with the decoding limit the generated service has.
pub(crate) async fn serve(
    kv: Arc<crate::kv::KvService>,
    txn_ops_max: usize,
    decode_bytes_max: usize,
    request: axum::extract::Request,
) -> axum::response::Response {
    let mut grpc = tonic::server::Grpc::new(TxnCodec { txn_ops_max })
        .apply_max_message_size_config(Some(decode_bytes_max), None);
    grpc.unary(TxnMethod(kv), request)
        .await
        .map(axum::body::Body::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str) -> pb::RequestOp {
        pb::RequestOp {
            request: Some(Op::RequestPut(pb::PutRequest {
                key: key.into(),
                value: b"v".to_vec(),
                ..Default::default()
            })),
        }
    }

    /// A txn `depth` levels deep, each level with one compare and the next level in `success`,
    /// the innermost putting a key.
    fn nested(depth: usize) -> pb::TxnRequest {
        let mut txn = pb::TxnRequest {
            success: vec![put("inner")],
            ..Default::default()
        };
        for _ in 1..depth {
            txn = pb::TxnRequest {
                compare: vec![pb::Compare {
                    key: b"c".to_vec(),
                    ..Default::default()
                }],
                success: vec![pb::RequestOp {
                    request: Some(Op::RequestTxn(txn)),
                }],
                failure: vec![put("f")],
            };
        }
        txn
    }

    fn depth_of(txn: &pb::TxnRequest) -> usize {
        let inner = txn
            .success
            .iter()
            .chain(&txn.failure)
            .find_map(|op| match &op.request {
                Some(Op::RequestTxn(t)) => Some(t),
                _ => None,
            });
        1 + inner.map_or(0, depth_of)
    }

    #[test]
    fn what_prost_decodes_is_decoded_the_same() {
        for depth in [1, 2, 10, 49] {
            let request = nested(depth);
            let bytes = Bytes::from(request.encode_to_vec());
            assert_eq!(pb::TxnRequest::decode(bytes.clone()).unwrap(), request);
            assert_eq!(decode(bytes, 128).ok(), Some(request), "depth {depth}");
        }
    }

    #[test]
    fn deeper_than_prost_goes_is_decoded_up_to_one_past_the_ops_limit() {
        // Fully decoded while the limits allow it ...
        let request = nested(150);
        let bytes = Bytes::from(request.encode_to_vec());
        assert!(
            pb::TxnRequest::decode(bytes.clone()).is_err(),
            "prost refuses"
        );
        assert_eq!(decode(bytes, 500).ok(), Some(request));
        // ... and cut one level past where the ops limit refuses it.
        let bytes = Bytes::from(nested(200).encode_to_vec());
        let cut = decode(bytes, 128).unwrap();
        assert_eq!(
            depth_of(&cut),
            131,
            "130 levels decoded, then the empty stand-in"
        );
        assert_eq!(
            crate::validate::txn(&cut, 128),
            Err(crate::error::Invalid::TooManyOps)
        );
    }

    #[test]
    fn past_the_decoded_maximum_a_huge_ops_limit_gets_the_decode_refusal() {
        let bytes = Bytes::from(nested(DEPTH_DECODED_MAX + 5).encode_to_vec());
        let refused = decode(bytes.clone(), usize::MAX).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Internal);
        // The deepest limit the ops check still cuts at.
        let cut = decode(bytes, DEPTH_DECODED_MAX - 2).unwrap();
        assert_eq!(depth_of(&cut), DEPTH_DECODED_MAX + 1);
    }

    #[test]
    fn malformed_bytes_get_prosts_own_error() {
        // Field 2 (success) with a varint wire type.
        let bytes = Bytes::from_static(&[0x10, 0x01]);
        let ours = decode(bytes.clone(), 128).unwrap_err();
        let prost = pb::TxnRequest::decode(bytes).unwrap_err();
        assert_eq!(ours.code(), tonic::Code::Internal);
        assert_eq!(ours.message(), prost.to_string());
    }
}
