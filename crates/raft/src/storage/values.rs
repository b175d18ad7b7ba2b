//! The values the state machine released from memory, read back from the file's `kv` table
//! (`leasehold_mvcc::Store::release_values`). A value is released only once the checkpoint that
//! wrote its row is durable ([`Db::durable_revision`]), and its row leaves the file only after a
//! compaction removed the version from memory, so every value the store asks for is there.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use leasehold_mvcc::{Record, Revision, ValueReader, ValueSource};

use super::{Db, KV, Txn, decode};

/// How many bytes of superseded values the state machine keeps in memory past their checkpoint:
/// the newest ones, which a watch's previous values and a read at a recent revision most likely
/// ask for.
pub(crate) const SUPERSEDED_HELD_BYTES: usize = 4 << 20;

/// Reads released values from the file. Holds the database weakly: the state machine must not
/// keep the file open after the member lets go of it (a restart in the same process waits for
/// the file to close).
#[derive(Debug)]
pub(crate) struct FileValues {
    db: Weak<Db>,
}

impl FileValues {
    pub(crate) fn new(db: Weak<Db>) -> FileValues {
        FileValues { db }
    }
}

impl ValueSource for FileValues {
    fn reader(&self) -> Result<Box<dyn ValueReader + '_>, String> {
        let db = self.db.upgrade().ok_or("the database is closed")?;
        let txn = db
            .begin_read_reopened("a released value")
            .map_err(|e| e.to_string())?;
        let table = txn.open_table(KV).map_err(|e| e.to_string())?;
        Ok(Box::new(FileReader {
            table,
            _txn: txn,
            _db: db,
        }))
    }
}

/// One read transaction's view of `kv`.
struct FileReader {
    table: redb::ReadOnlyTable<[u8; 16], &'static [u8]>,
    /// Counted among the transactions a defragmentation waits out, until the reader is done.
    _txn: Txn<redb::ReadTransaction>,
    _db: Arc<Db>,
}

impl ValueReader for FileReader {
    fn read(&mut self, rev: Revision) -> Result<Bytes, String> {
        let row = self
            .table
            .get(rev.to_bytes())
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no row at revision {}/{}", rev.main, rev.sub))?;
        match decode::<Record>("kv", row.value()).map_err(|e| e.to_string())? {
            Record::Put(kv) => Ok(kv.value),
            Record::Tombstone { .. } => Err(format!(
                "the row at revision {}/{} is a tombstone",
                rev.main, rev.sub
            )),
        }
    }
}
