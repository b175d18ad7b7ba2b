//! etcd's snapshot file, both ways.
//!
//! A snapshot is etcd's backend, a bbolt file in etcd's bucket layout (`layout.rs`), followed
//! by the SHA-256 of the file. [`build`] writes leasehold's state that way (`export.rs`), from a
//! [`StateView`], into an unnamed temporary file, and [`Backend::chunks`] sends it as etcd's
//! Maintenance.Snapshot does: 32 KiB pieces, each with the bytes that remain, then the hash.
//! [`restore`] reads such a file, leasehold's or etcd's (`import.rs`), checks its hash as
//! `etcdctl snapshot restore` does, and makes a new member's data dir of it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use leasehold_raft::{RestoreError, Restored, StateView};
use sha2::{Digest, Sha256};

mod export;
mod import;
pub mod layout;

pub use export::Exported;

/// The size of the SHA-256 etcd appends to a snapshot.
const HASH_LEN: u64 = 32;

/// How etcd sends a snapshot: pieces of 32 KiB.
pub const CHUNK_LEN: usize = 32 * 1024;

/// Why a snapshot could not be read or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Format(#[from] leasehold_bbolt::Error),
    /// etcd's words.
    #[error("snapshot missing hash but --skip-hash-check=false")]
    MissingHash,
    /// etcd's words (Go prints byte slices as decimal lists).
    #[error("expected sha256 {}, got {}", go_bytes(.expected), go_bytes(.got))]
    HashMismatch { expected: Vec<u8>, got: Vec<u8> },
    #[error("snapshot row {bucket}/{}: {problem}", hex(.key))]
    BadRow {
        bucket: String,
        key: Vec<u8>,
        problem: String,
    },
    #[error("{0}")]
    Restore(#[from] RestoreError),
}

fn go_bytes(bytes: &[u8]) -> String {
    let parts: Vec<String> = bytes.iter().map(u8::to_string).collect();
    format!("[{}]", parts.join(" "))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A snapshot's backend file, written and ready to send.
pub struct Backend {
    file: File,
    size: u64,
    pub exported: Exported,
}

/// Writes `view` as etcd's backend into an unnamed temporary file in `temp_dir` (gone when
/// dropped). Blocking; writes to the store go on meanwhile (the view is a read transaction).
pub fn build(view: &StateView, temp_dir: &Path) -> io::Result<Backend> {
    let file = tempfile::tempfile_in(temp_dir)?;
    let (mut file, exported) = export::write_backend(view, file)?;
    let size = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(0))?;
    Ok(Backend {
        file,
        size,
        exported,
    })
}

impl Backend {
    /// The backend file's size (without the hash).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The file in pieces as etcd sends them: each piece with the bytes of the file that remain
    /// after it, then the file's SHA-256 with 0 remaining. Blocking reads.
    pub fn chunks(self) -> Chunks {
        Chunks {
            file: self.file,
            remaining: self.size,
            hash: Some(Sha256::new()),
        }
    }
}

/// See [`Backend::chunks`].
pub struct Chunks {
    file: File,
    remaining: u64,
    /// `None` once the hash was given.
    hash: Option<Sha256>,
}

impl Iterator for Chunks {
    /// A piece and the bytes that remain after it.
    type Item = io::Result<(Vec<u8>, u64)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return self.hash.take().map(|h| Ok((h.finalize().to_vec(), 0)));
        }
        let len = usize::try_from(self.remaining).map_or(CHUNK_LEN, |r| r.min(CHUNK_LEN));
        let mut piece = vec![0; len];
        if let Err(e) = self.file.read_exact(&mut piece) {
            self.remaining = 0;
            self.hash = None;
            return Some(Err(e));
        }
        self.remaining -= len as u64;
        if let Some(h) = &mut self.hash {
            h.update(&piece);
        }
        Some(Ok((piece, self.remaining)))
    }
}

/// Checks the SHA-256 etcd appends, as `etcdctl snapshot restore` does: a file whose size is
/// 32 bytes past a multiple of 512 carries one (bbolt files are whole pages).
fn check_hash(path: &Path, skip: bool) -> Result<(), SnapshotError> {
    let mut file = File::open(path)?;
    let size = file.metadata()?.len();
    let has_hash = size % 512 == HASH_LEN;
    if skip {
        return Ok(());
    }
    if !has_hash {
        return Err(SnapshotError::MissingHash);
    }
    let mut hasher = Sha256::new();
    io::copy(&mut (&mut file).take(size - HASH_LEN), &mut hasher)?;
    let mut expected = vec![0; HASH_LEN as usize];
    file.read_exact(&mut expected)?;
    let got = hasher.finalize().to_vec();
    if got != expected {
        return Err(SnapshotError::HashMismatch { expected, got });
    }
    Ok(())
}

/// Makes `data_dir` a member of a new cluster of `members` (id → peer URL) holding the state of
/// the snapshot at `path` (leasehold's or etcd's): every version, the compaction point, leases
/// with their remaining time, alarms, users and roles. Refuses a data dir that is not empty and
/// leaves nothing behind when it fails. Blocking.
pub fn restore(
    path: &Path,
    data_dir: &Path,
    members: &BTreeMap<u64, String>,
    skip_hash_check: bool,
) -> Result<Restored, SnapshotError> {
    check_hash(path, skip_hash_check)?;
    let db = leasehold_bbolt::Db::open(path)?;
    // bbolt's own consistency check first (every page reachable once, none freed and used), so
    // a damaged file is refused before anything is written.
    db.check()?;
    let state = import::read_state(&db)?;
    let mut failed: Option<SnapshotError> = None;
    let restored = leasehold_raft::restore_data_dir(data_dir, members, &state, |sink| {
        import::for_each_record(&db, sink).map_err(|e| {
            let text = e.to_string();
            failed = Some(e);
            io::Error::other(text)
        })
    });
    match (restored, failed) {
        (_, Some(e)) => Err(e),
        (Ok(restored), None) => Ok(restored),
        (Err(e), None) => Err(e.into()),
    }
}
