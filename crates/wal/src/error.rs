use std::path::PathBuf;

/// Why the log could not be opened or written. Every arm but `Io` means the files hold something
/// this log would never have written: the member must not serve from them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    #[error("write-ahead log I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Bytes that fail their checks somewhere other than a torn tail (a flipped bit, a zeroed
    /// sector inside the log, a frame that does not decode).
    #[error("write-ahead log damaged: {path} at byte {offset}: {what}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    /// The segments do not join up (one missing, or entries missing between two).
    #[error("write-ahead log incomplete in {dir}: {what}")]
    Incomplete { dir: PathBuf, what: String },
    /// One append larger than a frame may be (refused before writing; the log is unchanged).
    #[error("an append of {bytes} bytes is larger than a write-ahead log frame may be")]
    TooLarge { bytes: usize },
    /// An earlier write or sync failed; the log takes no more appends until it is reopened.
    #[error("write-ahead log stopped after a failed write or sync; reopen it to go on")]
    Poisoned,
    /// A read of an entry the log does not hold: compacted away, or replaced
    /// ([`crate::WalReader`]).
    #[error("write-ahead log: entry {index} is not held")]
    NotHeld { index: u64 },
    /// An append whose entries do not follow the log (a caller's bug, refused before writing).
    #[error("entries must follow the log: got index {got}, the log allows {min}..={max}")]
    NotContiguous { got: u64, min: u64, max: u64 },
}

impl WalError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> WalError {
        let path = path.into();
        move |source| WalError::Io { path, source }
    }

    /// Whether the disk is full (an append may succeed once space is freed).
    pub fn is_disk_full(&self) -> bool {
        matches!(self, WalError::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull)
    }
}
