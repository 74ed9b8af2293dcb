//! Which CUDA driver library a process runs, found in its own mappings (`/proc/<pid>/maps`),
//! and the very file it maps, opened by identity.
//!
//! The NVIDIA container toolkit bind-mounts the host's file into each container: one inode, one
//! attachment for them all. A driver upgrade brings a new inode, probed when a process maps it.
//!
//! Everything here is shaped by a tenant: the path in the maps is whatever the container's tree
//! names, and the container can rename, replace or symlink it at any moment. So a library is
//! never opened or probed by its path string:
//! - its path is walked component by component from the process's root
//!   (`/proc/<pid>/root`), each with `O_PATH | O_NOFOLLOW`, so no symbolic link is followed
//!   (the kernel's own name for a mapped file has none) and nothing is opened for reading
//!   before it is known to be a regular file (an `O_PATH` open of a FIFO or a device does not
//!   block and has no side effect);
//! - the file found must be a regular file whose device and inode are those of an executable
//!   mapping of the process;
//! - it is then read, and later probed, through the agent's own descriptor of it
//!   (`/proc/self/fd/<n>`), so the kernel resolves the very inode that was checked, whatever the
//!   path names by then.
//!
//! Reads are bounded: `/proc/<pid>/maps` is streamed a line at a time (a process can make it
//! hundreds of MB), and only the driver's lines are kept.
use std::ffi::CString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The file name every CUDA driver library starts with (`libcuda.so.1` links to
/// `libcuda.so.<driver version>`).
const DRIVER_LIBRARY: &str = "libcuda.so";

/// How much of a process's `maps` is read: a PyTorch process on the H100 host had ~4,000
/// mappings (~0.5 MB); a process with more than this is not a training job's shape.
pub const MAPS_MAX_BYTES: u64 = 16 << 20;
/// The longest `maps` line kept: the fields, and a path of up to `PATH_MAX` (4096) bytes.
const MAPS_LINE_MAX: usize = 4096 + 128;
/// Path components walked at most (`PATH_MAX` / 2: "a/" each).
const PATH_COMPONENTS_MAX: usize = 2048;

/// A driver library as one process maps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedLibrary {
    /// Its path in the process's mount namespace, as the kernel names it.
    pub path: String,
    /// The device and inode the process's mapping names.
    pub device: u64,
    pub inode: u64,
}

/// The driver libraries a process maps, and whether its `maps` was read to the end.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Mappings {
    pub libraries: Vec<MappedLibrary>,
    /// The read stopped at [`MAPS_MAX_BYTES`]: libraries past it are unseen.
    pub truncated: bool,
}

/// A driver library a process maps, open by identity (see the module docs).
#[derive(Debug)]
pub struct LibraryFile {
    pub mapped: MappedLibrary,
    /// Open for reading: its symbols are read from it, and it is probed through it.
    pub file: File,
    /// Its size, bounding every offset read or probed in it.
    pub size: u64,
    pub device: u64,
    pub inode: u64,
}

impl LibraryFile {
    /// The path the kernel resolves to this very file while it stays open: the agent's own
    /// descriptor. What the probes are attached through.
    pub fn probe_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    #[error("reading {path}: {source}")]
    Maps {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("opening {path:?} in the process's root: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("{path:?} is not a path the kernel names a mapped file with")]
    OddPath { path: String },
    #[error(
        "{path:?} is not a regular file (a symbolic link, FIFO, device or directory now stands \
         where the process's library was)"
    )]
    NotRegular { path: String },
    #[error(
        "{path:?} is no longer the file the process maps (device {device}, inode {inode}): it \
         was replaced"
    )]
    Replaced {
        path: String,
        device: u64,
        inode: u64,
    },
}

/// A device as `/proc/<pid>/maps` writes it (`fe:10`, hex major:minor), in `st_dev`'s encoding.
fn parse_device(s: &str) -> Option<u64> {
    let (major, minor) = s.split_once(':')?;
    let (major, minor) = (
        u32::from_str_radix(major, 16).ok()?,
        u32::from_str_radix(minor, 16).ok()?,
    );
    Some(libc::makedev(major, minor))
}

/// The driver library one `maps` line maps executable, if any.
fn driver_mapping(line: &str) -> Option<MappedLibrary> {
    // address perms offset dev inode path (the path may hold spaces)
    let mut fields = line.splitn(6, ' ');
    let (_, perms, _, dev, inode, path) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    // Only code is probed: a library mapped without execute is not one the process runs.
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let path = path.trim_start();
    let name = path.rsplit('/').next().unwrap_or(path);
    // A library deleted since it was mapped (an upgrade) has no path to walk.
    if !name.starts_with(DRIVER_LIBRARY) || path.ends_with(" (deleted)") {
        return None;
    }
    Some(MappedLibrary {
        path: path.to_owned(),
        device: parse_device(dev)?,
        inode: inode.parse().ok()?,
    })
}

/// The driver libraries mapped executable in a `maps` stream (each once), reading at most
/// [`MAPS_MAX_BYTES`] and keeping only the driver's lines.
pub fn driver_libraries(maps: impl Read) -> std::io::Result<Mappings> {
    let mut reader = BufReader::new(maps.take(MAPS_MAX_BYTES));
    let mut out = Mappings::default();
    let mut line = Vec::with_capacity(256);
    let mut read = 0u64;
    loop {
        line.clear();
        // At most one line's worth at a time: the rest of a longer line is skipped unkept.
        let n = (&mut reader)
            .take(MAPS_LINE_MAX as u64)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        read += n as u64;
        let whole = line.last() == Some(&b'\n');
        if !whole {
            // A line longer than any the kernel writes for a real path: skip to its end.
            read += skip_line(&mut reader)?;
            continue;
        }
        let Ok(text) = std::str::from_utf8(&line[..line.len() - 1]) else {
            continue;
        };
        if let Some(lib) = driver_mapping(text) {
            if !out.libraries.contains(&lib) {
                out.libraries.push(lib);
            }
        }
    }
    out.truncated = read >= MAPS_MAX_BYTES;
    Ok(out)
}

/// Skips the rest of a line without keeping it; the bytes skipped.
fn skip_line(reader: &mut impl BufRead) -> std::io::Result<u64> {
    let mut skipped = 0u64;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(skipped);
        }
        let (n, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        reader.consume(n);
        skipped += n as u64;
        if done {
            return Ok(skipped);
        }
    }
}

/// The driver libraries process `pid` maps.
pub fn mapped_by(proc_root: &Path, pid: u32) -> Result<Mappings, LibraryError> {
    let path = proc_root.join(pid.to_string()).join("maps");
    let maps_error = |source| LibraryError::Maps {
        path: path.clone(),
        source,
    };
    let file = File::open(&path).map_err(maps_error)?;
    driver_libraries(file).map_err(maps_error)
}

/// `openat(2)` in `dir` (the working directory for `None`), close-on-exec.
fn openat(dir: Option<&OwnedFd>, name: &[u8], flags: libc::c_int) -> std::io::Result<OwnedFd> {
    let name = CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let dir = dir.map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd);
    // SAFETY: `dir` is an open descriptor (or AT_FDCWD) and `name` a NUL-terminated string,
    // both alive for the call; the result is a new descriptor or -1.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The path's components, when it is one the kernel writes for a mapped file: absolute, no
/// empty, `.` or `..` component.
fn components(path: &str) -> Option<Vec<&[u8]>> {
    let rest = path.strip_prefix('/')?;
    let parts: Vec<&[u8]> = rest.split('/').map(str::as_bytes).collect();
    let odd = |c: &&[u8]| c.is_empty() || *c == b"." || *c == b"..";
    (!parts.is_empty() && parts.len() <= PATH_COMPONENTS_MAX && !parts.iter().any(odd))
        .then_some(parts)
}

/// Opens the file process `pid` maps as `lib`, by identity (see the module docs).
pub fn open(proc_root: &Path, pid: u32, lib: &MappedLibrary) -> Result<LibraryFile, LibraryError> {
    let open_error = |source| LibraryError::Open {
        path: lib.path.clone(),
        source,
    };
    let parts = components(&lib.path).ok_or_else(|| LibraryError::OddPath {
        path: lib.path.clone(),
    })?;
    let root = proc_root.join(pid.to_string()).join("root");
    // The process's root itself is a link the kernel makes (into its mount namespace).
    let mut dir = openat(
        None,
        root.as_os_str().as_bytes(),
        libc::O_PATH | libc::O_DIRECTORY,
    )
    .map_err(open_error)?;
    let (last, dirs) = parts.split_last().ok_or_else(|| LibraryError::OddPath {
        path: lib.path.clone(),
    })?;
    for part in dirs {
        dir = openat(
            Some(&dir),
            part,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )
        .map_err(|e| match e.raw_os_error() {
            // a symbolic link where a directory was
            Some(libc::ENOTDIR) | Some(libc::ELOOP) => LibraryError::NotRegular {
                path: lib.path.clone(),
            },
            _ => open_error(e),
        })?;
    }
    let found =
        File::from(openat(Some(&dir), last, libc::O_PATH | libc::O_NOFOLLOW).map_err(open_error)?);
    let meta = found.metadata().map_err(open_error)?;
    if !meta.file_type().is_file() {
        return Err(LibraryError::NotRegular {
            path: lib.path.clone(),
        });
    }
    if (meta.dev(), meta.ino()) != (lib.device, lib.inode) {
        return Err(LibraryError::Replaced {
            path: lib.path.clone(),
            device: lib.device,
            inode: lib.inode,
        });
    }
    // Reopened for reading through the checked descriptor: the same inode, whatever the path
    // names now.
    let file = File::open(format!("/proc/self/fd/{}", found.as_raw_fd())).map_err(open_error)?;
    let meta = file.metadata().map_err(open_error)?;
    if (meta.dev(), meta.ino()) != (lib.device, lib.inode) || !meta.file_type().is_file() {
        return Err(LibraryError::Replaced {
            path: lib.path.clone(),
            device: lib.device,
            inode: lib.inode,
        });
    }
    Ok(LibraryFile {
        mapped: lib.clone(),
        file,
        size: meta.len(),
        device: meta.dev(),
        inode: meta.ino(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn libs(maps: &str) -> Vec<MappedLibrary> {
        driver_libraries(maps.as_bytes()).unwrap().libraries
    }

    #[test]
    fn finds_the_driver_library_once_as_the_h100_host_maps_it() {
        // /proc/<pid>/maps of a PyTorch process on the H100 host (driver 580.159.04), trimmed.
        let maps = "\
7fafa0400000-7fafa0600000 r--p 00000000 fe:10 42                         /usr/local/nvidia/lib64/libcuda.so.580.159.04
7fafa0600000-7fafa1e00000 r-xp 00200000 fe:10 42                         /usr/local/nvidia/lib64/libcuda.so.580.159.04
7fafa3000000-7fafa3001000 rw-p 00000000 00:00 0 
7fafa4000000-7fafa4100000 r-xp 00000000 fe:01 1311                       /usr/lib/x86_64-linux-gnu/libc.so.6
7fafa5000000-7fafa5100000 r-xp 00000000 fe:01 99                         /opt/my libs/libcudart.so.12
7fafa6000000-7fafa6100000 r-xp 00000000 fe:01 77                         /usr/lib/libcuda.so.1 (deleted)
7fafa7000000-7fafa7100000 r--p 00000000 fe:01 78                         /data/libcuda.so.1
";
        let found = libs(maps);
        assert_eq!(
            found,
            vec![MappedLibrary {
                path: "/usr/local/nvidia/lib64/libcuda.so.580.159.04".into(),
                device: libc::makedev(0xfe, 0x10),
                inode: 42,
            }],
            "the executable mapping once; the deleted and the data-only mappings not at all"
        );
        // The H100 host's stat of that file: st_dev 65040 (254:16).
        assert_eq!(found[0].device, 65040);
    }

    #[test]
    fn a_huge_maps_is_read_only_up_to_its_bound_and_long_lines_are_skipped() {
        let line = "7f0000000000-7f0000001000 r-xp 00000000 fe:10 42 /usr/lib/libcuda.so.1\n";
        let long = format!(
            "7f0000000000-7f0000001000 r-xp 00000000 fe:10 43 /{}/libcuda.so.1\n",
            "a".repeat(MAPS_LINE_MAX)
        );
        let filler = "7f0000000000-7f0000001000 r--p 00000000 fe:10 7 /usr/lib/libfoo.so\n";
        // The long line is skipped, the driver's found after it, and the read stops at the
        // bound: the library past it is unseen, and the result says so.
        let mut text = long.clone() + line;
        while (text.len() as u64) < MAPS_MAX_BYTES + 4096 {
            text.push_str(filler);
        }
        text.push_str(&line.replace(" 42 ", " 44 "));
        let m = driver_libraries(text.as_bytes()).unwrap();
        assert_eq!(m.libraries.len(), 1, "{:?}", m.libraries);
        assert_eq!(m.libraries[0].inode, 42);
        assert!(m.truncated);
        let short = driver_libraries(line.as_bytes()).unwrap();
        assert!(!short.truncated);
    }

    /// A tree standing in for a container's: `lib/libcuda.so.1` mapped (here, this test's
    /// own file with its inode), and the things a tenant can put where it was.
    struct Tree {
        dir: tempfile::TempDir,
    }

    impl Tree {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir(dir.path().join("lib")).unwrap();
            std::fs::write(dir.path().join("lib/libcuda.so.1"), b"\x7fELF").unwrap();
            Self { dir }
        }

        fn mapped(&self, name: &str) -> MappedLibrary {
            let meta = std::fs::metadata(self.dir.path().join("lib/libcuda.so.1")).unwrap();
            MappedLibrary {
                path: format!("{}/{name}", self.dir.path().display()),
                device: meta.dev(),
                inode: meta.ino(),
            }
        }
    }

    /// Opens as the agent does, with this process's root standing in for the container's.
    fn open_own(lib: &MappedLibrary) -> Result<LibraryFile, LibraryError> {
        open(Path::new("/proc"), std::process::id(), lib)
    }

    #[test]
    fn opens_the_mapped_file_by_identity_and_probes_it_through_its_own_descriptor() {
        let tree = Tree::new();
        let lib = tree.mapped("lib/libcuda.so.1");
        let opened = open_own(&lib).unwrap();
        assert_eq!((opened.device, opened.inode), (lib.device, lib.inode));
        assert_eq!(opened.size, 4);
        // The probe path is the descriptor, and it stays this inode after the path is swapped.
        std::fs::rename(
            tree.dir.path().join("lib/libcuda.so.1"),
            tree.dir.path().join("lib/old"),
        )
        .unwrap();
        std::fs::write(tree.dir.path().join("lib/libcuda.so.1"), b"other").unwrap();
        let via = std::fs::metadata(opened.probe_path()).unwrap();
        assert_eq!(via.ino(), lib.inode);
    }

    #[test]
    fn refuses_a_symlink_a_fifo_a_replaced_file_and_an_odd_path() {
        let tree = Tree::new();
        let lib = tree.mapped("lib/libcuda.so.1");
        let at = tree.dir.path().join("lib/libcuda.so.1");
        // Held, as a process's mapping holds it: its inode is not freed, nor its number reused.
        let _mapped = File::open(&at).unwrap();
        // A symbolic link to the very same file: still refused (no link is followed).
        std::fs::rename(&at, tree.dir.path().join("lib/real")).unwrap();
        symlink(tree.dir.path().join("lib/real"), &at).unwrap();
        assert!(
            matches!(open_own(&lib), Err(LibraryError::NotRegular { .. })),
            "{:?}",
            open_own(&lib)
        );
        // A symbolic link in a directory component.
        std::fs::remove_file(&at).unwrap();
        std::fs::rename(tree.dir.path().join("lib/real"), &at).unwrap();
        std::fs::rename(tree.dir.path().join("lib"), tree.dir.path().join("lib2")).unwrap();
        symlink(tree.dir.path().join("lib2"), tree.dir.path().join("lib")).unwrap();
        assert!(matches!(
            open_own(&lib),
            Err(LibraryError::NotRegular { .. })
        ));
        std::fs::remove_file(tree.dir.path().join("lib")).unwrap();
        std::fs::rename(tree.dir.path().join("lib2"), tree.dir.path().join("lib")).unwrap();
        assert!(open_own(&lib).is_ok());
        // A FIFO where the library was: refused at once, not waited on.
        std::fs::remove_file(&at).unwrap();
        let c = CString::new(at.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        assert!(matches!(
            open_own(&lib),
            Err(LibraryError::NotRegular { .. })
        ));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // Another regular file under the name: not the mapped inode.
        std::fs::remove_file(&at).unwrap();
        std::fs::write(&at, b"other").unwrap();
        assert!(matches!(open_own(&lib), Err(LibraryError::Replaced { .. })));
        for odd in [
            "lib/../lib/libcuda.so.1",
            "lib//libcuda.so.1",
            "lib/./libcuda.so.1",
        ] {
            let mut l = lib.clone();
            l.path = format!("{}/{odd}", tree.dir.path().display());
            assert!(
                matches!(open_own(&l), Err(LibraryError::OddPath { .. })),
                "{odd}"
            );
        }
        let mut relative = lib.clone();
        relative.path = "lib/libcuda.so.1".into();
        assert!(matches!(
            open_own(&relative),
            Err(LibraryError::OddPath { .. })
        ));
    }
}
