//! Waiting for one key's deletion: what a lock queue waits on.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Waiters for the deletion of one key each, woken by the apply that deletes it (writes a
/// tombstone) or by a snapshot install (which replaces every key at once), and by nothing else.
/// This is what a lock queue waits on: a release wakes the one waiter queued behind the released
/// key, not everyone who waits on the store. Entries are removed when fired or when their waiter
/// gives up ([`KeyDeleteWaiter`]'s drop), so the map holds no more than the waiters that exist.
///
/// Lock order: taken after `state` is released (apply fires once the store shows the delete).
#[derive(Debug, Default)]
pub(crate) struct KeyDeletes {
    waiters: Mutex<HashMap<Vec<u8>, Vec<KeyDeleteSlot>>>,
    next_id: AtomicU64,
    /// Set by [`KeyDeletes::close`]: every waiter, present and future, is told the replica
    /// stopped.
    closed: AtomicBool,
}

impl KeyDeletes {
    pub(super) fn register(&self, key: &[u8]) -> (u64, oneshot::Receiver<()>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut waiters = self.waiters.lock().expect("key deletes lock poisoned");
        // Checked under the lock that `close` empties the map under, so a registration is
        // either emptied by `close` or sees the flag: no waiter outlives the close.
        if !self.closed.load(Ordering::SeqCst) {
            waiters.entry(key.to_vec()).or_default().push((id, tx));
        }
        (id, rx)
    }

    pub(super) fn unregister(&self, key: &[u8], id: u64) {
        let mut waiters = self.waiters.lock().expect("key deletes lock poisoned");
        if let Some(list) = waiters.get_mut(key) {
            list.retain(|(other, _)| *other != id);
            if list.is_empty() {
                waiters.remove(key);
            }
        }
    }

    /// Wakes whoever waits for one of `keys` (keys just deleted).
    pub(super) fn deleted<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) {
        let mut waiters = self.waiters.lock().expect("key deletes lock poisoned");
        if waiters.is_empty() {
            return;
        }
        for key in keys {
            for (_, tx) in waiters.remove(key).into_iter().flatten() {
                let _ = tx.send(());
            }
        }
    }

    /// Ends every wait, present and future, with "stopped" (the sender is dropped, not fired):
    /// the member is shutting down or its Raft core failed, and a lock waiter must not hold up
    /// the drain of client requests forever.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let waiters = std::mem::take(&mut *self.waiters.lock().expect("key deletes lock poisoned"));
        drop(waiters);
    }

    /// Wakes every waiter: the whole store was replaced (they look again).
    pub(super) fn replaced(&self) {
        let waiters = std::mem::take(&mut *self.waiters.lock().expect("key deletes lock poisoned"));
        for (_, tx) in waiters.into_values().flatten() {
            let _ = tx.send(());
        }
    }
}

/// One waiter's registration: its id and how to wake it.
pub(super) type KeyDeleteSlot = (u64, oneshot::Sender<()>);

/// One registration in [`KeyDeletes`]; removes itself when dropped (a waiter that gives up).
pub(crate) struct KeyDeleteWaiter {
    deletes: Arc<KeyDeletes>,
    key: Vec<u8>,
    id: u64,
    fired: oneshot::Receiver<()>,
}

impl KeyDeleteWaiter {
    /// Registers for the next delete of `key`. Register before looking at the store, so that a
    /// delete applied after the look is never missed.
    pub(crate) fn register(deletes: &Arc<KeyDeletes>, key: &[u8]) -> KeyDeleteWaiter {
        let (id, fired) = deletes.register(key);
        KeyDeleteWaiter {
            deletes: deletes.clone(),
            key: key.to_vec(),
            id,
            fired,
        }
    }

    /// Completes when the key is deleted (or the store replaced); `false` if the state machine
    /// is gone first.
    pub(crate) async fn fired(&mut self) -> bool {
        (&mut self.fired).await.is_ok()
    }
}

impl Drop for KeyDeleteWaiter {
    fn drop(&mut self) {
        self.deletes.unregister(&self.key, self.id);
    }
}
