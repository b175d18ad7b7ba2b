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
        let mut reader = FileReader { db, view: None };
        reader.retrying(|_| Ok(()))?;
        Ok(Box::new(reader))
    }
}

/// How many rows a [`FileReader`] steps past on its walk to the next one it wants before it
/// looks that one up instead.
const WALK_STEPS_MAX: usize = 8;

/// How many times a read opens the file again when it finds it refusing reads: a write that
/// failed (a full disk's checkpoint, tried again and again) leaves redb refusing every read
/// until the file is opened again, and another may fail between that and the read.
const REOPENS_MAX: usize = 3;

/// A walk through `kv`'s rows in revision order.
type Rows = redb::Range<'static, [u8; 16], &'static [u8]>;

/// Reads released values: one read transaction's view of `kv`, opened again (a newer view) only
/// when the file refused it.
struct FileReader {
    db: Arc<Db>,
    view: Option<View>,
}

/// One read transaction's view of `kv`.
struct View {
    table: redb::ReadOnlyTable<[u8; 16], &'static [u8]>,
    /// The rows after the last one read, and that one's key: reads in revision order (a range
    /// of keys written together, as most are; a hash) walk on from it rather than descend the
    /// tree for each row.
    walk: Option<(Rows, [u8; 16])>,
    /// Counted among the transactions a defragmentation (or a reopening) waits out, until the
    /// view is dropped.
    _txn: Txn<redb::ReadTransaction>,
}

/// Why a read of the file failed.
enum Failed {
    /// The file refuses reads since a write failed: it must be opened again.
    Refused,
    Other(String),
}

impl From<redb::StorageError> for Failed {
    fn from(e: redb::StorageError) -> Failed {
        match e {
            redb::StorageError::PreviousIo => Failed::Refused,
            e => Failed::Other(e.to_string()),
        }
    }
}

impl FileReader {
    /// `read` on the view (opened if there is none), opening the file again and retrying when
    /// the file refuses it.
    fn retrying<T>(
        &mut self,
        mut read: impl FnMut(&mut View) -> Result<T, Failed>,
    ) -> Result<T, String> {
        let mut reopens = 0;
        loop {
            let result = match self.view() {
                Ok(view) => read(view),
                Err(e) => Err(e),
            };
            match result {
                Ok(value) => return Ok(value),
                Err(Failed::Refused) if reopens < REOPENS_MAX => {
                    // The transaction goes first: opening the file again waits for it.
                    self.view = None;
                    self.db.reopen_before_next_read();
                    reopens += 1;
                }
                Err(Failed::Refused) => {
                    return Err(redb::StorageError::PreviousIo.to_string());
                }
                Err(Failed::Other(e)) => return Err(e),
            }
        }
    }

    fn view(&mut self) -> Result<&mut View, Failed> {
        if self.view.is_none() {
            let txn = self
                .db
                .begin_read_reopened("a released value")
                .map_err(|e| Failed::Other(e.to_string()))?;
            let table = txn.open_table(KV).map_err(|e| match e {
                redb::TableError::Storage(e) => Failed::from(e),
                e => Failed::Other(e.to_string()),
            })?;
            self.view = Some(View {
                table,
                walk: None,
                _txn: txn,
            });
        }
        Ok(self.view.as_mut().expect("opened above"))
    }
}

impl ValueReader for FileReader {
    fn read(&mut self, rev: Revision) -> Result<Bytes, String> {
        self.retrying(|view| view.read(rev))
    }
}

impl View {
    fn read(&mut self, rev: Revision) -> Result<Bytes, Failed> {
        let want = rev.to_bytes();
        if let Some((walk, last)) = &mut self.walk
            && *last < want
        {
            for row in walk.by_ref().take(WALK_STEPS_MAX) {
                let (key, value) = row?;
                *last = key.value();
                match (*last).cmp(&want) {
                    Ordering::Less => {}
                    Ordering::Equal => return value_in(rev, value.value()),
                    // The walk went from below it to past it: it has no row.
                    Ordering::Greater => return Err(Failed::Other(no_row(rev))),
                }
            }
        }
        // Too far on, behind, or the first read: a walk from this row.
        let mut walk = self.table.range(want..)?;
        let (key, value) = walk.next().ok_or_else(|| Failed::Other(no_row(rev)))??;
        if key.value() != want {
            return Err(Failed::Other(no_row(rev)));
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
fn value_in(rev: Revision, row: &[u8]) -> Result<Bytes, Failed> {
    match decode::<Record>("kv", row).map_err(|e| Failed::Other(e.to_string()))? {
        Record::Put(kv) => Ok(kv.value),
        Record::Tombstone { .. } => Err(Failed::Other(format!(
            "the row at revision {}/{} is a tombstone",
            rev.main, rev.sub
        ))),
    }
}
