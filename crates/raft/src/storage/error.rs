//! What a storage failure was: the operation that failed, on what, and the source error itself
//! (redb's, postcard's, the OS's), never its text only.

use std::path::PathBuf;

/// A storage operation that failed. `what` names the table or metadata row it was working on.
/// The message includes the source error, so that one `{}` tells the whole story (the binary
/// prints it as it exits); the source is in the variant's fields for callers that branch on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// Creating the data dir.
    #[error("creating the data dir {dir}: {error}")]
    CreateDir { dir: PathBuf, error: std::io::Error },
    /// Opening (or creating) the database file.
    #[error("opening the database {path}: {error}")]
    Open { path: PathBuf, error: redb::Error },
    /// Beginning a read, opening a table for it, or reading a row.
    #[error("reading {what}: {error}")]
    Read {
        what: &'static str,
        error: redb::Error,
    },
    /// Beginning a write transaction, opening a table in it, or writing a row.
    #[error("writing {what}: {error}")]
    Write {
        what: &'static str,
        error: redb::Error,
    },
    /// Committing (and fsyncing) a write transaction.
    #[error("committing {what}: {error}")]
    Commit {
        what: &'static str,
        error: redb::Error,
    },
    /// A stored row (or a snapshot) that does not decode as the type it should hold.
    #[error("decoding {what}: {error}")]
    Decode {
        what: &'static str,
        error: postcard::Error,
    },
    /// A row that decodes but breaks an invariant of the format.
    #[error("corrupt {what}: {problem}")]
    Corrupt {
        what: &'static str,
        problem: &'static str,
    },
    /// A value the state machine released from memory could not be read back from the file
    /// (`storage/values.rs`); `why` holds the source error's text.
    #[error("reading back a released value: {why}")]
    ValueUnreadable { why: String },
    /// Writing, reading or moving a snapshot's file, sent to or received from a peer
    /// (`state_machine/transfer.rs`).
    #[error("{what}: {error}")]
    Transfer {
        what: &'static str,
        error: std::io::Error,
    },
    /// A data dir written in a storage format this build does not read.
    #[error("unsupported storage format {found}; this build reads {supported}")]
    Format { found: u32, supported: u32 },
    /// The blocking thread that ran a write panicked or was cancelled.
    #[error("the storage thread {what}: {error}")]
    Thread {
        what: &'static str,
        error: tokio::task::JoinError,
    },
}

impl StorageError {
    /// For `map_err`: a failed read of `what`.
    pub(crate) fn read<E: Into<redb::Error>>(what: &'static str) -> impl FnOnce(E) -> StorageError {
        move |e| StorageError::Read {
            what,
            error: e.into(),
        }
    }

    /// For `map_err`: a failed write of `what`.
    pub(crate) fn write<E: Into<redb::Error>>(
        what: &'static str,
    ) -> impl FnOnce(E) -> StorageError {
        move |e| StorageError::Write {
            what,
            error: e.into(),
        }
    }

    /// For `map_err`: a failed commit of `what`.
    pub(crate) fn commit<E: Into<redb::Error>>(
        what: &'static str,
    ) -> impl FnOnce(E) -> StorageError {
        move |e| StorageError::Commit {
            what,
            error: e.into(),
        }
    }

    /// Whether the disk (or the file system's quota) ran out of space: a condition this member
    /// waits out (see `Db::out_of_space`) rather than a failure.
    pub fn is_out_of_space(&self) -> bool {
        let redb_error = match self {
            StorageError::CreateDir { error, .. } | StorageError::Transfer { error, .. } => {
                return is_out_of_space(error);
            }
            StorageError::Open { error, .. }
            | StorageError::Read { error, .. }
            | StorageError::Write { error, .. }
            | StorageError::Commit { error, .. } => error,
            _ => return false,
        };
        matches!(redb_error, redb::Error::Io(io) if is_out_of_space(io))
    }

    /// For `map_err`: a failed file operation on a snapshot's file.
    pub(crate) fn transfer(what: &'static str) -> impl FnOnce(std::io::Error) -> StorageError {
        move |error| StorageError::Transfer { what, error }
    }

    /// For `map_err`: `what` did not decode.
    pub(crate) fn decode(what: &'static str) -> impl FnOnce(postcard::Error) -> StorageError {
        move |error| StorageError::Decode { what, error }
    }
}

/// ENOSPC or EDQUOT, whichever way the OS reported it.
fn is_out_of_space(error: &std::io::Error) -> bool {
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    matches!(
        error.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    ) || matches!(error.raw_os_error(), Some(ENOSPC | EDQUOT))
}
