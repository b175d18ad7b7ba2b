//! Reading and writing files in bbolt's on-disk format (go.etcd.io/bbolt v1.3.x), which is the
//! format of etcd's backend database and of its snapshot files.
//!
//! - [`Writer`] streams a new file: top-level buckets in name order, entries in key order, in
//!   memory proportional to the tree depth rather than the data. The result passes bbolt's
//!   `Tx.Check` (every page below the high-water mark is in use) and has an empty freelist.
//! - [`Db`] opens an existing file and reads its pages on demand; [`Bucket`] iterates a bucket's
//!   entries in key order. Corrupt files give an [`Error`], never a panic or an endless loop.
//!
//! ```
//! use std::io::Cursor;
//! use leasehold_bbolt::{Db, Writer};
//!
//! let mut writer = Writer::new(Cursor::new(Vec::new()));
//! let mut bucket = writer.bucket(b"key")?;
//! bucket.put(b"a", b"1")?;
//! bucket.put(b"b", b"2")?;
//! bucket.finish()?;
//! let file = writer.finish(1)?.into_inner();
//!
//! let db = Db::from_reader(Cursor::new(file))?;
//! assert_eq!(db.bucket_names()?, vec![b"key".to_vec()]);
//! let mut entries = Vec::new();
//! db.bucket(b"key")?.unwrap().for_each(|k, v| entries.push((k.to_vec(), v.to_vec())))?;
//! assert_eq!(entries.len(), 2);
//! # Ok::<(), leasehold_bbolt::Error>(())
//! ```
//!
//! Only what etcd needs is supported: the writer makes top-level buckets only (the reader also
//! walks nested ones), and nothing is modified in place.

mod builder;
mod check;
mod error;
mod format;
mod limits;
mod page;
mod reader;
#[cfg(test)]
mod testutil;
mod walk;
mod writer;

pub use error::Error;
pub use format::DEFAULT_PAGE_SIZE;
pub use limits::{MAX_KEY_SIZE, MAX_VALUE_SIZE};
pub use reader::{Bucket, Db, Entry};
pub use writer::{BucketWriter, Writer};
