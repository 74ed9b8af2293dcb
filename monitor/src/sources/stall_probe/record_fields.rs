//! Load-time relocation of the tracepoint record fields the programs load directly (see
//! `monitor_common::record_fields` for why it is done here and not by CO-RE): in a copy of the
//! object, every load at a field's marker offset gets the field's offset on this kernel.
//!
//! Only what that needs of ELF64 is read: the section headers, to find the sections of code.
//! An instruction is 8 bytes: opcode, registers, a 16-bit signed offset, a 32-bit immediate
//! (<https://docs.kernel.org/bpf/standardization/instruction-set.html>).
use super::tracefs::FieldLayout;
use monitor_common::record_fields::{marker, slot, RECORD_LOADABLE, SLOT_SIZES};

#[derive(Debug, thiserror::Error)]
pub enum RelocationError {
    #[error("the eBPF object is not a little-endian ELF64 file")]
    NotElf64,
    #[error("the eBPF object is cut short: {what} at byte {at} runs past its {len} bytes")]
    Truncated { what: String, at: usize, len: usize },
    #[error(
        "the eBPF object loads record field slot {slot} with {found} bytes at byte {at}, where \
         its marker means {expected}: the programs and this loader disagree"
    )]
    SizeMismatch {
        slot: u32,
        at: usize,
        found: u32,
        expected: u32,
    },
}

/// What relocation did: which slots' loads now read the record directly (a bit per slot, for
/// `DIRECT_RECORD_FIELDS`), and how many loads each slot had.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Relocated {
    pub direct: u32,
    pub loads: [u32; slot::COUNT as usize],
}

const SHF_EXECINSTR: u64 = 0x4;
const BPF_LDX: u8 = 0x01;
const BPF_MEM: u8 = 0x60;
const BPF_LD_IMM64: u8 = 0x18;

/// Relocates `object` in place for the fields in `layouts` (slot, its layout on this kernel).
/// A field goes direct when its size is what the program loads and its offset is one the
/// verifier takes (aligned, inside the record); the others, and slots not given, stay on the
/// probe-read helper.
pub fn relocate(
    object: &mut [u8],
    layouts: &[(u32, FieldLayout)],
) -> Result<Relocated, RelocationError> {
    let mut target: [Option<u32>; slot::COUNT as usize] = [None; slot::COUNT as usize];
    for &(s, layout) in layouts {
        let size = SLOT_SIZES[s as usize];
        let aligned = layout.offset % size == 0;
        let inside =
            RECORD_LOADABLE.contains(&layout.offset) && layout.offset + size <= RECORD_LOADABLE.end;
        if layout.size == size && aligned && inside {
            target[s as usize] = Some(layout.offset);
        }
    }
    let mut done = Relocated::default();
    for (start, len) in code_sections(object)? {
        let mut at = start;
        while at + 8 <= start + len {
            let insn = &mut object[at..at + 8];
            let opcode = insn[0];
            if opcode == BPF_LD_IMM64 {
                at += 16; // a wide instruction: its second half is not an instruction
                continue;
            }
            let off = i16::from_le_bytes([insn[2], insn[3]]);
            if opcode & 0x07 == BPF_LDX && opcode & 0xe0 == BPF_MEM {
                if let Some(s) = (0..slot::COUNT).find(|&s| marker(s) == off) {
                    // the size bits: W, H, B, DW
                    let found = [4, 2, 1, 8][usize::from((opcode >> 3) & 0x03)];
                    let expected = SLOT_SIZES[s as usize];
                    if found != expected {
                        return Err(RelocationError::SizeMismatch {
                            slot: s,
                            at,
                            found,
                            expected,
                        });
                    }
                    done.loads[s as usize] += 1;
                    if let Some(offset) = target[s as usize] {
                        insn[2..4].copy_from_slice(&(offset as i16).to_le_bytes());
                    }
                }
            }
            at += 8;
        }
    }
    for (s, t) in target.iter().enumerate() {
        // a slot whose loads were not found (compiled out) has nothing to go direct
        if t.is_some() && done.loads[s] > 0 {
            done.direct |= 1 << s;
        }
    }
    Ok(done)
}

/// The (file offset, size) of each section of code in `elf`.
fn code_sections(elf: &[u8]) -> Result<Vec<(usize, usize)>, RelocationError> {
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return Err(RelocationError::NotElf64);
    }
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let u64_at = |at: usize| -> Result<u64, RelocationError> {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            .ok_or_else(|| truncated("a section header", at, elf.len()))
    };
    let (shoff, shentsize, shnum) = (u64_at(0x28)? as usize, u16_at(0x3a), u16_at(0x3c));
    if shentsize < 0x28 {
        return Err(RelocationError::NotElf64);
    }
    let mut sections = Vec::new();
    for i in 0..shnum {
        let header = shoff.saturating_add(i * shentsize);
        if header.saturating_add(shentsize) > elf.len() {
            return Err(truncated("a section header", header, elf.len()));
        }
        let flags = u64_at(header + 0x08)?;
        let (offset, size) = (
            u64_at(header + 0x18)? as usize,
            u64_at(header + 0x20)? as usize,
        );
        if flags & SHF_EXECINSTR != 0 && size > 0 {
            if offset.saturating_add(size) > elf.len() {
                return Err(truncated(&format!("section {i}"), offset, elf.len()));
            }
            sections.push((offset, size));
        }
    }
    Ok(sections)
}

fn truncated(what: &str, at: usize, len: usize) -> RelocationError {
    RelocationError::Truncated {
        what: what.into(),
        at,
        len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(offset: u32, size: u32) -> FieldLayout {
        FieldLayout { offset, size }
    }

    /// This kernel generation's layouts (6.x: the common header of 8 bytes).
    fn current_layouts() -> Vec<(u32, FieldLayout)> {
        vec![
            (slot::SCHED_SWITCH_PREV_PID, layout(24, 4)),
            (slot::SCHED_SWITCH_PREV_STATE_8, layout(32, 8)),
            (slot::SYS_EXIT_RET, layout(16, 8)),
            (slot::BLOCK_ISSUE_DEV, layout(8, 4)),
            (slot::BLOCK_ISSUE_SECTOR, layout(16, 8)),
            (slot::BLOCK_ISSUE_BYTES, layout(28, 4)),
            (slot::BLOCK_COMPLETE_DEV, layout(8, 4)),
            (slot::BLOCK_COMPLETE_SECTOR, layout(16, 8)),
        ]
    }

    /// The byte positions where `a` and `b` differ.
    fn differing(a: &[u8], b: &[u8]) -> Vec<usize> {
        a.iter()
            .zip(b)
            .enumerate()
            .filter(|(_, (x, y))| x != y)
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn every_field_of_the_real_object_is_found_and_only_its_offsets_change() {
        let original = super::super::PROBES.to_vec();
        let mut object = original.clone();
        let done = relocate(&mut object, &current_layouts()).unwrap();
        // every slot's load is in the object: a change in how the compiler emits them fails here
        for s in 0..slot::COUNT {
            assert!(done.loads[s as usize] >= 1, "slot {s}: {done:?}");
        }
        // each given slot is direct; the int-sized prev_state was not given
        let given: u32 = current_layouts().iter().map(|(s, _)| 1 << s).sum();
        assert_eq!(done.direct, given);
        // only offset fields changed, and each to its layout's offset
        let changed = differing(&original, &object);
        let relocated: u32 = current_layouts()
            .iter()
            .map(|(s, _)| done.loads[*s as usize])
            .sum();
        assert!(changed.len() <= 2 * relocated as usize, "{changed:?}");
        for at in changed {
            let insn = at - at % 8;
            let off = i16::from_le_bytes([object[insn + 2], object[insn + 3]]) as u32;
            assert!(
                current_layouts().iter().any(|(_, l)| l.offset == off),
                "byte {at}: offset {off}"
            );
            assert_eq!(object[insn] & 0x07, BPF_LDX, "byte {at}");
        }
    }

    #[test]
    fn a_field_the_verifier_would_refuse_stays_on_the_helper() {
        let original = super::super::PROBES.to_vec();
        let mut object = original.clone();
        let odd = [
            // unaligned for a long, as on a kernel with a 12-byte common header
            (slot::SYS_EXIT_RET, layout(20, 8)),
            // not the size the program loads
            (slot::SCHED_SWITCH_PREV_PID, layout(24, 8)),
            // past the record a tracepoint program may read
            (slot::BLOCK_ISSUE_DEV, layout(4096, 4)),
            // in the first 8 bytes, which the kernel overwrites before the program runs
            (slot::BLOCK_ISSUE_SECTOR, layout(0, 8)),
        ];
        let done = relocate(&mut object, &odd).unwrap();
        assert_eq!(done.direct, 0);
        assert_eq!(object, original, "nothing rewritten");
    }

    #[test]
    fn another_layout_is_written_where_the_markers_were() {
        let mut object = super::super::PROBES.to_vec();
        // an RT kernel's layout: the common header 4 bytes longer
        let rt = [(slot::SCHED_SWITCH_PREV_PID, layout(28, 4))];
        let done = relocate(&mut object, &rt).unwrap();
        assert_eq!(done.direct, 1 << slot::SCHED_SWITCH_PREV_PID);
        // relocating again finds no marker of that slot left
        let again = relocate(&mut object, &rt).unwrap();
        assert_eq!(again.loads[slot::SCHED_SWITCH_PREV_PID as usize], 0);
        assert_eq!(again.direct, 0);
    }

    #[test]
    fn a_broken_object_is_an_error_not_a_panic() {
        assert!(matches!(
            relocate(&mut [0u8; 10], &[]),
            Err(RelocationError::NotElf64)
        ));
        let mut cut = super::super::PROBES[..200].to_vec();
        assert!(matches!(
            relocate(&mut cut, &current_layouts()),
            Err(RelocationError::Truncated { .. })
        ));
        // a section header pointing past the end
        let mut object = super::super::PROBES.to_vec();
        let shoff = u64::from_le_bytes(object[0x28..0x30].try_into().unwrap()) as usize;
        let shentsize = u16::from_le_bytes([object[0x3a], object[0x3b]]) as usize;
        // the second section (after the null one) gets an offset past the end and EXECINSTR
        let h = shoff + shentsize;
        object[h + 0x08..h + 0x10].copy_from_slice(&SHF_EXECINSTR.to_le_bytes());
        object[h + 0x18..h + 0x20].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        object[h + 0x20..h + 0x28].copy_from_slice(&64u64.to_le_bytes());
        assert!(matches!(
            relocate(&mut object, &current_layouts()),
            Err(RelocationError::Truncated { .. })
        ));
    }
}
