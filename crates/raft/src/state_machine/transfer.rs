//! A snapshot for a follower as a file, so that neither end holds the state in memory.
//!
//! ```text
//!   leader:   redb rows ─► write_outgoing ─► <dir>/snap-out/<term>-<index>.lhsnap
//!             Raft's MsgSnapshot carries only a SnapshotRef (the file's name, length, CRC)
//!   follower: receive (the peer transport streams the file) ─► <dir>/snap-in/…  ─► Raft steps
//!             the message ─► install_file: the rows into redb in one transaction, the state
//!             loaded from the file as at a start
//! ```
//!
//! The file: [`FILE_MAGIC`], then frames (a tag byte, a little-endian `u32` length, the bytes):
//! one [`HEAD`] (the metadata rows, postcard), every KV row ([`KV`]: the 16-byte key, then the
//! stored record) and every lease row ([`LEASE`]: the 8-byte key, then the stored record), as
//! the leader's file holds them, and [`END`]. The follower checks the length and CRC-32C the
//! reference names before Raft sees the message, so Raft never takes a snapshot the follower
//! cannot install; a transfer that fails drops the message, and the leader offers the snapshot
//! again (`Core::resume_snapshot_waits`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use redb::ReadableTable;
use serde::{Deserialize, Serialize};

use super::shared::Shared;
use super::snapshot::{emptied_tables, load, replace_state};
use crate::storage::{Db, KV, LEASES, SmMeta, StorageError, decode, write_sm};

/// What the data of a Raft snapshot that names a file starts with. An inline snapshot (a
/// postcard `SnapshotPayload`) starts with an `Option` tag, 0 or 1, so the two never meet.
const REF_MAGIC: &[u8; 8] = b"LHSNAPRF";
/// What a snapshot's file starts with.
const FILE_MAGIC: &[u8; 8] = b"LHSNAP01";
const HEAD: u8 = 1;
const KV_ROW: u8 = 2;
const LEASE_ROW: u8 = 3;
const END: u8 = 4;
/// Where a leader keeps the file it offers, and a follower the one it received, under the
/// database's directory.
const OUTGOING: &str = "snap-out";
const INCOMING: &str = "snap-in";
const BUFFER_BYTES: usize = 1 << 20;

/// A snapshot's file as a Raft snapshot names it: the applied position it holds, and what the
/// follower checks it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRef {
    pub index: u64,
    pub term: u64,
    pub bytes: u64,
    pub crc: u32,
}

impl SnapshotRef {
    /// The Raft snapshot's data for this file.
    pub(crate) fn to_data(self) -> Vec<u8> {
        let mut data = REF_MAGIC.to_vec();
        postcard::to_io(&self, &mut data).expect("in-memory serialization cannot fail");
        data
    }

    /// The file a Raft snapshot's data names; `None` for an inline snapshot (or bytes that are
    /// neither).
    pub fn from_data(data: &[u8]) -> Option<SnapshotRef> {
        postcard::from_bytes(data.strip_prefix(REF_MAGIC)?).ok()
    }

    fn file_name(self) -> String {
        format!("{:016x}-{:016x}.lhsnap", self.term, self.index)
    }
}

/// A writer that counts and checksums (CRC-32C) what it passes on.
struct Summed<W> {
    inner: W,
    bytes: u64,
    crc: u32,
}

impl<W: Write> Summed<W> {
    fn new(inner: W) -> Self {
        Summed {
            inner,
            bytes: 0,
            crc: 0,
        }
    }
}

impl<W: Write> Write for Summed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn frame(out: &mut impl Write, tag: u8, parts: &[&[u8]]) -> std::io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(len).map_err(|_| std::io::Error::other("a row over 4 GiB"))?;
    out.write_all(&[tag])?;
    out.write_all(&len.to_le_bytes())?;
    for part in parts {
        out.write_all(part)?;
    }
    Ok(())
}

/// Removes every file in `dir` (a missing `dir` is created).
fn clear_dir(dir: &Path) -> Result<(), StorageError> {
    std::fs::create_dir_all(dir)
        .map_err(StorageError::transfer("creating a snapshot directory"))?;
    let entries =
        std::fs::read_dir(dir).map_err(StorageError::transfer("listing a snapshot directory"))?;
    for entry in entries.flatten() {
        if let Err(e) = std::fs::remove_file(entry.path()) {
            tracing::warn!(path = %entry.path().display(), "removing an old snapshot file: {e}");
        }
    }
    Ok(())
}

/// Writes the state machine as its file holds it (staged changes first, durably) to the file
/// offered to followers, in place of the one offered before. Blocking.
pub(crate) fn write_outgoing(db: &Db) -> Result<(SmMeta, SnapshotRef), StorageError> {
    const WHAT: &str = "writing a snapshot's file";
    db.flush_staged_sm()?;
    let dir = db.dir().join(OUTGOING);
    clear_dir(&dir)?;
    let txn = db.begin_read().map_err(StorageError::read("a snapshot"))?;
    let meta = SmMeta::read(&txn)?;
    let applied = meta.last_applied.unwrap_or_default();
    let partial = dir.join("partial");
    let file = File::create(&partial).map_err(StorageError::transfer(WHAT))?;
    let mut out = Summed::new(BufWriter::with_capacity(BUFFER_BYTES, file));
    out.write_all(FILE_MAGIC)
        .and_then(|()| frame(&mut out, HEAD, &[&crate::storage::encode(&meta)]))
        .map_err(StorageError::transfer(WHAT))?;
    let kv = txn.open_table(KV).map_err(StorageError::read("kv"))?;
    for row in kv.iter().map_err(StorageError::read("kv"))? {
        let (k, v) = row.map_err(StorageError::read("kv"))?;
        frame(&mut out, KV_ROW, &[&k.value(), v.value()]).map_err(StorageError::transfer(WHAT))?;
    }
    let leases = txn
        .open_table(LEASES)
        .map_err(StorageError::read("leases"))?;
    for row in leases.iter().map_err(StorageError::read("leases"))? {
        let (k, v) = row.map_err(StorageError::read("leases"))?;
        frame(&mut out, LEASE_ROW, &[&k.value(), v.value()])
            .map_err(StorageError::transfer(WHAT))?;
    }
    frame(&mut out, END, &[]).map_err(StorageError::transfer(WHAT))?;
    out.flush().map_err(StorageError::transfer(WHAT))?;
    drop(kv);
    drop(leases);
    drop(txn);
    let reference = SnapshotRef {
        index: applied.index,
        term: applied.term,
        bytes: out.bytes,
        crc: out.crc,
    };
    std::fs::rename(&partial, dir.join(reference.file_name()))
        .map_err(StorageError::transfer(WHAT))?;
    Ok((meta, reference))
}

/// The file a follower asked for (`request`: a Raft snapshot's data naming it), if this member
/// still offers it.
pub(crate) fn outgoing_file(db: &Db, request: &[u8]) -> Result<PathBuf, String> {
    let reference = SnapshotRef::from_data(request).ok_or("not a request for a snapshot's file")?;
    let path = db.dir().join(OUTGOING).join(reference.file_name());
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "no snapshot at index {} term {} is offered here (a newer one replaced it)",
            reference.index, reference.term
        ))
    }
}

/// Receives the file `reference` names: `fetch` writes its bytes (from the leader) into the
/// writer it is given. `Ok` once the whole file, checked, is where [`install_file`] reads it.
pub(crate) fn receive(
    db: &Db,
    reference: SnapshotRef,
    fetch: impl FnOnce(&mut dyn Write) -> Result<(), String>,
) -> Result<(), String> {
    let dir = db.dir().join(INCOMING);
    clear_dir(&dir).map_err(|e| e.to_string())?;
    let partial = dir.join("partial");
    let file =
        File::create(&partial).map_err(|e| format!("creating {}: {e}", partial.display()))?;
    let mut sink = Summed::new(BufWriter::with_capacity(BUFFER_BYTES, file));
    let fetched = fetch(&mut sink).and_then(|()| {
        sink.flush()
            .map_err(|e| format!("writing {}: {e}", partial.display()))
    });
    if let Err(e) = fetched {
        drop(sink);
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    let (bytes, crc) = (sink.bytes, sink.crc);
    if (bytes, crc) != (reference.bytes, reference.crc) {
        let _ = std::fs::remove_file(&partial);
        return Err(format!(
            "the snapshot's file arrived as {bytes} bytes with CRC {crc:08x}, not the {} bytes \
             with CRC {:08x} its leader named",
            reference.bytes, reference.crc
        ));
    }
    std::fs::rename(&partial, dir.join(reference.file_name()))
        .map_err(|e| format!("renaming {}: {e}", partial.display()))
}

/// Reads one frame into `buf`: its tag.
fn read_frame(input: &mut impl Read, buf: &mut Vec<u8>) -> std::io::Result<u8> {
    let mut head = [0u8; 5];
    input.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    buf.clear();
    buf.resize(len, 0);
    input.read_exact(buf)?;
    Ok(head[0])
}

/// Replaces the state machine with the received file `reference` names, durably (the rows in
/// one transaction), and loads the state from the database as a start does; the file is then
/// removed. Blocking.
pub(crate) fn install_file(
    shared: &Shared,
    db: &Db,
    reference: SnapshotRef,
) -> Result<(), StorageError> {
    const WHAT: &str = "a snapshot";
    const CORRUPT: fn(&'static str) -> StorageError = |problem| StorageError::Corrupt {
        what: "a received snapshot's file",
        problem,
    };
    let telemetry = db.telemetry().clone();
    let _installing = telemetry.installing_snapshot();
    let path = db.dir().join(INCOMING).join(reference.file_name());
    let io = |error| StorageError::Transfer {
        what: "reading a received snapshot's file",
        error,
    };
    let file = File::open(&path).map_err(io)?;
    let mut input = BufReader::with_capacity(BUFFER_BYTES, file);
    let mut buf = Vec::new();
    let mut magic = [0u8; 8];
    input.read_exact(&mut magic).map_err(io)?;
    if &magic != FILE_MAGIC || read_frame(&mut input, &mut buf).map_err(io)? != HEAD {
        return Err(CORRUPT("no snapshot header"));
    }
    let meta: SmMeta = decode(WHAT, &buf)?;
    let applied = meta.last_applied.unwrap_or_default();
    if (applied.index, applied.term) != (reference.index, reference.term) {
        return Err(CORRUPT("its applied position is not the one Raft was sent"));
    }
    tracing::info!(
        index = reference.index,
        bytes = reference.bytes,
        revision = meta.current_revision,
        "installing a snapshot from the leader"
    );
    // Staged changes predate the snapshot and must never be written over it.
    db.discard_staged_sm();
    let txn = db.begin_write().map_err(StorageError::write(WHAT))?;
    {
        let (mut kv, mut leases) = emptied_tables(&txn)?;
        loop {
            match read_frame(&mut input, &mut buf).map_err(io)? {
                KV_ROW if buf.len() >= 16 => {
                    let (key, value) = buf.split_at(16);
                    let key: [u8; 16] = key.try_into().expect("16 bytes");
                    kv.insert(key, value).map_err(StorageError::write("kv"))?;
                }
                LEASE_ROW if buf.len() >= 8 => {
                    let (key, value) = buf.split_at(8);
                    let key: [u8; 8] = key.try_into().expect("8 bytes");
                    leases
                        .insert(key, value)
                        .map_err(StorageError::write("leases"))?;
                }
                END => break,
                _ => return Err(CORRUPT("a frame that is no row")),
            }
        }
    }
    write_sm(&txn, &[], &BTreeMap::new(), &meta)?;
    let started = std::time::Instant::now();
    txn.commit().map_err(StorageError::commit(WHAT))?;
    db.telemetry().state_commit.observe(started.elapsed());
    drop(input);
    if let Err(e) = std::fs::remove_file(&path) {
        tracing::warn!(path = %path.display(), "removing an installed snapshot's file: {e}");
    }
    let state = load(db)?;
    replace_state(shared, db, state);
    Ok(())
}

/// Removes what a previous run left of snapshot files (none is offered or awaited after a
/// start).
pub(crate) fn clear_files(db: &Db) {
    for which in [OUTGOING, INCOMING] {
        let dir = db.dir().join(which);
        if dir.exists()
            && let Err(e) = clear_dir(&dir)
        {
            tracing::warn!("removing old snapshot files: {e}");
        }
    }
}
