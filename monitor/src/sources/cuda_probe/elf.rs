//! The exported functions of a shared library and their file offsets (what a uprobe is attached
//! at), read from its dynamic symbol table with positioned reads: the driver library is ~96 MB
//! (580.159.04), and only its headers, `.dynsym` and `.dynstr` (tens of KB) are read.
//!
//! ELF64, little-endian (x86-64 and arm64, the hosts the driver ships for).
//!
//! The file may be a tenant's (a container maps whatever it names `libcuda.so.1`), so every
//! size and offset it claims is bounded: tables up to [`TABLE_MAX_BYTES`], headers within the
//! file, and a function's offset only inside an executable loadable segment of this file (a
//! uprobe anywhere else would be planted in data, or past the code the kernel maps).
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Largest symbol or string table read: the H100 host's driver (580.159.04) has a `.dynsym` of
/// ~40 KB and a `.dynstr` of ~50 KB.
pub const TABLE_MAX_BYTES: u64 = 1 << 20;
/// Largest program or section header table read.
const HEADERS_MAX_BYTES: u64 = 64 << 10;
const SHT_DYNSYM: u32 = 11;
const PT_LOAD: u32 = 1;
const STT_FUNC: u8 = 2;
/// `p_flags`: the segment is executable.
const PF_X: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("reading {what}: {source}")]
    Read {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("not an ELF64 little-endian object")]
    NotElf64,
    #[error("{0}")]
    Malformed(&'static str),
    #[error("{what} claims {len} bytes, more than the {max} a driver library's can be")]
    TooLarge {
        what: &'static str,
        len: u64,
        max: u64,
    },
}

fn read_at(
    file: &File,
    offset: u64,
    len: u64,
    max: u64,
    what: &'static str,
) -> Result<Vec<u8>, ElfError> {
    if len > max {
        return Err(ElfError::TooLarge { what, len, max });
    }
    let mut buf = vec![0; len as usize];
    file.read_exact_at(&mut buf, offset)
        .map_err(|source| ElfError::Read { what, source })?;
    Ok(buf)
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// An executable loadable segment: where its addresses live in the file.
struct Segment {
    vaddr: u64,
    filesz: u64,
    offset: u64,
}

/// The defined, exported functions named by `wanted`, with their file offsets: each inside an
/// executable loadable segment and inside the file's `size` bytes.
pub fn exported_functions(
    file: &File,
    size: u64,
    wanted: impl Fn(&str) -> bool,
) -> Result<HashMap<String, u64>, ElfError> {
    let header = read_at(file, 0, 64, 64, "the ELF header")?;
    if header.get(..4) != Some(b"\x7fELF") || header[4] != 2 || header[5] != 1 {
        return Err(ElfError::NotElf64);
    }
    let malformed = || ElfError::Malformed("a header field out of range");
    let field = |at| u64_at(&header, at).ok_or_else(malformed);
    let half = |at| u16_at(&header, at).map(u64::from).ok_or_else(malformed);
    let (phoff, shoff) = (field(0x20)?, field(0x28)?);
    let (phentsize, phnum, shentsize, shnum) = (half(0x36)?, half(0x38)?, half(0x3a)?, half(0x3c)?);
    if phentsize < 56 || shentsize < 64 {
        return Err(ElfError::Malformed("header entries smaller than ELF64's"));
    }
    let phdrs = read_at(
        file,
        phoff,
        phentsize * phnum,
        HEADERS_MAX_BYTES,
        "the program headers",
    )?;
    let segments: Vec<Segment> = phdrs
        .chunks_exact(phentsize as usize)
        .filter(|p| u32_at(p, 0) == Some(PT_LOAD))
        .filter(|p| u32_at(p, 4).is_some_and(|flags| flags & PF_X != 0))
        .filter_map(|p| {
            Some(Segment {
                offset: u64_at(p, 8)?,
                vaddr: u64_at(p, 16)?,
                filesz: u64_at(p, 32)?,
            })
        })
        .collect();
    let shdrs = read_at(
        file,
        shoff,
        shentsize * shnum,
        HEADERS_MAX_BYTES,
        "the section headers",
    )?;
    let sections: Vec<&[u8]> = shdrs.chunks_exact(shentsize as usize).collect();
    let Some(dynsym) = sections.iter().find(|s| u32_at(s, 4) == Some(SHT_DYNSYM)) else {
        return Err(ElfError::Malformed("no dynamic symbol table"));
    };
    let table = |s: &[u8], what| -> Result<Vec<u8>, ElfError> {
        read_at(
            file,
            u64_at(s, 24).ok_or_else(malformed)?,
            u64_at(s, 32).ok_or_else(malformed)?,
            TABLE_MAX_BYTES,
            what,
        )
    };
    let symbols = table(dynsym, ".dynsym")?;
    let strtab_index = u32_at(dynsym, 40).ok_or_else(malformed)? as usize;
    let strings = table(
        sections.get(strtab_index).ok_or(ElfError::Malformed(
            "the symbol table's string table is missing",
        ))?,
        ".dynstr",
    )?;
    let mut out = HashMap::new();
    for sym in symbols.as_chunks::<24>().0 {
        let (Some(name_at), Some(shndx), Some(value)) =
            (u32_at(sym, 0), u16_at(sym, 6), u64_at(sym, 8))
        else {
            continue;
        };
        // Defined functions only (an indirect function's address is its resolver's).
        if shndx == 0 || sym[4] & 0xf != STT_FUNC {
            continue;
        }
        let Some(rest) = strings.get(name_at as usize..) else {
            continue;
        };
        let Some(end) = rest.iter().position(|b| *b == 0) else {
            continue;
        };
        let Ok(name) = std::str::from_utf8(&rest[..end]) else {
            continue;
        };
        if !wanted(name) {
            continue;
        }
        // In the segment's bytes from the file (not its zero-filled tail), and in the file.
        let offset = segments
            .iter()
            .find(|s| s.vaddr <= value && value - s.vaddr < s.filesz)
            .and_then(|s| (value - s.vaddr).checked_add(s.offset))
            .filter(|o| *o < size);
        if let Some(offset) = offset {
            out.entry(name.to_owned()).or_insert(offset);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_this_hosts_libc_functions_where_the_dynamic_linker_maps_them() {
        // libc's own `getpid` and `write`: the offsets must land where this process has them
        // mapped (the address in memory minus its mapping's start, plus the mapping's offset).
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| l.contains("libc.so.6") && l.contains("r-xp"))
            .expect("libc mapped");
        let path = line.split_whitespace().last().unwrap();
        let mut fields = line.split_whitespace();
        let range = fields.next().unwrap();
        fields.next();
        let map_offset = u64::from_str_radix(fields.next().unwrap(), 16).unwrap();
        let start = u64::from_str_radix(range.split('-').next().unwrap(), 16).unwrap();
        let file = File::open(path).unwrap();
        let size = file.metadata().unwrap().len();
        let found = exported_functions(&file, size, |n| n == "getpid" || n == "write").unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        let getpid = libc::getpid as *const () as usize as u64;
        assert_eq!(found["getpid"], getpid - start + map_offset);
    }

    #[test]
    fn refuses_what_is_not_elf64_without_reading_past_it() {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, b"#!/bin/sh\necho not a library\n").unwrap();
        assert!(matches!(
            exported_functions(&f, 30, |_| true),
            Err(ElfError::Read { .. } | ElfError::NotElf64)
        ));
        let mut header = vec![0u8; 64];
        header[..6].copy_from_slice(b"\x7fELF\x02\x01");
        // section headers claimed far beyond the file
        header[0x28..0x30].copy_from_slice(&(1u64 << 40).to_le_bytes());
        header[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        header[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        header[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &header).unwrap();
        assert!(exported_functions(&f, 64, |_| true).is_err());
    }

    fn put(b: &mut [u8], at: usize, v: &[u8]) {
        b[at..at + v.len()].copy_from_slice(v);
    }

    /// A small ELF64 shared object as a tenant could write it: an executable segment and a
    /// writable one, and `code_fn` (in the code), `data_fn` (in the data) and `tail_fn` (in the
    /// code segment's memory past its bytes in the file). `dynsym_size` is what its symbol
    /// table claims.
    fn tenant_elf(dynsym_size: u64) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        put(&mut b, 0, b"\x7fELF\x02\x01\x01");
        put(&mut b, 0x10, &3u16.to_le_bytes());
        put(&mut b, 0x20, &64u64.to_le_bytes()); // program headers
        put(&mut b, 0x28, &1024u64.to_le_bytes()); // section headers
        put(&mut b, 0x36, &56u16.to_le_bytes());
        put(&mut b, 0x38, &2u16.to_le_bytes());
        put(&mut b, 0x3a, &64u16.to_le_bytes());
        put(&mut b, 0x3c, &3u16.to_le_bytes());
        // (flags, offset, vaddr, filesz, memsz): R+X code, then R+W data
        for (i, (flags, off, vaddr, filesz, memsz)) in [
            (5u32, 0u64, 0x10000u64, 0x800u64, 0x1000u64),
            (6, 0x800, 0x20000, 0x800, 0x800),
        ]
        .iter()
        .enumerate()
        {
            let ph = 64 + i * 56;
            put(&mut b, ph, &PT_LOAD.to_le_bytes());
            put(&mut b, ph + 4, &flags.to_le_bytes());
            put(&mut b, ph + 8, &off.to_le_bytes());
            put(&mut b, ph + 16, &vaddr.to_le_bytes());
            put(&mut b, ph + 32, &filesz.to_le_bytes());
            put(&mut b, ph + 40, &memsz.to_le_bytes());
        }
        let names = b"\0code_fn\0data_fn\0tail_fn\0";
        put(&mut b, 256, names);
        for (i, (name_at, value)) in [(1u32, 0x10100u64), (9, 0x20100), (17, 0x10900)]
            .iter()
            .enumerate()
        {
            let sym = 512 + (i + 1) * 24;
            put(&mut b, sym, &name_at.to_le_bytes());
            b[sym + 4] = 0x10 | STT_FUNC;
            put(&mut b, sym + 6, &1u16.to_le_bytes());
            put(&mut b, sym + 8, &value.to_le_bytes());
        }
        // section 1: .dynsym, linked to section 2: .dynstr
        let sh = 1024 + 64;
        put(&mut b, sh + 4, &SHT_DYNSYM.to_le_bytes());
        put(&mut b, sh + 24, &512u64.to_le_bytes());
        put(&mut b, sh + 32, &dynsym_size.to_le_bytes());
        put(&mut b, sh + 40, &2u32.to_le_bytes());
        let sh = 1024 + 128;
        put(&mut b, sh + 4, &3u32.to_le_bytes());
        put(&mut b, sh + 24, &256u64.to_le_bytes());
        put(&mut b, sh + 32, &(names.len() as u64).to_le_bytes());
        b
    }

    fn file_of(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        f
    }

    #[test]
    fn offsets_only_in_the_files_own_executable_code() {
        let f = file_of(&tenant_elf(96));
        let found = exported_functions(&f, 4096, |_| true).unwrap();
        assert_eq!(found.get("code_fn"), Some(&0x100), "{found:?}");
        assert!(!found.contains_key("data_fn"), "a data segment: {found:?}");
        assert!(
            !found.contains_key("tail_fn"),
            "past the file's bytes: {found:?}"
        );
        // A file shorter than its code segment claims: the offset must be inside the file.
        assert!(exported_functions(&f, 0x100, |_| true).unwrap().is_empty());
    }

    #[test]
    fn a_symbol_table_larger_than_a_drivers_is_refused_before_it_is_read() {
        // A tenant's "library" claiming a 16 MiB symbol table (sparse, so reading it would cost
        // only time): refused from its header.
        let f = file_of(&tenant_elf(16 << 20));
        assert!(matches!(
            exported_functions(&f, 4096, |_| true),
            Err(ElfError::TooLarge {
                what: ".dynsym",
                ..
            })
        ));
    }
}
