//! Maintenance: Status (what `etcdctl endpoint status/health` need), alarms (list, raise, clear),
//! Hash and HashKV (`etcdctl endpoint hashkv`, corruption checks), Defragment, Snapshot (etcd's
//! backend file, `leasehold-snapshot`), MoveLeader (`Replica::move_leader`). Downgrade checks
//! its target as etcd 3.7 does and answers etcd's errors; a valid target (3.6) gets
//! `Unimplemented`, since leasehold has no mode that runs as an older etcd.

use std::sync::Arc;

use leasehold_api::etcdserverpb::{self as pb, maintenance_server::Maintenance};
use pb::alarm_request::AlarmAction;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use crate::context::ServerContext;
use leasehold_raft::{Alarm, AlarmChange, AlarmMember};

use crate::error::ApiError;
use crate::version::ETCD_API_VERSION;

/// A downgrade target as etcd reads it: a semantic version, or `major.minor`; only major and
/// minor count.
fn downgrade_target(v: &str) -> Option<(u64, u64)> {
    let core = v.split(['-', '+']).next()?;
    let parts: Vec<&str> = core.split('.').collect();
    let number = |s: &str| {
        // semver: digits only, no leading zero.
        (!s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0')))
        .then(|| s.parse::<u64>().ok())
        .flatten()
    };
    match parts.as_slice() {
        [major, minor] | [major, minor, _] if parts.len() == 2 || number(parts[2]).is_some() => {
            Some((number(major)?, number(minor)?))
        }
        _ => None,
    }
}

/// The cluster version leasehold runs at: [`ETCD_API_VERSION`]'s major and minor.
fn cluster_minor() -> (u64, u64) {
    downgrade_target(ETCD_API_VERSION).expect("ETCD_API_VERSION is a version")
}

/// How long a leadership transfer may take, in election timeouts: the transferee catches up and
/// wins an election (raft-rs gives up a transfer after one election timeout; a slow catch-up
/// may need a second). Under etcdctl's default command timeout (5 s) at the default election
/// timeout.
const MOVE_LEADER_ELECTION_TIMEOUTS: u32 = 4;

/// Snapshot pieces read ahead of the client.
const SNAPSHOT_PIECES_QUEUED: usize = 8;

pub struct MaintenanceService {
    ctx: Arc<ServerContext>,
}

impl MaintenanceService {
    pub fn new(ctx: Arc<ServerContext>) -> MaintenanceService {
        MaintenanceService { ctx }
    }

    /// This member's current store revision, for a response header.
    async fn revision(&self) -> Result<i64, Status> {
        Ok(self
            .ctx
            .replica
            .read(false, |s| s.current_revision())
            .await
            .map_err(ApiError::from)?)
    }

    /// Defragment, Snapshot, Hash, HashKV, MoveLeader and raising or clearing an alarm need an
    /// admin while auth is on, refused with etcd's codes (3.6+; 3.4 answered code Unknown).
    fn admin<T>(&self, req: &Request<T>) -> Result<(), Status> {
        self.ctx.admin(req)?;
        Ok(())
    }
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    /// etcd 3.7's checks of a downgrade: the target's format, then that it is the one minor
    /// release below the cluster's; no downgrade is ever in progress to cancel. Root only while
    /// auth is on, as etcd.
    async fn downgrade(
        &self,
        req: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        self.admin(&req)?;
        let req = req.into_inner();
        match pb::downgrade_request::DowngradeAction::try_from(req.action) {
            Ok(pb::downgrade_request::DowngradeAction::Cancel) => {
                return Err(Status::failed_precondition(
                    "etcdserver: no inflight downgrade job",
                ));
            }
            Ok(_) => {}
            Err(_) => return Err(Status::unimplemented("etcdserver: unknown method")),
        }
        let target = downgrade_target(&req.version).ok_or_else(|| {
            Status::invalid_argument("etcdserver: wrong downgrade target version format")
        })?;
        let cluster = cluster_minor();
        if target != (cluster.0, cluster.1.wrapping_sub(1)) {
            return Err(Status::invalid_argument(
                "etcdserver: invalid downgrade target version",
            ));
        }
        Err(Status::unimplemented(format!(
            "leasehold cannot downgrade to etcd {}.{}: it has no mode that runs as an older etcd",
            target.0, target.1
        )))
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        // Any signed-in user may ask (etcd 3.6+).
        self.ctx.signed_in(&req)?;
        let raft = self.ctx.replica.status();
        let revision = self.revision().await?;
        let db_size = i64::try_from(self.ctx.replica.db_size_bytes()).unwrap_or(i64::MAX);
        let in_use = self.ctx.replica.db_size_in_use_bytes().await;
        let db_size_in_use = i64::try_from(in_use).unwrap_or(i64::MAX);
        Ok(Response::new(pb::StatusResponse {
            header: self.ctx.header().at(revision),
            version: ETCD_API_VERSION.into(),
            db_size,
            leader: raft.leader.unwrap_or(0),
            raft_index: raft.last_log_index,
            raft_term: raft.term,
            raft_applied_index: raft.applied_index,
            errors: self.ctx.replica.alarms().iter().map(alarm_text).collect(),
            db_size_in_use,
            is_learner: self.ctx.replica.is_learner(),
            // etcd 3.6+: the storage schema, and the quota (0 when there is none).
            storage_version: leasehold_snapshot::layout::STORAGE_SCHEMA.to_owned(),
            db_size_quota: self
                .ctx
                .replica
                .quota_bytes()
                .map_or(0, |q| i64::try_from(q).unwrap_or(i64::MAX)),
            ..Default::default()
        }))
    }

    /// Compacts this member's database file, as etcd's defragment does (per member; writes wait
    /// meanwhile).
    async fn defragment(
        &self,
        req: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        self.admin(&req)?;
        let defragmenting = self.ctx.metrics.defragmenting();
        let done = self.ctx.replica.defragment().await;
        drop(defragmenting);
        match done.map_err(ApiError::from)? {
            Some(done) => {
                tracing::info!(
                    bytes_before = done.bytes_before,
                    bytes_after = done.bytes_after,
                    "defragmented the database file"
                );
            }
            None => {
                return Err(Status::unavailable(
                    "etcdserver: defragment: a snapshot is being sent from this member; try again",
                ));
            }
        }
        // No header: etcd (3.4 to 3.7) answers an empty DefragmentResponse, and client
        // libraries' tests assert that.
        Ok(Response::new(pb::DefragmentResponse { header: None }))
    }

    /// etcd's KV hash at a revision, equal to etcd's for the same history (see
    /// `leasehold_mvcc::KvHash`). Answered from this member's own state, as etcd does: members
    /// compare their hashes at one revision.
    async fn hash_kv(
        &self,
        req: Request<pb::HashKvRequest>,
    ) -> Result<Response<pb::HashKvResponse>, Status> {
        self.admin(&req)?;
        let revision = req.into_inner().revision;
        let (hashed, current, took) = self
            .ctx
            .replica
            .read(false, |s| {
                let started = std::time::Instant::now();
                (s.hash_kv(revision), s.current_revision(), started.elapsed())
            })
            .await
            .map_err(ApiError::from)?;
        self.ctx.metrics.hashed(true, took);
        let hashed = hashed.map_err(ApiError::from)?;
        Ok(Response::new(pb::HashKvResponse {
            header: self.ctx.header().at(current),
            hash: hashed.hash,
            compact_revision: hashed.compact_revision,
            hash_revision: hashed.hash_revision,
        }))
    }

    /// etcd hashes its whole backend file here ("for testing only"); leasehold answers the KV
    /// hash at the current revision (docs/compat.md).
    async fn hash(
        &self,
        req: Request<pb::HashRequest>,
    ) -> Result<Response<pb::HashResponse>, Status> {
        self.admin(&req)?;
        let (hashed, current, took) = self
            .ctx
            .replica
            .read(false, |s| {
                let started = std::time::Instant::now();
                (s.hash_kv(0), s.current_revision(), started.elapsed())
            })
            .await
            .map_err(ApiError::from)?;
        self.ctx.metrics.hashed(false, took);
        let hashed = hashed.map_err(ApiError::from)?;
        Ok(Response::new(pb::HashResponse {
            header: self.ctx.header().at(current),
            hash: hashed.hash,
        }))
    }

    /// This member's state as etcd's snapshot file: etcd's backend (a bbolt file in etcd's
    /// layout) in 32 KiB pieces, each with the bytes that remain, then its SHA-256. The file is
    /// written from one read transaction into a temporary file in the data dir first, so writes
    /// go on while it is made and sent. Root only while auth is on, as in etcd.
    async fn snapshot(
        &self,
        req: Request<pb::SnapshotRequest>,
    ) -> Result<Response<BoxStream<pb::SnapshotResponse>>, Status> {
        self.admin(&req)?;
        let began = std::time::Instant::now();
        let replica = &self.ctx.replica;
        let view = replica.view_state().await.map_err(ApiError::from)?;
        let revision = view.current_revision;
        let dir = replica.data_dir().to_path_buf();
        let backend = tokio::task::spawn_blocking(move || leasehold_snapshot::build(&view, &dir))
            .await
            .map_err(|_| Status::unavailable("etcdserver: server stopped"))?
            .map_err(|e| Status::new(tonic::Code::Unknown, format!("snapshot: {e}")))?;
        tracing::info!(
            bytes = backend.size(),
            versions = backend.exported.records,
            leases = backend.exported.leases,
            revision,
            "sending a snapshot"
        );
        let (tx, rx) = mpsc::channel(SNAPSHOT_PIECES_QUEUED);
        let metrics = self.ctx.metrics.clone();
        tokio::task::spawn_blocking(move || {
            let mut whole = true;
            for piece in backend.chunks() {
                // No header on any piece, as etcd (3.4 to 3.7) sends them; each names the
                // file's storage version, as etcd 3.6+ does.
                let message = piece
                    .map(|(blob, remaining_bytes)| pb::SnapshotResponse {
                        header: None,
                        remaining_bytes,
                        blob,
                        version: leasehold_snapshot::layout::STORAGE_SCHEMA.to_owned(),
                    })
                    .map_err(|e| Status::new(tonic::Code::Unknown, format!("snapshot: {e}")));
                // The client went away: stop reading.
                if tx.blocking_send(message).is_err() {
                    whole = false;
                    break;
                }
            }
            if whole {
                metrics.snapshot_sent(began.elapsed());
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    /// etcd's MoveLeader: this member, which must lead, hands leadership to the target voter.
    /// Root only while auth is on, as in etcd.
    async fn move_leader(
        &self,
        req: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        self.admin(&req)?;
        let target = req.into_inner().target_id;
        let replica = &self.ctx.replica;
        let within = replica.election_timeout() * MOVE_LEADER_ELECTION_TIMEOUTS;
        replica
            .move_leader(target, within)
            .await
            .map_err(ApiError::from)?;
        // No header, as etcd (3.4 to 3.7) answers.
        Ok(Response::new(pb::MoveLeaderResponse { header: None }))
    }

    /// etcd's alarms: list (all, or of one type), raise, clear. Raising and clearing go through
    /// the log, so every member holds the same alarms; a raised NOSPACE refuses writes that add
    /// data, CORRUPT every write (`Replica::propose`).
    async fn alarm(
        &self,
        req: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        // Listing: any signed-in user; raising or clearing: an admin (etcd 3.6+).
        if req.get_ref().action == AlarmAction::Get as i32 {
            self.ctx.signed_in(&req)?;
        } else {
            self.admin(&req)?;
        }
        let req = req.into_inner();
        let alarm = match pb::AlarmType::try_from(req.alarm) {
            Ok(pb::AlarmType::Nospace) => Some(Alarm::NoSpace),
            Ok(pb::AlarmType::Corrupt) => Some(Alarm::Corrupt),
            Ok(pb::AlarmType::None) | Err(_) => None,
        };
        let alarms = match AlarmAction::try_from(req.action) {
            Ok(AlarmAction::Get) => {
                // Read after everything committed is applied here, as etcd's goes through Raft.
                self.ctx
                    .replica
                    .read(true, |_| ())
                    .await
                    .map_err(ApiError::from)?;
                self.ctx
                    .replica
                    .alarms()
                    .into_iter()
                    .filter(|a| alarm.is_none_or(|wanted| a.alarm == wanted))
                    .collect()
            }
            Ok(action @ (AlarmAction::Activate | AlarmAction::Deactivate)) => match alarm {
                // etcd raises or clears nothing of type NONE (or of a type it does not know).
                None => Vec::new(),
                Some(alarm) => {
                    let change = AlarmChange {
                        activate: action == AlarmAction::Activate,
                        alarm: AlarmMember {
                            member: req.member_id,
                            alarm,
                        },
                    };
                    let changed = self
                        .ctx
                        .replica
                        .propose(change)
                        .await
                        .map_err(ApiError::from)?;
                    changed.into_iter().collect()
                }
            },
            Err(_) => Vec::new(),
        };
        Ok(Response::new(pb::AlarmResponse {
            header: self.ctx.header().at(self.revision().await?),
            alarms: alarms.iter().map(alarm_member).collect(),
        }))
    }
}

/// An alarm type's name on the wire and in `/health` (`NOSPACE`, `CORRUPT`).
pub(crate) fn alarm_name(alarm: Alarm) -> &'static str {
    alarm_type(alarm).as_str_name()
}

fn alarm_type(alarm: Alarm) -> pb::AlarmType {
    match alarm {
        Alarm::NoSpace => pb::AlarmType::Nospace,
        Alarm::Corrupt => pb::AlarmType::Corrupt,
    }
}

fn alarm_member(a: &AlarmMember) -> pb::AlarmMember {
    pb::AlarmMember {
        member_id: a.member,
        alarm: alarm_type(a.alarm) as i32,
    }
}

/// An alarm as etcd's Status lists it in `errors` (its protobuf text form).
fn alarm_text(a: &AlarmMember) -> String {
    format!("memberID:{} alarm:{} ", a.member, alarm_name(a.alarm))
}

#[cfg(test)]
mod downgrade_tests {
    use super::*;

    #[test]
    fn targets_are_read_as_etcd_reads_them() {
        assert_eq!(downgrade_target("3.6"), Some((3, 6)));
        assert_eq!(downgrade_target("3.6.0"), Some((3, 6)));
        assert_eq!(downgrade_target("3.6.2-rc.1"), Some((3, 6)));
        assert_eq!(downgrade_target("3.0"), Some((3, 0)));
        for bad in ["", "3", "x.y", "3.6.x", "03.6", "3.6.0.1"] {
            assert_eq!(downgrade_target(bad), None, "{bad:?}");
        }
        assert_eq!(cluster_minor(), (3, 7));
    }
}
