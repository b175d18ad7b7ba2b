//! The file system as the log sees it: the one seam through which it touches a disk. [`StdFs`] is
//! the real one; [`MemFs`] keeps files in memory and can crash, losing what was not synced (and,
//! if asked, tearing the last unsynced write sector by sector), for the crash tests here and for
//! the simulator.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What the log needs of a file system. Paths are the ones the log builds under its directory.
pub trait Fs: Clone + Send + Sync + 'static {
    type File: WalFile;

    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the files directly in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Self::File>;
    /// Creates `path` empty, replacing any file there.
    fn create(&self, path: &Path) -> io::Result<Self::File>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes the creations, renames and removals in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Starts making `path` a file of `size` zero bytes, synced, away from the caller's thread,
    /// where this file system does that: the file comes on the receiver. `None`: the caller
    /// makes it in place (the default, and what the test file systems do, which stay
    /// deterministic).
    fn zero_fill_apart(
        &self,
        _path: &Path,
        _size: u64,
    ) -> Option<std::sync::mpsc::Receiver<io::Result<Self::File>>> {
        None
    }
    /// Bytes free for new data on the file system that holds `dir`, if known.
    fn available(&self, _dir: &Path) -> Option<u64> {
        None
    }
}

/// One open file.
pub trait WalFile: Send + 'static {
    /// The file's size in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Reads into `buf` from `offset`; how many bytes it read (fewer only at the file's end).
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()>;
    /// Makes the written bytes durable (`fdatasync`; the file's size does not change after it is
    /// preallocated, so its metadata need not be synced too).
    fn sync_data(&mut self) -> io::Result<()>;
}

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct StdFs;

#[derive(Debug)]
pub struct StdFile(std::fs::File);

impl Fs for StdFs {
    fn available(&self, dir: &Path) -> Option<u64> {
        let stat = rustix::fs::statvfs(dir).ok()?;
        Some(stat.f_bavail.saturating_mul(stat.f_frsize))
    }

    type File = StdFile;

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(names)
    }

    fn open(&self, path: &Path) -> io::Result<StdFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        Ok(StdFile(file))
    }

    fn create(&self, path: &Path) -> io::Result<StdFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(StdFile(file))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir)?.sync_all()
    }

    /// On a thread of its own: writing and syncing a 64 MiB segment takes the disk for a few
    /// hundred milliseconds, which the Raft thread (the log's writer) must not wait out.
    fn zero_fill_apart(
        &self,
        path: &Path,
        size: u64,
    ) -> Option<std::sync::mpsc::Receiver<io::Result<StdFile>>> {
        let (made, made_rx) = std::sync::mpsc::sync_channel(1);
        let path = path.to_path_buf();
        std::thread::Builder::new()
            .name("leasehold-wal-spare".into())
            .spawn(move || {
                let _ = made.send(crate::wal::zero_filled(&StdFs, &path, size));
            })
            .ok()?;
        Some(made_rx)
    }
}

impl WalFile for StdFile {
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let mut read = 0;
        while read < buf.len() {
            match self.0.read_at(&mut buf[read..], offset + read as u64) {
                Ok(0) => break,
                Ok(n) => read += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(read)
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.0.write_all_at(bytes, offset)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
}

/// Sector size the crash model tears writes at: a write reaches the disk sector by sector, each
/// sector whole or not at all.
pub const SECTOR_BYTES: usize = 512;

/// How a [`MemFs`] crash treats the writes not yet synced.
#[derive(Clone, Copy, Debug)]
pub enum Crash {
    /// Every unsynced write is lost.
    LoseUnsynced,
    /// Each sector an unsynced write touched reaches the disk or not, drawn from this seed.
    TearSectors(u64),
    /// Every unsynced write reaches the disk (the kernel flushed it before the power went).
    KeepUnsynced,
}

/// Files in memory, with a crash model: what `sync_data` and `sync_dir` made durable survives
/// [`MemFs::crash`], the rest as [`Crash`] says. Clones share the same files.
#[derive(Clone, Debug, Default)]
pub struct MemFs {
    inner: Arc<Mutex<MemInner>>,
}

#[derive(Debug, Default)]
struct MemInner {
    next_inode: u64,
    /// The names as a reader sees them now.
    names: BTreeMap<PathBuf, u64>,
    /// The names as they would be after a crash (made durable by `sync_dir`).
    durable_names: BTreeMap<PathBuf, u64>,
    inodes: BTreeMap<u64, Inode>,
    /// Fail every operation from now on (a disk that went away).
    failing: Option<io::ErrorKind>,
    /// Bytes all files together may hold; a write that would grow a file past it fails with
    /// `StorageFull` (writes inside a file's size still succeed, as on a real full disk).
    capacity: Option<u64>,
    /// Fail `sync_data` only (the write reached the page cache, its sync did not return).
    failing_syncs: bool,
}

#[derive(Debug, Default, Clone)]
struct Inode {
    /// The contents a reader sees.
    now: Vec<u8>,
    /// The contents after a crash that lost every unsynced write.
    durable: Vec<u8>,
}

#[derive(Debug)]
pub struct MemFile {
    fs: MemFs,
    inode: u64,
}

impl MemFs {
    pub fn new() -> MemFs {
        MemFs::default()
    }

    /// The power goes: open files become useless to their holders (drop them), names not made
    /// durable disappear, and unsynced writes are lost or torn as `crash` says.
    pub fn crash(&self, crash: Crash) {
        let mut inner = self.inner.lock().expect("memfs lock poisoned");
        inner.names = inner.durable_names.clone();
        let mut rng = crash_seed(crash);
        for inode in inner.inodes.values_mut() {
            let survived = match crash {
                Crash::LoseUnsynced => inode.durable.clone(),
                Crash::KeepUnsynced => inode.now.clone(),
                Crash::TearSectors(_) => tear(&inode.durable, &inode.now, &mut rng),
            };
            inode.now = survived.clone();
            inode.durable = survived;
        }
    }

    /// From now on every operation fails with `kind` (`StorageFull`: a full disk).
    pub fn fail_with(&self, kind: Option<io::ErrorKind>) {
        self.inner.lock().expect("memfs lock poisoned").failing = kind;
    }

    /// A disk that holds `bytes` at most (see [`MemFs::used_bytes`]); `None`: unbounded.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.inner.lock().expect("memfs lock poisoned").capacity = bytes;
    }

    /// Bytes held by the files that have a name.
    pub fn used_bytes(&self) -> u64 {
        let inner = self.inner.lock().expect("memfs lock poisoned");
        inner.used_bytes()
    }

    /// From now on `sync_data` fails (or works again), so a write is left unsynced for a crash
    /// to tear.
    pub fn fail_syncs(&self, failing: bool) {
        self.inner
            .lock()
            .expect("memfs lock poisoned")
            .failing_syncs = failing;
    }

    /// Flips one bit of the file at `path`, durably (a disk that rots).
    pub fn flip_bit(&self, path: &Path, byte: usize, bit: u8) {
        let mut inner = self.inner.lock().expect("memfs lock poisoned");
        let inode = inner.names[path];
        let node = inner.inodes.get_mut(&inode).expect("named inode exists");
        node.now[byte] ^= 1 << bit;
        node.durable[byte] ^= 1 << bit;
    }

    /// The contents of `path` as a reader sees them.
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let inner = self.inner.lock().expect("memfs lock poisoned");
        let inode = inner.names.get(path)?;
        Some(inner.inodes[inode].now.clone())
    }

    fn with<T>(&self, f: impl FnOnce(&mut MemInner) -> io::Result<T>) -> io::Result<T> {
        let mut inner = self.inner.lock().expect("memfs lock poisoned");
        if let Some(kind) = inner.failing {
            return Err(io::Error::new(kind, "memfs: failing on request"));
        }
        f(&mut inner)
    }
}

impl MemInner {
    fn used_bytes(&self) -> u64 {
        let named: std::collections::HashSet<u64> = self.names.values().copied().collect();
        named.iter().map(|i| self.inodes[i].now.len() as u64).sum()
    }
}

fn crash_seed(crash: Crash) -> u64 {
    match crash {
        Crash::TearSectors(seed) => seed | 1,
        _ => 1,
    }
}

/// xorshift64: enough to draw which sectors survive, and the same for the same seed.
fn next_random(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

fn tear(durable: &[u8], now: &[u8], rng: &mut u64) -> Vec<u8> {
    let mut out = durable.to_vec();
    out.resize(now.len(), 0);
    for (i, sector) in now.chunks(SECTOR_BYTES).enumerate() {
        let start = i * SECTOR_BYTES;
        let end = start + sector.len();
        let old = durable.get(start..end.min(durable.len())).unwrap_or(&[]);
        if old == sector {
            continue;
        }
        if next_random(rng).is_multiple_of(2) {
            out[start..end].copy_from_slice(sector);
        }
    }
    out
}

impl Fs for MemFs {
    fn available(&self, _dir: &Path) -> Option<u64> {
        let inner = self.inner.lock().expect("memfs lock poisoned");
        inner
            .capacity
            .map(|capacity| capacity.saturating_sub(inner.used_bytes()))
    }

    type File = MemFile;

    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        self.with(|_| Ok(()))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.with(|inner| {
            Ok(inner
                .names
                .keys()
                .filter(|p| p.parent() == Some(dir))
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect())
        })
    }

    fn open(&self, path: &Path) -> io::Result<MemFile> {
        let inode = self.with(|inner| {
            inner
                .names
                .get(path)
                .copied()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "memfs: no such file"))
        })?;
        Ok(MemFile {
            fs: self.clone(),
            inode,
        })
    }

    fn create(&self, path: &Path) -> io::Result<MemFile> {
        let inode = self.with(|inner| {
            inner.next_inode += 1;
            let inode = inner.next_inode;
            inner.inodes.insert(inode, Inode::default());
            inner.names.insert(path.to_path_buf(), inode);
            Ok(inode)
        })?;
        Ok(MemFile {
            fs: self.clone(),
            inode,
        })
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.with(|inner| {
            let inode = inner
                .names
                .remove(from)
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "memfs: no such file"))?;
            inner.names.insert(to.to_path_buf(), inode);
            Ok(())
        })
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.with(|inner| {
            inner
                .names
                .remove(path)
                .map(|_| ())
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "memfs: no such file"))
        })
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.with(|inner| {
            inner.durable_names.retain(|p, _| p.parent() != Some(dir));
            let now: Vec<_> = inner
                .names
                .iter()
                .filter(|(p, _)| p.parent() == Some(dir))
                .map(|(p, i)| (p.clone(), *i))
                .collect();
            inner.durable_names.extend(now);
            Ok(())
        })
    }
}

impl WalFile for MemFile {
    fn size(&self) -> io::Result<u64> {
        self.fs
            .with(|inner| Ok(inner.inodes[&self.inode].now.len() as u64))
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.fs.with(|inner| {
            let now = &inner.inodes[&self.inode].now;
            let from = usize::try_from(offset).unwrap_or(usize::MAX).min(now.len());
            let n = buf.len().min(now.len() - from);
            buf[..n].copy_from_slice(&now[from..from + n]);
            Ok(n)
        })
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.fs.with(|inner| {
            let start = usize::try_from(offset).expect("memfs offsets fit in memory");
            let end = start + bytes.len();
            let size = inner.inodes[&self.inode].now.len();
            if let Some(capacity) = inner.capacity
                && end > size
                && inner.used_bytes() + (end - size) as u64 > capacity
            {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "memfs: no space left on device",
                ));
            }
            let node = inner
                .inodes
                .get_mut(&self.inode)
                .expect("open inode exists");
            if node.now.len() < end {
                node.now.resize(end, 0);
            }
            node.now[start..end].copy_from_slice(bytes);
            Ok(())
        })
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.fs.with(|inner| {
            if inner.failing_syncs {
                return Err(io::Error::other("memfs: sync failing on request"));
            }
            let node = inner
                .inodes
                .get_mut(&self.inode)
                .expect("open inode exists");
            node.durable = node.now.clone();
            Ok(())
        })
    }
}
