//! The log itself: a directory of segments, the last one written.
//!
//! Segment files are `{seq:016x}-{first_index:016x}.wal`: `seq` counts up from 0 with no gap,
//! and `first_index` is the index the segment's first entry was expected to have when it was
//! cut. Each is zero-filled to its full size before it gets a name, so an append changes no file
//! size and `fdatasync` is enough; its first frame is a [`SegmentHeader`] holding the log's hard
//! state and compaction mark at the cut, so older segments can go without taking them along.
//!
//! **Invariant:** every frame is synced before the next is written. So at most one frame, the
//! last, can be torn by a crash, and any damage followed by an intact frame is not a torn write.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use prost::Message;

use crate::error::WalError;
use crate::frame::{self, BadFrame, Headers, Read};
use crate::fs::{Fs, StdFs, WalFile};
use crate::proto::{Batch, Compacted, Entry, Frame, FrameKind, HardState, SegmentHeader};

/// The format this build writes: 2, frame headers with their own check. It also reads format 1
/// (the same but for a zero where the check is).
pub const WAL_FORMAT: u32 = 2;
/// etcd's segment size.
/// Appends [`Wal::take_written`] keeps between takes.
pub const WRITTEN_KEPT_MAX: usize = 1024;

pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
const ZEROS_CHUNK_BYTES: usize = 1024 * 1024;
/// The next segment, made ahead of need (zero-filled and synced, with no header and no segment
/// name yet), so that starting it takes no new space; etcd's WAL keeps one ready the same way.
/// A `.wal.tmp` name: a log opened after a crash removes it and makes it again. It is made only
/// when the disk has room for it and a quarter segment more.
const SPARE_NAME: &str = "next.wal.tmp";

#[derive(Clone, Copy, Debug)]
pub struct WalOptions {
    /// The size each segment is preallocated to; a frame larger than that gets a segment of its
    /// own size.
    pub segment_bytes: u64,
}

impl Default for WalOptions {
    fn default() -> WalOptions {
        WalOptions {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
        }
    }
}

/// What the log held when it was opened.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovered {
    /// The log is compacted up to here (0, 0 for a new log).
    pub compacted: Compacted,
    pub hard_state: HardState,
    /// Every entry after `compacted.index`, in order, with no gap.
    pub entries: Vec<Entry>,
    /// Bytes of a torn last frame that were cleared (0 if the log ended cleanly).
    pub torn_bytes_cleared: u64,
}

#[derive(Debug, Clone)]
struct Segment {
    seq: u64,
    path: PathBuf,
    /// The highest entry index any frame of this segment holds (0: none).
    max_index: u64,
}

/// The Raft log's write-ahead log. One writer; every append is one frame and one `fdatasync`.
pub struct Wal<F: Fs = StdFs> {
    fs: F,
    dir: PathBuf,
    segment_bytes: u64,
    /// Oldest first; the last is being written.
    segments: Vec<Segment>,
    active: F::File,
    /// Where the next frame goes in the active segment.
    offset: u64,
    /// The active segment's size.
    active_bytes: u64,
    last_index: u64,
    /// The terms of the entries after the mark, as runs: `(first index, term)`, ascending.
    terms: Vec<(u64, u64)>,
    compacted: Compacted,
    hard_state: HardState,
    scratch: Vec<u8>,
    /// A write or sync of the active segment failed: what reached the disk is unknown (a failed
    /// `fdatasync` may have dropped the dirty pages), so no later append may be acknowledged.
    /// Reopening replays what is really there.
    poisoned: bool,
    /// The next segment, made ahead ([`SPARE_NAME`]); `None` when there was no room for it, or
    /// while it is being made apart (`making`).
    spare: Option<F::File>,
    /// The spare being made away from this thread ([`Fs::zero_fill_apart`]), if it is.
    making: Option<std::sync::mpsc::Receiver<std::io::Result<F::File>>>,
    /// The appends since [`Wal::take_written`] last took them.
    written: Vec<Written>,
    /// Where the entries the log holds sit, for [`WalReader`]s.
    located: Arc<Mutex<Located>>,
}

/// Where each entry the log holds was last written: runs of entries, frame by frame, ascending,
/// disjoint and contiguous (a later append that replaced some entries shortened the run that
/// held them).
#[derive(Debug, Default)]
struct Located {
    runs: std::collections::VecDeque<Run>,
    /// The segment being written.
    active: Option<Arc<Path>>,
}

#[derive(Clone, Debug)]
struct Run {
    first: u64,
    last: u64,
    segment: Arc<Path>,
    offset: u64,
    framed: u64,
}

impl Located {
    /// Entries `first..=last` were just written in the frame at `offset` of the active segment.
    fn note(&mut self, first: u64, last: u64, offset: u64, framed: u64) {
        while self.runs.back().is_some_and(|r| r.first >= first) {
            self.runs.pop_back();
        }
        if let Some(run) = self.runs.back_mut() {
            run.last = run.last.min(first - 1);
        }
        if let Some(segment) = &self.active {
            self.runs.push_back(Run {
                first,
                last,
                segment: segment.clone(),
                offset,
                framed,
            });
        }
    }

    /// The log is compacted through `index`.
    fn drop_through(&mut self, index: u64) {
        while self.runs.front().is_some_and(|r| r.last <= index) {
            self.runs.pop_front();
        }
    }
}

/// Reads back the entries the log holds, from their segments: for a leader that keeps only the
/// newest entries of its log in memory and sends a lagging follower the rest from here. Clones
/// share the log's record of where each entry sits.
#[derive(Clone)]
pub struct WalReader<F: Fs> {
    fs: F,
    located: Arc<Mutex<Located>>,
}

impl<F: Fs> std::fmt::Debug for WalReader<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalReader")
            .field("from", &self.located_from())
            .finish()
    }
}

impl<F: Fs> WalReader<F> {
    /// The oldest index this reader finds; every entry after it through the last appended is
    /// found too (`None`: the log holds no entry).
    pub fn located_from(&self) -> Option<u64> {
        let located = self.located.lock().expect("wal locations lock poisoned");
        located.runs.front().map(|r| r.first)
    }

    /// The entries `low..high` as they were appended, from the segments: from `low` on, in
    /// order, stopping once they hold `max_bytes` of data (at least one entry). `Err` when an
    /// entry in the range is not held (compacted away, or replaced), or its frame no longer
    /// reads back as written.
    pub fn read(&self, low: u64, high: u64, max_bytes: u64) -> Result<Vec<Entry>, WalError> {
        let runs: Vec<Run> = {
            let located = self.located.lock().expect("wal locations lock poisoned");
            located
                .runs
                .iter()
                .filter(|r| r.last >= low && r.first < high)
                .cloned()
                .collect()
        };
        let mut out: Vec<Entry> = Vec::new();
        let mut bytes = 0u64;
        let mut next = low;
        let mut open: Option<(Arc<Path>, F::File)> = None;
        for run in runs {
            if run.first > next {
                break;
            }
            let damaged = |what: String| WalError::Corrupt {
                path: run.segment.to_path_buf(),
                offset: run.offset,
                what: format!("reading entries back: {what}"),
            };
            let file = match open.take() {
                Some((segment, file)) if segment == run.segment => file,
                _ => self
                    .fs
                    .open(&run.segment)
                    .map_err(WalError::io(&*run.segment))?,
            };
            let (_, file) = open.insert((run.segment.clone(), file));
            let mut buf = vec![0u8; usize::try_from(run.framed).unwrap_or(usize::MAX)];
            let got = file
                .read_at(run.offset, &mut buf)
                .map_err(WalError::io(&*run.segment))?;
            let payload = match frame::read(&buf[..got], 0, Headers::CheckedOrZero) {
                Read::Frame { payload, .. } => payload,
                other => return Err(damaged(format!("{other:?}"))),
            };
            let Ok(Frame {
                kind: Some(FrameKind::Batch(batch)),
            }) = Frame::decode(payload)
            else {
                return Err(damaged("not a batch of entries".into()));
            };
            let upto = run.last.min(high - 1);
            for e in batch.entries {
                if e.index < next || e.index > upto {
                    continue;
                }
                if e.index != next {
                    return Err(damaged(format!("entry {} where {next} was", e.index)));
                }
                let size = e.data.len() as u64;
                if !out.is_empty() && bytes + size > max_bytes {
                    return Ok(out);
                }
                bytes += size;
                next += 1;
                out.push(e);
            }
            if next <= upto {
                return Err(damaged(format!("no entry {next} in its frame")));
            }
        }
        if next < high {
            return Err(WalError::NotHeld { index: next });
        }
        Ok(out)
    }
}

/// One append as it reached the file: the bytes written and how long the write took before
/// its sync (for the member's disk metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub bytes: u64,
    pub write: std::time::Duration,
}

impl<F: Fs> std::fmt::Debug for Wal<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .field("segments", &self.segments.len())
            .field("offset", &self.offset)
            .field("last_index", &self.last_index)
            .field("compacted", &self.compacted)
            .finish()
    }
}

fn segment_name(seq: u64, first_index: u64) -> String {
    format!("{seq:016x}-{first_index:016x}.wal")
}

pub(crate) fn parse_segment_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".wal")?;
    let (seq, first) = stem.split_once('-')?;
    if seq.len() != 16 || first.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(seq, 16).ok()?,
        u64::from_str_radix(first, 16).ok()?,
    ))
}

/// Replays frames into the state they describe.
pub(crate) struct Replay {
    compacted: Compacted,
    hard_state: HardState,
    pub(crate) entries: Vec<Entry>,
    /// Where each entry held sits.
    located: Located,
}

impl Replay {
    fn last_index(&self) -> u64 {
        self.entries
            .last()
            .map_or(self.compacted.index, |e| e.index)
    }

    /// The log is compacted up to `mark`. If the log holds another entry at the mark's index
    /// (a snapshot installed over a stale suffix), the entries after it belong to that other
    /// history and go too.
    fn mark(&mut self, mark: Compacted) {
        if mark.index > self.compacted.index {
            let conflicts = self
                .entries
                .iter()
                .any(|e| e.index == mark.index && e.term != mark.term);
            self.compacted = mark;
            if conflicts {
                self.entries.clear();
                self.located.runs.clear();
            } else {
                self.drop_through(mark.index);
                self.located.drop_through(mark.index);
            }
        }
    }

    /// Drops the entries up to and including `index`: a prefix, as the entries are contiguous
    /// (so a replay costs time in the entries it keeps, not in the batches it reads).
    fn drop_through(&mut self, index: u64) {
        let Some(start) = self.entries.first().map(|e| e.index) else {
            return;
        };
        if index >= start {
            let count = usize::try_from(index - start + 1).unwrap_or(usize::MAX);
            self.entries.drain(..count.min(self.entries.len()));
        }
    }

    /// Applies `entries`; `Err` names what does not join up.
    fn append(&mut self, entries: Vec<Entry>) -> Result<(), String> {
        let Some(first) = entries.first().map(|e| e.index) else {
            return Ok(());
        };
        for pair in entries.windows(2) {
            if pair[1].index != pair[0].index + 1 {
                return Err(format!(
                    "entries {} and {} in one batch",
                    pair[0].index, pair[1].index
                ));
            }
        }
        match self.entries.first().map(|e| e.index) {
            None => {}
            Some(start) if first <= start => self.entries.clear(),
            Some(start) => {
                let last = self.last_index();
                if first > last + 1 {
                    return Err(format!("entry {first} follows entry {last}"));
                }
                // Contiguous: the entries before `first` are the first `first - start`.
                let kept = usize::try_from(first - start).unwrap_or(usize::MAX);
                self.entries.truncate(kept);
            }
        }
        self.entries.extend(entries);
        self.drop_through(self.compacted.index);
        Ok(())
    }
}

impl Wal<StdFs> {
    /// Opens (or creates) the log in `dir` on the real file system.
    pub fn open(dir: &Path, options: WalOptions) -> Result<(Wal<StdFs>, Recovered), WalError> {
        Wal::open_on(StdFs, dir, options)
    }
}

impl<F: Fs> Wal<F> {
    /// Opens (or creates) the log in `dir` on `fs`: replays every segment, clears a torn last
    /// frame, and refuses any other damage.
    pub fn open_on(
        fs: F,
        dir: &Path,
        options: WalOptions,
    ) -> Result<(Wal<F>, Recovered), WalError> {
        assert!(options.segment_bytes >= 4096, "segments of at least 4 KiB");
        fs.create_dir_all(dir).map_err(WalError::io(dir))?;
        let mut found: Vec<(u64, u64, String)> = Vec::new();
        for name in fs.list(dir).map_err(WalError::io(dir))? {
            if let Some((seq, first_index)) = parse_segment_name(&name) {
                found.push((seq, first_index, name));
            } else if name.ends_with(".wal.tmp") {
                // A segment that was being prepared when the process stopped never got a name.
                let _ = fs.remove(&dir.join(&name));
            }
        }
        found.sort();
        if found.is_empty() {
            return Wal::create(fs, dir, options);
        }
        for pair in found.windows(2) {
            if pair[1].0 != pair[0].0 + 1 {
                return Err(WalError::Incomplete {
                    dir: dir.to_path_buf(),
                    what: format!("segment {} follows segment {}", pair[1].0, pair[0].0),
                });
            }
        }
        let mut replay: Option<Replay> = None;
        let mut segments = Vec::with_capacity(found.len());
        let mut torn_bytes_cleared = 0;
        let mut tail = None;
        let last_seq = found.last().map(|f| f.0);
        for (seq, first_index, name) in found {
            let path = dir.join(&name);
            let mut file = fs.open(&path).map_err(WalError::io(&path))?;
            let is_last = Some(seq) == last_seq;
            let mut window = SegmentWindow::new(&mut file).map_err(WalError::io(&path))?;
            let (end, max_index, cleared) =
                replay_segment(&path, &mut window, seq, first_index, is_last, &mut replay)?;
            if cleared > 0 {
                let zeros = vec![0u8; cleared as usize];
                file.write_at(end, &zeros).map_err(WalError::io(&path))?;
                file.sync_data().map_err(WalError::io(&path))?;
                tracing::warn!(
                    segment = %path.display(),
                    offset = end,
                    bytes = cleared,
                    "write-ahead log: cleared a torn last frame (a write the crash interrupted)"
                );
                torn_bytes_cleared = cleared;
            }
            segments.push(Segment {
                seq,
                path: path.clone(),
                max_index,
            });
            if is_last {
                let size = file.size().map_err(WalError::io(&path))?;
                tail = Some((file, end, size));
            }
        }
        let replay = replay.expect("at least one segment was replayed");
        if let Some(first) = replay.entries.first()
            && first.index > replay.compacted.index + 1
        {
            return Err(WalError::Incomplete {
                dir: dir.to_path_buf(),
                what: format!(
                    "entries after {} are missing: the oldest segment begins at {}",
                    replay.compacted.index, first.index
                ),
            });
        }
        let (active, offset, active_bytes) = tail.expect("the last segment was opened");
        let located = Arc::new(Mutex::new(replay.located));
        let recovered = Recovered {
            compacted: replay.compacted,
            hard_state: replay.hard_state,
            entries: replay.entries,
            torn_bytes_cleared,
        };
        let wal = Wal {
            fs,
            dir: dir.to_path_buf(),
            segment_bytes: options.segment_bytes,
            segments,
            active,
            offset,
            active_bytes,
            last_index: recovered
                .entries
                .last()
                .map_or(recovered.compacted.index, |e| e.index),
            terms: Vec::new(),
            compacted: recovered.compacted,
            hard_state: recovered.hard_state,
            scratch: Vec::new(),
            poisoned: false,
            spare: None,
            making: None,
            written: Vec::new(),
            located,
        };
        let mut wal = wal;
        wal.locate_active();
        wal.note_terms(&recovered.entries);
        wal.make_spare();
        Ok((wal, recovered))
    }

    fn create(fs: F, dir: &Path, options: WalOptions) -> Result<(Wal<F>, Recovered), WalError> {
        let header = SegmentHeader {
            format: WAL_FORMAT,
            seq: 0,
            first_index: 1,
            compacted: Some(Compacted::default()),
            hard_state: Some(HardState::default()),
        };
        let (active, path, offset) = new_segment(&fs, dir, &header, options.segment_bytes)?;
        let wal = Wal {
            fs,
            dir: dir.to_path_buf(),
            segment_bytes: options.segment_bytes,
            segments: vec![Segment {
                seq: 0,
                path,
                max_index: 0,
            }],
            active,
            offset,
            active_bytes: options.segment_bytes,
            last_index: 0,
            terms: Vec::new(),
            compacted: Compacted::default(),
            hard_state: HardState::default(),
            scratch: Vec::new(),
            poisoned: false,
            spare: None,
            making: None,
            written: Vec::new(),
            located: Arc::default(),
        };
        let mut wal = wal;
        wal.locate_active();
        wal.make_spare();
        let recovered = Recovered {
            compacted: Compacted::default(),
            hard_state: HardState::default(),
            entries: Vec::new(),
            torn_bytes_cleared: 0,
        };
        Ok((wal, recovered))
    }

    /// A reader of the entries the log holds, now and as it changes.
    pub fn reader(&self) -> WalReader<F> {
        WalReader {
            fs: self.fs.clone(),
            located: self.located.clone(),
        }
    }

    /// The segment now written is where the next appends are located.
    fn locate_active(&mut self) {
        let path = &self.segments.last().expect("an active segment").path;
        self.located
            .lock()
            .expect("wal locations lock poisoned")
            .active = Some(Arc::from(path.as_path()));
    }

    /// The appends since the last call, oldest first (at most [`WRITTEN_KEPT_MAX`] of them: a
    /// caller that never takes them loses the rest, not memory).
    pub fn take_written(&mut self) -> Vec<Written> {
        std::mem::take(&mut self.written)
    }

    /// The last entry's index (the compaction mark's when no entry follows it).
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    pub fn hard_state(&self) -> HardState {
        self.hard_state
    }

    pub fn compacted(&self) -> Compacted {
        self.compacted
    }

    /// How many segment files the log has.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Whether the next segment is made ahead, so that starting it needs no new space.
    pub fn has_spare(&self) -> bool {
        self.spare.is_some()
    }

    /// Whether the log has room set aside for what a member must write even when it takes no
    /// client writes (elections, lease expiries, membership, its own shutdown): a spare segment,
    /// or a quarter of a segment left in the one in use. Without it, the host should take no
    /// writes that add data, so that the log never has to grow on a full disk.
    /// A spare being made apart counts: it was started only with room for it and a quarter
    /// segment more, and counting it as missing for the moments it takes would refuse writes on
    /// a disk with room (the segment in use can pass its last quarter meanwhile under a fast
    /// writer). Each append looks whether it is done, so a failure to make it counts at once.
    pub fn has_room(&self) -> bool {
        self.spare.is_some()
            || self.making.is_some()
            || self.active_bytes.saturating_sub(self.offset) >= self.segment_bytes / 4
    }

    /// Makes the spare segment if there is none (see [`SPARE_NAME`]); whether there is one now.
    /// On a full disk it fails, leaving no file behind: try again later (it writes a whole
    /// segment, so not on every append). Where the file system makes it apart
    /// ([`Fs::zero_fill_apart`]) this starts it, or looks whether it is done: `false` until then.
    pub fn make_spare(&mut self) -> bool {
        if self.spare.is_some() {
            return true;
        }
        if let Some(done) = self.spare_made() {
            return done;
        }
        // Not tried without room for it and a quarter segment more: filling the disk for a moment
        // would fail whatever else writes there then (the state machine's checkpoint).
        let needed = self.segment_bytes + self.segment_bytes / 4;
        if self
            .fs
            .available(&self.dir)
            .is_some_and(|free| free < needed)
        {
            return false;
        }
        let path = self.dir.join(SPARE_NAME);
        if let Some(making) = self.fs.zero_fill_apart(&path, self.segment_bytes) {
            self.making = Some(making);
            return false;
        }
        let made = zero_filled(&self.fs, &path, self.segment_bytes);
        self.made_spare(made)
    }

    /// Takes in the spare being made apart if it is done: `None` if none is being made, else
    /// whether there is a spare now (`false` while it is still being made, or if it failed).
    fn spare_made(&mut self) -> Option<bool> {
        let making = self.making.as_ref()?;
        let made = match making.try_recv() {
            Err(std::sync::mpsc::TryRecvError::Empty) => return Some(false),
            Ok(made) => made,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                Err(std::io::Error::other("the spare's maker stopped"))
            }
        };
        self.making = None;
        Some(self.made_spare(made))
    }

    /// Bytes left in the segment in use.
    #[cfg(test)]
    pub(crate) fn room_in_segment(&self) -> u64 {
        self.active_bytes.saturating_sub(self.offset)
    }

    /// Whether a spare is being made apart ([`Fs::zero_fill_apart`]).
    #[cfg(test)]
    pub(crate) fn making_spare(&self) -> bool {
        self.making.is_some()
    }

    /// The spare, to start the next segment with. One still being made apart is waited for: it
    /// is already under way, and making another here would take longer.
    fn take_spare(&mut self) -> Option<F::File> {
        if let Some(making) = self.making.take() {
            let made = making
                .recv()
                .unwrap_or_else(|_| Err(std::io::Error::other("the spare's maker stopped")));
            self.made_spare(made);
        }
        self.spare.take()
    }

    /// Takes in a spare just made (or the failure to make it: no file is left behind).
    fn made_spare(&mut self, made: std::io::Result<F::File>) -> bool {
        let path = self.dir.join(SPARE_NAME);
        match made {
            Ok(file) => {
                self.spare = Some(file);
                true
            }
            Err(_) => {
                let _ = self.fs.remove(&path);
                false
            }
        }
    }

    /// Writes `batch` as one frame and syncs it: when this returns `Ok`, the batch survives a
    /// crash whole. Entries must start in `(compacted.index, last_index + 1]` (an earlier start
    /// replaces the entries from there on) and be contiguous.
    ///
    /// A failed cut (no space for a new segment) leaves the log as it was, so the append can be
    /// tried again; a failed write or sync of the segment in use fails every later append too.
    pub fn append(&mut self, batch: &Batch) -> Result<(), WalError> {
        if self.poisoned {
            return Err(WalError::Poisoned);
        }
        self.spare_made();
        if let Some(first) = batch.entries.first() {
            let min = batch
                .compacted
                .map_or(self.compacted.index, |c| c.index.max(self.compacted.index))
                + 1;
            let max = if batch.compacted.is_some_and(|c| c.index > self.last_index) {
                min
            } else {
                self.last_index + 1
            };
            if first.index < min || first.index > max {
                return Err(WalError::NotContiguous {
                    got: first.index,
                    min,
                    max,
                });
            }
            for (i, e) in batch.entries.iter().enumerate() {
                if e.index != first.index + i as u64 {
                    return Err(WalError::NotContiguous {
                        got: e.index,
                        min: first.index + i as u64,
                        max: first.index + i as u64,
                    });
                }
            }
        }
        let frame = Frame {
            kind: Some(FrameKind::Batch(batch.clone())),
        };
        let payload = frame.encode_to_vec();
        if payload.len() > frame::FRAME_PAYLOAD_BYTES_MAX {
            return Err(WalError::TooLarge {
                bytes: payload.len(),
            });
        }
        self.scratch.clear();
        frame::encode(&payload, &mut self.scratch);
        let framed = self.scratch.len() as u64;
        if self.offset + framed > self.active_bytes {
            self.cut(framed)?;
        }
        let path = &self.segments.last().expect("an active segment").path;
        let started = std::time::Instant::now();
        let mut write_took = std::time::Duration::ZERO;
        let written = self
            .active
            .write_at(self.offset, &self.scratch)
            .and_then(|()| {
                write_took = started.elapsed();
                self.active.sync_data()
            });
        if let Err(e) = written {
            self.poisoned = true;
            return Err(WalError::io(path)(e));
        }
        if self.written.len() < WRITTEN_KEPT_MAX {
            self.written.push(Written {
                bytes: framed,
                write: write_took,
            });
        }
        self.offset += framed;
        if let Some(mark) = batch.compacted
            && mark.index > self.compacted.index
        {
            let held = self.term_at(mark.index);
            self.compacted = mark;
            let mut located = self.located.lock().expect("wal locations lock poisoned");
            if held == Some(mark.term) {
                // Runs wholly at or below the mark are no longer needed.
                while self.terms.len() > 1 && self.terms[1].0 <= mark.index + 1 {
                    self.terms.remove(0);
                }
                located.drop_through(mark.index);
            } else {
                // Past the end, or another history's entry there: nothing follows the mark.
                self.terms.clear();
                self.last_index = mark.index;
                located.runs.clear();
            }
        }
        if let (Some(first), Some(last)) = (batch.entries.first(), batch.entries.last()) {
            self.note_terms(&batch.entries);
            let active = self.segments.last_mut().expect("an active segment");
            active.max_index = active.max_index.max(last.index);
            self.located
                .lock()
                .expect("wal locations lock poisoned")
                .note(first.index, last.index, self.offset - framed, framed);
        }
        if let Some(hs) = batch.hard_state {
            self.hard_state = hs;
        }
        Ok(())
    }

    /// The term of the entry at `index`, if the log holds it (after the mark).
    fn term_at(&self, index: u64) -> Option<u64> {
        if index <= self.compacted.index || index > self.last_index {
            return None;
        }
        self.terms
            .iter()
            .rev()
            .find(|run| run.0 <= index)
            .map(|run| run.1)
    }

    /// Notes the terms of `entries`, which replace any from their first index on.
    fn note_terms(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else {
            return;
        };
        self.terms.retain(|run| run.0 < first.index);
        for e in entries {
            if self.terms.last().is_none_or(|run| run.1 != e.term) {
                self.terms.push((e.index, e.term));
            }
        }
        self.last_index = entries.last().map_or(self.last_index, |e| e.index);
    }

    /// Marks the log compacted up to `mark` (durably, as an append) and deletes the segments
    /// whose every entry is at or below it. The active segment always stays.
    pub fn compact(&mut self, mark: Compacted) -> Result<(), WalError> {
        if mark.index > self.compacted.index {
            self.append(&Batch {
                compacted: Some(mark),
                ..Batch::default()
            })?;
        }
        let keep_from = self
            .segments
            .iter()
            .position(|s| s.max_index > self.compacted.index)
            .unwrap_or(self.segments.len() - 1)
            .min(self.segments.len() - 1);
        if keep_from == 0 {
            return Ok(());
        }
        // Oldest first, so that a crash part-way leaves the segments that remain contiguous.
        for segment in &self.segments[..keep_from] {
            self.fs
                .remove(&segment.path)
                .map_err(WalError::io(&segment.path))?;
        }
        self.fs
            .sync_dir(&self.dir)
            .map_err(WalError::io(&self.dir))?;
        self.segments.drain(..keep_from);
        Ok(())
    }

    /// Starts a new segment for a frame of `framed` bytes.
    fn cut(&mut self, framed: u64) -> Result<(), WalError> {
        let seq = self.segments.last().expect("an active segment").seq + 1;
        let header = SegmentHeader {
            format: WAL_FORMAT,
            seq,
            first_index: self.last_index + 1,
            compacted: Some(self.compacted),
            hard_state: Some(self.hard_state),
        };
        let header_bytes = encoded_header_len(&header);
        let size = self.segment_bytes.max(header_bytes + framed);
        let spare = if size == self.segment_bytes {
            self.take_spare()
        } else {
            None
        };
        let (active, path, offset) = match spare {
            Some(spare) => name_spare(&self.fs, &self.dir, spare, &header)?,
            None => new_segment(&self.fs, &self.dir, &header, size)?,
        };
        self.active = active;
        self.offset = offset;
        self.active_bytes = size;
        self.segments.push(Segment {
            seq,
            path,
            max_index: 0,
        });
        self.locate_active();
        // The next one, ahead of need; no room for it is not an error now (`has_room` says so).
        self.make_spare();
        Ok(())
    }
}

impl<F: Fs> Drop for Wal<F> {
    /// A spare still being made apart is waited for, so that no thread writes zeros into the
    /// spare's file once this log is gone (a log opened again at once would make the same file).
    fn drop(&mut self) {
        if let Some(making) = self.making.take() {
            let _ = making.recv();
        }
    }
}

/// Turns the spare segment into the segment `header` starts: its header written and synced in
/// the space it already has, then its name given (and made durable). On failure the spare is
/// gone and the log is as it was (a named segment left by a failed directory sync holds no frame
/// and is renamed over by the next try, as with `new_segment`).
fn name_spare<F: Fs>(
    fs: &F,
    dir: &Path,
    mut spare: F::File,
    header: &SegmentHeader,
) -> Result<(F::File, PathBuf, u64), WalError> {
    let tmp = dir.join(SPARE_NAME);
    let path = dir.join(segment_name(header.seq, header.first_index));
    let header_bytes = write_header(&mut spare, header);
    let named = header_bytes.and_then(|n| fs.rename(&tmp, &path).map(|()| n));
    match named {
        Ok(n) => {
            fs.sync_dir(dir).map_err(WalError::io(dir))?;
            Ok((spare, path, n))
        }
        Err(e) => {
            let _ = fs.remove(&tmp);
            Err(WalError::io(&tmp)(e))
        }
    }
}

fn encoded_header_len(header: &SegmentHeader) -> u64 {
    let frame = Frame {
        kind: Some(FrameKind::Header(header.clone())),
    };
    frame::framed_len(frame.encoded_len()) as u64
}

/// Makes a zero-filled segment of `size` bytes holding `header`, synced, under its final name
/// (made durable too); returns it open, its path, and where its first batch goes.
fn new_segment<F: Fs>(
    fs: &F,
    dir: &Path,
    header: &SegmentHeader,
    size: u64,
) -> Result<(F::File, PathBuf, u64), WalError> {
    let name = segment_name(header.seq, header.first_index);
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(&name);
    let made = fill_segment(fs, &tmp, header, size);
    let (file, header_bytes) = match made {
        Ok(made) => made,
        Err(e) => {
            // Out of space, say: leave no half-made file behind, and the log as it was.
            let _ = fs.remove(&tmp);
            return Err(WalError::io(&tmp)(e));
        }
    };
    fs.rename(&tmp, &path).map_err(WalError::io(&path))?;
    fs.sync_dir(dir).map_err(WalError::io(dir))?;
    Ok((file, path, header_bytes))
}

fn fill_segment<F: Fs>(
    fs: &F,
    tmp: &Path,
    header: &SegmentHeader,
    size: u64,
) -> std::io::Result<(F::File, u64)> {
    let mut file = zero_filled(fs, tmp, size)?;
    let header_bytes = write_header(&mut file, header)?;
    Ok((file, header_bytes))
}

/// A new file of `size` zero bytes, synced.
pub(crate) fn zero_filled<F: Fs>(fs: &F, path: &Path, size: u64) -> std::io::Result<F::File> {
    let mut file = fs.create(path)?;
    let zeros = vec![0u8; ZEROS_CHUNK_BYTES];
    let mut at = 0;
    while at < size {
        let n = (size - at).min(ZEROS_CHUNK_BYTES as u64);
        file.write_at(at, &zeros[..n as usize])?;
        at += n;
    }
    file.sync_data()?;
    Ok(file)
}

/// Writes `header`'s frame at the start of `file` and syncs it; its length.
fn write_header<W: WalFile>(file: &mut W, header: &SegmentHeader) -> std::io::Result<u64> {
    let mut bytes = Vec::new();
    let payload = Frame {
        kind: Some(FrameKind::Header(header.clone())),
    }
    .encode_to_vec();
    frame::encode(&payload, &mut bytes);
    file.write_at(0, &bytes)?;
    file.sync_data()?;
    Ok(bytes.len() as u64)
}

/// Replays one segment into `replay` (starting it from the first segment's header). Returns
/// where its written frames end, the highest entry index it holds, and how many bytes of a torn
/// last frame must be cleared from that end (only in the last segment).
pub(crate) fn replay_segment(
    path: &Path,
    window: &mut SegmentWindow<'_, impl WalFile>,
    seq: u64,
    first_index: u64,
    is_last: bool,
    replay: &mut Option<Replay>,
) -> Result<(u64, u64, u64), WalError> {
    let corrupt = |offset: usize, what: String| WalError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        what,
    };
    let io = || WalError::io(path);
    let mut at = 0usize;
    let mut max_index = 0;
    // Until the segment's header says its format.
    let mut headers = Headers::CheckedOrZero;
    loop {
        window.cover_frame_at(at).map_err(io())?;
        let rel = at - window.base;
        match frame::read(&window.bytes, rel, headers) {
            Read::Frame { payload, next } => {
                let frame = Frame::decode(payload)
                    .map_err(|e| corrupt(at, format!("a frame that does not decode: {e}")))?;
                match frame.kind {
                    Some(FrameKind::Header(h)) if at == 0 => {
                        if h.format == WAL_FORMAT {
                            headers = Headers::Checked;
                        } else if h.format != 1 {
                            return Err(corrupt(
                                at,
                                format!(
                                    "format {} (this build reads formats 1 and {WAL_FORMAT})",
                                    h.format
                                ),
                            ));
                        }
                        if h.seq != seq || h.first_index != first_index {
                            return Err(corrupt(
                                at,
                                format!(
                                    "the header says segment {} from index {}, the name {} from {}",
                                    h.seq, h.first_index, seq, first_index
                                ),
                            ));
                        }
                        if replay.is_none() {
                            *replay = Some(Replay {
                                compacted: h.compacted.unwrap_or_default(),
                                hard_state: h.hard_state.unwrap_or_default(),
                                entries: Vec::new(),
                                located: Located::default(),
                            });
                        }
                        if let Some(state) = replay.as_mut() {
                            state.located.active = Some(Arc::from(path));
                        }
                    }
                    Some(FrameKind::Batch(batch)) if at > 0 => {
                        let state = replay.as_mut().expect("the header came first");
                        if let Some(mark) = batch.compacted {
                            state.mark(mark);
                        }
                        let run = batch.entries.first().zip(batch.entries.last());
                        if let Some((first, last)) = run {
                            max_index = max_index.max(last.index);
                            let framed = (window.base + next - at) as u64;
                            let (first, last) = (first.index, last.index);
                            state.located.note(first, last, at as u64, framed);
                        }
                        state
                            .append(batch.entries)
                            .map_err(|what| corrupt(at, what))?;
                        if let Some(hs) = batch.hard_state {
                            state.hard_state = hs;
                        }
                    }
                    _ => return Err(corrupt(at, "a frame out of place".into())),
                }
                at = window.base + next;
                window.forget_before(at);
            }
            Read::End => {
                if at == 0 {
                    return Err(corrupt(0, "a segment without its header".into()));
                }
                // What follows the end is kept only when it is not all zeros.
                window.rest_unless_zeros().map_err(io())?;
                let bytes = &window.bytes;
                if let Some(later) = frame::intact_frame_after(bytes, rel + frame::ALIGN_BYTES) {
                    return Err(corrupt(
                        at,
                        format!(
                            "zeros where a frame was written (an intact frame at {})",
                            window.base + later
                        ),
                    ));
                }
                let cleared = if is_last {
                    trailing_garbage(bytes, rel)
                } else {
                    0
                };
                return Ok((at as u64, max_index, cleared));
            }
            Read::Bad(_) => {
                // Judged with the whole rest of the segment.
                window.rest().map_err(io())?;
                let bytes = &window.bytes;
                let Read::Bad(bad) = frame::read(bytes, rel, headers) else {
                    unreachable!("the frame read bad with every byte it reaches read");
                };
                let torn = matches!(bad, BadFrame::Torn | BadFrame::Short);
                if is_last && torn && at > 0 && frame::intact_frame_after(bytes, rel + 8).is_none()
                {
                    let cleared = trailing_garbage(bytes, rel);
                    return Ok((at as u64, max_index, cleared));
                }
                return Err(corrupt(at, format!("{bad:?} frame")));
            }
        }
    }
}

/// A segment read a chunk at a time for replay: `bytes` holds the segment from offset `base` on,
/// as far as replay has needed. What replay stepped past is let go, and the zeros that fill a
/// segment past its frames are checked, not kept, so replaying a 64 MiB segment holds a frame
/// and a chunk, not the segment. To judge a bad frame, or an end followed by anything but
/// zeros, it reads the rest of the segment whole: every check sees from the frame it is at on
/// what it saw when segments were read whole.
pub(crate) struct SegmentWindow<'f, F> {
    file: &'f mut F,
    size: usize,
    base: usize,
    bytes: Vec<u8>,
}

const WINDOW_CHUNK: usize = 1 << 20;

impl<'f, F: WalFile> SegmentWindow<'f, F> {
    pub(crate) fn new(file: &'f mut F) -> std::io::Result<Self> {
        let size = usize::try_from(file.size()?).unwrap_or(usize::MAX);
        Ok(SegmentWindow {
            file,
            size,
            base: 0,
            bytes: Vec::new(),
        })
    }

    /// Reads on until the window reaches offset `to` (a chunk further at least) or the file's
    /// end.
    fn cover(&mut self, to: usize) -> std::io::Result<()> {
        let held = self.bytes.len();
        if self.base + held >= to || self.base + held >= self.size {
            return Ok(());
        }
        let want = (to - self.base).max(held + WINDOW_CHUNK);
        self.bytes.resize(want.min(self.size - self.base), 0);
        let read = self
            .file
            .read_at((self.base + held) as u64, &mut self.bytes[held..])?;
        self.bytes.truncate(held + read);
        Ok(())
    }

    /// Covers the frame at `at`: its header, and the whole frame when the header's length is
    /// one a frame may have.
    fn cover_frame_at(&mut self, at: usize) -> std::io::Result<()> {
        self.cover(at + frame::HEADER_BYTES)?;
        let rel = at - self.base;
        if let Some(header) = self.bytes.get(rel..rel + frame::HEADER_BYTES) {
            let len = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
            if len <= frame::FRAME_PAYLOAD_BYTES_MAX {
                self.cover(at + frame::framed_len(len))?;
            }
        }
        Ok(())
    }

    /// The bytes the window holds.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.bytes.len()
    }

    /// Lets go of what lies before `at`, once that is a chunk or more.
    fn forget_before(&mut self, at: usize) {
        let rel = at - self.base;
        if rel >= WINDOW_CHUNK && rel <= self.bytes.len() {
            self.bytes.drain(..rel);
            self.base = at;
        }
    }

    /// Reads the rest of the segment into the window.
    fn rest(&mut self) -> std::io::Result<()> {
        self.cover(self.size)
    }

    /// Checks that the segment holds only zeros past the window, keeping none of them; reads
    /// the rest into the window when it does not.
    fn rest_unless_zeros(&mut self) -> std::io::Result<()> {
        let mut chunk = vec![0u8; WINDOW_CHUNK];
        let mut offset = self.base + self.bytes.len();
        while offset < self.size {
            let read = self.file.read_at(offset as u64, &mut chunk)?;
            if read == 0 {
                return Ok(());
            }
            if chunk[..read].iter().any(|b| *b != 0) {
                return self.rest();
            }
            offset += read;
        }
        Ok(())
    }
}

/// How many bytes from `at` must be zeroed so the segment ends cleanly there.
fn trailing_garbage(bytes: &[u8], at: usize) -> u64 {
    bytes[at..]
        .iter()
        .rposition(|b| *b != 0)
        .map_or(0, |last| last as u64 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_parse_back() {
        let name = segment_name(3, 0x1234);
        assert_eq!(name, "0000000000000003-0000000000001234.wal");
        assert_eq!(parse_segment_name(&name), Some((3, 0x1234)));
        assert_eq!(parse_segment_name("3-1234.wal"), None);
        assert_eq!(parse_segment_name(&format!("{name}.tmp")), None);
    }
}
