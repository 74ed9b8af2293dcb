//! The exported functions of a shared library and their file offsets (what a uprobe is attached
//! at), read from its dynamic symbol table with positioned reads: the driver library is ~96 MB
//! (580.159.04), and only its headers, `.dynsym` and `.dynstr` (tens of KB) are read.
//!
//! ELF64, little-endian (x86-64 and arm64, the hosts the driver ships for).
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Largest symbol or string table read: a driver library's are tens of KB.
const TABLE_MAX_BYTES: u64 = 16 << 20;
const SHT_DYNSYM: u32 = 11;
const PT_LOAD: u32 = 1;
const STT_FUNC: u8 = 2;

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
}

fn read_at(file: &File, offset: u64, len: u64, what: &'static str) -> Result<Vec<u8>, ElfError> {
    if len > TABLE_MAX_BYTES {
        return Err(ElfError::Malformed("a table larger than 16 MiB"));
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

/// A loadable segment: where its addresses live in the file.
struct Segment {
    vaddr: u64,
    memsz: u64,
    offset: u64,
}

/// The defined, exported functions named by `wanted`, with their file offsets.
pub fn exported_functions(
    file: &File,
    wanted: impl Fn(&str) -> bool,
) -> Result<HashMap<String, u64>, ElfError> {
    let header = read_at(file, 0, 64, "the ELF header")?;
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
    let phdrs = read_at(file, phoff, phentsize * phnum, "the program headers")?;
    let segments: Vec<Segment> = phdrs
        .chunks_exact(phentsize as usize)
        .filter(|p| u32_at(p, 0) == Some(PT_LOAD))
        .filter_map(|p| {
            Some(Segment {
                offset: u64_at(p, 8)?,
                vaddr: u64_at(p, 16)?,
                memsz: u64_at(p, 40)?,
            })
        })
        .collect();
    let shdrs = read_at(file, shoff, shentsize * shnum, "the section headers")?;
    let sections: Vec<&[u8]> = shdrs.chunks_exact(shentsize as usize).collect();
    let Some(dynsym) = sections.iter().find(|s| u32_at(s, 4) == Some(SHT_DYNSYM)) else {
        return Err(ElfError::Malformed("no dynamic symbol table"));
    };
    let table = |s: &[u8], what| -> Result<Vec<u8>, ElfError> {
        read_at(
            file,
            u64_at(s, 24).ok_or_else(malformed)?,
            u64_at(s, 32).ok_or_else(malformed)?,
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
        if let Some(s) = segments
            .iter()
            .find(|s| s.vaddr <= value && value - s.vaddr < s.memsz)
        {
            out.entry(name.to_owned())
                .or_insert(value - s.vaddr + s.offset);
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
        let found = exported_functions(&File::open(path).unwrap(), |n| {
            n == "getpid" || n == "write"
        })
        .unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        let getpid = libc::getpid as *const () as usize as u64;
        assert_eq!(found["getpid"], getpid - start + map_offset);
    }

    #[test]
    fn refuses_what_is_not_elf64_without_reading_past_it() {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, b"#!/bin/sh\necho not a library\n").unwrap();
        assert!(matches!(
            exported_functions(&f, |_| true),
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
        assert!(exported_functions(&f, |_| true).is_err());
    }
}
