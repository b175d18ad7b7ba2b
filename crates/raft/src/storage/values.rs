//! The values the state machine released from memory, read back from the file's `kv` table
//! (`leasehold_mvcc::Store::release_values`). A value is released only once the checkpoint that
//! wrote its row is durable ([`Db::durable_revision`]), and its row leaves the file only after a
//! compaction removed the version from memory, so every value the store asks for is there.

use std::cmp::Ordering;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use leasehold_mvcc::{Record, Revision, ValueReader, ValueSource};

use super::{Db, KV, Txn, decode};

/// How many bytes of values the state machine keeps in memory past their checkpoint: the
/// newest ones, which watches, reads of keys just written and a txn's compare most likely ask
/// for.
pub(crate) const VALUES_HELD_BYTES: usize = 4 << 20;

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
    fn reader(&self) -> Result<Box<dyn ValueReader + Send>, String> {
        let db = self.db.upgrade().ok_or("the database is closed")?;
        let txn = db
            .begin_read_reopened("a released value")
            .map_err(|e| e.to_string())?;
        let table = txn.open_table(KV).map_err(|e| e.to_string())?;
        Ok(Box::new(FileReader {
            table,
            walk: None,
            _txn: txn,
            _db: db,
        }))
    }
}

/// How many rows a [`FileReader`] steps past on its walk to the next one it wants before it
/// looks that one up instead.
const WALK_STEPS_MAX: usize = 8;

/// A walk through `kv`'s rows in revision order.
type Rows = redb::Range<'static, [u8; 16], &'static [u8]>;

/// One read transaction's view of `kv`.
struct FileReader {
    table: redb::ReadOnlyTable<[u8; 16], &'static [u8]>,
    /// The rows after the last one read, and that one's key: reads in revision order (a range
    /// of keys written together, as most are; a hash) walk on from it rather than descend the
    /// tree for each row.
    walk: Option<(Rows, [u8; 16])>,
    /// Counted among the transactions a defragmentation waits out, until the reader is done.
    _txn: Txn<redb::ReadTransaction>,
    _db: Arc<Db>,
}

impl ValueReader for FileReader {
    fn read(&mut self, rev: Revision) -> Result<Bytes, String> {
        let want = rev.to_bytes();
        if let Some((walk, last)) = &mut self.walk
            && *last < want
        {
            for row in walk.by_ref().take(WALK_STEPS_MAX) {
                let (key, value) = row.map_err(|e| e.to_string())?;
                *last = key.value();
                match (*last).cmp(&want) {
                    Ordering::Less => {}
                    Ordering::Equal => return value_in(rev, value.value()),
                    // The walk went from below it to past it: it has no row.
                    Ordering::Greater => return Err(no_row(rev)),
                }
            }
        }
        // Too far on, behind, or the first read: a walk from this row.
        let mut walk = self.table.range(want..).map_err(|e| e.to_string())?;
        let (key, value) = walk
            .next()
            .ok_or_else(|| no_row(rev))?
            .map_err(|e| e.to_string())?;
        if key.value() != want {
            return Err(no_row(rev));
        }
        let value = value_in(rev, value.value())?;
        self.walk = Some((walk, want));
        Ok(value)
    }
}

fn no_row(rev: Revision) -> String {
    format!("no row at revision {}/{}", rev.main, rev.sub)
}

/// The value a `kv` row at `rev` holds.
fn value_in(rev: Revision, row: &[u8]) -> Result<Bytes, String> {
    match decode::<Record>("kv", row).map_err(|e| e.to_string())? {
        Record::Put(kv) => Ok(kv.value),
        Record::Tombstone { .. } => Err(format!(
            "the row at revision {}/{} is a tombstone",
            rev.main, rev.sub
        )),
    }
}
