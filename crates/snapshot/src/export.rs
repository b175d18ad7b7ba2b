//! leasehold's state, written as etcd's backend: a bbolt file in etcd's bucket layout
//! (`layout.rs`), which etcd's tools read (`etcdctl snapshot status`, `snapshot restore`).

use std::io::{self, Seek, Write};

use leasehold_api::{authpb, etcdserverpb, leasepb, mvccpb};
use leasehold_auth::{AuthState, PermKind};
use leasehold_bbolt::Writer;
use leasehold_mvcc::Record;
use leasehold_raft::{Alarm, StateView};
use prost::Message as _;

use crate::layout;

/// What an export wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exported {
    pub records: u64,
    pub leases: u64,
}

/// Writes `view` to `out` as etcd's backend file. Buckets go in byte order, as bbolt keeps them.
pub fn write_backend<W: Write + Seek>(view: &StateView, out: W) -> io::Result<(W, Exported)> {
    let mut exported = Exported {
        records: 0,
        leases: 0,
    };
    let mut file = Writer::new(out);

    let mut alarms: Vec<Vec<u8>> = view
        .alarms
        .iter()
        .map(|a| {
            etcdserverpb::AlarmMember {
                member_id: a.member,
                alarm: alarm_type(a.alarm) as i32,
            }
            .encode_to_vec()
        })
        .collect();
    alarms.sort();
    let mut bucket = file.bucket(layout::ALARM).map_err(format)?;
    for key in &alarms {
        bucket.put(key, b"").map_err(format)?;
    }
    bucket.finish().map_err(format)?;

    write_auth(&mut file, &view.auth)?;

    let mut bucket = file.bucket(layout::KEY).map_err(format)?;
    view.for_each_record(|rev, record| {
        let (tombstone, kv) = match record {
            Record::Put(kv) => (
                false,
                mvccpb::KeyValue {
                    key: kv.key,
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                    version: kv.version,
                    value: kv.value,
                    lease: leasehold_raft::LeaseId::to_wire(kv.lease),
                },
            ),
            // etcd marks a delete with a version holding the key alone.
            Record::Tombstone { key } => (
                true,
                mvccpb::KeyValue {
                    key,
                    ..Default::default()
                },
            ),
        };
        exported.records += 1;
        bucket
            .put(&layout::revision_key(rev, tombstone), &kv.encode_to_vec())
            .map_err(format)
    })?;
    bucket.finish().map_err(format)?;

    let mut bucket = file.bucket(layout::LEASE).map_err(format)?;
    view.for_each_lease(|id, lease| {
        let left_ms = lease.deadline_ms.saturating_sub(view.lease_time_ms);
        let row = leasepb::Lease {
            id: id.get(),
            ttl: lease.ttl_secs,
            // Whole seconds, rounded up: a lease with time left never reads as expired.
            remaining_ttl: i64::try_from(left_ms.div_ceil(1000)).unwrap_or(i64::MAX),
        };
        exported.leases += 1;
        bucket
            .put(&(id.get() as u64).to_be_bytes(), &row.encode_to_vec())
            .map_err(format)
    })?;
    bucket.finish().map_err(format)?;

    let mut bucket = file.bucket(layout::MEMBERS).map_err(format)?;
    let mut members = view.members.clone();
    members.sort_by_key(|m| format!("{:x}", m.id));
    for member in &members {
        let row = layout::MemberRow {
            id: member.id,
            peer_urls: vec![member.peer_url.as_str()],
            is_learner: member.learner,
            name: member.published.as_ref().map_or("", |p| p.name.as_str()),
            client_urls: member
                .published
                .as_ref()
                .map(|p| p.client_urls.as_slice())
                .filter(|urls| !urls.is_empty()),
        };
        let json = serde_json::to_vec(&row).map_err(io::Error::other)?;
        bucket
            .put(format!("{:x}", member.id).as_bytes(), &json)
            .map_err(format)?;
    }
    bucket.finish().map_err(format)?;

    let mut meta: Vec<(&[u8], Vec<u8>)> = vec![
        (
            layout::CONSISTENT_INDEX,
            view.applied_index.to_be_bytes().to_vec(),
        ),
        (layout::TERM, view.applied_term.to_be_bytes().to_vec()),
        (
            layout::STORAGE_VERSION,
            layout::STORAGE_SCHEMA.as_bytes().to_vec(),
        ),
    ];
    if view.compact_revision > 0 {
        let rev = leasehold_mvcc::Revision {
            main: view.compact_revision,
            sub: 0,
        };
        meta.push((
            layout::FINISHED_COMPACT_REV,
            layout::revision_key(rev, false),
        ));
        meta.push((
            layout::SCHEDULED_COMPACT_REV,
            layout::revision_key(rev, false),
        ));
    }
    meta.sort();
    let mut bucket = file.bucket(layout::META).map_err(format)?;
    for (key, value) in &meta {
        bucket.put(key, value).map_err(format)?;
    }
    bucket.finish().map_err(format)?;

    let out = file.finish(view.applied_index.max(1)).map_err(format)?;
    Ok((out, exported))
}

/// The bbolt writer's refusals and failures, as I/O errors.
fn format(e: leasehold_bbolt::Error) -> io::Error {
    io::Error::other(e)
}

fn alarm_type(alarm: Alarm) -> etcdserverpb::AlarmType {
    match alarm {
        Alarm::NoSpace => etcdserverpb::AlarmType::Nospace,
        Alarm::Corrupt => etcdserverpb::AlarmType::Corrupt,
    }
}

/// The `auth`, `authRoles` and `authUsers` buckets.
fn write_auth<W: Write + Seek>(file: &mut Writer<W>, auth: &AuthState) -> io::Result<()> {
    let mut bucket = file.bucket(layout::AUTH).map_err(format)?;
    bucket
        .put(layout::AUTH_ENABLED, &[u8::from(auth.enabled)])
        .map_err(format)?;
    bucket
        .put(layout::AUTH_REVISION, &auth.revision.to_be_bytes())
        .map_err(format)?;
    bucket.finish().map_err(format)?;

    let mut bucket = file.bucket(layout::AUTH_ROLES).map_err(format)?;
    for (name, role) in &auth.roles {
        let row = authpb::Role {
            name: name.as_bytes().to_vec(),
            key_permission: role
                .perms
                .iter()
                .map(|p| authpb::Permission {
                    perm_type: perm_type(p.kind) as i32,
                    key: p.key.clone(),
                    range_end: p.range_end.clone(),
                    lease: p.lease.unwrap_or(0),
                })
                .collect(),
        };
        bucket
            .put(name.as_bytes(), &row.encode_to_vec())
            .map_err(format)?;
    }
    bucket.finish().map_err(format)?;

    let mut bucket = file.bucket(layout::AUTH_USERS).map_err(format)?;
    for (name, user) in &auth.users {
        let row = authpb::User {
            name: name.as_bytes().to_vec(),
            password: user
                .password_hash
                .as_deref()
                .unwrap_or("")
                .as_bytes()
                .to_vec(),
            roles: user.roles.clone(),
            options: user
                .password_hash
                .is_none()
                .then_some(authpb::UserAddOptions { no_password: true }),
        };
        bucket
            .put(name.as_bytes(), &row.encode_to_vec())
            .map_err(format)?;
    }
    bucket.finish().map_err(format)
}

pub(crate) fn perm_type(kind: PermKind) -> authpb::permission::Type {
    match kind {
        PermKind::Read => authpb::permission::Type::Read,
        PermKind::Write => authpb::permission::Type::Write,
        PermKind::ReadWrite => authpb::permission::Type::Readwrite,
    }
}
