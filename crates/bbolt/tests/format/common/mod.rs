//! Helpers shared by the integration tests: a plain in-memory model of a bbolt file (buckets of
//! sorted key/value pairs), writing a model with the crate's writer, and reading a file back into
//! a model with the crate's reader.

use std::io::{Cursor, Read, Seek};

use leasehold_bbolt::{Db, Writer};

/// A bucket's entries in key order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Top-level buckets in name order, each with its entries.
pub type Model = Vec<(Vec<u8>, Entries)>;

/// One bucket of a model.
pub fn named(name: &str, entries: Entries) -> (Vec<u8>, Entries) {
    (name.as_bytes().to_vec(), entries)
}

/// Writes `model` with the given page size; returns the file's bytes.
pub fn write_model(model: &Model, page_size: u32, txid: u64) -> Vec<u8> {
    let mut writer = Writer::with_page_size(Cursor::new(Vec::new()), page_size).unwrap();
    for (name, entries) in model {
        let mut bucket = writer.bucket(name).unwrap();
        for (key, value) in entries {
            bucket.put(key, value).unwrap();
        }
        bucket.finish().unwrap();
    }
    writer.finish(txid).unwrap().into_inner()
}

/// Reads every top-level bucket of `db` into a model.
pub fn read_model<R: Read + Seek>(db: &Db<R>) -> Model {
    let mut model = Model::new();
    for name in db.bucket_names().unwrap() {
        let bucket = db.bucket(&name).unwrap().expect("listed bucket opens");
        let mut entries = Vec::new();
        bucket
            .for_each(|k, v| entries.push((k.to_vec(), v.to_vec())))
            .unwrap();
        model.push((name, entries));
    }
    model
}

/// Opens in-memory file bytes.
pub fn open_bytes(bytes: &[u8]) -> Result<Db<Cursor<&[u8]>>, leasehold_bbolt::Error> {
    Db::from_reader(Cursor::new(bytes))
}

/// Writes `model`, reads it back, checks the file's structure, and compares.
pub fn round_trip(model: &Model, page_size: u32) -> Vec<u8> {
    let bytes = write_model(model, page_size, 7);
    assert_eq!(bytes.len() % page_size as usize, 0, "file is whole pages");
    let db = open_bytes(&bytes).unwrap();
    db.check().unwrap();
    assert_eq!(db.txid(), 7);
    assert_eq!(db.page_size(), page_size);
    assert_eq!(db.page_count() * u64::from(page_size), bytes.len() as u64);
    assert!(
        read_model(&db) == *model,
        "read back differs from what was written"
    );
    bytes
}

/// `n` keys of the shape etcd's "key" bucket uses: 8-byte big-endian main revision, '_', 8-byte
/// big-endian sub revision.
pub fn revision_key(main: u64, sub: u64) -> Vec<u8> {
    let mut key = main.to_be_bytes().to_vec();
    key.push(b'_');
    key.extend_from_slice(&sub.to_be_bytes());
    key
}

/// A deterministic pseudo-random byte string (xorshift), for values.
pub fn bytes_of(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Reads the flags of page `pgid` straight from the file bytes.
pub fn page_flags(bytes: &[u8], page_size: usize, pgid: u64) -> u16 {
    let at = pgid as usize * page_size + 8;
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// The child page of branch element `index` of page `pgid`, straight from the file bytes.
pub fn branch_child(bytes: &[u8], page_size: usize, pgid: u64, index: usize) -> u64 {
    let at = pgid as usize * page_size + 16 + 16 * index + 8;
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// How many levels the tree rooted at `root` has, following first children.
pub fn tree_depth(bytes: &[u8], page_size: usize, root: u64) -> usize {
    let mut depth = 1;
    let mut page = root;
    while page_flags(bytes, page_size, page) == 0x01 {
        page = branch_child(bytes, page_size, page, 0);
        depth += 1;
    }
    depth
}
