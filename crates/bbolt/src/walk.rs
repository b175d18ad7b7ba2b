//! Depth-first traversal of one bucket's B+tree, yielding its leaf entries in key order.
//!
//! The traversal defends against corrupt trees: it bounds the depth, refuses to enter a page (or
//! an overflow page) twice, requires branch and leaf pages to carry exactly their flag, and
//! requires the leaf keys to be strictly ascending.

use std::ops::ControlFlow;

use crate::error::Error;
use crate::format::{BRANCH_PAGE, LEAF_PAGE, PageHeader, Pgid};
use crate::page::{branch_element, leaf_element};

/// The deepest B+tree accepted; real trees are a handful of levels deep.
pub(crate) const MAX_TREE_DEPTH: usize = 64;

/// Where a tree starts: a page of the file, or an inline bucket's page (its bytes, and the id of
/// the page holding the bucket's entry, which labels errors).
#[derive(Debug, Clone, Copy)]
pub(crate) enum TreeRoot<'a> {
    Page(Pgid),
    Inline { page: &'a [u8], parent: Pgid },
}

/// A set of page ids below the high-water mark, one bit each.
#[derive(Debug)]
pub(crate) struct PageSet {
    bits: Vec<u64>,
}

impl PageSet {
    /// An empty set for page ids `0..pages` (`pages` is bounded by the file's length).
    pub(crate) fn new(pages: u64) -> PageSet {
        PageSet {
            bits: vec![0; pages.div_ceil(64) as usize],
        }
    }

    /// Adds `page`; false if it was already present.
    pub(crate) fn insert(&mut self, page: Pgid) -> bool {
        let (word, bit) = ((page / 64) as usize, 1u64 << (page % 64));
        let fresh = self.bits[word] & bit == 0;
        self.bits[word] |= bit;
        fresh
    }

    pub(crate) fn contains(&self, page: Pgid) -> bool {
        self.bits[(page / 64) as usize] & (1u64 << (page % 64)) != 0
    }
}

/// The callback of a walk: page id (of the leaf), element flags, key, value.
pub(crate) type Visit<'v, E> =
    dyn FnMut(Pgid, u32, &[u8], &[u8]) -> Result<ControlFlow<()>, E> + 'v;

/// Where a walk reads pages from: the file (`reader::Db`), each page checked to be in range
/// and to carry its own id.
pub(crate) trait Pages {
    /// The page `pgid` and its overflow pages.
    fn read_page(&self, pgid: Pgid) -> Result<Vec<u8>, Error>;
}

/// Walks the tree at `root`, calling `visit` for each leaf entry in order, until it breaks.
/// Every page entered is added to `seen`; a page already in `seen` is an error.
pub(crate) fn walk_tree<P, E>(
    db: &P,
    seen: &mut PageSet,
    root: TreeRoot<'_>,
    visit: &mut Visit<'_, E>,
) -> Result<(), E>
where
    P: Pages,
    E: From<Error>,
{
    let mut walk = Walk {
        db,
        seen,
        last_key: None,
    };
    // Whether the walk ran to the end or `visit` stopped it makes no difference to the caller.
    let _ended_or_stopped = match root {
        TreeRoot::Page(pgid) => walk.node(pgid, 0, visit)?,
        TreeRoot::Inline { page, parent } => {
            let header = PageHeader::decode(page);
            expect_flags(header.flags, LEAF_PAGE, parent, "leaf (inline bucket)")?;
            walk.leaf(page, parent, header.count, visit)?
        }
    };
    Ok(())
}

struct Walk<'a, P> {
    db: &'a P,
    seen: &'a mut PageSet,
    last_key: Option<Vec<u8>>,
}

impl<P: Pages> Walk<'_, P> {
    fn node<E: From<Error>>(
        &mut self,
        pgid: Pgid,
        depth: usize,
        visit: &mut Visit<'_, E>,
    ) -> Result<ControlFlow<()>, E> {
        if depth >= MAX_TREE_DEPTH {
            return Err(Error::TooDeep { page: pgid }.into());
        }
        let page = self.db.read_page(pgid)?;
        let header = PageHeader::decode(&page);
        if header.flags != BRANCH_PAGE {
            expect_flags(header.flags, LEAF_PAGE, pgid, "leaf or branch")?;
        }
        self.mark(pgid, header.overflow)?;
        if header.flags == BRANCH_PAGE {
            self.branch(&page, pgid, header.count, depth, visit)
        } else {
            self.leaf(&page, pgid, header.count, visit)
        }
    }

    /// Records the page and its overflow pages as visited (`read_page` checked their range).
    fn mark(&mut self, pgid: Pgid, overflow: u32) -> Result<(), Error> {
        for page in pgid..=pgid + u64::from(overflow) {
            if !self.seen.insert(page) {
                return Err(Error::PageRevisited { page });
            }
        }
        Ok(())
    }

    fn branch<E: From<Error>>(
        &mut self,
        page: &[u8],
        pgid: Pgid,
        count: u16,
        depth: usize,
        visit: &mut Visit<'_, E>,
    ) -> Result<ControlFlow<()>, E> {
        let mut previous: Option<&[u8]> = None;
        for index in 0..usize::from(count) {
            let elem = branch_element(page, pgid, index)?;
            if previous.is_some_and(|p| p >= elem.key) {
                return Err(Error::UnsortedKeys { page: pgid }.into());
            }
            previous = Some(elem.key);
            if self.node(elem.child, depth + 1, visit)?.is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    fn leaf<E: From<Error>>(
        &mut self,
        page: &[u8],
        pgid: Pgid,
        count: u16,
        visit: &mut Visit<'_, E>,
    ) -> Result<ControlFlow<()>, E> {
        for index in 0..usize::from(count) {
            let elem = leaf_element(page, pgid, index)?;
            self.check_order(elem.key, pgid)?;
            if visit(pgid, elem.flags, elem.key, elem.value)?.is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Requires `key` to be greater than the previous leaf key of this tree, then remembers it.
    fn check_order(&mut self, key: &[u8], pgid: Pgid) -> Result<(), Error> {
        match &mut self.last_key {
            Some(last) if last.as_slice() >= key => Err(Error::UnsortedKeys { page: pgid }),
            Some(last) => {
                last.clear();
                last.extend_from_slice(key);
                Ok(())
            }
            None => {
                self.last_key = Some(key.to_vec());
                Ok(())
            }
        }
    }
}

/// Requires a page's flags to be exactly `want`.
pub(crate) fn expect_flags(
    flags: u16,
    want: u16,
    page: Pgid,
    expected: &'static str,
) -> Result<(), Error> {
    if flags == want {
        Ok(())
    } else {
        Err(Error::BadPageType {
            page,
            flags,
            expected,
        })
    }
}
