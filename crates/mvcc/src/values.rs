//! Values the store let go of. A version keeps its value in memory until the caller has made it
//! durable and lets it go ([`crate::Store::release_values`]); from then on it is read back, when
//! a read asks for it, from where the caller persisted it: a [`ValueSource`]. The store itself
//! still does no I/O: the source is the caller's.

use std::fmt;

use bytes::Bytes;

use crate::{Error, Revision};

/// Where released values are read back from: the caller's persisted rows, by revision.
pub trait ValueSource: fmt::Debug + Send + Sync {
    /// A reader for one read of the store (a range, a watch step, a hash): what it reads comes
    /// from one view of the rows, opened once however many values it reads, and taken as the
    /// rows stood when it was opened, whatever is written or removed after. The store opens one
    /// only when a read meets a released value. A range opens it under whatever guards the
    /// store and reads with it after ([`crate::RangeScan::finish`]), so it owns its view.
    fn reader(&self) -> Result<Box<dyn ValueReader + Send>, String>;
}

/// One view of the caller's rows ([`ValueSource::reader`]).
pub trait ValueReader {
    /// The value of the version at `rev`, which the caller made durable before the store
    /// released it. An error says why it could not be read (an I/O error, a damaged row): the
    /// store answers [`crate::Error::Unreadable`] with it. Reads in revision order may be
    /// cheaper than others: rows lie in that order.
    fn read(&mut self, rev: Revision) -> Result<Bytes, String>;
}

/// The source of a store that never releases a value (the default): nothing to read back.
#[derive(Debug, Default)]
pub struct NothingReleased;

impl ValueSource for NothingReleased {
    fn reader(&self) -> Result<Box<dyn ValueReader + Send>, String> {
        Err("a value was released with no source to read it back from".into())
    }
}

/// The values one read of the store reads back: its source, and the reader opened on the first
/// released value it meets.
pub(crate) struct ReadBack<'s> {
    source: &'s dyn ValueSource,
    reader: Option<Box<dyn ValueReader + Send>>,
}

impl<'s> ReadBack<'s> {
    pub(crate) fn new(source: &'s dyn ValueSource) -> ReadBack<'s> {
        ReadBack {
            source,
            reader: None,
        }
    }

    pub(crate) fn read(&mut self, rev: Revision) -> Result<Bytes, Error> {
        let reader = match &mut self.reader {
            Some(reader) => reader,
            None => self
                .reader
                .insert(self.source.reader().map_err(Error::Unreadable)?),
        };
        reader.read(rev).map_err(Error::Unreadable)
    }

    /// A reader of its own, opened now: for reads taken later, away from the store.
    pub(crate) fn open(&self) -> Result<Box<dyn ValueReader + Send>, Error> {
        self.source.reader().map_err(Error::Unreadable)
    }
}
