//! Reading a per-CPU map whole with `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+): one system call per
//! few hundred entries, where a key walk costs two per entry (next key, then lookup) and an
//! allocation for each entry's per-CPU values.
//!
//! On the H200 host (16 CPUs) the key walk of the stall probe's three task maps cost ~1.1 ms of
//! CPU per round, as much as every NVML call of the round together; the CUDA probe's statistics
//! map (two entries per process) is read the same way. Kernels without the command (or
//! maps without it) answer EINVAL / ENOTSUPP, and the caller falls back to the walk.
use aya::maps::MapData;
use aya::Pod;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// The kernel's own "operation not supported" (not exported to userspace headers).
const ENOTSUPP: i32 = 524;
/// Entries asked for per call; the buffers grow when one hash bucket holds more.
const FIRST_CAPACITY: usize = 256;

/// `bpf_attr.batch`, as `include/uapi/linux/bpf.h` lays it out.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    /// In: entries the buffers hold. Out: entries filled.
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// The number of possible CPUs: how many copies of a value a per-CPU map holds.
pub fn possible_cpus() -> Option<usize> {
    aya::util::nr_cpus().ok().map(|n| n.get() as usize)
}

/// Why a batch read gave up.
#[derive(Debug)]
pub enum BatchError {
    /// This kernel or map has no batch lookup: walk the keys instead.
    Unsupported,
    Io(io::Error),
}

/// Reusable buffers for reading one per-CPU map of `K` → `V` in batches.
pub struct BatchReader<K, V> {
    cpus: usize,
    keys: Vec<K>,
    /// Per entry, one `V` per possible CPU, each padded to 8 bytes as the kernel copies them.
    values: Vec<u64>,
    _value: std::marker::PhantomData<V>,
}

impl<K: Pod + Default, V: Pod + Default> BatchReader<K, V> {
    pub fn new(possible_cpus: usize) -> Self {
        Self::with_capacity(possible_cpus, FIRST_CAPACITY)
    }

    fn with_capacity(possible_cpus: usize, capacity: usize) -> Self {
        let mut reader = Self {
            cpus: possible_cpus.max(1),
            keys: Vec::new(),
            values: Vec::new(),
            _value: std::marker::PhantomData,
        };
        reader.grow(capacity.max(1));
        reader
    }

    fn stride_words() -> usize {
        size_of::<V>().div_ceil(8)
    }

    fn capacity(&self) -> usize {
        self.keys.len()
    }

    fn grow(&mut self, capacity: usize) {
        self.keys.resize(capacity, K::default());
        self.values
            .resize(capacity * self.cpus * Self::stride_words(), 0);
    }

    /// Calls `each(key, per_cpu_values)` for every entry of `map`. An entry is read whole (its
    /// bucket is copied under the bucket's lock), so none vanishes between key and value.
    pub fn read(&mut self, map: &MapData, mut each: impl FnMut(K, &[V])) -> Result<(), BatchError> {
        let fd = map.fd().as_fd().as_raw_fd();
        let mut token = 0u64;
        let mut first = true;
        let mut per_cpu = Vec::with_capacity(self.cpus);
        loop {
            let mut attr = BatchAttr {
                in_batch: if first { 0 } else { &raw const token as u64 },
                out_batch: &raw mut token as u64,
                map_fd: fd as u32,
                keys: self.keys.as_mut_ptr() as u64,
                values: self.values.as_mut_ptr() as u64,
                count: self.capacity() as u32,
                ..Default::default()
            };
            // SAFETY: `attr` points at buffers of `count` keys and `count × cpus` padded values,
            // which is what the kernel writes at most; `token` outlives the call.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_MAP_LOOKUP_BATCH,
                    &raw mut attr,
                    size_of::<BatchAttr>(),
                )
            };
            let done = if rc == 0 {
                false
            } else {
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::ENOENT) => true,
                    Some(libc::ENOSPC) if attr.count == 0 => {
                        // One bucket holds more entries than the buffers: grow, ask again.
                        self.grow(self.capacity() * 2);
                        continue;
                    }
                    Some(libc::EINVAL | ENOTSUPP | libc::EOPNOTSUPP) if first => {
                        return Err(BatchError::Unsupported)
                    }
                    _ => return Err(BatchError::Io(err)),
                }
            };
            self.deliver(attr.count as usize, &mut per_cpu, &mut each);
            if done {
                return Ok(());
            }
            first = false;
        }
    }

    fn deliver(&self, count: usize, per_cpu: &mut Vec<V>, each: &mut impl FnMut(K, &[V])) {
        let stride = Self::stride_words();
        for (i, key) in self.keys[..count.min(self.capacity())].iter().enumerate() {
            per_cpu.clear();
            for cpu in 0..self.cpus {
                let at = (i * self.cpus + cpu) * stride;
                // SAFETY: `at..at + stride` lies inside `values` (sized for `capacity` entries);
                // V is plain data, read unaligned from the kernel's copy.
                let v = unsafe { std::ptr::read_unaligned(self.values[at..].as_ptr().cast::<V>()) };
                per_cpu.push(v);
            }
            each(*key, per_cpu);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aya::maps::{IterableMap, Map, PerCpuHashMap, PerCpuValues};
    use std::os::fd::{FromRawFd, OwnedFd};

    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_LRU_PERCPU_HASH: u32 = 10;

    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    struct Key {
        a: u64,
        b: u32,
        c: u32,
    }
    // SAFETY: plain data, no padding.
    unsafe impl Pod for Key {}

    /// 20 bytes: the kernel pads each CPU's copy to 24, which the reader must step over.
    #[repr(C, packed)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    struct Value {
        x: u64,
        y: u64,
        z: u32,
    }
    // SAFETY: plain data, no padding.
    unsafe impl Pod for Value {}

    /// A per-CPU LRU hash map like the probe's task maps, created in the real kernel.
    fn lru_percpu_map(max_entries: u32) -> PerCpuHashMap<MapData, Key, Value> {
        #[repr(C)]
        #[derive(Default)]
        struct CreateAttr {
            map_type: u32,
            key_size: u32,
            value_size: u32,
            max_entries: u32,
            map_flags: u32,
        }
        let mut attr = CreateAttr {
            map_type: BPF_MAP_TYPE_LRU_PERCPU_HASH,
            key_size: size_of::<Key>() as u32,
            value_size: size_of::<Value>() as u32,
            max_entries,
            map_flags: 0,
        };
        // SAFETY: a BPF_MAP_CREATE attribute of the size given.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_CREATE,
                &raw mut attr,
                size_of::<CreateAttr>(),
            )
        };
        assert!(
            fd >= 0,
            "BPF_MAP_CREATE (root needed): {}",
            io::Error::last_os_error()
        );
        // SAFETY: a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let data = MapData::from_fd(fd).expect("map info");
        PerCpuHashMap::try_from(Map::PerCpuLruHashMap(data)).expect("per-CPU hash")
    }

    fn value(key: u32, cpu: usize) -> Value {
        Value {
            x: u64::from(key) * 1_000 + cpu as u64,
            y: u64::MAX - u64::from(key),
            z: key ^ cpu as u32,
        }
    }

    /// Every entry comes back exactly once with its own value on every CPU, across many calls
    /// and with buffers too small for some buckets (so they grow on ENOSPC).
    fn reads_back(capacity: usize) {
        let cpus = possible_cpus().expect("possible CPUs");
        let mut map = lru_percpu_map(2048);
        let n = 700u32;
        for k in 0..n {
            let key = Key {
                a: u64::from(k) << 32,
                b: k,
                c: 1,
            };
            let values: Vec<Value> = (0..cpus).map(|cpu| value(k, cpu)).collect();
            map.insert(&key, PerCpuValues::try_from(values).unwrap(), 0)
                .unwrap();
        }
        let mut reader = BatchReader::<Key, Value>::with_capacity(cpus, capacity);
        let mut seen = std::collections::HashMap::new();
        reader
            .read(map.map(), |key, per_cpu| {
                assert_eq!(per_cpu.len(), cpus);
                for (cpu, v) in per_cpu.iter().enumerate() {
                    assert_eq!(*v, value(key.b, cpu), "key {key:?} cpu {cpu}");
                }
                assert!(seen.insert(key.b, key).is_none(), "{key:?} twice");
            })
            .unwrap();
        assert_eq!(seen.len(), n as usize);
        assert!(reader.capacity() >= capacity);
        if capacity == 1 {
            assert!(
                reader.capacity() > 1,
                "700 keys in 2,048 buckets share some bucket"
            );
        }
        for (b, key) in seen {
            assert_eq!(
                key,
                Key {
                    a: u64::from(b) << 32,
                    b,
                    c: 1
                }
            );
        }
    }

    #[test]
    fn a_per_cpu_lru_map_reads_back_whole_in_batches() {
        reads_back(FIRST_CAPACITY);
    }

    #[test]
    fn buffers_grow_when_a_bucket_does_not_fit() {
        reads_back(1);
    }

    #[test]
    fn an_empty_map_reads_as_nothing() {
        let cpus = possible_cpus().expect("possible CPUs");
        let map = lru_percpu_map(64);
        let mut reader = BatchReader::<Key, Value>::new(cpus);
        let mut n = 0;
        reader.read(map.map(), |_, _| n += 1).unwrap();
        assert_eq!(n, 0);
    }
}
