//! Corrupt files: damaged meta pages, truncation, page ids past the end, cycles, wrong page
//! types, elements beyond their page, unsorted keys, absurd counts and lengths, and random damage.
//! Each must give an error (or, where a good copy survives, the good data): never a panic, a hang
//! or a huge allocation.

use crate::common;

use common::{Model, branch_child, bytes_of, open_bytes, read_model, revision_key, write_model};
use leasehold_bbolt::Error;
use proptest::prelude::*;

const PS: usize = 4096;

/// A file with a three-level "key" bucket, an inline bucket and a paged one.
fn sample() -> (Model, Vec<u8>) {
    let keys = (1..=20_000u64)
        .map(|rev| (revision_key(rev, 0), bytes_of(rev, 120)))
        .collect();
    let model = vec![
        (b"inline".to_vec(), vec![(b"a".to_vec(), b"1".to_vec())]),
        (b"key".to_vec(), keys),
        (
            b"paged".to_vec(),
            vec![(b"big".to_vec(), bytes_of(9, 10_000))],
        ),
    ];
    let bytes = write_model(&model, PS as u32, 10);
    (model, bytes)
}

fn key_root(bytes: &[u8]) -> u64 {
    let db = open_bytes(bytes).unwrap();
    db.bucket(b"key").unwrap().unwrap().root_page().unwrap()
}

/// The first leaf page of the "key" bucket.
fn first_leaf(bytes: &[u8]) -> u64 {
    let mut page = key_root(bytes);
    while common::page_flags(bytes, PS, page) == 0x01 {
        page = branch_child(bytes, PS, page, 0);
    }
    page
}

fn set_u16(bytes: &mut [u8], at: usize, v: u16) {
    bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn set_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn set_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Iterates the "key" bucket, returning the error it ends with.
fn key_bucket_error(bytes: &[u8]) -> Error {
    let db = open_bytes(bytes).unwrap();
    let bucket = db.bucket(b"key").unwrap().unwrap();
    let err = bucket.for_each(|_, _| {}).unwrap_err();
    let check = db.check().unwrap_err();
    assert_eq!(
        check.to_string(),
        err.to_string(),
        "check finds the same problem"
    );
    err
}

#[test]
fn one_damaged_meta_page_falls_back_to_the_other() {
    let (model, mut bytes) = sample();
    bytes[16 + 40] ^= 0x01; // meta 0's high-water mark
    let db = open_bytes(&bytes).unwrap();
    assert_eq!(db.txid(), 9, "meta 1 (txid - 1) is used");
    assert_eq!(read_model(&db), model);

    let (_, mut bytes) = sample();
    bytes[PS + 16 + 20] ^= 0x80; // meta 1's root
    assert_eq!(open_bytes(&bytes).unwrap().txid(), 10);
}

#[test]
fn both_meta_pages_damaged() {
    let (_, mut bytes) = sample();
    bytes[16 + 40] ^= 0x01;
    bytes[PS + 16 + 40] ^= 0x01;
    let err = open_bytes(&bytes).unwrap_err();
    assert!(matches!(err, Error::MetaChecksum { page: 0 }), "{err}");
    assert_eq!(err.to_string(), "meta page 0: checksum mismatch");

    let (_, mut bytes) = sample();
    bytes[16] ^= 0xFF;
    bytes[PS + 16] ^= 0xFF;
    let err = open_bytes(&bytes).unwrap_err();
    assert_eq!(err.to_string(), "not a bbolt file: bad magic");

    let (_, mut bytes) = sample();
    set_u32(&mut bytes, 16 + 4, 3);
    set_u32(&mut bytes, PS + 16 + 4, 3);
    assert!(matches!(
        open_bytes(&bytes),
        Err(Error::UnsupportedVersion(3))
    ));
}

#[test]
fn not_bbolt_files() {
    for bytes in [vec![], vec![0; 10], vec![0; 3 * PS], bytes_of(5, 50_000)] {
        assert!(
            matches!(open_bytes(&bytes), Err(Error::BadMagic)),
            "{} bytes",
            bytes.len()
        );
    }
}

#[test]
fn truncated_files() {
    let (_, bytes) = sample();
    for len in [PS + 100, 3 * PS, bytes.len() / 2, bytes.len() - 1] {
        let err = open_bytes(&bytes[..len]).unwrap_err();
        assert!(matches!(err, Error::Truncated { .. }), "{len}: {err}");
        assert!(err.to_string().starts_with("file truncated"), "{err}");
    }
}

#[test]
fn page_id_past_the_end() {
    let (_, mut bytes) = sample();
    let root = key_root(&bytes);
    set_u64(&mut bytes, root as usize * PS + 16 + 8, 1_000_000);
    let pages = bytes.len() / PS;
    let err = key_bucket_error(&bytes);
    assert_eq!(
        err.to_string(),
        format!("page 1000000 out of range (file has {pages} pages)")
    );
}

#[test]
fn cycles_are_detected() {
    let (_, mut bytes) = sample();
    let root = key_root(&bytes);
    let child = branch_child(&bytes, PS, root, 0);
    // The root's second child points back at the root; its first child's first child at the
    // root too.
    set_u64(&mut bytes, root as usize * PS + 16 + 16 + 8, root);
    let err = key_bucket_error(&bytes);
    assert!(
        matches!(err, Error::PageRevisited { page } if page == root),
        "{err}"
    );

    let (_, mut bytes) = sample();
    set_u64(&mut bytes, child as usize * PS + 16 + 8, root);
    assert!(matches!(
        key_bucket_error(&bytes),
        Error::PageRevisited { .. }
    ));
}

#[test]
fn shared_pages_are_detected() {
    let (_, mut bytes) = sample();
    let root = key_root(&bytes);
    let first = branch_child(&bytes, PS, root, 0);
    set_u64(&mut bytes, root as usize * PS + 16 + 16 + 8, first);
    assert!(matches!(
        key_bucket_error(&bytes),
        Error::PageRevisited { .. } | Error::UnsortedKeys { .. }
    ));
}

#[test]
fn wrong_page_types() {
    let (_, mut bytes) = sample();
    let root = key_root(&bytes);
    set_u64(&mut bytes, root as usize * PS + 16 + 8, 0); // a meta page as child
    let err = key_bucket_error(&bytes);
    assert!(
        matches!(
            err,
            Error::BadPageType {
                page: 0,
                flags: 0x04,
                ..
            }
        ),
        "{err}"
    );

    let (_, mut bytes) = sample();
    let leaf = first_leaf(&bytes);
    set_u16(&mut bytes, leaf as usize * PS + 8, 0x03);
    assert!(matches!(
        key_bucket_error(&bytes),
        Error::BadPageType { flags: 0x03, .. }
    ));

    let (_, mut bytes) = sample();
    set_u64(&mut bytes, leaf as usize * PS, leaf + 1);
    let err = key_bucket_error(&bytes);
    assert!(matches!(err, Error::PageIdMismatch { .. }), "{err}");
}

#[test]
fn elements_beyond_their_page() {
    let (_, mut bytes) = sample();
    let leaf = first_leaf(&bytes) as usize;
    set_u32(&mut bytes, leaf * PS + 16 + 8, 0xFFFF_0000); // ksize of element 0
    let err = key_bucket_error(&bytes);
    assert_eq!(
        err.to_string(),
        format!("page {leaf}: element 0 lies beyond the page")
    );

    let (_, mut bytes) = sample();
    set_u32(&mut bytes, leaf * PS + 16 + 4, u32::MAX); // pos of element 0
    assert!(matches!(
        key_bucket_error(&bytes),
        Error::ElementOutOfBounds { index: 0, .. }
    ));

    let (_, mut bytes) = sample();
    set_u16(&mut bytes, leaf * PS + 10, u16::MAX); // count
    assert!(matches!(
        key_bucket_error(&bytes),
        Error::ElementOutOfBounds { .. }
    ));
}

#[test]
fn absurd_overflow_is_out_of_range_not_allocated() {
    let (_, mut bytes) = sample();
    let leaf = first_leaf(&bytes);
    set_u32(&mut bytes, leaf as usize * PS + 12, u32::MAX);
    assert!(matches!(
        key_bucket_error(&bytes),
        Error::PageOutOfRange { .. }
    ));
}

#[test]
fn unsorted_keys() {
    let (_, mut bytes) = sample();
    let leaf = first_leaf(&bytes) as usize;
    let at = leaf * PS + 16;
    let pos = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
    bytes[at + pos] = 0xFF; // element 0's key now sorts after element 1's
    let err = key_bucket_error(&bytes);
    assert_eq!(
        err.to_string(),
        format!("page {leaf}: keys not in ascending order")
    );
}

#[test]
fn damaged_bucket_headers_and_inline_pages() {
    let (_, bytes) = sample();
    // The root bucket's leaf page holds the three bucket entries; "inline" is the first.
    let root_leaf = (bytes.len() / PS) - 1;
    let at = root_leaf * PS + 16;
    let pos = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
    let value_at = at + pos + b"inline".len();

    let mut damaged = bytes.clone();
    set_u16(&mut damaged, value_at + 16 + 10, 500); // the inline page's count
    let db = open_bytes(&damaged).unwrap();
    let inline = db.bucket(b"inline").unwrap().unwrap();
    assert!(matches!(
        inline.for_each(|_, _| {}),
        Err(Error::ElementOutOfBounds { .. })
    ));

    let mut damaged = bytes.clone();
    set_u16(&mut damaged, value_at + 16 + 8, 0x01); // the inline page claims to be a branch
    let db = open_bytes(&damaged).unwrap();
    let err = db
        .bucket(b"inline")
        .unwrap()
        .unwrap()
        .for_each(|_, _| {})
        .unwrap_err();
    assert!(matches!(err, Error::BadPageType { .. }), "{err}");

    let mut damaged = bytes;
    set_u32(&mut damaged, at, 0); // the "inline" entry loses its bucket flag
    let db = open_bytes(&damaged).unwrap();
    let err = db.bucket_names().unwrap_err();
    assert!(matches!(err, Error::BadBucket { .. }), "{err}");
}

#[test]
fn damaged_freelist() {
    let (_, mut bytes) = sample();
    set_u16(&mut bytes, 2 * PS + 10, 0xFFFF);
    set_u64(&mut bytes, 2 * PS + 16, u64::MAX);
    let db = open_bytes(&bytes).unwrap();
    assert!(matches!(db.check(), Err(Error::BadFreelist { .. })));
    assert!(
        db.bucket(b"key")
            .unwrap()
            .unwrap()
            .for_each(|_, _| {})
            .is_ok(),
        "data still reads"
    );

    let (_, mut bytes) = sample();
    set_u16(&mut bytes, 2 * PS + 10, 1);
    set_u64(&mut bytes, 2 * PS + 16, 3); // page 3, in use, listed as free
    let err = open_bytes(&bytes).unwrap().check().unwrap_err();
    assert!(
        matches!(err, Error::FreedPageReachable { page: 3 }),
        "{err}"
    );
}

/// Reads everything the file offers; any outcome but a panic is fine.
fn read_everything(bytes: &[u8]) {
    let Ok(db) = open_bytes(bytes) else { return };
    let _ = db.check();
    let Ok(names) = db.bucket_names() else { return };
    for name in names {
        if let Ok(Some(bucket)) = db.bucket(&name) {
            let _ = bucket.for_each(|_, _| {});
        }
    }
}

fn small_sample() -> Vec<u8> {
    let keys = (1..=400u64)
        .map(|rev| (revision_key(rev, 0), bytes_of(rev, rev as usize % 90)))
        .collect();
    let model = vec![
        (b"a".to_vec(), vec![(b"x".to_vec(), b"y".to_vec())]),
        (b"key".to_vec(), keys),
        (b"z".to_vec(), vec![(b"big".to_vec(), bytes_of(1, 2000))]),
    ];
    write_model(&model, 512, 3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_damage_never_panics(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<Option<prop::sample::Index>>(),
    ) {
        let mut bytes = small_sample();
        for (at, byte) in flips {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        read_everything(&bytes);
    }
}
