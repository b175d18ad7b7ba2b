//! Reading a bbolt file: [`Db`] opens it (validating and choosing a meta page) and reads pages on
//! demand with positioned reads; [`Bucket`] iterates a bucket's entries in key order.
//!
//! Nothing is trusted: page ids are checked against the high-water mark, the high-water mark
//! against the file's length, and every element against its page, so corrupt input gives an
//! [`Error`], and no length field makes the reader allocate more than the file holds.

use std::cell::RefCell;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::ControlFlow;
use std::path::Path;

use crate::error::Error;
use crate::format::{
    BUCKET_HEADER_SIZE, BUCKET_LEAF_FLAG, BucketHeader, MAX_PAGE_SIZE, META_SIZE, MIN_PAGE_SIZE,
    Meta, NO_FREELIST, PAGE_HEADER_SIZE, PageHeader, Pgid,
};
use crate::walk::{PageSet, Pages, TreeRoot, Visit, walk_tree};

/// An open bbolt file. Reads pages on demand from `R`; never loads the whole file.
pub struct Db<R> {
    source: RefCell<R>,
    meta: Meta,
    file_len: u64,
}

impl<R> std::fmt::Debug for Db<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("meta", &self.meta)
            .field("file_len", &self.file_len)
            .finish()
    }
}

/// What a bucket entry holds: a value, or (bbolt allows buckets inside buckets) a nested bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    /// An ordinary key/value pair.
    Value(&'a [u8]),
    /// A nested bucket; open it with [`Bucket::bucket`].
    Bucket,
}

impl Db<File> {
    /// Opens the bbolt file at `path` for reading.
    pub fn open(path: impl AsRef<Path>) -> Result<Db<File>, Error> {
        Db::from_reader(File::open(path)?)
    }
}

impl<R: Read + Seek> Pages for Db<R> {
    fn read_page(&self, pgid: Pgid) -> Result<Vec<u8>, Error> {
        Db::read_page(self, pgid)
    }
}

impl<R: Read + Seek> Db<R> {
    /// Opens a bbolt file from any seekable reader. Bytes after the last page (such as the sha256
    /// etcd appends to a snapshot) are ignored.
    pub fn from_reader(mut source: R) -> Result<Db<R>, Error> {
        let file_len = source.seek(SeekFrom::End(0))?;
        let meta = choose_meta(&mut source, file_len)?;
        Ok(Db {
            source: RefCell::new(source),
            meta,
            file_len,
        })
    }

    /// The page size recorded in the file.
    pub fn page_size(&self) -> u32 {
        self.meta.page_size
    }

    /// The transaction id of the meta page in use.
    pub fn txid(&self) -> u64 {
        self.meta.txid
    }

    /// The high-water mark: how many pages the file uses (later bytes are not part of it).
    pub fn page_count(&self) -> u64 {
        self.meta.pgid
    }

    /// The length of the underlying file in bytes, trailing bytes included.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Gives back the reader.
    pub fn into_inner(self) -> R {
        self.source.into_inner()
    }

    /// The names of the top-level buckets, in ascending byte order.
    pub fn bucket_names(&self) -> Result<Vec<Vec<u8>>, Error> {
        let mut names = Vec::new();
        self.root().try_for_each(|name, entry| match entry {
            Entry::Bucket => {
                names.push(name.to_vec());
                Ok(())
            }
            Entry::Value(_) => Err(not_a_bucket(name)),
        })?;
        Ok(names)
    }

    /// The top-level bucket called `name`, if there is one.
    pub fn bucket(&self, name: &[u8]) -> Result<Option<Bucket<'_, R>>, Error> {
        self.root().bucket(name)
    }

    /// The root bucket, whose entries are the top-level buckets.
    pub(crate) fn root(&self) -> Bucket<'_, R> {
        Bucket {
            db: self,
            name: Vec::new(),
            header: self.meta.root,
            inline: None,
            depth: 0,
        }
    }

    pub(crate) fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Reads page `pgid` with its overflow pages, checking its range and its self-declared id.
    pub(crate) fn read_page(&self, pgid: Pgid) -> Result<Vec<u8>, Error> {
        let pages = self.meta.pgid;
        if pgid >= pages {
            return Err(Error::PageOutOfRange { page: pgid, pages });
        }
        let page_size = u64::from(self.meta.page_size);
        let mut page = vec![0; self.meta.page_size as usize];
        self.read_at(pgid * page_size, &mut page)?;
        let header = PageHeader::decode(&page);
        if header.id != pgid {
            return Err(Error::PageIdMismatch {
                page: pgid,
                found: header.id,
            });
        }
        if header.overflow > 0 {
            let last = pgid + u64::from(header.overflow);
            if last >= pages {
                return Err(Error::PageOutOfRange { page: last, pages });
            }
            // Bounded: the whole range lies below the high-water mark, which fits in the file.
            page.resize(((u64::from(header.overflow) + 1) * page_size) as usize, 0);
            self.read_at(
                (pgid + 1) * page_size,
                &mut page[self.meta.page_size as usize..],
            )?;
        }
        Ok(page)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        let mut source = self.source.borrow_mut();
        source.seek(SeekFrom::Start(offset))?;
        source.read_exact(buf)?;
        Ok(())
    }
}

/// Reads both meta pages and picks the valid one with the higher transaction id.
fn choose_meta<R: Read + Seek>(source: &mut R, file_len: u64) -> Result<Meta, Error> {
    let first = read_meta(source, 0, 0, file_len);
    let page_size = match &first {
        Ok(meta) => meta.page_size,
        Err(_) => guess_page_size(source, file_len).unwrap_or(0),
    };
    let second = match page_size {
        0 => Err(Error::BadMagic),
        size => {
            read_meta(source, 1, u64::from(size), file_len).and_then(|m| same_page_size(m, size))
        }
    };
    match (first, second) {
        (Ok(a), Ok(b)) => Ok(if b.txid > a.txid { b } else { a }),
        (Ok(a), Err(_)) => Ok(a),
        (Err(_), Ok(b)) => Ok(b),
        (Err(e), Err(_)) => Err(e),
    }
}

/// When meta page 0 is damaged, finds the page size by looking for a valid meta page 1.
fn guess_page_size<R: Read + Seek>(source: &mut R, file_len: u64) -> Option<u32> {
    let mut size = MIN_PAGE_SIZE;
    while size <= MAX_PAGE_SIZE {
        if read_meta(source, 1, u64::from(size), file_len).is_ok_and(|m| m.page_size == size) {
            return Some(size);
        }
        size *= 2;
    }
    None
}

fn same_page_size(meta: Meta, page_size: u32) -> Result<Meta, Error> {
    if meta.page_size == page_size {
        Ok(meta)
    } else {
        Err(Error::BadPageSize(meta.page_size))
    }
}

/// Reads, decodes and sanity-checks the meta record of page `page` starting at `offset`.
fn read_meta<R: Read + Seek>(
    source: &mut R,
    page: Pgid,
    offset: u64,
    file_len: u64,
) -> Result<Meta, Error> {
    let mut bytes = [0u8; META_SIZE];
    let start = offset + PAGE_HEADER_SIZE as u64;
    if start + META_SIZE as u64 > file_len {
        return Err(if page == 0 {
            Error::BadMagic
        } else {
            Error::Truncated {
                needed: start,
                actual: file_len,
            }
        });
    }
    source.seek(SeekFrom::Start(start))?;
    source.read_exact(&mut bytes)?;
    let meta = Meta::decode(&bytes, page)?;
    check_meta(&meta, file_len)?;
    Ok(meta)
}

/// Checks that a (checksum-valid) meta record describes a file that can exist.
fn check_meta(meta: &Meta, file_len: u64) -> Result<(), Error> {
    if !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&meta.page_size) {
        return Err(Error::BadPageSize(meta.page_size));
    }
    let needed = meta.pgid.checked_mul(u64::from(meta.page_size));
    if needed.is_none_or(|needed| needed > file_len) {
        return Err(Error::Truncated {
            needed: needed.unwrap_or(u64::MAX),
            actual: file_len,
        });
    }
    let pages = meta.pgid;
    if meta.root.root < 2 || meta.root.root >= pages {
        return Err(Error::PageOutOfRange {
            page: meta.root.root,
            pages,
        });
    }
    if meta.freelist != NO_FREELIST && (meta.freelist < 2 || meta.freelist >= pages) {
        return Err(Error::PageOutOfRange {
            page: meta.freelist,
            pages,
        });
    }
    Ok(())
}

fn not_a_bucket(name: &[u8]) -> Error {
    Error::BadBucket {
        name: name.to_vec(),
        reason: "top-level entry is not a bucket",
    }
}

/// The most buckets may nest inside one another before the file is considered corrupt.
pub(crate) const MAX_BUCKET_DEPTH: usize = 64;

/// A bucket of an open [`Db`]. Cheap to hold: iteration reads its pages afresh.
pub struct Bucket<'d, R> {
    db: &'d Db<R>,
    name: Vec<u8>,
    header: BucketHeader,
    /// An inline bucket's page (the bytes after its header, which live in its parent's value) and
    /// the id of the page holding that value.
    inline: Option<(Vec<u8>, Pgid)>,
    depth: usize,
}

impl<R> std::fmt::Debug for Bucket<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("name", &self.name.escape_ascii().to_string())
            .field("header", &self.header)
            .field("inline", &self.inline.is_some())
            .finish()
    }
}

impl<'d, R: Read + Seek> Bucket<'d, R> {
    /// Opens the bucket whose entry in its parent (on page `parent`) is `name` -> `value`.
    pub(crate) fn from_entry(
        db: &'d Db<R>,
        parent: Pgid,
        name: &[u8],
        value: &[u8],
        depth: usize,
    ) -> Result<Bucket<'d, R>, Error> {
        let bad = |reason| Error::BadBucket {
            name: name.to_vec(),
            reason,
        };
        if depth > MAX_BUCKET_DEPTH {
            return Err(bad("buckets nested too deep"));
        }
        let header = BucketHeader::decode(value).ok_or_else(|| bad("bucket header too short"))?;
        let inline = if header.root == 0 {
            let page = &value[BUCKET_HEADER_SIZE..];
            if page.len() < PAGE_HEADER_SIZE {
                return Err(bad("inline bucket page too short"));
            }
            Some((page.to_vec(), parent))
        } else {
            None
        };
        Ok(Bucket {
            db,
            name: name.to_vec(),
            header,
            inline,
            depth,
        })
    }

    /// The bucket's name (empty for the root bucket).
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The bucket's sequence number (bbolt's `NextSequence` counter).
    pub fn sequence(&self) -> u64 {
        self.header.sequence
    }

    /// Whether the bucket is stored inline, inside its parent's leaf, rather than in pages.
    pub fn is_inline(&self) -> bool {
        self.inline.is_some()
    }

    /// The page its tree starts at, or `None` for an inline bucket.
    pub fn root_page(&self) -> Option<u64> {
        self.inline.is_none().then_some(self.header.root)
    }

    /// Calls `f` with each key and value in ascending key order. Nested buckets are skipped.
    pub fn for_each<F>(&self, mut f: F) -> Result<(), Error>
    where
        F: FnMut(&[u8], &[u8]),
    {
        self.try_for_each(|key, entry| {
            if let Entry::Value(value) = entry {
                f(key, value);
            }
            Ok::<(), Error>(())
        })
    }

    /// Calls `f` with each key and [`Entry`] in ascending key order, stopping at the first error,
    /// which it returns. Reading errors are converted into `E`.
    pub fn try_for_each<E, F>(&self, mut f: F) -> Result<(), E>
    where
        E: From<Error>,
        F: FnMut(&[u8], Entry<'_>) -> Result<(), E>,
    {
        self.walk(&mut |_, flags, key, value| {
            f(key, entry_of(flags, value))?;
            Ok(ControlFlow::Continue(()))
        })
    }

    /// The nested bucket called `name`, if there is one.
    pub fn bucket(&self, name: &[u8]) -> Result<Option<Bucket<'d, R>>, Error> {
        let mut found = None;
        self.walk::<Error>(&mut |pgid, flags, key, value| {
            if key < name {
                return Ok(ControlFlow::Continue(()));
            }
            if key == name && flags & BUCKET_LEAF_FLAG != 0 {
                found = Some(Bucket::from_entry(
                    self.db,
                    pgid,
                    key,
                    value,
                    self.depth + 1,
                )?);
            }
            Ok(ControlFlow::Break(()))
        })?;
        Ok(found)
    }

    /// How this bucket's tree starts: a page, or the inline page in its parent's value.
    pub(crate) fn tree_root(&self) -> TreeRoot<'_> {
        match &self.inline {
            Some((page, parent)) => TreeRoot::Inline {
                page,
                parent: *parent,
            },
            None => TreeRoot::Page(self.header.root),
        }
    }

    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// Walks the bucket's leaf entries in order with a fresh set of visited pages.
    fn walk<E: From<Error>>(&self, visit: &mut Visit<'_, E>) -> Result<(), E> {
        let mut seen = PageSet::new(self.db.meta.pgid);
        walk_tree(self.db, &mut seen, self.tree_root(), visit)
    }
}

fn entry_of(flags: u32, value: &[u8]) -> Entry<'_> {
    if flags & BUCKET_LEAF_FLAG != 0 {
        Entry::Bucket
    } else {
        Entry::Value(value)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;
    use crate::format::LEAF_PAGE;
    use crate::testutil::{assemble, single_element_page};

    /// Bucket "outer" (page 3) holds key "a" -> "1" and the inline bucket "inner" with "x" -> "y";
    /// the root bucket's leaf is page 4.
    fn nested_file() -> Vec<u8> {
        let inner_page = single_element_page(0, LEAF_PAGE, 0, b"x", b"y", 0);
        let mut inner = BucketHeader {
            root: 0,
            sequence: 5,
        }
        .encode()
        .to_vec();
        inner.extend_from_slice(&inner_page[..16 + 16 + 2]);
        let mut outer = vec![0u8; crate::testutil::PS];
        PageHeader {
            id: 3,
            flags: LEAF_PAGE,
            count: 2,
            overflow: 0,
        }
        .encode(&mut outer);
        let data = 16 + 2 * 16;
        let elements = [
            (0u32, &b"a"[..], &b"1"[..]),
            (BUCKET_LEAF_FLAG, b"inner", &inner),
        ];
        let mut at = data;
        for (index, (flags, key, value)) in elements.into_iter().enumerate() {
            let e = 16 + 16 * index;
            outer[e..e + 4].copy_from_slice(&flags.to_le_bytes());
            outer[e + 4..e + 8].copy_from_slice(&((at - e) as u32).to_le_bytes());
            outer[e + 8..e + 12].copy_from_slice(&(key.len() as u32).to_le_bytes());
            outer[e + 12..e + 16].copy_from_slice(&(value.len() as u32).to_le_bytes());
            outer[at..at + key.len()].copy_from_slice(key);
            outer[at + key.len()..at + key.len() + value.len()].copy_from_slice(value);
            at += key.len() + value.len();
        }
        let header = BucketHeader {
            root: 3,
            sequence: 0,
        }
        .encode();
        let root = single_element_page(4, LEAF_PAGE, BUCKET_LEAF_FLAG, b"outer", &header, 0);
        assemble(vec![outer, root], 4)
    }

    #[test]
    fn nested_buckets_are_reported_distinctly_and_readable() {
        let bytes = nested_file();
        let db = Db::from_reader(Cursor::new(&bytes)).unwrap();
        db.check().unwrap();
        let outer = db.bucket(b"outer").unwrap().unwrap();
        assert_eq!(outer.root_page(), Some(3));

        let mut values = Vec::new();
        outer
            .for_each(|k, v| values.push((k.to_vec(), v.to_vec())))
            .unwrap();
        assert_eq!(
            values,
            vec![(b"a".to_vec(), b"1".to_vec())],
            "nested buckets are skipped"
        );

        let mut entries = Vec::new();
        outer
            .try_for_each(|k, entry| {
                entries.push((k.to_vec(), entry == Entry::Bucket));
                Ok::<_, Error>(())
            })
            .unwrap();
        assert_eq!(
            entries,
            vec![(b"a".to_vec(), false), (b"inner".to_vec(), true)]
        );

        let inner = outer.bucket(b"inner").unwrap().unwrap();
        assert!(inner.is_inline());
        assert_eq!(inner.sequence(), 5);
        let mut inner_values = Vec::new();
        inner
            .for_each(|k, v| inner_values.push((k.to_vec(), v.to_vec())))
            .unwrap();
        assert_eq!(inner_values, vec![(b"x".to_vec(), b"y".to_vec())]);
        assert!(
            outer.bucket(b"a").unwrap().is_none(),
            "a value is not a bucket"
        );
        assert!(outer.bucket(b"zzz").unwrap().is_none());
    }
}
