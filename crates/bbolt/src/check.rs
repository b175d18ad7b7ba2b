//! A consistency check of a whole file, in the spirit of bbolt's `Tx.Check`: every bucket (nested
//! ones included) must be readable, no page may be referenced twice or be both used and free,
//! and every page below the high-water mark must be used or free.

use std::io::{Read, Seek};
use std::ops::ControlFlow;

use crate::error::Error;
use crate::format::{
    BUCKET_LEAF_FLAG, FREELIST_PAGE, NO_FREELIST, PAGE_HEADER_SIZE, PageHeader, Pgid, read_u64,
};
use crate::reader::{Bucket, Db};
use crate::walk::{PageSet, expect_flags, walk_tree};

/// The freelist's page count that means "the real count is in the first id slot".
const COUNT_IN_FIRST_SLOT: u16 = 0xFFFF;

impl<R: Read + Seek> Db<R> {
    /// Checks the whole file's page structure, returning the first inconsistency found.
    /// When the file stores no freelist, unreachable pages cannot be told from free ones and are
    /// not reported.
    pub fn check(&self) -> Result<(), Error> {
        let pages = self.meta().pgid;
        let mut used = PageSet::new(pages);
        used.insert(0);
        used.insert(1);
        let free = self.read_freelist(&mut used)?;
        self.check_bucket(&self.root(), &mut used)?;
        for page in 0..pages {
            match &free {
                Some(free) if free.contains(page) && used.contains(page) => {
                    return Err(Error::FreedPageReachable { page });
                }
                Some(free) if !free.contains(page) && !used.contains(page) => {
                    return Err(Error::UnreachablePage { page });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Walks `bucket`'s tree, marking its pages used, then checks its nested buckets likewise.
    fn check_bucket(&self, bucket: &Bucket<'_, R>, used: &mut PageSet) -> Result<(), Error> {
        let mut nested = Vec::new();
        walk_tree(
            self,
            used,
            bucket.tree_root(),
            &mut |pgid, flags, key, value| {
                if flags & BUCKET_LEAF_FLAG != 0 {
                    nested.push((pgid, key.to_vec(), value.to_vec()));
                }
                Ok::<_, Error>(ControlFlow::Continue(()))
            },
        )?;
        for (pgid, name, value) in nested {
            let child = Bucket::from_entry(self, pgid, &name, &value, bucket.depth() + 1)?;
            self.check_bucket(&child, used)?;
        }
        Ok(())
    }

    /// Reads the freelist (if the file stores one), marking its own pages used, and returns the
    /// set of free pages.
    fn read_freelist(&self, used: &mut PageSet) -> Result<Option<PageSet>, Error> {
        let pgid = self.meta().freelist;
        if pgid == NO_FREELIST {
            return Ok(None);
        }
        let page = self.read_page(pgid)?;
        let header = PageHeader::decode(&page);
        expect_flags(header.flags, FREELIST_PAGE, pgid, "freelist")?;
        for page in pgid..=pgid + u64::from(header.overflow) {
            if !used.insert(page) {
                return Err(Error::PageRevisited { page });
            }
        }
        let ids = freelist_ids(&page, pgid, header.count)?;
        let pages = self.meta().pgid;
        let mut free = PageSet::new(pages);
        for id in ids {
            if id < 2 || id >= pages {
                return Err(Error::BadFreelist {
                    page: pgid,
                    reason: "free page id out of range",
                });
            }
            if !free.insert(id) {
                return Err(Error::BadFreelist {
                    page: pgid,
                    reason: "page listed twice",
                });
            }
        }
        Ok(Some(free))
    }
}

/// The page ids a freelist page lists, after checking that they fit in the page.
fn freelist_ids(
    page: &[u8],
    pgid: Pgid,
    count: u16,
) -> Result<impl Iterator<Item = Pgid> + '_, Error> {
    let too_long = || Error::BadFreelist {
        page: pgid,
        reason: "count runs beyond the page",
    };
    let slots = (page.len() - PAGE_HEADER_SIZE) / 8;
    let (first, count) = if count == COUNT_IN_FIRST_SLOT {
        if slots == 0 {
            return Err(too_long());
        }
        (1, read_u64(page, PAGE_HEADER_SIZE))
    } else {
        (0, u64::from(count))
    };
    if count > (slots - first) as u64 {
        return Err(too_long());
    }
    let ids =
        (first..first + count as usize).map(move |i| read_u64(page, PAGE_HEADER_SIZE + 8 * i));
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;
    use crate::format::{BRANCH_PAGE, BucketHeader, LEAF_PAGE, Meta};
    use crate::testutil::{PS, assemble, meta_page, single_element_page};
    use crate::writer::Writer;

    /// Rewrites both meta pages of `bytes` through `edit`.
    fn edit_metas(bytes: &mut [u8], edit: impl Fn(&mut Meta)) {
        for id in 0..2 {
            let at = id * PS;
            let mut meta = Meta::decode(&bytes[at + 16..at + 80], id as u64).unwrap();
            edit(&mut meta);
            bytes[at..at + PS].copy_from_slice(&meta_page(id as u64, &meta));
        }
    }

    fn written() -> Vec<u8> {
        let mut writer = Writer::with_page_size(Cursor::new(Vec::new()), PS as u32).unwrap();
        let mut bucket = writer.bucket(b"b").unwrap();
        for i in 0..200u32 {
            bucket.put(&i.to_be_bytes(), &[1; 30]).unwrap();
        }
        bucket.finish().unwrap();
        writer.finish(1).unwrap().into_inner()
    }

    #[test]
    fn written_files_pass() {
        let bytes = written();
        let db = Db::from_reader(Cursor::new(&bytes)).unwrap();
        db.check().unwrap();
    }

    #[test]
    fn unreachable_pages_are_reported() {
        let mut bytes = written();
        let pages = (bytes.len() / PS) as u64;
        bytes.extend_from_slice(&[0; PS]);
        edit_metas(&mut bytes, |meta| meta.pgid += 1);
        let db = Db::from_reader(Cursor::new(&bytes)).unwrap();
        let err = db.check().unwrap_err();
        let unreachable = matches!(err, Error::UnreachablePage { page } if page == pages);
        assert!(unreachable, "{err}");

        // Listed as free, the extra page is fine.
        let freelist = 2 * PS;
        bytes[freelist + 10..freelist + 12].copy_from_slice(&1u16.to_le_bytes());
        bytes[freelist + 16..freelist + 24].copy_from_slice(&pages.to_le_bytes());
        let db = Db::from_reader(Cursor::new(&bytes)).unwrap();
        db.check().unwrap();
    }

    #[test]
    fn over_deep_trees_are_rejected() {
        let chain = 70u64;
        let first = 3;
        let leaf = first + chain;
        let mut pages = Vec::new();
        for id in first..leaf {
            pages.push(single_element_page(id, BRANCH_PAGE, 0, b"k", b"", id + 1));
        }
        pages.push(single_element_page(leaf, LEAF_PAGE, 0, b"k", b"v", 0));
        let header = BucketHeader {
            root: first,
            sequence: 0,
        }
        .encode();
        let root = leaf + 1;
        pages.push(single_element_page(
            root,
            LEAF_PAGE,
            BUCKET_LEAF_FLAG,
            b"b",
            &header,
            0,
        ));
        let bytes = assemble(pages, root);

        let db = Db::from_reader(Cursor::new(&bytes)).unwrap();
        let bucket = db.bucket(b"b").unwrap().unwrap();
        let err = bucket.for_each(|_, _| {}).unwrap_err();
        assert!(matches!(err, Error::TooDeep { .. }), "{err}");
        assert!(matches!(db.check(), Err(Error::TooDeep { .. })));
    }
}
