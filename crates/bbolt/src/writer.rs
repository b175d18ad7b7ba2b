//! Writing a bbolt file in one streaming pass: top-level buckets in name order, each with its
//! entries in key order. Memory stays proportional to the tree depth and the number of buckets,
//! not to the data.
//!
//! Layout of the result: pages 0 and 1 are the meta pages (written last, by seeking back), page 2
//! an empty freelist, then every bucket's pages as they fill, then the root bucket's pages. Page
//! ids are allocated contiguously, so every page below the high-water mark is in use, as bbolt's
//! `Tx.Check` requires.

use std::io::{Seek, SeekFrom, Write};

use crate::builder::{PageSink, TreeBuilder};
use crate::error::Error;
use crate::format::{
    BUCKET_LEAF_FLAG, BucketHeader, DEFAULT_PAGE_SIZE, FREELIST_PAGE, META_PAGE, MIN_PAGE_SIZE,
    Meta, PAGE_HEADER_SIZE, PageHeader, Pgid,
};
use crate::limits::{MAX_KEY_SIZE, MAX_VALUE_SIZE};

/// The page the writer puts the (always empty) freelist on.
const FREELIST_PGID: Pgid = 2;
/// The largest page size the writer produces.
const MAX_WRITER_PAGE_SIZE: u32 = 1 << 16;

/// Writes a bbolt file to `W`. Wrap a file in a `BufWriter` for speed: pages are written with
/// one `write_all` each, and the writer seeks only at the end, to fill in the meta pages.
pub struct Writer<W> {
    pages: Pages<W>,
    /// The finished top-level buckets: name and bucket value.
    buckets: Vec<(Vec<u8>, Vec<u8>)>,
    last_name: Option<Vec<u8>>,
    /// A bucket was started and not finished yet.
    open: bool,
}

impl<W> std::fmt::Debug for Writer<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("next_pgid", &self.pages.next_pgid)
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

/// The output stream and page allocation.
struct Pages<W> {
    out: W,
    page_size: usize,
    /// Stream position of page 0, once the first page is written.
    base: Option<u64>,
    next_pgid: Pgid,
    failed: bool,
}

impl<W: Write + Seek> Writer<W> {
    /// A writer producing 4096-byte pages.
    pub fn new(out: W) -> Writer<W> {
        Writer::with_pages(out, DEFAULT_PAGE_SIZE as usize)
    }

    /// A writer producing pages of `page_size` bytes (a power of two from 512 to 65536).
    pub fn with_page_size(out: W, page_size: u32) -> Result<Writer<W>, Error> {
        if !page_size.is_power_of_two()
            || !(MIN_PAGE_SIZE..=MAX_WRITER_PAGE_SIZE).contains(&page_size)
        {
            return Err(Error::BadPageSize(page_size));
        }
        Ok(Writer::with_pages(out, page_size as usize))
    }

    fn with_pages(out: W, page_size: usize) -> Writer<W> {
        let pages = Pages {
            out,
            page_size,
            base: None,
            next_pgid: 0,
            failed: false,
        };
        Writer {
            pages,
            buckets: Vec::new(),
            last_name: None,
            open: false,
        }
    }

    /// Starts the top-level bucket `name`. Buckets must come in strictly ascending name order, and
    /// each must be finished with [`BucketWriter::finish`] before the next starts.
    pub fn bucket(&mut self, name: &[u8]) -> Result<BucketWriter<'_, W>, Error> {
        self.usable()?;
        check_key(name)?;
        if let Some(previous) = &self.last_name
            && previous.as_slice() >= name
        {
            let (name, previous) = (name.to_vec(), previous.clone());
            return Err(Error::BucketOrder { name, previous });
        }
        self.pages.start()?;
        self.last_name = Some(name.to_vec());
        self.open = true;
        let tree = TreeBuilder::new(self.pages.page_size);
        Ok(BucketWriter {
            writer: self,
            name: name.to_vec(),
            tree,
            sequence: 0,
        })
    }

    /// Writes the root bucket and both meta pages (transaction id `txid`, and `txid - 1` on the
    /// second, as bbolt's own copy does), flushes, and returns the output positioned at its end.
    pub fn finish(mut self, txid: u64) -> Result<W, Error> {
        self.usable()?;
        self.pages.start()?;
        let mut root = TreeBuilder::new(self.pages.page_size);
        for (name, value) in &self.buckets {
            root.push(&mut self.pages, BUCKET_LEAF_FLAG, name, value)?;
        }
        let root = root.finish_pages(&mut self.pages)?;
        self.pages.write_metas(root, txid)?;
        Ok(self.pages.out)
    }

    fn usable(&self) -> Result<(), Error> {
        if self.open {
            Err(Error::BucketNotFinished)
        } else if self.pages.failed {
            Err(Error::WriterFailed)
        } else {
            Ok(())
        }
    }
}

/// Writes the entries of one top-level bucket; get one from [`Writer::bucket`].
pub struct BucketWriter<'w, W> {
    writer: &'w mut Writer<W>,
    name: Vec<u8>,
    tree: TreeBuilder,
    sequence: u64,
}

impl<W> std::fmt::Debug for BucketWriter<'_, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketWriter")
            .field("name", &self.name.escape_ascii().to_string())
            .finish()
    }
}

impl<W: Write + Seek> BucketWriter<'_, W> {
    /// Adds an entry. Keys must be non-empty, at most 32768 bytes, and strictly ascending; values
    /// at most 2^31 - 2 bytes. A rejected entry leaves the bucket as it was.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        if self.writer.pages.failed {
            return Err(Error::WriterFailed);
        }
        check_key(key)?;
        if value.len() > MAX_VALUE_SIZE {
            return Err(Error::ValueTooLarge { len: value.len() });
        }
        self.tree.push(&mut self.writer.pages, 0, key, value)
    }

    /// Sets the bucket's sequence number (bbolt's `NextSequence` counter); 0 by default.
    pub fn set_sequence(&mut self, sequence: u64) {
        self.sequence = sequence;
    }

    /// Writes the bucket's remaining pages. Small buckets are stored inline, as bbolt does.
    pub fn finish(self) -> Result<(), Error> {
        let BucketWriter {
            writer,
            name,
            tree,
            sequence,
        } = self;
        if writer.pages.failed {
            return Err(Error::WriterFailed);
        }
        let built = tree.finish(&mut writer.pages)?;
        writer.buckets.push((name, built.bucket_value(sequence)));
        writer.open = false;
        Ok(())
    }
}

/// Checks a key or bucket name against bbolt's limits.
fn check_key(key: &[u8]) -> Result<(), Error> {
    if key.is_empty() {
        Err(Error::EmptyKey)
    } else if key.len() > MAX_KEY_SIZE {
        Err(Error::KeyTooLarge { len: key.len() })
    } else {
        Ok(())
    }
}

impl<W: Write + Seek> Pages<W> {
    /// On first use: notes where page 0 starts, writes placeholders for the meta pages (zeros:
    /// an unfinished file is not a valid bbolt file) and the empty freelist page.
    fn start(&mut self) -> Result<(), Error> {
        if self.base.is_some() {
            return Ok(());
        }
        let base = self
            .out
            .stream_position()
            .inspect_err(|_| self.failed = true)?;
        self.base = Some(base);
        for _ in 0..2 {
            self.write_page(&mut vec![0; self.page_size])?;
        }
        let mut freelist = vec![0; self.page_size];
        PageHeader {
            id: 0,
            flags: FREELIST_PAGE,
            count: 0,
            overflow: 0,
        }
        .encode(&mut freelist);
        let pgid = self.write_page(&mut freelist)?;
        debug_assert_eq!(pgid, FREELIST_PGID);
        Ok(())
    }

    /// Fills in and writes both meta pages, then leaves the output at the end of the file.
    fn write_metas(&mut self, root: Pgid, txid: u64) -> Result<(), Error> {
        let meta = Meta {
            page_size: self.page_size as u32,
            flags: 0,
            root: BucketHeader { root, sequence: 0 },
            freelist: FREELIST_PGID,
            pgid: self.next_pgid,
            txid,
        };
        let base = self.base.unwrap_or_default();
        let end = base + self.next_pgid * self.page_size as u64;
        let result = (|| {
            self.out.seek(SeekFrom::Start(base))?;
            self.out.write_all(&self.meta_page(0, meta))?;
            let older = Meta {
                txid: txid.saturating_sub(1),
                ..meta
            };
            self.out.write_all(&self.meta_page(1, older))?;
            self.out.seek(SeekFrom::Start(end))?;
            self.out.flush()
        })();
        result.map_err(|e| self.fail(e))
    }

    fn meta_page(&self, pgid: Pgid, meta: Meta) -> Vec<u8> {
        let mut page = vec![0; self.page_size];
        PageHeader {
            id: pgid,
            flags: META_PAGE,
            count: 0,
            overflow: 0,
        }
        .encode(&mut page);
        page[PAGE_HEADER_SIZE..PAGE_HEADER_SIZE + crate::format::META_SIZE]
            .copy_from_slice(&meta.encode());
        page
    }

    fn fail(&mut self, e: std::io::Error) -> Error {
        self.failed = true;
        Error::Io(e)
    }
}

impl<W: Write + Seek> PageSink for Pages<W> {
    fn write_page(&mut self, page: &mut [u8]) -> Result<Pgid, Error> {
        let pgid = self.next_pgid;
        let span = (page.len() / self.page_size) as u64;
        let mut header = PageHeader::decode(page);
        header.id = pgid;
        header.overflow = (span - 1) as u32;
        header.encode(page);
        self.out.write_all(page).map_err(|e| self.fail(e))?;
        self.next_pgid += span;
        Ok(pgid)
    }
}
