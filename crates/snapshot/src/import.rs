//! An etcd backend file (leasehold's snapshot or etcd's) read back as leasehold's state: the
//! versions, the compaction point, leases with their remaining time, alarms and the auth store.
//! Every row is checked as it is decoded; a row that does not decode, or that contradicts its
//! key, fails the import with what and where.

use std::collections::BTreeMap;

use leasehold_api::{authpb, etcdserverpb, leasepb, mvccpb};
use leasehold_auth::{AuthState, PermKind, Permission, Role, User};
use std::fs::File;

use leasehold_bbolt::{Db as Bbolt, Entry};

type Db = Bbolt<File>;
use leasehold_mvcc::{KeyValue, Record};
use leasehold_raft::{Alarm, AlarmMember, ImportedLease, ImportedState, LeaseId, RecordSink};
use prost::Message as _;

use crate::SnapshotError;
use crate::layout;

/// Reads everything but the versions, which [`for_each_record`] streams.
pub fn read_state(db: &Db) -> Result<ImportedState, SnapshotError> {
    Ok(ImportedState {
        compact_revision: compact_revision(db)?,
        leases: leases(db)?,
        alarms: alarms(db)?,
        auth: auth(db)?,
    })
}

fn bad(bucket: &[u8], key: &[u8], problem: impl Into<String>) -> SnapshotError {
    SnapshotError::BadRow {
        bucket: String::from_utf8_lossy(bucket).into_owned(),
        key: key.to_vec(),
        problem: problem.into(),
    }
}

/// Every row of `bucket` (none if it is missing), each through `f`.
fn rows(
    db: &Db,
    bucket: &[u8],
    mut f: impl FnMut(&[u8], &[u8]) -> Result<(), SnapshotError>,
) -> Result<(), SnapshotError> {
    let Some(b) = db.bucket(bucket)? else {
        return Ok(());
    };
    b.try_for_each(|k, entry| match entry {
        Entry::Value(v) => f(k, v),
        // etcd keeps no nested buckets.
        Entry::Bucket => Err(bad(bucket, k, "a nested bucket")),
    })
}

/// etcd's finished compaction (a scheduled one that did not finish is not taken: its versions
/// are all still there).
fn compact_revision(db: &Db) -> Result<i64, SnapshotError> {
    let mut rev = 0;
    rows(db, layout::META, |k, v| {
        if k == layout::FINISHED_COMPACT_REV {
            let (r, _) = layout::parse_revision_key(v)
                .ok_or_else(|| bad(layout::META, k, "not a revision"))?;
            rev = r.main;
        }
        Ok(())
    })?;
    Ok(rev)
}

fn leases(db: &Db) -> Result<Vec<ImportedLease>, SnapshotError> {
    let mut out = Vec::new();
    rows(db, layout::LEASE, |k, v| {
        let row = leasepb::Lease::decode(v).map_err(|e| bad(layout::LEASE, k, e.to_string()))?;
        let id = LeaseId::from_wire(row.id).ok_or_else(|| bad(layout::LEASE, k, "lease id 0"))?;
        if row.ttl <= 0 {
            return Err(bad(layout::LEASE, k, format!("TTL {}", row.ttl)));
        }
        out.push(ImportedLease {
            id,
            ttl_secs: row.ttl,
            // etcd writes what was left only when it checkpoints; otherwise the whole TTL.
            remaining_secs: if row.remaining_ttl > 0 {
                row.remaining_ttl.min(row.ttl)
            } else {
                row.ttl
            },
        });
        Ok(())
    })?;
    Ok(out)
}

fn alarms(db: &Db) -> Result<Vec<AlarmMember>, SnapshotError> {
    let mut out = Vec::new();
    rows(db, layout::ALARM, |k, _| {
        let row = etcdserverpb::AlarmMember::decode(k)
            .map_err(|e| bad(layout::ALARM, k, e.to_string()))?;
        let alarm = match etcdserverpb::AlarmType::try_from(row.alarm) {
            Ok(etcdserverpb::AlarmType::Nospace) => Alarm::NoSpace,
            Ok(etcdserverpb::AlarmType::Corrupt) => Alarm::Corrupt,
            _ => return Err(bad(layout::ALARM, k, format!("alarm type {}", row.alarm))),
        };
        out.push(AlarmMember {
            member: row.member_id,
            alarm,
        });
        Ok(())
    })?;
    Ok(out)
}

fn auth(db: &Db) -> Result<AuthState, SnapshotError> {
    let mut state = AuthState::default();
    rows(db, layout::AUTH, |k, v| {
        if k == layout::AUTH_ENABLED {
            state.enabled = v == [1];
        } else if k == layout::AUTH_REVISION {
            let bytes: [u8; 8] = v
                .try_into()
                .map_err(|_| bad(layout::AUTH, k, "not 8 bytes"))?;
            state.revision = u64::from_be_bytes(bytes);
        }
        Ok(())
    })?;
    let mut roles = BTreeMap::new();
    rows(db, layout::AUTH_ROLES, |k, v| {
        let row = authpb::Role::decode(v).map_err(|e| bad(layout::AUTH_ROLES, k, e.to_string()))?;
        let name = utf8(layout::AUTH_ROLES, k, row.name)?;
        let perms = row
            .key_permission
            .into_iter()
            .map(|p| {
                Ok(Permission {
                    kind: perm_kind(p.perm_type)
                        .ok_or_else(|| bad(layout::AUTH_ROLES, k, "unknown permission type"))?,
                    key: p.key,
                    range_end: p.range_end,
                    lease: (p.lease != 0).then_some(p.lease),
                })
            })
            .collect::<Result<Vec<_>, SnapshotError>>()?;
        roles.insert(name, Role { perms });
        Ok(())
    })?;
    let mut users = BTreeMap::new();
    rows(db, layout::AUTH_USERS, |k, v| {
        let row = authpb::User::decode(v).map_err(|e| bad(layout::AUTH_USERS, k, e.to_string()))?;
        let name = utf8(layout::AUTH_USERS, k, row.name)?;
        let no_password = row.options.is_some_and(|o| o.no_password) || row.password.is_empty();
        let password_hash = if no_password {
            None
        } else {
            Some(utf8(layout::AUTH_USERS, k, row.password)?)
        };
        let mut user_roles = row.roles;
        user_roles.sort();
        user_roles.dedup();
        users.insert(
            name,
            User {
                password_hash,
                roles: user_roles,
            },
        );
        Ok(())
    })?;
    state.roles = roles;
    state.users = users;
    Ok(state)
}

fn utf8(bucket: &[u8], key: &[u8], bytes: Vec<u8>) -> Result<String, SnapshotError> {
    String::from_utf8(bytes).map_err(|_| bad(bucket, key, "not UTF-8"))
}

fn perm_kind(wire: i32) -> Option<PermKind> {
    match authpb::permission::Type::try_from(wire).ok()? {
        authpb::permission::Type::Read => Some(PermKind::Read),
        authpb::permission::Type::Write => Some(PermKind::Write),
        authpb::permission::Type::Readwrite => Some(PermKind::ReadWrite),
    }
}

/// Every version of the `key` bucket, in revision order, into `sink`, each checked against its
/// key: a put's `mod_revision` is its revision, its create revision is not later, its version is
/// positive.
pub fn for_each_record(db: &Db, sink: &mut RecordSink<'_>) -> Result<(), SnapshotError> {
    rows(db, layout::KEY, |k, v| {
        let (rev, tombstone) =
            layout::parse_revision_key(k).ok_or_else(|| bad(layout::KEY, k, "not a revision"))?;
        let kv = mvccpb::KeyValue::decode(v).map_err(|e| bad(layout::KEY, k, e.to_string()))?;
        if kv.key.is_empty() {
            return Err(bad(layout::KEY, k, "empty key"));
        }
        let record = if tombstone {
            Record::Tombstone { key: kv.key }
        } else {
            if kv.mod_revision != rev.main
                || kv.create_revision < 1
                || kv.create_revision > rev.main
                || kv.version < 1
            {
                return Err(bad(
                    layout::KEY,
                    k,
                    format!(
                        "create revision {}, mod revision {}, version {} at revision {}",
                        kv.create_revision, kv.mod_revision, kv.version, rev.main
                    ),
                ));
            }
            Record::Put(KeyValue {
                key: kv.key,
                create_revision: kv.create_revision,
                mod_revision: kv.mod_revision,
                version: kv.version,
                value: kv.value,
                lease: LeaseId::from_wire(kv.lease),
            })
        };
        sink(rev, record).map_err(SnapshotError::Io)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_bbolt::Writer;
    use leasehold_mvcc::Revision;

    /// A bucket's name and rows.
    type Rows<'a> = (&'a [u8], Vec<(Vec<u8>, Vec<u8>)>);

    /// A backend file of `buckets` (buckets and rows in byte order).
    fn file(buckets: &[Rows<'_>]) -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("db");
        let mut writer = Writer::new(std::fs::File::create(&path).expect("create"));
        for (name, rows) in buckets {
            let mut bucket = writer.bucket(name).expect("bucket");
            for (k, v) in rows {
                bucket.put(k, v).expect("put");
            }
            bucket.finish().expect("finish");
        }
        writer.finish(1).expect("finish file");
        let db = Bbolt::open(&path).expect("open");
        (dir, db)
    }

    fn lease(id: i64, ttl: i64, remaining_ttl: i64) -> (Vec<u8>, Vec<u8>) {
        let row = leasepb::Lease {
            id,
            ttl,
            remaining_ttl,
        };
        ((id as u64).to_be_bytes().to_vec(), row.encode_to_vec())
    }

    #[test]
    fn a_lease_keeps_its_remaining_time_or_gets_its_ttl_when_none_was_recorded() {
        let (_dir, db) = file(&[(
            layout::LEASE,
            vec![lease(1, 600, 17), lease(2, 600, 0), lease(3, 60, 900)],
        )]);
        let state = read_state(&db).expect("read");
        let left: Vec<(i64, i64, i64)> = state
            .leases
            .iter()
            .map(|l| (l.id.get(), l.ttl_secs, l.remaining_secs))
            .collect();
        // Never more than the TTL.
        assert_eq!(left, vec![(1, 600, 17), (2, 600, 600), (3, 60, 60)]);
    }

    #[test]
    fn compaction_point_is_the_finished_one() {
        let rev = |main| layout::revision_key(Revision { main, sub: 0 }, false);
        let (_dir, db) = file(&[(
            layout::META,
            vec![
                (layout::FINISHED_COMPACT_REV.to_vec(), rev(7)),
                (layout::SCHEDULED_COMPACT_REV.to_vec(), rev(9)),
            ],
        )]);
        assert_eq!(read_state(&db).expect("read").compact_revision, 7);
    }

    fn put_row(main: i64, kv: mvccpb::KeyValue) -> (Vec<u8>, Vec<u8>) {
        (
            layout::revision_key(Revision { main, sub: 0 }, false),
            kv.encode_to_vec(),
        )
    }

    fn records(db: &Db) -> Result<Vec<(Revision, Record)>, SnapshotError> {
        let mut out = Vec::new();
        for_each_record(db, &mut |rev, record| {
            out.push((rev, record));
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn versions_come_back_as_puts_and_tombstones() {
        let kv = mvccpb::KeyValue {
            key: b"a".to_vec(),
            create_revision: 2,
            mod_revision: 2,
            version: 1,
            value: b"v".to_vec().into(),
            lease: 5,
        };
        let tombstone = (
            layout::revision_key(Revision { main: 3, sub: 0 }, true),
            mvccpb::KeyValue {
                key: b"a".to_vec(),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let (_dir, db) = file(&[(layout::KEY, vec![put_row(2, kv), tombstone])]);
        let got = records(&db).expect("records");
        assert_eq!(got.len(), 2);
        match &got[0].1 {
            Record::Put(kv) => {
                assert_eq!(kv.lease.map(LeaseId::get), Some(5));
                assert_eq!(kv.value, &b"v"[..]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&got[1].1, Record::Tombstone { key } if key == b"a"));
    }

    #[test]
    fn a_version_that_contradicts_its_revision_is_refused_with_where() {
        let kv = mvccpb::KeyValue {
            key: b"a".to_vec(),
            create_revision: 2,
            mod_revision: 9,
            version: 1,
            ..Default::default()
        };
        let (_dir, db) = file(&[(layout::KEY, vec![put_row(2, kv)])]);
        let err = records(&db).expect_err("refused").to_string();
        assert!(err.starts_with("snapshot row key/"), "{err}");
        assert!(err.contains("mod revision 9"), "{err}");
        let (_dir, db) = file(&[(layout::KEY, vec![(b"nonsense".to_vec(), vec![])])]);
        assert!(records(&db).is_err());
        let (_dir, db) = file(&[(layout::LEASE, vec![(vec![0; 8], vec![0xff])])]);
        assert!(read_state(&db).is_err());
    }
}
