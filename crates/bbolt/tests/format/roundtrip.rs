//! Writer → reader round trips: empty files and buckets, one key, trees several levels deep,
//! values spanning overflow pages, many buckets, random models; and the writer's refusals.

use crate::common;

use std::io::{Cursor, Seek, SeekFrom, Write};

use common::{
    Model, bytes_of, named, open_bytes, read_model, revision_key, round_trip, tree_depth,
    write_model,
};
use leasehold_bbolt::{Db, Entry, Error, Writer};
use proptest::prelude::*;

#[test]
fn file_without_buckets() {
    let bytes = round_trip(&Model::new(), 4096);
    assert_eq!(
        bytes.len(),
        4 * 4096,
        "two metas, the freelist, an empty root leaf"
    );
}

#[test]
fn empty_buckets_are_inline() {
    let model = vec![
        named("a", vec![]),
        named("b", vec![]),
        named("lease", vec![]),
    ];
    let bytes = round_trip(&model, 4096);
    let db = open_bytes(&bytes).unwrap();
    assert!(db.bucket(b"a").unwrap().unwrap().is_inline());
    assert!(db.bucket(b"missing").unwrap().is_none());
    assert!(db.bucket(b"").unwrap().is_none());
}

#[test]
fn one_key() {
    let model = vec![named("key", vec![(b"k".to_vec(), b"v".to_vec())])];
    round_trip(&model, 4096);
}

#[test]
fn bucket_just_over_a_quarter_page_gets_a_page() {
    let entries = vec![(b"k".to_vec(), vec![1u8; 1024])];
    let bytes = round_trip(&vec![named("x", entries)], 4096);
    let db = open_bytes(&bytes).unwrap();
    let x = db.bucket(b"x").unwrap().unwrap();
    assert!(!x.is_inline());
    assert!(x.root_page().unwrap() >= 3);
}

#[test]
fn many_keys_make_several_branch_levels() {
    let entries: Vec<_> = (0..60_000u64)
        .map(|i| (revision_key(i + 1, 0), bytes_of(i, (i % 200) as usize)))
        .collect();
    for page_size in [512, 4096] {
        let model = vec![
            named("key", entries.clone()),
            named("meta", vec![(b"m".to_vec(), b"1".to_vec())]),
        ];
        let bytes = round_trip(&model, page_size);
        let db = open_bytes(&bytes).unwrap();
        let root = db.bucket(b"key").unwrap().unwrap().root_page().unwrap();
        let depth = tree_depth(&bytes, page_size as usize, root);
        assert!(depth >= 3, "page size {page_size}: depth {depth}");
    }
}

#[test]
fn large_values_use_overflow_pages() {
    let big = 1_500_000;
    let entries = vec![
        (b"a".to_vec(), bytes_of(1, 10)),
        (b"b".to_vec(), bytes_of(2, big)),
        (b"c".to_vec(), bytes_of(3, 4096)),
        (b"d".to_vec(), bytes_of(4, 4080)),
        (b"e".to_vec(), bytes_of(5, big)),
        (b"f".to_vec(), vec![]),
    ];
    let bytes = round_trip(&vec![named("key", entries)], 4096);
    assert!(bytes.len() > 2 * big);
}

#[test]
fn many_buckets() {
    let model: Model = (0..3000u32)
        .map(|i| {
            let entries = (0..(i % 7))
                .map(|k| {
                    (
                        vec![b'k', k as u8],
                        bytes_of(u64::from(i), (i % 300) as usize),
                    )
                })
                .collect();
            (format!("bucket-{i:05}").into_bytes(), entries)
        })
        .collect();
    let bytes = round_trip(&model, 4096);
    let db = open_bytes(&bytes).unwrap();
    assert_eq!(db.bucket_names().unwrap().len(), 3000);
    let b = db.bucket(b"bucket-02999").unwrap().unwrap();
    let mut n = 0;
    b.for_each(|_, _| n += 1).unwrap();
    assert_eq!(n, 2999 % 7);
}

#[test]
fn try_for_each_stops_at_the_first_error() {
    let entries = (0..100u8).map(|i| (vec![i], vec![i])).collect();
    let bytes = write_model(&vec![named("b", entries)], 4096, 1);
    let db = open_bytes(&bytes).unwrap();
    let bucket = db.bucket(b"b").unwrap().unwrap();
    let mut seen = 0;
    let result: Result<(), Box<dyn std::error::Error>> = bucket.try_for_each(|key, entry| {
        assert!(matches!(entry, Entry::Value(v) if v == key));
        seen += 1;
        if key == [9] {
            Err("stop".into())
        } else {
            Ok(())
        }
    });
    assert_eq!(result.unwrap_err().to_string(), "stop");
    assert_eq!(seen, 10);
}

#[test]
fn output_is_left_at_its_end_and_trailing_bytes_are_ignored() {
    let model = vec![named("key", vec![(b"k".to_vec(), b"v".to_vec())])];
    let mut writer = Writer::new(Cursor::new(Vec::new()));
    let mut b = writer.bucket(b"key").unwrap();
    b.put(b"k", b"v").unwrap();
    b.set_sequence(99);
    b.finish().unwrap();
    let mut out = writer.finish(5).unwrap();
    out.write_all(&[0xAB; 32]).unwrap();
    let bytes = out.into_inner();
    assert_eq!(bytes.len() % 4096, 32);
    let db = open_bytes(&bytes).unwrap();
    db.check().unwrap();
    assert_eq!(read_model(&db), model);
    assert_eq!(db.bucket(b"key").unwrap().unwrap().sequence(), 99);
}

#[test]
fn opens_files_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let file = std::fs::File::create(&path).unwrap();
    let mut writer = Writer::new(std::io::BufWriter::new(file));
    let mut b = writer.bucket(b"key").unwrap();
    for i in 0..1000u64 {
        b.put(&revision_key(i, 0), &bytes_of(i, 100)).unwrap();
    }
    b.finish().unwrap();
    writer
        .finish(3)
        .unwrap()
        .into_inner()
        .unwrap()
        .sync_all()
        .unwrap();
    let db = Db::open(&path).unwrap();
    db.check().unwrap();
    let mut count = 0;
    db.bucket(b"key")
        .unwrap()
        .unwrap()
        .for_each(|_, _| count += 1)
        .unwrap();
    assert_eq!(count, 1000);
}

#[test]
fn writes_at_an_offset_into_the_stream() {
    let mut out = Cursor::new(Vec::new());
    out.write_all(b"prefix").unwrap();
    let mut writer = Writer::new(out);
    writer.bucket(b"a").unwrap().finish().unwrap();
    let bytes = writer.finish(1).unwrap().into_inner();
    let db = open_bytes(&bytes[6..]).unwrap();
    db.check().unwrap();
    assert_eq!(db.bucket_names().unwrap(), vec![b"a".to_vec()]);
}

#[test]
fn keys_out_of_order_are_rejected_and_the_bucket_stays_usable() {
    let mut writer = Writer::new(Cursor::new(Vec::new()));
    let mut b = writer.bucket(b"b").unwrap();
    b.put(b"2", b"").unwrap();
    let err = b.put(b"1", b"").unwrap_err();
    assert!(matches!(err, Error::KeyOrder { .. }), "{err}");
    assert!(
        matches!(b.put(b"2", b""), Err(Error::KeyOrder { .. })),
        "duplicates too"
    );
    assert!(matches!(b.put(b"", b""), Err(Error::EmptyKey)));
    assert!(matches!(
        b.put(&vec![1; 32769], b""),
        Err(Error::KeyTooLarge { len: 32769 })
    ));
    b.put(b"3", b"").unwrap();
    b.finish().unwrap();
    let err = writer.bucket(b"a").unwrap_err();
    assert!(matches!(err, Error::BucketOrder { .. }), "{err}");
    assert!(matches!(
        writer.bucket(b"b"),
        Err(Error::BucketOrder { .. })
    ));
    let bytes = writer.finish(1).unwrap().into_inner();
    let db = open_bytes(&bytes).unwrap();
    let expected = vec![named(
        "b",
        vec![(b"2".to_vec(), vec![]), (b"3".to_vec(), vec![])],
    )];
    assert_eq!(read_model(&db), expected);
}

#[test]
fn an_unfinished_bucket_is_an_error() {
    let mut writer = Writer::new(Cursor::new(Vec::new()));
    writer.bucket(b"a").unwrap().put(b"k", b"v").unwrap();
    assert!(matches!(writer.bucket(b"b"), Err(Error::BucketNotFinished)));
    assert!(matches!(writer.finish(1), Err(Error::BucketNotFinished)));
}

#[test]
fn bad_page_sizes_are_rejected() {
    for size in [0, 100, 511, 1000, 1 << 17] {
        assert!(matches!(
            Writer::with_page_size(Cursor::new(Vec::new()), size),
            Err(Error::BadPageSize(_))
        ));
    }
}

/// A sink that fails after a given number of bytes.
struct FailingWriter {
    inner: Cursor<Vec<u8>>,
    budget: usize,
}

impl Write for FailingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() > self.budget {
            return Err(std::io::Error::other("disk full"));
        }
        self.budget -= buf.len();
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Seek for FailingWriter {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.inner.seek(pos)
    }
}

#[test]
fn io_errors_poison_the_writer() {
    let mut writer = Writer::new(FailingWriter {
        inner: Cursor::new(Vec::new()),
        budget: 5 * 4096,
    });
    let mut b = writer.bucket(b"b").unwrap();
    let mut failed = None;
    for i in 0..10_000u32 {
        if let Err(e) = b.put(&i.to_be_bytes(), &[0; 100]) {
            failed = Some(e);
            break;
        }
    }
    assert!(matches!(failed, Some(Error::Io(_))), "{failed:?}");
    assert!(matches!(
        b.put(b"\xff\xff\xff\xff\xff", b""),
        Err(Error::WriterFailed)
    ));
    assert!(matches!(b.finish(), Err(Error::WriterFailed)));
}

fn model_strategy() -> impl Strategy<Value = Model> {
    let entries = prop::collection::btree_map(
        prop::collection::vec(any::<u8>(), 1..40),
        prop::collection::vec(any::<u8>(), 0..700),
        0..120,
    );
    prop::collection::btree_map(prop::collection::vec(any::<u8>(), 1..12), entries, 0..12).prop_map(
        |buckets| {
            buckets
                .into_iter()
                .map(|(name, entries)| (name, entries.into_iter().collect()))
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_models_round_trip(model in model_strategy(), small_pages in any::<bool>()) {
        round_trip(&model, if small_pages { 512 } else { 4096 });
    }
}
