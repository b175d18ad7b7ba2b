//! The members' disks: the write-ahead log's [`MemFs`], which loses unsynced writes, tears them
//! or rots bits when told, behind the log's own `Fs` seam. [`SimFs::Lying`] is a known-bad disk
//! for the simulator's own tests: it reports every `fdatasync` done and does none.

use std::io;
use std::path::Path;

use leasehold_wal::{Fs, MemFile, MemFs, WalFile};

#[derive(Clone, Debug)]
pub enum SimFs {
    Honest(MemFs),
    /// Acknowledges `sync_data` without syncing: the bug "a log that acknowledges before its
    /// fsync".
    Lying(MemFs),
}

impl SimFs {
    pub fn mem(&self) -> &MemFs {
        match self {
            SimFs::Honest(fs) | SimFs::Lying(fs) => fs,
        }
    }
}

pub struct SimFile {
    file: MemFile,
    lying: bool,
}

impl Fs for SimFs {
    type File = SimFile;

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.mem().create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.mem().list(dir)
    }
    fn open(&self, path: &Path) -> io::Result<SimFile> {
        let lying = matches!(self, SimFs::Lying(_));
        Ok(SimFile {
            file: self.mem().open(path)?,
            lying,
        })
    }
    fn create(&self, path: &Path) -> io::Result<SimFile> {
        let lying = matches!(self, SimFs::Lying(_));
        Ok(SimFile {
            file: self.mem().create(path)?,
            lying,
        })
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.mem().rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.mem().remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.mem().sync_dir(dir)
    }
}

impl WalFile for SimFile {
    fn size(&self) -> io::Result<u64> {
        self.file.size()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.file.write_at(offset, bytes)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        if self.lying {
            return Ok(());
        }
        self.file.sync_data()
    }
}
