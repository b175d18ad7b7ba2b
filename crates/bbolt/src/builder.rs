//! Building one bucket's B+tree bottom-up from entries given in key order, streaming its pages out
//! as they fill.
//!
//! Leaf pages are filled up to the page size; an entry too big for a page gets a page of its own
//! with overflow pages. Each full page is written at once and its first key and page id are
//! passed up to the branch level above, which in turn fills pages (at least two children each, so
//! the tree always narrows) and passes them up. Memory is one pending page per level. At the end
//! the partial pages are written bottom-up until one page remains: the root. A bucket small
//! enough (as bbolt decides: at most a quarter page) is instead returned inline.

use crate::error::Error;
use crate::format::{
    BRANCH_ELEMENT_SIZE, BRANCH_PAGE, BucketHeader, LEAF_ELEMENT_SIZE, LEAF_PAGE, PAGE_HEADER_SIZE,
    PageHeader, Pgid,
};

/// Where finished pages go. The sink assigns page ids (contiguously) and fills the header's id
/// and overflow fields.
pub(crate) trait PageSink {
    /// Writes `page` (a multiple of the page size long) and returns its page id.
    fn write_page(&mut self, page: &mut [u8]) -> Result<Pgid, Error>;
}

/// How a finished tree is referenced from its parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Built {
    /// The tree's root page.
    Root(Pgid),
    /// The whole bucket as an inline leaf page (without bucket header).
    Inline(Vec<u8>),
}

impl Built {
    /// The bucket value that refers to this tree: its header, then the inline page if any.
    pub(crate) fn bucket_value(&self, sequence: u64) -> Vec<u8> {
        let root = match self {
            Built::Root(pgid) => *pgid,
            Built::Inline(_) => 0,
        };
        let mut value = BucketHeader { root, sequence }.encode().to_vec();
        if let Built::Inline(page) = self {
            value.extend_from_slice(page);
        }
        value
    }
}

const _: () = assert!(LEAF_ELEMENT_SIZE == BRANCH_ELEMENT_SIZE);

/// One element waiting in a [`NodeBuf`]; its key (and value) are in the buffer's data.
#[derive(Debug, Clone, Copy)]
struct Elem {
    flags: u32,
    ksize: u32,
    vsize: u32,
    child: Pgid,
}

/// The elements of one page under construction, leaf or branch.
#[derive(Debug, Default)]
struct NodeBuf {
    elems: Vec<Elem>,
    data: Vec<u8>,
}

impl NodeBuf {
    fn len(&self) -> usize {
        self.elems.len()
    }

    /// The encoded size of the page, header included, before padding. (Leaf and branch elements
    /// are the same size, so this holds for both.)
    fn size(&self) -> usize {
        PAGE_HEADER_SIZE + self.elems.len() * LEAF_ELEMENT_SIZE + self.data.len()
    }

    fn push(&mut self, flags: u32, key: &[u8], value: &[u8], child: Pgid) {
        // Sizes were checked against bbolt's limits, which fit in u32.
        let elem = Elem {
            flags,
            ksize: key.len() as u32,
            vsize: value.len() as u32,
            child,
        };
        self.elems.push(elem);
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value);
    }

    fn first_key(&self) -> &[u8] {
        &self.data[..self.elems[0].ksize as usize]
    }

    fn clear(&mut self) {
        self.elems.clear();
        self.data.clear();
    }

    /// Encodes the page with the given flags, zero-padded to `pad_to` bytes (at least its size).
    fn encode(&self, flags: u16, pad_to: usize) -> Vec<u8> {
        let mut page = vec![0u8; pad_to.max(self.size())];
        let header = PageHeader {
            id: 0,
            flags,
            count: self.elems.len() as u16,
            overflow: 0,
        };
        header.encode(&mut page);
        let data_start = PAGE_HEADER_SIZE + self.elems.len() * LEAF_ELEMENT_SIZE;
        let mut data_at = data_start;
        for (index, elem) in self.elems.iter().enumerate() {
            let at = PAGE_HEADER_SIZE + index * LEAF_ELEMENT_SIZE;
            let pos = (data_at - at) as u32;
            let fields = &mut page[at..at + LEAF_ELEMENT_SIZE];
            if flags == BRANCH_PAGE {
                encode_branch_element(fields, pos, elem);
            } else {
                encode_leaf_element(fields, pos, elem);
            }
            data_at += (elem.ksize + elem.vsize) as usize;
        }
        page[data_start..data_at].copy_from_slice(&self.data);
        page
    }
}

fn encode_leaf_element(out: &mut [u8], pos: u32, elem: &Elem) {
    out[0..4].copy_from_slice(&elem.flags.to_le_bytes());
    out[4..8].copy_from_slice(&pos.to_le_bytes());
    out[8..12].copy_from_slice(&elem.ksize.to_le_bytes());
    out[12..16].copy_from_slice(&elem.vsize.to_le_bytes());
}

fn encode_branch_element(out: &mut [u8], pos: u32, elem: &Elem) {
    out[0..4].copy_from_slice(&pos.to_le_bytes());
    out[4..8].copy_from_slice(&elem.ksize.to_le_bytes());
    out[8..16].copy_from_slice(&elem.child.to_le_bytes());
}

/// One branch level: its pending page, and whether it has written a page yet.
#[derive(Debug, Default)]
struct Level {
    node: NodeBuf,
    flushed: bool,
}

/// Builds one bucket's tree from entries in strictly ascending key order.
#[derive(Debug)]
pub(crate) struct TreeBuilder {
    page_size: usize,
    leaf: NodeBuf,
    leaf_flushed: bool,
    /// `levels[0]` refers to leaf pages, `levels[1]` to `levels[0]`'s pages, and so on.
    levels: Vec<Level>,
    last_key: Option<Vec<u8>>,
}

impl TreeBuilder {
    pub(crate) fn new(page_size: usize) -> TreeBuilder {
        TreeBuilder {
            page_size,
            leaf: NodeBuf::default(),
            leaf_flushed: false,
            levels: Vec::new(),
            last_key: None,
        }
    }

    /// Adds an entry; its key must be greater than the previous one. The caller has checked the
    /// key and value against bbolt's size limits.
    pub(crate) fn push(
        &mut self,
        sink: &mut dyn PageSink,
        flags: u32,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), Error> {
        self.check_order(key)?;
        let added = LEAF_ELEMENT_SIZE + key.len() + value.len();
        if self.leaf.len() > 0 && self.leaf.size() + added > self.page_size {
            self.flush_leaf(sink)?;
        }
        self.leaf.push(flags, key, value, 0);
        self.remember(key);
        Ok(())
    }

    fn check_order(&self, key: &[u8]) -> Result<(), Error> {
        match &self.last_key {
            Some(previous) if previous.as_slice() >= key => Err(Error::KeyOrder {
                key: key.to_vec(),
                previous: previous.clone(),
            }),
            _ => Ok(()),
        }
    }

    fn remember(&mut self, key: &[u8]) {
        let last = self.last_key.get_or_insert_with(Vec::new);
        last.clear();
        last.extend_from_slice(key);
    }

    /// Finishes the tree: inline if small enough (at most a quarter page, bbolt's rule), else
    /// as pages.
    pub(crate) fn finish(self, sink: &mut dyn PageSink) -> Result<Built, Error> {
        if !self.leaf_flushed && self.leaf.size() <= self.page_size / 4 {
            return Ok(Built::Inline(self.leaf.encode(LEAF_PAGE, 0)));
        }
        self.finish_pages(sink).map(Built::Root)
    }

    /// Finishes the tree as pages and returns its root page.
    pub(crate) fn finish_pages(mut self, sink: &mut dyn PageSink) -> Result<Pgid, Error> {
        if !self.leaf_flushed {
            return self.write(sink, &self.leaf, LEAF_PAGE);
        }
        self.flush_leaf(sink)?;
        let mut level = 0;
        loop {
            let current = &self.levels[level];
            if !current.flushed && current.node.len() == 1 {
                return Ok(current.node.elems[0].child);
            }
            self.flush_branch(sink, level)?;
            level += 1;
        }
    }

    /// Writes the pending leaf page and passes it up to the first branch level.
    fn flush_leaf(&mut self, sink: &mut dyn PageSink) -> Result<(), Error> {
        let pgid = self.write(sink, &self.leaf, LEAF_PAGE)?;
        let first = self.leaf.first_key().to_vec();
        self.leaf.clear();
        self.leaf_flushed = true;
        self.add_child(sink, 0, &first, pgid)
    }

    /// Adds a child page to branch level `level`, writing that level's page first if it is full.
    fn add_child(
        &mut self,
        sink: &mut dyn PageSink,
        level: usize,
        key: &[u8],
        child: Pgid,
    ) -> Result<(), Error> {
        if self.levels.len() == level {
            self.levels.push(Level::default());
        }
        let added = BRANCH_ELEMENT_SIZE + key.len();
        let node = &self.levels[level].node;
        // At least two children per branch page, so each level is smaller than the one below.
        if node.len() >= 2 && node.size() + added > self.page_size {
            self.flush_branch(sink, level)?;
        }
        self.levels[level].node.push(0, key, &[], child);
        Ok(())
    }

    /// Writes branch level `level`'s pending page and passes it up a level.
    fn flush_branch(&mut self, sink: &mut dyn PageSink, level: usize) -> Result<(), Error> {
        let pgid = self.write(sink, &self.levels[level].node, BRANCH_PAGE)?;
        let first = self.levels[level].node.first_key().to_vec();
        self.levels[level].node.clear();
        self.levels[level].flushed = true;
        self.add_child(sink, level + 1, &first, pgid)
    }

    /// Encodes `node` as a page padded to whole pages and writes it.
    fn write(&self, sink: &mut dyn PageSink, node: &NodeBuf, flags: u16) -> Result<Pgid, Error> {
        let pad_to = node.size().div_ceil(self.page_size).max(1) * self.page_size;
        let mut page = node.encode(flags, pad_to);
        sink.write_page(&mut page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::{branch_element, leaf_element};

    /// Collects pages in memory, as a file would hold them.
    struct MemSink {
        page_size: usize,
        pages: Vec<Vec<u8>>,
        next: Pgid,
    }

    impl PageSink for MemSink {
        fn write_page(&mut self, page: &mut [u8]) -> Result<Pgid, Error> {
            let id = self.next;
            let span = (page.len() / self.page_size) as u64;
            let mut header = PageHeader::decode(page);
            header.id = id;
            header.overflow = (span - 1) as u32;
            header.encode(page);
            self.pages.push(page.to_vec());
            self.next += span;
            Ok(id)
        }
    }

    fn sink() -> MemSink {
        MemSink {
            page_size: 512,
            pages: Vec::new(),
            next: 10,
        }
    }

    #[test]
    fn small_tree_is_inline() {
        let mut sink = sink();
        let mut tree = TreeBuilder::new(512);
        tree.push(&mut sink, 0, b"a", b"1").unwrap();
        let Built::Inline(page) = tree.finish(&mut sink).unwrap() else {
            panic!("not inline")
        };
        assert_eq!(page.len(), 16 + 16 + 2);
        let elem = leaf_element(&page, 0, 0).unwrap();
        assert_eq!((elem.key, elem.value), (&b"a"[..], &b"1"[..]));
        assert!(sink.pages.is_empty());
    }

    #[test]
    fn empty_tree_without_inline_is_one_empty_leaf() {
        let mut sink = sink();
        let root = TreeBuilder::new(512).finish_pages(&mut sink).unwrap();
        assert_eq!(root, 10);
        assert_eq!(
            PageHeader::decode(&sink.pages[0]),
            PageHeader {
                id: 10,
                flags: LEAF_PAGE,
                count: 0,
                overflow: 0
            }
        );
    }

    #[test]
    fn big_tree_gets_branch_levels_with_first_keys() {
        let mut sink = sink();
        let mut tree = TreeBuilder::new(512);
        for i in 0..2000u32 {
            tree.push(&mut sink, 0, &i.to_be_bytes(), b"value").unwrap();
        }
        let Built::Root(root) = tree.finish(&mut sink).unwrap() else {
            panic!("inline")
        };
        let root_page = &sink.pages[(root - 10) as usize];
        assert_eq!(PageHeader::decode(root_page).flags, BRANCH_PAGE);
        assert_eq!(
            branch_element(root_page, root, 0).unwrap().key,
            &0u32.to_be_bytes()
        );
    }

    #[test]
    fn oversized_entry_gets_overflow_pages() {
        let mut sink = sink();
        let mut tree = TreeBuilder::new(512);
        tree.push(&mut sink, 0, b"a", &[7u8; 1500]).unwrap();
        tree.push(&mut sink, 0, b"b", b"small").unwrap();
        tree.finish(&mut sink).unwrap();
        assert_eq!(
            PageHeader::decode(&sink.pages[0]).overflow,
            2,
            "16 + 16 + 1 + 1500 bytes span 3 pages"
        );
        assert_eq!(PageHeader::decode(&sink.pages[1]).id, 13);
    }

    #[test]
    fn keys_must_ascend() {
        let mut sink = sink();
        let mut tree = TreeBuilder::new(512);
        tree.push(&mut sink, 0, b"b", b"").unwrap();
        assert!(matches!(
            tree.push(&mut sink, 0, b"b", b""),
            Err(Error::KeyOrder { .. })
        ));
        assert!(matches!(
            tree.push(&mut sink, 0, b"a", b""),
            Err(Error::KeyOrder { .. })
        ));
        tree.push(&mut sink, 0, b"c", b"").unwrap();
    }
}
