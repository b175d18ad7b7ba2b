//! The crate's error type: I/O failures, files that are not (valid) bbolt files, and misuse of
//! the writer.

use std::fmt;

/// Everything that can go wrong reading or writing a bbolt file.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The underlying reader or writer failed.
    Io(std::io::Error),
    /// Neither meta page starts with bbolt's magic number.
    BadMagic,
    /// The meta page names a file-format version other than 2.
    UnsupportedVersion(u32),
    /// The meta page's checksum does not match its contents.
    MetaChecksum { page: u64 },
    /// The page size is outside what the reader or writer accepts.
    BadPageSize(u32),
    /// The file is shorter than its meta page says.
    Truncated { needed: u64, actual: u64 },
    /// A page id at or past the high-water mark (the number of pages in use).
    PageOutOfRange { page: u64, pages: u64 },
    /// A page's header names another page id than the one it was read as.
    PageIdMismatch { page: u64, found: u64 },
    /// A page has other flags than its place in the file requires.
    BadPageType {
        page: u64,
        flags: u16,
        expected: &'static str,
    },
    /// A page's element or its key/value lies (partly) outside the page.
    ElementOutOfBounds { page: u64, index: usize },
    /// A B+tree (or bucket nesting) is deeper than any real file gets: a cycle or corruption.
    TooDeep { page: u64 },
    /// A page is reached twice in one traversal: a cycle or a shared page.
    PageRevisited { page: u64 },
    /// A bucket's keys are not strictly ascending.
    UnsortedKeys { page: u64 },
    /// An entry that must be a bucket is not one, or its bucket header is malformed.
    BadBucket { name: Vec<u8>, reason: &'static str },
    /// The freelist is malformed.
    BadFreelist { page: u64, reason: &'static str },
    /// A page below the high-water mark is neither reachable nor free.
    UnreachablePage { page: u64 },
    /// A page is both reachable and listed as free.
    FreedPageReachable { page: u64 },
    /// Writer: a key is empty (bbolt requires non-empty keys and bucket names).
    EmptyKey,
    /// Writer: a key is longer than bbolt allows.
    KeyTooLarge { len: usize },
    /// Writer: a value is longer than bbolt allows.
    ValueTooLarge { len: usize },
    /// Writer: a key is not greater than the key before it in its bucket.
    KeyOrder { key: Vec<u8>, previous: Vec<u8> },
    /// Writer: a bucket name is not greater than the bucket name before it.
    BucketOrder { name: Vec<u8>, previous: Vec<u8> },
    /// Writer: a bucket was started while the previous one was not finished.
    BucketNotFinished,
    /// Writer: used again after an earlier error left the output incomplete.
    WriterFailed,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::BadMagic => f.write_str("not a bbolt file: bad magic"),
            Error::UnsupportedVersion(v) => {
                write!(f, "unsupported bbolt file version {v} (expected 2)")
            }
            Error::MetaChecksum { page } => write!(f, "meta page {page}: checksum mismatch"),
            Error::BadPageSize(size) => write!(f, "unsupported page size {size}"),
            Error::Truncated { needed, actual } => {
                write!(
                    f,
                    "file truncated: its pages need {needed} bytes, the file has {actual}"
                )
            }
            Error::PageOutOfRange { page, pages } => {
                write!(f, "page {page} out of range (file has {pages} pages)")
            }
            Error::PageIdMismatch { page, found } => {
                write!(f, "page {page}: header says it is page {found}")
            }
            Error::BadPageType {
                page,
                flags,
                expected,
            } => {
                write!(
                    f,
                    "page {page}: expected a {expected} page, found flags {flags:#04x}"
                )
            }
            Error::ElementOutOfBounds { page, index } => {
                write!(f, "page {page}: element {index} lies beyond the page")
            }
            Error::TooDeep { page } => {
                write!(f, "page {page}: tree nested too deep (cycle or corruption)")
            }
            Error::PageRevisited { page } => {
                write!(
                    f,
                    "page {page}: referenced more than once (cycle or shared page)"
                )
            }
            Error::UnsortedKeys { page } => write!(f, "page {page}: keys not in ascending order"),
            Error::BadBucket { name, reason } => {
                write!(f, "bucket {}: {reason}", Escaped(name))
            }
            Error::BadFreelist { page, reason } => write!(f, "freelist page {page}: {reason}"),
            Error::UnreachablePage { page } => write!(f, "page {page}: unreachable and not free"),
            Error::FreedPageReachable { page } => {
                write!(f, "page {page}: reachable but listed as free")
            }
            Error::EmptyKey => f.write_str("keys and bucket names must not be empty"),
            Error::KeyTooLarge { len } => write!(
                f,
                "key of {len} bytes is too large (at most {})",
                crate::limits::MAX_KEY_SIZE
            ),
            Error::ValueTooLarge { len } => write!(
                f,
                "value of {len} bytes is too large (at most {})",
                crate::limits::MAX_VALUE_SIZE
            ),
            Error::KeyOrder { key, previous } => write!(
                f,
                "keys must be strictly ascending: {} after {}",
                Escaped(key),
                Escaped(previous)
            ),
            Error::BucketOrder { name, previous } => write!(
                f,
                "buckets must be given in strictly ascending name order: {} after {}",
                Escaped(name),
                Escaped(previous)
            ),
            Error::BucketNotFinished => {
                f.write_str("the previous bucket was not finished (call BucketWriter::finish)")
            }
            Error::WriterFailed => f.write_str("writer unusable after an earlier error"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// Shows a key as escaped text, shortened when long.
struct Escaped<'a>(&'a [u8]);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 64;
        let shown = &self.0[..self.0.len().min(SHOWN)];
        write!(f, "\"{}\"", shown.escape_ascii())?;
        if self.0.len() > SHOWN {
            write!(f, "... ({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_clear() {
        assert_eq!(Error::BadMagic.to_string(), "not a bbolt file: bad magic");
        assert_eq!(
            Error::PageOutOfRange {
                page: 12,
                pages: 10
            }
            .to_string(),
            "page 12 out of range (file has 10 pages)"
        );
        let order = Error::KeyOrder {
            key: b"a\x00".to_vec(),
            previous: b"b".to_vec(),
        };
        assert_eq!(
            order.to_string(),
            "keys must be strictly ascending: \"a\\x00\" after \"b\""
        );
    }
}
