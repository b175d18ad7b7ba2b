//! The hash a compaction takes, taken away from the apply.
//!
//! A compaction's hash covers every live key's value at the compaction revision: at Kubernetes'
//! scale, tens of thousands of values, most of them released to the caller's file. Read back and
//! hashed where the compaction is applied, it held every write behind it for hundreds of
//! milliseconds (etcd hashes in its background compaction). So the apply only picks what the
//! hash covers (the versions, with a view of the released values opened there and then, before
//! anything the compaction hides can leave the file), and the hashing is done by whoever comes
//! first: the hashing worker ([`hash_in_background`]), or a reader that asks for the hash sooner.

use std::fmt;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use leasehold_types::{Key, LeaseId};

use super::Version;
use crate::error::Error;
use crate::hash::{HashedVersion, KvHash, KvHasher};
use crate::values::ValueReader;

/// One compaction's hash: known, or still to be computed from what the compaction picked.
#[derive(Debug)]
pub struct CompactionHash {
    hash_revision: i64,
    compact_revision: i64,
    state: Mutex<HashState>,
}

#[derive(Debug)]
enum HashState {
    Pending(Picked),
    Done(Result<u32, Error>),
}

/// The versions a hash covers, in revision order, and the view their released values are read
/// back from (`None` when none of them is released).
pub(super) struct Picked {
    pub(super) versions: Vec<(Key, Version)>,
    pub(super) reader: Option<Box<dyn ValueReader + Send>>,
}

impl fmt::Debug for Picked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Picked")
            .field("versions", &self.versions.len())
            .field("reader", &self.reader.is_some())
            .finish()
    }
}

impl Picked {
    /// etcd's hash of the picked versions. A released value is read back, hashed and let go.
    pub(super) fn hash(self) -> Result<u32, Error> {
        let Picked {
            versions,
            mut reader,
        } = self;
        let mut hasher = KvHasher::new();
        for (key, v) in &versions {
            let read_back: Bytes;
            let value: Option<&[u8]> = match &v.value {
                _ if !v.is_live() => None,
                Some(value) => Some(value),
                None => {
                    let reader = reader.as_mut().ok_or_else(|| {
                        Error::Unreadable("a released value with no view to read it from".into())
                    })?;
                    read_back = reader.read(v.rev).map_err(Error::Unreadable)?;
                    Some(&read_back)
                }
            };
            hasher.add(&HashedVersion {
                rev: v.rev,
                key,
                value,
                create_revision: v.create_revision,
                version: v.version,
                lease: v.lease.map_or(0, LeaseId::get),
            });
        }
        Ok(hasher.finish())
    }
}

impl CompactionHash {
    pub(super) fn pending(hash_revision: i64, compact_revision: i64, picked: Picked) -> Self {
        CompactionHash {
            hash_revision,
            compact_revision,
            state: Mutex::new(HashState::Pending(picked)),
        }
    }

    /// The revision the compaction ended at.
    pub fn hash_revision(&self) -> i64 {
        self.hash_revision
    }

    /// The hash, computed here if no one has yet; waits while another computes it.
    pub fn resolve(&self) -> Result<KvHash, Error> {
        // A panic while hashing leaves the placeholder below: the hash is then unknown.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let placeholder =
            HashState::Done(Err(Error::Unreadable("the hash was not finished".into())));
        if let HashState::Pending(_) = &*state {
            let HashState::Pending(picked) = std::mem::replace(&mut *state, placeholder) else {
                unreachable!("matched above");
            };
            *state = HashState::Done(picked.hash());
        }
        let HashState::Done(hash) = &*state else {
            unreachable!("computed above");
        };
        hash.clone().map(|hash| KvHash {
            hash,
            hash_revision: self.hash_revision,
            compact_revision: self.compact_revision,
        })
    }
}

/// Hands `hash` to the process's hashing worker, which computes the hashes it is given one at a
/// time, oldest first (a reader may have computed one first: then there is nothing left to do).
/// Without a worker (its thread could not start) the hash is computed when first asked for.
pub fn hash_in_background(hash: Arc<CompactionHash>) {
    static WORKER: OnceLock<Option<mpsc::Sender<Arc<CompactionHash>>>> = OnceLock::new();
    let worker = WORKER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Arc<CompactionHash>>();
        std::thread::Builder::new()
            .name("leasehold-hash".into())
            .spawn(move || {
                for hash in rx {
                    // An error stays in the hash, for whoever asks for it.
                    let _ = hash.resolve();
                }
            })
            .ok()
            .map(|_| tx)
    });
    if let Some(tx) = worker {
        let _ = tx.send(hash);
    }
}
