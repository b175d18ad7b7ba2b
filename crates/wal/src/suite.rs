//! The log's conformance suite: each case runs on the real file system (a temporary directory)
//! and on [`MemFs`]; the crash cases need `MemFs`'s crash model and run there only.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::proto::{Batch, Compacted, Entry, EntryType, HardState};
use crate::{Crash, Fs, MemFs, StdFs, Wal, WalError, WalOptions};

const SMALL: WalOptions = WalOptions {
    segment_bytes: 4096,
};

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        entry_type: EntryType::EntryNormal as i32,
        term,
        index,
        data: Bytes::from(format!("entry {index} of term {term}")),
        context: Bytes::new(),
    }
}

fn entries(from: u64, to: u64, term: u64) -> Vec<Entry> {
    (from..=to).map(|i| entry(i, term)).collect()
}

fn batch(from: u64, to: u64, term: u64) -> Batch {
    Batch {
        entries: entries(from, to, term),
        hard_state: Some(HardState {
            term,
            vote: 1,
            commit: from.saturating_sub(1),
        }),
        ..Batch::default()
    }
}

fn indexes(es: &[Entry]) -> Vec<(u64, u64)> {
    es.iter().map(|e| (e.index, e.term)).collect()
}

/// Runs `case` on a fresh directory of each file system.
fn on_both(case: impl Fn(&dyn Fn() -> Box<dyn Opener>)) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("wal");
    case(&|| Box::new((StdFs, dir.clone())) as Box<dyn Opener>);
    let mem = MemFs::new();
    case(&|| Box::new((mem.clone(), PathBuf::from("/data/wal"))) as Box<dyn Opener>);
}

/// Opens the same log again and again, on whichever file system.
trait Opener {
    fn open(&self, options: WalOptions) -> Result<(Box<dyn Log>, crate::Recovered), WalError>;
    fn list(&self) -> Vec<String>;
    fn remove(&self, name: &str);
}

trait Log {
    fn append(&mut self, batch: &Batch) -> Result<(), WalError>;
    fn compact(&mut self, mark: Compacted) -> Result<(), WalError>;
    fn segment_count(&self) -> usize;
    fn last_index(&self) -> u64;
    /// What a [`crate::WalReader`] of this log reads.
    fn read(&self, low: u64, high: u64, max_bytes: u64) -> Result<Vec<Entry>, WalError>;
}

impl<F: Fs> Log for Wal<F> {
    fn append(&mut self, batch: &Batch) -> Result<(), WalError> {
        Wal::append(self, batch)
    }
    fn compact(&mut self, mark: Compacted) -> Result<(), WalError> {
        Wal::compact(self, mark)
    }
    fn segment_count(&self) -> usize {
        Wal::segment_count(self)
    }
    fn last_index(&self) -> u64 {
        Wal::last_index(self)
    }
    fn read(&self, low: u64, high: u64, max_bytes: u64) -> Result<Vec<Entry>, WalError> {
        self.reader().read(low, high, max_bytes)
    }
}

impl<F: Fs + Clone> Opener for (F, PathBuf) {
    fn open(&self, options: WalOptions) -> Result<(Box<dyn Log>, crate::Recovered), WalError> {
        let (wal, recovered) = Wal::open_on(self.0.clone(), &self.1, options)?;
        Ok((Box::new(wal), recovered))
    }
    fn list(&self) -> Vec<String> {
        let mut names = self.0.list(&self.1).expect("list");
        names.sort();
        names
    }
    fn remove(&self, name: &str) {
        self.0.remove(&self.1.join(name)).expect("remove");
    }
}

#[test]
fn a_new_log_is_empty_and_reopens_empty() {
    on_both(|log| {
        let (_wal, recovered) = log().open(SMALL).expect("create");
        assert!(recovered.entries.is_empty());
        assert_eq!(recovered.hard_state, HardState::default());
        drop(_wal);
        let (wal, recovered) = log().open(SMALL).expect("reopen");
        assert!(recovered.entries.is_empty());
        assert_eq!(wal.last_index(), 0);
    });
}

#[test]
fn appended_entries_and_hard_state_come_back_after_a_reopen() {
    on_both(|log| {
        let (mut wal, _) = log().open(SMALL).expect("create");
        wal.append(&batch(1, 3, 1)).expect("append");
        wal.append(&batch(4, 5, 2)).expect("append");
        drop(wal);
        let (wal, recovered) = log().open(SMALL).expect("reopen");
        assert_eq!(
            indexes(&recovered.entries),
            vec![(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]
        );
        assert_eq!(recovered.entries[2], entry(3, 1));
        assert_eq!(
            recovered.hard_state,
            HardState {
                term: 2,
                vote: 1,
                commit: 3
            }
        );
        assert_eq!(wal.last_index(), 5);
        assert_eq!(recovered.torn_bytes_cleared, 0);
    });
}

#[test]
fn an_append_at_an_earlier_index_replaces_the_conflicting_suffix() {
    on_both(|log| {
        let (mut wal, _) = log().open(SMALL).expect("create");
        wal.append(&batch(1, 5, 1)).expect("append");
        wal.append(&batch(3, 4, 2)).expect("append");
        assert_eq!(wal.last_index(), 4);
        drop(wal);
        let (_, recovered) = log().open(SMALL).expect("reopen");
        assert_eq!(
            indexes(&recovered.entries),
            vec![(1, 1), (2, 1), (3, 2), (4, 2)]
        );
    });
}

#[test]
fn appends_that_leave_a_gap_or_reach_below_the_mark_are_refused_before_writing() {
    on_both(|log| {
        let (mut wal, _) = log().open(SMALL).expect("create");
        wal.append(&batch(1, 3, 1)).expect("append");
        let gap = wal.append(&batch(5, 6, 1));
        assert!(
            matches!(
                gap,
                Err(WalError::NotContiguous {
                    got: 5,
                    min: 1,
                    max: 4
                })
            ),
            "{gap:?}"
        );
        wal.compact(Compacted { index: 2, term: 1 })
            .expect("compact");
        let below = wal.append(&batch(2, 2, 1));
        assert!(matches!(below, Err(WalError::NotContiguous { got: 2, .. })));
        let mut holes = batch(4, 4, 1);
        holes.entries.push(entry(6, 1));
        assert!(matches!(
            wal.append(&holes),
            Err(WalError::NotContiguous { got: 6, .. })
        ));
        drop(wal);
        let (_, recovered) = log().open(SMALL).expect("reopen");
        assert_eq!(indexes(&recovered.entries), vec![(3, 1)]);
    });
}

#[test]
fn a_log_spanning_many_segments_replays_whole() {
    on_both(|log| {
        let (mut wal, _) = log().open(SMALL).expect("create");
        for i in 1..=200 {
            wal.append(&batch(i, i, 1 + i / 50)).expect("append");
        }
        assert!(wal.segment_count() >= 3, "{} segments", wal.segment_count());
        drop(wal);
        let (_, recovered) = log().open(SMALL).expect("reopen");
        assert_eq!(recovered.entries.len(), 200);
        assert_eq!(recovered.entries[199], entry(200, 5));
        assert_eq!(recovered.hard_state.commit, 199);
    });
}

#[test]
fn entries_appended_since_the_open_read_back_from_their_segments_as_last_written() {
    on_both(|log| {
        let (mut wal, _) = log().open(SMALL).unwrap();
        // Over many 4 KiB segments, with a suffix replaced by a later term.
        for i in 1..=200 {
            wal.append(&batch(i, i, 1)).unwrap();
        }
        wal.append(&batch(190, 195, 2)).unwrap();
        assert!(wal.segment_count() > 2);
        let held: Vec<(u64, u64)> = (1..=189)
            .map(|i| (i, 1))
            .chain((190..=195).map(|i| (i, 2)))
            .collect();
        let all = wal.read(1, 196, u64::MAX).unwrap();
        assert_eq!(indexes(&all), held);
        assert_eq!(all[10].data, entry(11, 1).data);
        assert_eq!(all[192].data, entry(193, 2).data);
        // A range; a byte bound (but always one entry).
        let some = wal.read(20, 30, u64::MAX).unwrap();
        assert_eq!(indexes(&some), held[19..29].to_vec());
        let one = entry(20, 1).data.len() as u64;
        assert_eq!(wal.read(20, 30, 3 * one).unwrap().len(), 3);
        assert_eq!(wal.read(20, 30, 0).unwrap().len(), 1);
        // The replaced entries past 195 are no longer held.
        assert!(matches!(
            wal.read(180, 200, u64::MAX),
            Err(WalError::NotHeld { index: 196 })
        ));
        // Nor are compacted ones.
        wal.compact(Compacted { index: 30, term: 1 }).unwrap();
        assert!(matches!(
            wal.read(25, 35, u64::MAX),
            Err(WalError::NotHeld { index: 25 })
        ));
        assert_eq!(indexes(&wal.read(31, 196, u64::MAX).unwrap()), held[30..]);
        drop(wal);
        // Reopened: what the log recovered is found where the replay read it, and what is
        // appended since too.
        let (mut wal, recovered) = log().open(SMALL).unwrap();
        assert_eq!(indexes(&recovered.entries), held[30..]);
        assert_eq!(wal.read(31, 196, u64::MAX).unwrap(), recovered.entries);
        wal.append(&batch(194, 198, 3)).unwrap();
        let now: Vec<(u64, u64)> = held[30..193]
            .iter()
            .copied()
            .chain((194..=198).map(|i| (i, 3)))
            .collect();
        assert_eq!(indexes(&wal.read(31, 199, u64::MAX).unwrap()), now);
    });
}

#[test]
fn a_frame_larger_than_a_segment_gets_a_segment_of_its_own() {
    on_both(|log| {
        let (mut wal, _) = log().open(SMALL).expect("create");
        wal.append(&batch(1, 1, 1)).expect("append");
        let mut big = batch(2, 2, 1);
        big.entries[0].data = Bytes::from(vec![0xAB; 20_000]);
        wal.append(&big).expect("append a big entry");
        wal.append(&batch(3, 3, 1)).expect("append after it");
        drop(wal);
        let (_, recovered) = log().open(SMALL).expect("reopen");
        assert_eq!(recovered.entries.len(), 3);
        assert_eq!(recovered.entries[1].data.len(), 20_000);
    });
}

#[test]
fn compaction_deletes_whole_segments_below_the_mark_and_keeps_the_state() {
    on_both(|log| {
        let (mut wal, _) = log().open(SMALL).expect("create");
        append_one_by_one(wal.as_mut(), 200);
        let before = wal.segment_count();
        wal.compact(Compacted {
            index: 150,
            term: 1,
        })
        .expect("compact");
        assert!(wal.segment_count() < before);
        drop(wal);
        let (wal, recovered) = log().open(SMALL).expect("reopen");
        assert_eq!(
            recovered.compacted,
            Compacted {
                index: 150,
                term: 1
            }
        );
        assert_eq!(
            recovered.entries.first().map(|e| e.index),
            Some(151),
            "entries start right after the mark"
        );
        assert_eq!(recovered.entries.len(), 50);
        assert_eq!(recovered.hard_state.commit, 199);
        assert_eq!(wal.last_index(), 200);
    });
}

#[test]
fn a_mark_beyond_the_last_entry_empties_the_log_for_an_installed_snapshot() {
    on_both(|log| {
        let (mut wal, _) = log().open(SMALL).expect("create");
        wal.append(&batch(1, 5, 1)).expect("append");
        wal.append(&Batch {
            compacted: Some(Compacted {
                index: 100,
                term: 3,
            }),
            hard_state: Some(HardState {
                term: 3,
                vote: 2,
                commit: 100,
            }),
            ..Batch::default()
        })
        .expect("install");
        assert_eq!(wal.last_index(), 100);
        wal.append(&batch(101, 102, 3))
            .expect("append after the snapshot");
        drop(wal);
        let (_, recovered) = log().open(SMALL).expect("reopen");
        assert_eq!(recovered.compacted.index, 100);
        assert_eq!(indexes(&recovered.entries), vec![(101, 3), (102, 3)]);
    });
}

#[test]
fn a_missing_segment_is_refused_whether_in_the_middle_or_the_oldest_without_a_mark() {
    for missing in [1, 0] {
        on_both(|log| {
            let (mut wal, _) = log().open(SMALL).expect("create");
            append_one_by_one(wal.as_mut(), 200);
            drop(wal);
            let names = log().list();
            log().remove(&names[missing]);
            let opened = log().open(SMALL);
            assert!(
                matches!(opened, Err(WalError::Incomplete { .. })),
                "segment {missing} missing: {:?}",
                opened.map(|_| ())
            );
        });
    }
}

/// Appends entries 1..=`count` of term 1, one batch each.
fn append_one_by_one(wal: &mut dyn Log, count: u64) {
    for i in 1..=count {
        wal.append(&batch(i, i, 1)).expect("append");
    }
}

fn mem_log() -> (MemFs, PathBuf) {
    (MemFs::new(), PathBuf::from("/data/wal"))
}

fn open_mem(fs: &MemFs, dir: &Path) -> Result<(Wal<MemFs>, crate::Recovered), WalError> {
    Wal::open_on(fs.clone(), dir, SMALL)
}

/// The segment files in `dir` (not the spare the log makes ahead).
fn segment_names(fs: &impl Fs, dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs
        .list(dir)
        .expect("list")
        .into_iter()
        .filter(|n| n.ends_with(".wal"))
        .collect();
    names.sort();
    names
}

fn only_segment(fs: &MemFs, dir: &Path) -> PathBuf {
    let names = segment_names(fs, dir);
    assert_eq!(names.len(), 1, "{names:?}");
    dir.join(&names[0])
}

/// A log on `MemFs` holding `batches`, closed; its one segment's path.
fn log_of(batches: &[Batch]) -> (MemFs, PathBuf, PathBuf) {
    let (fs, dir) = mem_log();
    let (mut wal, _) = open_mem(&fs, &dir).expect("create");
    for b in batches {
        wal.append(b).expect("append");
    }
    drop(wal);
    let path = only_segment(&fs, &dir);
    (fs, dir, path)
}

#[test]
fn an_acknowledged_append_survives_a_crash_that_loses_everything_unsynced() {
    let (fs, dir) = mem_log();
    let (mut wal, _) = open_mem(&fs, &dir).expect("create");
    wal.append(&batch(1, 3, 1)).expect("append");
    fs.crash(Crash::LoseUnsynced);
    let (_, recovered) = open_mem(&fs, &dir).expect("reopen");
    assert_eq!(recovered.entries.len(), 3);
}

#[test]
fn a_crash_while_a_frame_is_written_keeps_every_acknowledged_frame_and_all_or_none_of_the_last() {
    for seed in 1..=64 {
        let (fs, dir) = mem_log();
        let (mut wal, _) = open_mem(&fs, &dir).expect("create");
        wal.append(&batch(1, 2, 1)).expect("append");
        fs.fail_syncs(true);
        let mut last = batch(3, 5, 1);
        for e in &mut last.entries {
            e.data = Bytes::from(vec![0x5A; 700]);
        }
        assert!(wal.append(&last).is_err(), "the sync failed");
        assert!(
            matches!(wal.append(&batch(6, 6, 1)), Err(WalError::Poisoned)),
            "nothing is acknowledged after a failed sync"
        );
        fs.fail_syncs(false);
        fs.crash(Crash::TearSectors(seed));
        let (mut wal, recovered) = open_mem(&fs, &dir)
            .unwrap_or_else(|e| panic!("seed {seed}: a torn tail must be repaired, got {e}"));
        let got = indexes(&recovered.entries);
        assert!(
            got == vec![(1, 1), (2, 1)] || got.len() == 5,
            "seed {seed}: {got:?}"
        );
        // The repaired log takes appends again, and they last.
        let next = wal.last_index() + 1;
        wal.append(&batch(next, next, 2))
            .expect("append after repair");
        drop(wal);
        let (_, again) = open_mem(&fs, &dir).expect("reopen after repair");
        assert_eq!(again.entries.last().map(|e| e.index), Some(next));
        assert_eq!(again.torn_bytes_cleared, 0, "seed {seed}");
    }
}

#[test]
fn some_crash_tears_the_last_frame_and_the_tear_is_cleared() {
    let cleared = (1..=64).any(|seed| {
        let (fs, dir) = mem_log();
        let (mut wal, _) = open_mem(&fs, &dir).expect("create");
        wal.append(&batch(1, 1, 1)).expect("append");
        fs.fail_syncs(true);
        let mut last = batch(2, 2, 1);
        last.entries[0].data = Bytes::from(vec![0x77; 1500]);
        let _ = wal.append(&last);
        fs.fail_syncs(false);
        fs.crash(Crash::TearSectors(seed));
        let (_, recovered) = open_mem(&fs, &dir).expect("reopen");
        recovered.torn_bytes_cleared > 0 && recovered.entries.len() == 1
    });
    assert!(
        cleared,
        "no seed tore the frame: the crash model is not exercised"
    );
}

#[test]
fn a_flipped_bit_in_an_acknowledged_frame_is_refused_inside_the_log_and_in_its_last_frame() {
    // One batch: the damaged frame is the last; two: another, intact, follows it.
    for batches in [2, 1] {
        let written: Vec<Batch> = (1..=batches).map(|i| batch(i, i, 1)).collect();
        let (fs, dir, path) = log_of(&written);
        let bytes = fs.contents(&path).expect("segment");
        let at = bytes
            .windows(7)
            .position(|w| w == b"entry 1")
            .expect("entry 1 is in the segment");
        fs.flip_bit(&path, at + 2, 3);
        assert_corrupt(open_mem(&fs, &dir));
    }
}

/// Found by the simulator: a bit flipped in the last frame's length made the frame reach into the
/// zeros after it, and the log cleared it as a torn write, losing an acknowledged entry.
#[test]
fn a_flipped_bit_in_the_last_frames_length_is_refused() {
    for bit in [8, 12, 20] {
        let (fs, dir, path) = log_of(&[batch(1, 1, 1), batch(2, 2, 1)]);
        let bytes = fs.contents(&path).expect("segment");
        let last = *frame_offsets(&bytes).last().expect("frames");
        fs.flip_bit(&path, last + 4 + bit / 8, (bit % 8) as u8);
        assert_corrupt(open_mem(&fs, &dir));
    }
}

/// A log written before frame headers had their check (format 1: zero in its place) opens, and
/// what is appended after goes on in format 2.
#[test]
fn a_format_1_log_still_opens() {
    use crate::proto::{Frame, FrameKind};
    use prost::Message;
    let (fs, dir, path) = log_of(&[batch(1, 3, 1)]);
    let bytes = fs.contents(&path).expect("segment");
    let mut old = Vec::new();
    for at in frame_offsets(&bytes) {
        let crate::frame::Read::Frame { payload, .. } =
            crate::frame::read(&bytes, at, crate::frame::Headers::Checked)
        else {
            unreachable!("an offset of an intact frame")
        };
        let mut decoded = Frame::decode(payload).expect("frame");
        if let Some(FrameKind::Header(h)) = decoded.kind.as_mut() {
            h.format = 1;
        }
        let start = old.len();
        crate::frame::encode(&decoded.encode_to_vec(), &mut old);
        old[start + 12..start + 16].copy_from_slice(&0u32.to_le_bytes());
    }
    old.resize(bytes.len(), 0);
    let mut file = fs.create(&path).expect("rewrite");
    crate::WalFile::write_at(&mut file, 0, &old).expect("write");
    crate::WalFile::sync_data(&mut file).expect("sync");
    drop(file);
    let (mut wal, recovered) = open_mem(&fs, &dir).expect("a format 1 log opens");
    assert_eq!(indexes(&recovered.entries), vec![(1, 1), (2, 1), (3, 1)]);
    wal.append(&batch(4, 4, 1)).expect("append after");
    drop(wal);
    let (_, recovered) = open_mem(&fs, &dir).expect("reopens");
    assert_eq!(recovered.entries.len(), 4);
}

fn assert_corrupt(opened: Result<(Wal<MemFs>, crate::Recovered), WalError>) {
    assert!(
        matches!(opened, Err(WalError::Corrupt { .. })),
        "{:?}",
        opened.map(|_| ())
    );
}

/// Where each intact frame of a segment starts.
fn frame_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut at = 0;
    let mut offsets = Vec::new();
    while let crate::frame::Read::Frame { next, .. } =
        crate::frame::read(bytes, at, crate::frame::Headers::Checked)
    {
        offsets.push(at);
        at = next;
    }
    offsets
}

#[test]
fn a_zeroed_frame_followed_by_intact_frames_is_refused() {
    let (fs, dir, path) = log_of(&[batch(1, 1, 1), batch(2, 2, 1)]);
    let bytes = fs.contents(&path).expect("segment");
    let frames = frame_offsets(&bytes);
    assert_eq!(frames.len(), 3, "the header and two batches");
    // Zero the first batch, header included: it reads as the end of the log, but an intact
    // frame follows.
    for (byte, value) in bytes.iter().enumerate().take(frames[2]).skip(frames[1]) {
        for bit in 0..8 {
            if value & (1 << bit) != 0 {
                fs.flip_bit(&path, byte, bit);
            }
        }
    }
    assert_corrupt(open_mem(&fs, &dir));
}

#[test]
fn a_crash_during_compaction_leaves_a_log_that_opens() {
    let (fs, dir) = mem_log();
    let (mut wal, _) = open_mem(&fs, &dir).expect("create");
    append_one_by_one(&mut wal, 200);
    wal.compact(Compacted {
        index: 120,
        term: 1,
    })
    .expect("compact");
    fs.crash(Crash::LoseUnsynced);
    let (_, recovered) = open_mem(&fs, &dir).expect("reopen");
    assert_eq!(recovered.compacted.index, 120);
    assert_eq!(recovered.entries.first().map(|e| e.index), Some(121));
    assert_eq!(recovered.entries.len(), 80);
}

#[test]
fn a_full_disk_refuses_the_append_that_needs_a_new_segment_and_the_log_goes_on_once_space_is_back()
{
    let (fs, dir) = mem_log();
    let (mut wal, _) = open_mem(&fs, &dir).expect("create");
    assert!(wal.has_spare(), "the next segment is made with the log");
    wal.append(&batch(1, 1, 1)).expect("append");
    // The disk is full: the segment in use still takes appends, and so does the spare, which
    // needs no new space; the spare after it cannot be made.
    fs.set_capacity(Some(fs.used_bytes()));
    let mut i = 2;
    let mut room_lost_at = None;
    let refused = loop {
        match wal.append(&batch(i, i, 1)) {
            Ok(()) => i += 1,
            Err(e) => break e,
        }
        if !wal.has_room() && room_lost_at.is_none() {
            room_lost_at = Some(i);
        }
        assert!(i < 10_000, "the segments never filled");
    };
    assert!(refused.is_disk_full(), "{refused}");
    assert_eq!(
        wal.segment_count(),
        2,
        "the spare became the second segment"
    );
    assert!(!wal.has_spare());
    let lost = room_lost_at.expect("the log said it had no room before it refused an append");
    assert!(
        i - lost >= 10,
        "room was lost only {} appends before the log was full",
        i - lost
    );
    assert_eq!(
        fs.list(&dir).expect("list").len(),
        2,
        "no half-made segment or spare stays"
    );
    // Space comes back: the same log takes the same append, without a reopen, and has its
    // spare again.
    fs.set_capacity(None);
    wal.append(&batch(i, i, 1))
        .expect("append once space is back");
    assert_eq!(wal.segment_count(), 3);
    assert!(wal.has_spare() && wal.has_room());
    drop(wal);
    let (wal, recovered) = open_mem(&fs, &dir).expect("reopen");
    assert_eq!(recovered.entries.len() as u64, i);
    assert!(wal.has_spare());
}

#[test]
fn a_spare_that_could_not_be_made_is_made_when_asked_again() {
    let (fs, dir) = mem_log();
    fs.create_dir_all(&dir).expect("mkdir");
    // Room for the first segment, not for the spare.
    fs.set_capacity(Some(SMALL.segment_bytes + SMALL.segment_bytes / 2));
    let (mut wal, _) = open_mem(&fs, &dir).expect("create");
    assert!(!wal.has_spare());
    assert!(wal.has_room(), "a fresh segment is room enough");
    assert_eq!(
        fs.list(&dir).expect("list").len(),
        1,
        "no half-made spare stays"
    );
    assert!(!wal.make_spare());
    fs.set_capacity(None);
    assert!(wal.make_spare());
    assert!(wal.has_spare());
}

#[test]
fn a_half_made_segment_is_removed_at_open() {
    let (fs, dir) = mem_log();
    let (mut wal, _) = open_mem(&fs, &dir).expect("create");
    wal.append(&batch(1, 1, 1)).expect("append");
    drop(wal);
    let tmp = dir.join("0000000000000001-0000000000000002.wal.tmp");
    fs.create(&tmp).expect("create tmp");
    let (_, recovered) = open_mem(&fs, &dir).expect("reopen");
    assert_eq!(recovered.entries.len(), 1);
    assert!(fs.contents(&tmp).is_none());
}

#[test]
fn a_torn_tail_on_the_real_file_system_is_cleared() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("wal");
    let (mut wal, _) = Wal::open(&dir, SMALL).expect("create");
    wal.append(&batch(1, 1, 1)).expect("append");
    let end = {
        let mut one = Vec::new();
        let mut big = batch(2, 2, 1);
        big.entries[0].data = Bytes::from(vec![0x42; 1500]);
        let payload = prost::Message::encode_to_vec(&crate::proto::Frame {
            kind: Some(crate::proto::FrameKind::Batch(big)),
        });
        crate::frame::encode(&payload, &mut one);
        one
    };
    drop(wal);
    let names = segment_names(&StdFs, &dir);
    let path = dir.join(&names[0]);
    let bytes = std::fs::read(&path).expect("read");
    let at = bytes
        .windows(7)
        .position(|w| w == b"entry 1")
        .expect("entry 1");
    let next = bytes[at..]
        .iter()
        .position(|b| *b == 0)
        .map(|p| (at + p).next_multiple_of(8))
        .expect("zeros after the frame");
    // Half a frame: up to the end of the sector its header is in; the sectors after it never
    // reached the disk.
    let written = (next + 1).next_multiple_of(crate::SECTOR_BYTES) - next;
    assert!(written >= 16 && written < end.len());
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    file.write_all_at(&end[..written], next as u64)
        .expect("write");
    drop(file);
    let (_, recovered) = Wal::open(&dir, SMALL).expect("reopen repairs");
    assert_eq!(indexes(&recovered.entries), vec![(1, 1)]);
    assert_eq!(recovered.torn_bytes_cleared, written as u64);
}

#[test]
fn a_mark_over_another_history_drops_its_suffix_and_the_log_continues_right_after_it() {
    on_both(|log| {
        let (mut wal, _) = log().open(SMALL).expect("create");
        wal.append(&batch(1, 8, 1)).expect("append");
        // A snapshot at 5 of term 2 installed over entries of term 1 up to 8.
        wal.append(&Batch {
            compacted: Some(Compacted { index: 5, term: 2 }),
            ..Batch::default()
        })
        .expect("install");
        assert_eq!(wal.last_index(), 5);
        drop(wal);
        let (mut wal, recovered) = log().open(SMALL).expect("reopen");
        assert_eq!(recovered.compacted, Compacted { index: 5, term: 2 });
        assert!(
            recovered.entries.is_empty(),
            "{:?}",
            indexes(&recovered.entries)
        );
        assert_eq!(wal.last_index(), 5);
        assert!(matches!(
            wal.append(&batch(8, 8, 2)),
            Err(WalError::NotContiguous { got: 8, .. })
        ));
        // A mark that agrees keeps what follows it.
        wal.append(&batch(6, 9, 2)).expect("append after the mark");
        wal.append(&Batch {
            compacted: Some(Compacted { index: 7, term: 2 }),
            ..Batch::default()
        })
        .expect("compact");
        assert_eq!(wal.last_index(), 9);
        drop(wal);
        let (wal, recovered) = log().open(SMALL).expect("reopen");
        assert_eq!(indexes(&recovered.entries), vec![(8, 2), (9, 2)]);
        assert_eq!(wal.last_index(), 9);
    });
}

/// On the real file system the spare segment is made on a thread of its own: the append that
/// starts a segment only starts making the next spare, and does not write and sync a whole
/// segment of zeros itself (a 64 MiB one held the Raft thread for 200-300 ms).
#[test]
fn the_real_file_system_makes_the_spare_apart_and_a_new_segment_takes_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("wal");
    let (mut wal, _) = Wal::open_on(StdFs, &dir, SMALL).expect("create");
    assert!(
        wal.making_spare() && !wal.has_spare(),
        "opening starts the spare and does not wait for it"
    );
    // Bounded: a 4 KiB file is made in milliseconds; 30 s leaves room for a slow, busy disk.
    let mut polls = 0;
    while !wal.make_spare() {
        assert!(polls < 30_000, "the spare was never made");
        polls += 1;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(wal.has_spare() && !wal.making_spare());
    let segments = wal.segment_count();
    let mut i = 1;
    while wal.segment_count() == segments {
        wal.append(&batch(i, i, 1)).expect("append");
        i += 1;
    }
    assert!(
        wal.making_spare() && !wal.has_spare(),
        "the new segment took the spare, and the next one is being made apart"
    );
    // Another new segment while the spare may still be in the making waits for it.
    let segments = wal.segment_count();
    while wal.segment_count() == segments {
        wal.append(&batch(i, i, 1)).expect("append");
        i += 1;
    }
    drop(wal);
    let (_, recovered) = Wal::open_on(StdFs, &dir, SMALL).expect("reopen");
    assert_eq!(
        indexes(&recovered.entries),
        (1..i).map(|n| (n, 1)).collect::<Vec<_>>()
    );
}

/// [`MemFs`], but it makes the spare apart as [`StdFs`] does, and the test says when that is done
/// and how it ended.
#[derive(Clone, Default)]
struct ApartFs {
    mem: MemFs,
    making: std::sync::Arc<std::sync::Mutex<Option<Making>>>,
}

type Making = (
    PathBuf,
    u64,
    std::sync::mpsc::SyncSender<std::io::Result<crate::MemFile>>,
);

impl ApartFs {
    /// Ends the spare being made: made (`None`), or failed with `error`.
    fn finish(&self, error: Option<std::io::ErrorKind>) {
        let (path, size, made) = self
            .making
            .lock()
            .expect("lock")
            .take()
            .expect("a spare is being made");
        let file = match error {
            None => crate::wal::zero_filled(&self.mem, &path, size),
            Some(kind) => Err(std::io::Error::from(kind)),
        };
        made.send(file).expect("the log waits for it");
    }
}

/// Fails the spare still being made when a test panics, so that the log it drops (which waits for
/// its spare) does not wait forever and the test reports its failure. Declared after the log, so
/// that it is dropped first.
struct FailOnPanic(ApartFs);

impl Drop for FailOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some((_, _, made)) = self.0.making.lock().expect("lock").take()
        {
            let _ = made.send(Err(std::io::Error::other("the test failed")));
        }
    }
}

impl Fs for ApartFs {
    type File = crate::MemFile;

    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        self.mem.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.mem.list(dir)
    }
    fn open(&self, path: &Path) -> std::io::Result<Self::File> {
        self.mem.open(path)
    }
    fn create(&self, path: &Path) -> std::io::Result<Self::File> {
        self.mem.create(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.mem.rename(from, to)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.mem.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.mem.sync_dir(dir)
    }
    fn zero_fill_apart(
        &self,
        path: &Path,
        size: u64,
    ) -> Option<std::sync::mpsc::Receiver<std::io::Result<Self::File>>> {
        let (made, made_rx) = std::sync::mpsc::sync_channel(1);
        *self.making.lock().expect("lock") = Some((path.to_path_buf(), size, made));
        Some(made_rx)
    }
}

/// A spare still being made counts as room: the segment in use may pass its last quarter
/// meanwhile, and the member must not refuse writes for it. Once it fails, the next append sees
/// it, and without a spare or a quarter segment left the log has no room; a spare made again
/// gives it room.
#[test]
fn a_spare_in_the_making_counts_as_room_until_it_fails() {
    let fs = ApartFs::default();
    let dir = PathBuf::from("/wal");
    let (mut wal, _) = Wal::open_on(fs.clone(), &dir, SMALL).expect("create");
    let _fail_on_panic = FailOnPanic(fs.clone());
    assert!(wal.making_spare() && !wal.has_spare());
    let segments = wal.segment_count();
    let mut i = 1;
    while wal.room_in_segment() >= SMALL.segment_bytes / 4 {
        wal.append(&batch(i, i, 1)).expect("append");
        i += 1;
    }
    assert_eq!(wal.segment_count(), segments, "still the first segment");
    assert!(wal.has_room(), "the spare in the making counts");

    fs.finish(Some(std::io::ErrorKind::StorageFull));
    assert!(wal.has_room(), "not looked at until the next append");
    wal.append(&batch(i, i, 1)).expect("append");
    i += 1;
    assert!(!wal.making_spare() && !wal.has_spare());
    assert!(
        !wal.has_room(),
        "no spare, and less than a quarter segment left"
    );
    assert!(
        fs.mem
            .list(&dir)
            .expect("list")
            .iter()
            .all(|n| !n.ends_with(".tmp")),
        "the failed spare left no file"
    );

    assert!(!wal.make_spare(), "started again, not done yet");
    assert!(wal.has_room());
    fs.finish(None);
    assert!(wal.make_spare() && wal.has_spare() && wal.has_room());
    let segments = wal.segment_count();
    while wal.segment_count() == segments {
        wal.append(&batch(i, i, 1)).expect("append");
        i += 1;
    }
    // The new segment took the spare and started the next one apart; that one is ended before
    // the log is dropped (dropping waits for it).
    assert!(wal.making_spare());
    fs.finish(None);
    drop(wal);
    let (_, recovered) = Wal::open_on(fs.mem.clone(), &dir, SMALL).expect("reopen");
    assert_eq!(
        indexes(&recovered.entries),
        (1..i).map(|n| (n, 1)).collect::<Vec<_>>()
    );
}

/// Replay reads a segment a chunk at a time and only checks that what follows its frames is
/// zeros: it holds a window, never the segment; anything but zeros there is read whole and
/// judged as before (here: the tail a torn write left, cleared).
#[test]
fn replay_holds_a_window_of_a_segment_and_reads_the_rest_whole_when_it_is_not_zeros() {
    use crate::fs::WalFile;
    use crate::wal::{SegmentWindow, replay_segment};
    const BIG: WalOptions = WalOptions {
        segment_bytes: 8 << 20,
    };
    let fs = MemFs::new();
    let dir = PathBuf::from("/data/wal");
    let (mut wal, _) = Wal::open_on(fs.clone(), &dir, BIG).expect("create");
    // About 3 MiB of frames: more than the window's chunk.
    for i in 1..=300 {
        let mut b = batch(i, i, 1);
        b.entries[0].data = Bytes::from(vec![b'v'; 10_000]);
        wal.append(&b).expect("append");
    }
    drop(wal);
    let path = only_segment(&fs, &dir);
    let mut file = fs.open(&path).expect("open");
    let name = path.file_name().unwrap().to_str().unwrap().to_owned();
    let (seq, first) = crate::wal::parse_segment_name(&name).expect("a segment's name");
    let replayed = |file: &mut _| {
        let mut replay = None;
        let mut window = SegmentWindow::new(file).expect("size");
        let (end, max_index, cleared) =
            replay_segment(&path, &mut window, seq, first, true, &mut replay).expect("replay");
        let held = window.held();
        (
            end,
            max_index,
            cleared,
            held,
            replay.expect("a header").entries.len(),
        )
    };
    let (end, max_index, cleared, held, entries) = replayed(&mut file);
    assert_eq!((max_index, cleared, entries), (300, 0, 300));
    assert!(end > 3_000_000, "frames up to {end}");
    assert!(held < (2 << 20) + (1 << 19), "held {held} bytes");

    // A byte past the frames, far into the zeros: what a torn write leaves past the last frame.
    let stray = end + (4 << 20);
    file.write_at(stray, &[7]).expect("write");
    let (end_after, _, cleared, held, entries) = replayed(&mut file);
    assert_eq!((end_after, entries), (end, 300));
    assert_eq!(
        cleared,
        stray - end + 1,
        "the stray byte is cleared as before"
    );
    assert!(held as u64 >= (8 << 20) - end, "the rest was read whole");
}
