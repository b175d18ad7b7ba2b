//! The on-disk layout in one redb database (see docs/storage-format.md). The Raft log and the
//! state machine share the file, which is what makes the group commit safe: state-machine commits
//! are made without fsync and become durable with the next fsync'd log commit; a crash rolls the
//! state machine back to an earlier applied index, and openraft re-applies from the log, which
//! still holds every entry above it (a purge is itself an fsync'd commit).

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Raft log entries by index: postcard-encoded `openraft::Entry`.
pub(crate) const RAFT_LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Raft's own durable state: `vote`, `committed`, `last_purged`.
pub(crate) const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
/// Every stored version of every key, by revision (`main` then `sub`, big-endian).
pub(crate) const KV: TableDefinition<[u8; 16], &[u8]> = TableDefinition::new("kv");
/// State-machine metadata: `last_applied`, `membership`, `current_revision`,
/// `compact_revision`.
pub(crate) const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");

/// The storage format version, stored under `format` in `SM_META`.
pub(crate) const FORMAT_VERSION: u32 = 1;

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("in-memory serialization cannot fail")
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, std::io::Error> {
    postcard::from_bytes(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

pub(crate) fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Opens (or creates) the database under `dir` and makes sure every table exists, so that
/// readers never meet a missing table.
pub fn open(dir: &Path) -> Result<Arc<Database>, std::io::Error> {
    std::fs::create_dir_all(dir)?;
    let db = Database::create(dir.join("leasehold.redb")).map_err(io_err)?;
    let txn = db.begin_write().map_err(io_err)?;
    {
        txn.open_table(RAFT_LOG).map_err(io_err)?;
        txn.open_table(RAFT_META).map_err(io_err)?;
        txn.open_table(KV).map_err(io_err)?;
        let mut meta = txn.open_table(SM_META).map_err(io_err)?;
        let format = meta
            .get("format")
            .map_err(io_err)?
            .map(|v| decode::<u32>(v.value()));
        match format {
            None => {
                meta.insert("format", encode(&FORMAT_VERSION).as_slice())
                    .map_err(io_err)?;
            }
            Some(Ok(FORMAT_VERSION)) => {}
            Some(other) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "unsupported storage format {other:?}; this build reads {FORMAT_VERSION}"
                    ),
                ));
            }
        }
    }
    txn.commit().map_err(io_err)?;
    let _ = db.begin_read().map_err(io_err)?;
    Ok(Arc::new(db))
}
