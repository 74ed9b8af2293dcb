//! Maps and sets keyed by PID, hashed in one multiplication.
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for PIDs: one multiplication (Fibonacci hashing). PIDs are small integers the kernel
/// hands out, not keys chosen to collide, and SipHash was a tenth of a round at 1,600 lookups.
#[derive(Default)]
pub struct PidHasher(u64);

impl Hasher for PidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by PID.
pub type PidMap<V> = HashMap<u32, V, BuildHasherDefault<PidHasher>>;
/// A set of PIDs.
pub type PidSet = std::collections::HashSet<u32, BuildHasherDefault<PidHasher>>;
