//! The running kernel's BTF (`/sys/kernel/btf/vmlinux`): byte offsets of members of its own
//! structures, for the stall probes, which read a few scheduler fields (a task's run-queue wait,
//! its last switch-in, its run queue's clock) straight from the kernel's memory. Those offsets
//! move between kernels and configurations, so they are looked up at start-up, never compiled in.
//!
//! Only what that needs is parsed: the type section's records, to walk them, and the names of
//! structs, unions and their members. The format: <https://docs.kernel.org/bpf/btf.html>.
use std::path::{Path, PathBuf};

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;

// Kinds (btf_type.info bits 24..28).
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;
const KIND_MAX: u32 = 19;

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading {path}: {source} (the kernel needs CONFIG_DEBUG_INFO_BTF)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: malformed BTF at byte {at}: {what}")]
    Malformed {
        path: PathBuf,
        at: usize,
        what: String,
    },
    #[error("{path}: no struct {name}")]
    NoStruct { path: PathBuf, name: String },
    #[error("{path}: struct {strukt} has no member {member} (kernel configuration without it?)")]
    NoMember {
        path: PathBuf,
        strukt: String,
        member: String,
    },
    #[error("{path}: {owner} is not a struct or union, so it has no member {member}")]
    NotAggregate {
        path: PathBuf,
        owner: String,
        member: String,
    },
    #[error("{path}: {strukt}.{member} is a bit field, not at a byte offset")]
    BitField {
        path: PathBuf,
        strukt: String,
        member: String,
    },
}

/// One record of the type section: where it starts and its fixed part.
#[derive(Clone, Copy, Debug)]
struct TypeRecord {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    /// `size` for structs and unions, `type` for typedefs and modifiers.
    size_or_type: u32,
    /// Byte offset of the record's trailing data (members) in `KernelBtf::bytes`.
    data: usize,
    /// Length of that trailing data.
    trailing: usize,
}

/// The type record at `at`, which must end by `end`; on error, where and what.
fn decode(bytes: &[u8], at: usize, end: usize) -> Result<TypeRecord, (usize, String)> {
    let word = |i: usize| {
        u32_at(bytes, at + 4 * i)
            .filter(|_| at + 4 * i + 4 <= end)
            .ok_or_else(|| (at, "type record cut off".to_owned()))
    };
    let (name_off, info, size_or_type) = (word(0)?, word(1)?, word(2)?);
    let kind = (info >> 24) & 0x1f;
    let vlen = (info & 0xffff) as usize;
    if kind == 0 || kind > KIND_MAX {
        return Err((at, format!("unknown kind {kind}")));
    }
    let trailing = match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        _ => 0,
    };
    let data = at + 12;
    if data + trailing > end {
        return Err((data, "type record cut off".to_owned()));
    }
    Ok(TypeRecord {
        name_off,
        kind,
        vlen,
        kind_flag: info >> 31 != 0,
        size_or_type,
        data,
        trailing,
    })
}

/// A parsed BTF blob: where each type record starts (type id `n` is `types[n - 1]`, decoded when
/// asked for: 4 bytes a type, not a 40-byte record, for the ~150,000 types of a kernel) and the
/// string section.
pub struct KernelBtf {
    path: PathBuf,
    bytes: Vec<u8>,
    types: Vec<u32>,
    strings: std::ops::Range<usize>,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at + 4)?;
    Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

impl KernelBtf {
    /// Reads the running kernel's BTF.
    pub fn load() -> Result<Self, BtfError> {
        Self::read(Path::new(VMLINUX))
    }

    pub fn read(path: &Path) -> Result<Self, BtfError> {
        let bytes = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(bytes, path)
    }

    /// Parses a BTF blob in this machine's byte order; `path` names it in errors.
    pub fn parse(bytes: Vec<u8>, path: &Path) -> Result<Self, BtfError> {
        let bad = |at: usize, what: String| BtfError::Malformed {
            path: path.to_owned(),
            at,
            what,
        };
        let magic = bytes
            .get(0..2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
            .ok_or_else(|| bad(0, "shorter than its header".into()))?;
        if magic != MAGIC {
            return Err(bad(0, format!("magic {magic:#06x}, not {MAGIC:#06x}")));
        }
        let header = |field: usize| {
            u32_at(&bytes, 4 + 4 * field).ok_or_else(|| bad(0, "shorter than its header".into()))
        };
        let hdr_len = header(0)? as usize;
        let (type_off, type_len) = (header(1)? as usize, header(2)? as usize);
        let (str_off, str_len) = (header(3)? as usize, header(4)? as usize);
        if hdr_len < HEADER_LEN {
            return Err(bad(4, format!("header length {hdr_len}")));
        }
        let section = |off: usize, len: usize, name: &str| {
            let start = hdr_len + off;
            let end = start + len;
            if end > bytes.len() {
                Err(bad(
                    start,
                    format!("{name} section runs past the end ({end} bytes)"),
                ))
            } else {
                Ok(start..end)
            }
        };
        let type_section = section(type_off, type_len, "type")?;
        let strings = section(str_off, str_len, "string")?;

        let mut types = Vec::new();
        let mut at = type_section.start;
        while at < type_section.end {
            let t = decode(&bytes, at, type_section.end).map_err(|(at, what)| bad(at, what))?;
            types.push(u32::try_from(at).map_err(|_| bad(at, "over 4 GiB".into()))?);
            at = t.data + t.trailing;
        }
        Ok(Self {
            path: path.to_owned(),
            bytes,
            types,
            strings,
        })
    }

    fn name(&self, off: u32) -> &str {
        let start = self.strings.start + off as usize;
        let tail = self.bytes.get(start..self.strings.end).unwrap_or_default();
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        std::str::from_utf8(&tail[..end]).unwrap_or("")
    }

    fn record(&self, id: u32) -> Option<TypeRecord> {
        let at = *self.types.get((id as usize).checked_sub(1)?)? as usize;
        decode(&self.bytes, at, self.bytes.len()).ok()
    }

    /// `id` with typedefs and qualifiers (const, volatile, restrict, type tags) looked through.
    fn resolve(&self, mut id: u32) -> Option<TypeRecord> {
        for _ in 0..32 {
            let t = self.record(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Some(t),
            }
        }
        None
    }

    /// The members of a struct or union: (name, type id, bit offset).
    fn members(&self, t: &TypeRecord) -> impl Iterator<Item = (&str, u32, u32)> + '_ {
        let (data, kind_flag) = (t.data, t.kind_flag);
        (0..t.vlen).filter_map(move |i| {
            let at = data + 12 * i;
            let name_off = u32_at(&self.bytes, at)?;
            let type_id = u32_at(&self.bytes, at + 4)?;
            let offset = u32_at(&self.bytes, at + 8)?;
            // With kind_flag, the low 24 bits are the offset and the high 8 a bit-field size.
            let bits = if kind_flag {
                offset & 0x00ff_ffff
            } else {
                offset
            };
            let bitfield = kind_flag && offset >> 24 != 0;
            Some((
                self.name(name_off),
                type_id,
                if bitfield { u32::MAX } else { bits },
            ))
        })
    }

    /// `name`'s member in aggregate `t`, looking into anonymous structs and unions: (type id,
    /// bit offset from `t`'s start; `u32::MAX` for a bit field).
    fn find_member(&self, t: &TypeRecord, name: &str, depth: usize) -> Option<(u32, u32)> {
        if depth > 8 {
            return None;
        }
        for (member, type_id, bits) in self.members(t) {
            if member == name {
                return Some((type_id, bits));
            }
            if member.is_empty() {
                let inner = self.resolve(type_id)?;
                if matches!(inner.kind, KIND_STRUCT | KIND_UNION) {
                    if let Some((id, inner_bits)) = self.find_member(&inner, name, depth + 1) {
                        return Some((id, bits.saturating_add(inner_bits)));
                    }
                }
            }
        }
        None
    }

    /// The byte offset of `strukt.path[0].path[1]…` from the start of `struct strukt`, walking
    /// into nested (not pointed-to) structs and unions.
    pub fn member_offset(&self, strukt: &str, path: &[&str]) -> Result<u32, BtfError> {
        let mut t = (1..=self.types.len() as u32)
            .filter_map(|id| self.record(id))
            // the full definition, not a forward declaration
            .find(|t| t.kind == KIND_STRUCT && t.vlen > 0 && self.name(t.name_off) == strukt)
            .ok_or_else(|| BtfError::NoStruct {
                path: self.path.clone(),
                name: strukt.to_owned(),
            })?;
        let mut owner = strukt.to_owned();
        let mut bits_total: u64 = 0;
        for (i, member) in path.iter().enumerate() {
            if i > 0 && !matches!(t.kind, KIND_STRUCT | KIND_UNION) {
                return Err(BtfError::NotAggregate {
                    path: self.path.clone(),
                    owner,
                    member: (*member).to_owned(),
                });
            }
            let (type_id, bits) =
                self.find_member(&t, member, 0)
                    .ok_or_else(|| BtfError::NoMember {
                        path: self.path.clone(),
                        strukt: owner.clone(),
                        member: (*member).to_owned(),
                    })?;
            if bits == u32::MAX || bits % 8 != 0 {
                return Err(BtfError::BitField {
                    path: self.path.clone(),
                    strukt: owner,
                    member: (*member).to_owned(),
                });
            }
            bits_total += u64::from(bits);
            owner = format!("{owner}.{member}");
            t = self.resolve(type_id).ok_or_else(|| BtfError::Malformed {
                path: self.path.clone(),
                at: 0,
                what: format!("{owner}: type id {type_id} does not resolve"),
            })?;
        }
        u32::try_from(bits_total / 8).map_err(|_| BtfError::Malformed {
            path: self.path.clone(),
            at: 0,
            what: format!("{owner}: offset {bits_total} bits"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a BTF blob from (name, info, size_or_type, trailing words) records.
    struct Blob {
        types: Vec<u32>,
        strings: Vec<u8>,
    }

    impl Blob {
        fn new() -> Self {
            Self {
                types: Vec::new(),
                strings: vec![0],
            }
        }
        fn s(&mut self, name: &str) -> u32 {
            if name.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(name.as_bytes());
            self.strings.push(0);
            off
        }
        fn add(
            &mut self,
            name: &str,
            kind: u32,
            vlen: u32,
            kind_flag: bool,
            size: u32,
            tail: &[u32],
        ) {
            let n = self.s(name);
            let info = (kind << 24) | vlen | (u32::from(kind_flag) << 31);
            self.types.extend([n, info, size]);
            self.types.extend_from_slice(tail);
        }
        fn strukt(&mut self, name: &str, size: u32, kind_flag: bool, members: &[(&str, u32, u32)]) {
            let mut tail = Vec::new();
            for (m, ty, off) in members {
                tail.extend([self.s(m), *ty, *off]);
            }
            self.add(
                name,
                KIND_STRUCT,
                members.len() as u32,
                kind_flag,
                size,
                &tail,
            );
        }
        fn bytes(&self) -> Vec<u8> {
            let type_len = (self.types.len() * 4) as u32;
            let mut out = Vec::new();
            out.extend(MAGIC.to_ne_bytes());
            out.extend([1u8, 0]); // version, flags
            for w in [
                HEADER_LEN as u32,
                0,
                type_len,
                type_len,
                self.strings.len() as u32,
            ] {
                out.extend(w.to_ne_bytes());
            }
            for w in &self.types {
                out.extend(w.to_ne_bytes());
            }
            out.extend(&self.strings);
            out
        }
    }

    /// A miniature of the kernel's layout: task_struct { int pid; struct sched_entity se (in an
    /// anonymous union); const struct sched_info sched_info; }, with a bit field and a typedef.
    fn sample() -> KernelBtf {
        let mut b = Blob::new();
        b.add("u64", KIND_INT, 0, false, 8, &[64]); // 1
        b.add("int", KIND_INT, 0, false, 4, &[32]); // 2
        b.add("", 2, 0, false, 6, &[]); // 3: pointer to struct cfs_rq (6)
        b.strukt(
            "sched_entity",
            24,
            false,
            &[("exec_start", 1, 0), ("cfs_rq", 3, 128)],
        ); // 4
        b.strukt("", 24, false, &[("se", 4, 0)]); // 5: anonymous
        b.strukt(
            "cfs_rq",
            8,
            true,
            &[("nr", 2, 1 << 24), ("rq_clock", 1, 64)],
        ); // 6
        b.add("sched_info_t", KIND_TYPEDEF, 0, false, 9, &[]); // 7
        b.add("", KIND_CONST, 0, false, 7, &[]); // 8
        b.strukt(
            "sched_info",
            16,
            false,
            &[("pcount", 1, 0), ("run_delay", 1, 64)],
        ); // 9
        b.add("task_struct", 7, 0, false, 0, &[]); // 10: a forward declaration first
        b.strukt(
            "task_struct",
            64,
            false,
            &[("pid", 2, 0), ("", 5, 64), ("sched_info", 8, 256)],
        ); // 11
        KernelBtf::parse(b.bytes(), Path::new("test.btf")).expect("valid blob")
    }

    #[test]
    fn finds_nested_members_through_anonymous_unions_typedefs_and_qualifiers() {
        let btf = sample();
        assert_eq!(btf.member_offset("task_struct", &["pid"]).unwrap(), 0);
        assert_eq!(btf.member_offset("task_struct", &["se"]).unwrap(), 8);
        assert_eq!(
            btf.member_offset("task_struct", &["se", "cfs_rq"]).unwrap(),
            24
        );
        assert_eq!(
            btf.member_offset("task_struct", &["sched_info", "run_delay"])
                .unwrap(),
            40
        );
        assert_eq!(btf.member_offset("cfs_rq", &["rq_clock"]).unwrap(), 8);
    }

    #[test]
    fn says_which_member_is_missing_or_unusable() {
        let btf = sample();
        let err = |strukt, path: &[&str]| btf.member_offset(strukt, path).unwrap_err().to_string();
        let e = err("task_struct", &["sched_info", "last_arrival"]);
        assert!(
            e.contains("struct task_struct.sched_info has no member last_arrival"),
            "{e}"
        );
        assert_eq!(err("rq", &["clock"]), "test.btf: no struct rq");
        let e = err("cfs_rq", &["nr"]);
        assert!(e.contains("cfs_rq.nr is a bit field"), "{e}");
        let e = err("task_struct", &["pid", "x"]);
        assert!(
            e.contains("task_struct.pid is not a struct or union, so it has no member x"),
            "{e}"
        );
    }

    #[test]
    fn rejects_a_blob_that_is_not_btf_or_is_cut_off() {
        let path = Path::new("x.btf");
        let e = KernelBtf::parse(vec![0; 30], path)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("magic 0x0000"), "{e}");
        let e = KernelBtf::parse(vec![], path).err().unwrap().to_string();
        assert!(e.contains("shorter than its header"), "{e}");
        let mut bytes = sample_bytes();
        bytes.truncate(bytes.len() - 40);
        let e = KernelBtf::parse(bytes, path).err().unwrap().to_string();
        assert!(e.contains("section runs past the end"), "{e}");
    }

    fn sample_bytes() -> Vec<u8> {
        let mut b = Blob::new();
        b.add("u64", KIND_INT, 0, false, 8, &[64]);
        b.strukt("s", 8, false, &[("a", 1, 0)]);
        b.bytes()
    }

    #[test]
    fn reads_this_kernels_task_fields() {
        // The real file: CI's kernel and the GPU host's have one.
        let btf = KernelBtf::load().expect("this kernel's BTF");
        let pid = btf.member_offset("task_struct", &["pid"]).unwrap();
        let tgid = btf.member_offset("task_struct", &["tgid"]).unwrap();
        assert_eq!(
            tgid,
            pid + 4,
            "the thread id, then its process's (both pid_t)"
        );
        let info = btf.member_offset("task_struct", &["sched_info"]).unwrap();
        let delay = btf
            .member_offset("task_struct", &["sched_info", "run_delay"])
            .unwrap();
        let arrival = btf
            .member_offset("task_struct", &["sched_info", "last_arrival"])
            .unwrap();
        assert_eq!(delay, info + 8, "run_delay follows pcount");
        assert!(arrival > delay);
        btf.member_offset("task_struct", &["se", "cfs_rq"]).unwrap();
        btf.member_offset("cfs_rq", &["rq"]).unwrap();
        btf.member_offset("rq", &["clock"]).unwrap();
    }
}
