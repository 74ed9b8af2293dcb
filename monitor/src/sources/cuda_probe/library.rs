//! Which CUDA driver library a process runs: found in its own mappings (`/proc/<pid>/maps`),
//! opened through its root (`/proc/<pid>/root`), so a container's library is the one probed,
//! whatever its path there. The NVIDIA container toolkit bind-mounts the host's file into each
//! container: one inode, one attachment for them all. A driver upgrade brings a new inode,
//! probed when a process maps it.
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The file name every CUDA driver library starts with (`libcuda.so.1` links to
/// `libcuda.so.<driver version>`).
const DRIVER_LIBRARY: &str = "libcuda.so";

/// A driver library as one process maps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedLibrary {
    /// Its path in the process's mount namespace.
    pub path: String,
    /// The device and inode the process's mapping names.
    pub device: u64,
    pub inode: u64,
}

/// The driver library a process maps, opened through its root.
#[derive(Debug)]
pub struct LibraryFile {
    pub mapped: MappedLibrary,
    /// `<proc_root>/<pid>/root/<path>`: what the probes are attached through.
    pub open_path: PathBuf,
    pub file: File,
    /// The opened file's own device and inode: the key of its attachment.
    pub device: u64,
    pub inode: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    #[error("reading {path}: {source}")]
    Maps {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("opening {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is no longer the file the process maps (device {device}, inode {inode})")]
    Replaced {
        path: PathBuf,
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

/// The driver libraries in one `maps` text (each once).
pub fn driver_libraries(maps: &str) -> Vec<MappedLibrary> {
    let mut out: Vec<MappedLibrary> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode path (the path may hold spaces)
        let mut fields = line.splitn(6, ' ');
        let (Some(_), Some(_), Some(_), Some(dev), Some(inode), Some(path)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let path = path.trim_start();
        let name = path.rsplit('/').next().unwrap_or(path);
        // A library deleted since it was mapped (an upgrade) cannot be opened by its path.
        if !name.starts_with(DRIVER_LIBRARY) || path.ends_with(" (deleted)") {
            continue;
        }
        let (Some(device), Ok(inode)) = (parse_device(dev), inode.parse::<u64>()) else {
            continue;
        };
        let lib = MappedLibrary {
            path: path.to_owned(),
            device,
            inode,
        };
        if !out.contains(&lib) {
            out.push(lib);
        }
    }
    out
}

/// The driver libraries process `pid` maps.
pub fn mapped_by(proc_root: &Path, pid: u32) -> Result<Vec<MappedLibrary>, LibraryError> {
    let path = proc_root.join(pid.to_string()).join("maps");
    let text = std::fs::read_to_string(&path).map_err(|source| LibraryError::Maps {
        path: path.clone(),
        source,
    })?;
    Ok(driver_libraries(&text))
}

/// Opens `lib` through process `pid`'s root, and checks it is still the file it maps.
pub fn open(proc_root: &Path, pid: u32, lib: &MappedLibrary) -> Result<LibraryFile, LibraryError> {
    let open_path = proc_root
        .join(pid.to_string())
        .join("root")
        .join(lib.path.trim_start_matches('/'));
    let file = File::open(&open_path).map_err(|source| LibraryError::Open {
        path: open_path.clone(),
        source,
    })?;
    let meta = file.metadata().map_err(|source| LibraryError::Open {
        path: open_path.clone(),
        source,
    })?;
    if meta.ino() != lib.inode {
        return Err(LibraryError::Replaced {
            path: open_path,
            device: lib.device,
            inode: lib.inode,
        });
    }
    Ok(LibraryFile {
        mapped: lib.clone(),
        open_path,
        file,
        device: meta.dev(),
        inode: meta.ino(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
";
        let libs = driver_libraries(maps);
        assert_eq!(
            libs,
            vec![MappedLibrary {
                path: "/usr/local/nvidia/lib64/libcuda.so.580.159.04".into(),
                device: libc::makedev(0xfe, 0x10),
                inode: 42,
            }]
        );
        // The H100 host's stat of that file: st_dev 65040 (254:16).
        assert_eq!(libs[0].device, 65040);
    }

    #[test]
    fn opens_a_library_through_the_process_root_and_notices_a_replaced_file() {
        // This process's own libc, found as a driver library would be.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps.lines().find(|l| l.contains("libc.so.6")).unwrap();
        let renamed = line.replace("libc.so.6", "libcuda.so.6");
        let mut lib = driver_libraries(&renamed).pop().unwrap();
        lib.path = lib.path.replace("libcuda.so.6", "libc.so.6");
        let pid = std::process::id();
        let opened = open(Path::new("/proc"), pid, &lib).unwrap();
        assert_eq!(opened.inode, lib.inode);
        assert!(opened.open_path.starts_with(format!("/proc/{pid}/root")));
        lib.inode += 1;
        assert!(matches!(
            open(Path::new("/proc"), pid, &lib),
            Err(LibraryError::Replaced { .. })
        ));
    }
}
