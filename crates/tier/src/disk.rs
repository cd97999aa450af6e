//! Local-directory store: one file per object (format in `docs/design/disk-format.md`), written
//! to a temporary name, fsynced, then renamed into place, so a reader (or a restart after
//! kill -9) only ever sees complete files. Byte budget with LRU eviction; the index is rebuilt
//! on open by scanning headers. Owns the directory; never shares it with another process.

use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use crate::dropped::DroppedKeys;
use crate::lru::ByteLru;
use crate::object::{self, Compression, HEADER_BYTES};
use crate::store::RawObjectAccess;
use crate::{
    BlockRef, StoredBlock, TierError, TierKey, TierKind, TierMetrics, TierStats, TierStore,
};

/// Sub-directory (inside the configured path) holding format-v1 objects.
pub const LAYOUT_DIR: &str = "agentkv-tier-v1";
const OBJECT_EXT: &str = "kvb";
const TMP_EXT: &str = "tmp";

/// Configuration of a [`DiskStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// Directory owned by this store (created if missing).
    pub path: PathBuf,
    /// Byte budget over object file sizes.
    pub max_bytes: u64,
    /// `fsync` each object before renaming it into place (default true). Without it a power
    /// loss (not a process kill) can leave a renamed file with lost data, which reads reject by
    /// checksum.
    pub fsync: bool,
    /// Payload compression applied on put.
    pub compression: Compression,
}

impl DiskConfig {
    /// Config with fsync on and no compression.
    pub fn new(path: impl Into<PathBuf>, max_bytes: u64) -> DiskConfig {
        DiskConfig {
            path: path.into(),
            max_bytes,
            fsync: true,
            compression: Compression::None,
        }
    }
}

/// What the open-time scan found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Valid-looking objects indexed.
    pub indexed: u64,
    /// Leftover temporary files (interrupted writes) deleted.
    pub removed_tmp: u64,
    /// Files with a bad header, wrong length or wrong name deleted (counted as `corrupt`).
    pub removed_invalid: u64,
    /// Objects evicted because the budget is now smaller than what was on disk.
    pub evicted: u64,
    /// Entries of a shard that are not regular files (directories, symlinks, sockets — even if
    /// named like an object) or cannot be read: left alone, never indexed, never deleted.
    pub skipped: u64,
    /// Files the scan meant to delete but could not (left in place; never indexed).
    pub remove_failed: u64,
}

/// One-directory, one-file-per-object store.
pub struct DiskStore {
    root: PathBuf,
    lru: Mutex<ByteLru<()>>,
    config: DiskConfig,
    tmp_counter: AtomicU64,
    metrics: TierMetrics,
    scan: ScanReport,
    dropped: DroppedKeys,
}

impl DiskStore {
    /// Open (creating if needed) the store at `config.path`, deleting leftover temporary files
    /// and invalid objects and indexing the rest, oldest modification time first.
    ///
    /// The scan reads everything first and deletes only afterwards, so an error that stops it
    /// (an unreadable directory) has deleted nothing; entries that are not regular files (a
    /// directory named like an object) are skipped, and a deletion that fails is reported, not
    /// fatal: neither stops start-up.
    pub fn open(config: DiskConfig) -> Result<DiskStore, TierError> {
        let root = config.path.join(LAYOUT_DIR);
        fs::create_dir_all(&root).map_err(|e| TierError::io(&root, e))?;
        let metrics = TierMetrics::default();
        let mut scan = ScanReport::default();
        let mut found: Vec<(SystemTime, TierKey, u64)> = Vec::new();
        let mut tmp_files = Vec::new();
        let mut invalid = Vec::new();
        // Phase 1, read only.
        for (shard, shard_type) in read_dir(&root)? {
            if !(shard_type.is_dir() || shard_type.is_symlink() && shard.is_dir()) {
                continue;
            }
            for (path, file_type) in read_dir(&shard)? {
                let ext = path.extension().and_then(|e| e.to_str());
                if !matches!(ext, Some(TMP_EXT | OBJECT_EXT)) {
                    continue;
                }
                if !file_type.is_file() {
                    tracing::warn!(path = %path.display(), "disk tier: not a regular file; skipped");
                    scan.skipped += 1;
                    continue;
                }
                if ext == Some(TMP_EXT) {
                    tmp_files.push(path);
                    continue;
                }
                match index_entry(&path) {
                    Ok(Some(entry)) => found.push(entry),
                    Ok(None) => invalid.push(path),
                    // Unreadable (permissions): neither trusted nor deleted.
                    Err(e) => {
                        tracing::warn!(error = %e, "disk tier: cannot read an object; skipped");
                        scan.skipped += 1;
                    }
                }
            }
        }
        // Phase 2: clean up, best effort.
        let mut remove = |path: &Path| match remove_file(path) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "disk tier: cannot delete a file found at start-up");
                scan.remove_failed += 1;
                false
            }
        };
        for path in &tmp_files {
            if remove(path) {
                scan.removed_tmp += 1;
            }
        }
        for path in &invalid {
            metrics.corrupted();
            if remove(path) {
                scan.removed_invalid += 1;
            }
        }
        found.sort_by_key(|(mtime, _, _)| *mtime);
        let mut lru = ByteLru::new(config.max_bytes);
        let mut to_delete = Vec::new();
        for (_, key, bytes) in found {
            scan.indexed += 1;
            if bytes > config.max_bytes {
                to_delete.push(key);
                continue;
            }
            to_delete.extend(lru.insert(key, (), bytes).into_iter().map(|(k, ())| k));
        }
        scan.evicted = to_delete.len() as u64;
        metrics.evicted(to_delete.len());
        let mut store = DiskStore {
            root,
            lru: Mutex::new(lru),
            config,
            tmp_counter: AtomicU64::new(0),
            metrics,
            scan,
            dropped: DroppedKeys::default(),
        };
        for key in to_delete {
            if let Err(e) = remove_file(&store.object_path(&key)) {
                tracing::warn!(error = %e, "disk tier: cannot delete an object over the budget");
                store.scan.remove_failed += 1;
            }
        }
        Ok(store)
    }

    /// What the open-time scan found.
    pub fn scan_report(&self) -> ScanReport {
        self.scan
    }

    /// Path of `key`'s object file: `<path>/agentkv-tier-v1/<hex[0..2]>/<hex>.kvb` where `hex` is
    /// [`TierKey::name_hex`].
    pub fn object_path(&self, key: &TierKey) -> PathBuf {
        let name = key.name_hex();
        self.root
            .join(&name[..2])
            .join(format!("{name}.{OBJECT_EXT}"))
    }

    fn lock(&self) -> MutexGuard<'_, ByteLru<()>> {
        // The index holds no invariant a panic elsewhere could half-break beyond accounting.
        self.lru
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Write `bytes` as `key`'s object: temp file in the same directory, optional fsync, rename.
    fn write_atomic(&self, key: &TierKey, bytes: &[u8]) -> Result<(), TierError> {
        let path = self.object_path(key);
        let dir = path.parent().expect("object paths have a shard directory");
        fs::create_dir_all(dir).map_err(|e| TierError::io(dir, e))?;
        let tmp = dir.join(format!(
            "{}.{}.{}.{TMP_EXT}",
            key.name_hex(),
            std::process::id(),
            self.tmp_counter.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut file = File::create(&tmp).map_err(|e| TierError::io(&tmp, e))?;
            file.write_all(bytes).map_err(|e| TierError::io(&tmp, e))?;
            if self.config.fsync {
                file.sync_all().map_err(|e| TierError::io(&tmp, e))?;
            }
            drop(file);
            fs::rename(&tmp, &path).map_err(|e| TierError::io(&path, e))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp); // best effort; a leftover is removed on next open
        }
        result
    }

    fn read_object(&self, key: &TierKey) -> Result<Option<Vec<u8>>, TierError> {
        let path = self.object_path(key);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(TierError::io(path, e)),
        }
    }

    fn drop_object(&self, key: &TierKey) -> Result<(), TierError> {
        self.lock().remove(key);
        remove_file(&self.object_path(key))
    }
}

/// The entries of `dir` with their types (symlinks not followed).
fn read_dir(dir: &Path) -> Result<Vec<(PathBuf, fs::FileType)>, TierError> {
    let entries = fs::read_dir(dir).map_err(|e| TierError::io(dir, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| TierError::io(dir, e))?;
        let file_type = entry
            .file_type()
            .map_err(|e| TierError::io(entry.path(), e))?;
        out.push((entry.path(), file_type));
    }
    Ok(out)
}

fn remove_file(path: &Path) -> Result<(), TierError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(TierError::io(path, e)),
    }
}

/// `(mtime, key, file bytes)` if `path` has a valid header, the length the header states and
/// the name its key implies; `None` if it is invalid.
fn index_entry(path: &Path) -> Result<Option<(SystemTime, TierKey, u64)>, TierError> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(TierError::io(path, e)),
    };
    let meta = file.metadata().map_err(|e| TierError::io(path, e))?;
    let mut header = [0u8; HEADER_BYTES];
    if file.read_exact(&mut header).is_err() {
        return Ok(None);
    }
    let Ok(parsed) = object::parse_header(&header) else {
        return Ok(None);
    };
    let expected_name = format!("{}.{OBJECT_EXT}", parsed.key.name_hex());
    let name_ok = path.file_name().and_then(|n| n.to_str()) == Some(expected_name.as_str());
    if !name_ok || parsed.object_bytes != meta.len() {
        return Ok(None);
    }
    let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    Ok(Some((mtime, parsed.key, meta.len())))
}

impl TierStore for DiskStore {
    fn kind(&self) -> TierKind {
        TierKind::Disk
    }

    fn contains_prefix(&self, chain: &[TierKey]) -> Result<usize, TierError> {
        let lru = self.lock();
        Ok(chain.iter().take_while(|key| lru.contains(key)).count())
    }

    fn get_many(&self, keys: &[TierKey]) -> Result<Vec<Option<StoredBlock>>, TierError> {
        let start = Instant::now();
        let mut out = Vec::with_capacity(keys.len());
        let mut misses = 0;
        for key in keys {
            let indexed = self.lock().get(key).is_some();
            let block = if indexed {
                let bytes = match self.read_object(key) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        self.metrics.error();
                        self.metrics.misses(misses + keys.len() - out.len());
                        return Err(e);
                    }
                };
                match bytes {
                    // Evicted or removed between index lookup and read: a plain miss.
                    None => {
                        self.lock().remove(key);
                        None
                    }
                    Some(bytes) => {
                        self.metrics.read(bytes.len());
                        match object::decode(key, &bytes, None) {
                            Ok(block) => Some(block),
                            Err(_) => {
                                self.metrics.corrupted();
                                self.drop_object(key)?;
                                None
                            }
                        }
                    }
                }
            } else {
                None
            };
            match &block {
                Some(b) => self.metrics.hit(b.num_tokens, b.payload.len()),
                None => misses += 1,
            }
            out.push(block);
        }
        self.metrics.misses(misses);
        self.metrics.load_latency(start.elapsed());
        Ok(out)
    }

    fn put_many(&self, blocks: &[BlockRef<'_>]) -> Result<(), TierError> {
        for block in blocks {
            let bytes = object::encode(block, self.config.compression, None)?;
            let len = bytes.len() as u64;
            if len > self.config.max_bytes {
                return Err(TierError::InvalidBlock(format!(
                    "{:?}: object of {len} bytes exceeds the disk budget of {} bytes",
                    block.key, self.config.max_bytes
                )));
            }
            if let Err(e) = self.write_atomic(&block.key, &bytes) {
                self.metrics.error();
                return Err(e);
            }
            self.metrics.written(bytes.len());
            let evicted = self.lock().insert(block.key, (), len);
            self.metrics.evicted(evicted.len());
            self.dropped.push(evicted.iter().map(|(key, ())| *key));
            for (key, ()) in evicted {
                if let Err(e) = remove_file(&self.object_path(&key)) {
                    self.metrics.error();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn remove(&self, keys: &[TierKey]) -> Result<(), TierError> {
        for key in keys {
            if let Err(e) = self.drop_object(key) {
                self.metrics.error();
                return Err(e);
            }
        }
        Ok(())
    }

    fn stats(&self) -> TierStats {
        let (objects, bytes) = {
            let lru = self.lock();
            (lru.len() as u64, lru.total_bytes())
        };
        self.metrics.snapshot(Some(objects), Some(bytes))
    }

    fn take_dropped(&self) -> Vec<TierKey> {
        self.dropped.take()
    }
}

impl RawObjectAccess for DiskStore {
    fn read_raw(&self, key: &TierKey) -> Result<Option<Vec<u8>>, TierError> {
        self.read_object(key)
    }

    /// Overwrites the file in place (not atomically: this simulates damage at rest).
    fn write_raw(&self, key: &TierKey, bytes: &[u8]) -> Result<(), TierError> {
        let path = self.object_path(key);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| TierError::io(dir, e))?;
        }
        fs::write(&path, bytes).map_err(|e| TierError::io(&path, e))?;
        let mut lru = self.lock();
        if lru.contains(key) {
            lru.resize(key, bytes.len() as u64);
        } else {
            lru.insert(*key, (), bytes.len() as u64);
        }
        Ok(())
    }
}
