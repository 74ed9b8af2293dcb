//! `cargo xtask hot-code`: writes `monitor/hot-code.txt`, the functions the agent runs, which
//! the release build links together at the front of its code (monitor/build.rs).
//!
//! Why: the kernel maps a file's pages 64 KiB at a time around each page fault ("fault-around")
//! when they are in the page cache, as an installed binary's are. The code the agent runs is
//! spread over its 10 MB of code, so a page it touches brings up to 15 others into its
//! resident set: on the dev VM 6.0 to 8.2 MB of the code was resident, of which 2.9 MB had
//! been touched. Linked together, the touched code is one block, and fault-around maps little
//! outside it.
//!
//! How: `serve` (release build, the fake NVML, real Docker and eBPF, its default configuration)
//! runs from a loop-mounted copy of the binary with read-ahead off, so a page is resident only
//! if the agent touched it. The fake GPU lists four processes, two in containers and two not;
//! the agent is scraped every second, for [`RUN_FOR`]. Every function on a resident page of
//! the binary is listed. The profiled build puts each function of the list it was built with
//! on pages of its own, so a resident page there names only the function that ran; each pass
//! profiles the last pass's list. Root, Docker and about four minutes a pass.
//!
//! Names are listed with their crate hashes (`Cs<hash>_` in v0 mangling) replaced by a wildcard,
//! since the hashes differ between a host build and a cross build (`cargo xtask release`). A
//! stale list costs nothing but the gain: functions it misses are linked where they would be.
use crate::fake_agent::FakeAgent;
use crate::{cargo, cargo_with_env, workspace_root};
use anyhow::{bail, Context, Result};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the agent runs before its resident pages are read: past the first series fetch
/// (10 s) and a few rounds of its default 5-s interval after it.
const RUN_FOR: Duration = Duration::from_secs(45);
const PAGE: u64 = 4096;
/// The list, from the workspace root.
pub const LIST: &str = "monitor/hot-code.txt";

fn say(msg: &str) {
    eprintln!("[hot-code] {msg}");
}

/// A function in the binary's symbol table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Symbol {
    address: u64,
    size: u64,
    name: String,
}

#[derive(clap::Args)]
pub struct Args {
    /// Profile and relink this many times, each pass profiling the binary the last one linked.
    /// On the dev VM, the list made over a hot-code layout was settled: a further pass moved
    /// `serve`'s RSS by less than the runs' spread (9.8-11.0 against 10.0-10.3 MiB).
    #[arg(long, default_value_t = 2)]
    pub passes: u32,
}

pub fn run(args: &Args) -> Result<()> {
    for pass in 1..=args.passes {
        say(&format!("pass {pass} of {}", args.passes));
        profile_once()?;
    }
    // Leave target/release/gpuwatch linked as releases are, not in the profiling layout.
    cargo(&["build", "--release", "-p", "gpuwatch", "--bins"])
}

/// What makes monitor/build.rs lay the listed functions out for profiling (its own copy is
/// `script::PROFILE_LAYOUT`; a test holds them equal).
pub const PROFILE_LAYOUT: &str = "GPUWATCH_HOT_CODE_PROFILE";

/// Builds the agent (with the list as it is), profiles it, and writes the list anew.
fn profile_once() -> Result<()> {
    // Apart, so that the agent is built as `cargo xtask release` builds it: built together,
    // the two packages' dependencies would share features and the code would differ. The
    // listed functions each on pages of their own (monitor/build.rs), so that a resident page
    // names the function that ran; functions the list misses are found with their page's
    // neighbours, and the next pass sorts those out.
    cargo_with_env(
        &["build", "--release", "-p", "gpuwatch", "--bins"],
        &[(PROFILE_LAYOUT, "1")],
    )?;
    cargo(&["build", "--release", "-p", "fake-nvml"])?;
    crate::image::base()?;
    let root = workspace_root();
    let binary = root.join("target/release/gpuwatch");
    let symbols = text_symbols(&binary)?;
    let mount = NoReadahead::mount()?;
    let copy = mount.dir.join("gpuwatch");
    std::fs::copy(&binary, &copy).context("copying the agent onto the loop mount")?;
    let jobs = GpuJobs::start(2)?;
    let scenario = mount.dir.join("scenario.json");
    std::fs::write(&scenario, jobs.scenario()?)?;
    // The copy's pages were just written: drop them, so none is resident before it runs.
    drop_page_cache()?;
    let agent = FakeAgent::start_binary(&copy, &scenario, "127.0.0.1:0", None)?;
    say(&format!(
        "serve ({}) beside {} GPU processes, half in containers, for {} s, scraped every second",
        agent.url,
        jobs.count(),
        RUN_FOR.as_secs()
    ));
    let started = Instant::now();
    let mut scrapes = 0;
    while started.elapsed() < RUN_FOR {
        for path in ["/metrics", "/api/v1/snapshot"] {
            match crate::soak::http_get(agent.addr(), path) {
                Ok(_) => scrapes += 1,
                Err(e) => say(&format!("{e:#}")),
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    if scrapes == 0 {
        bail!("no scrape of the agent succeeded");
    }
    let pages = resident_pages(agent.pid(), &copy)?;
    drop(agent);
    drop(jobs);
    drop(mount);
    let hot = hot_symbols(&symbols, &pages);
    let bytes: u64 = hot.iter().map(|s| s.size).sum();
    let mut patterns: Vec<String> = hot.iter().map(|s| pattern(&s.name)).collect();
    patterns.sort();
    patterns.dedup();
    let path = root.join(LIST);
    std::fs::write(&path, list_text(&patterns, bytes))
        .with_context(|| format!("writing {}", path.display()))?;
    say(&format!(
        "{} of the binary's pages resident; {} functions on them, {} KiB, as {} names in {LIST}",
        pages.len(),
        hot.len(),
        bytes / 1024,
        patterns.len()
    ));
    Ok(())
}

/// The list's text: a header (the hot functions' bytes first, which `xtask release` checks the
/// linked block against), then one name per line.
fn list_text(patterns: &[String], bytes: u64) -> String {
    let mut text = format!(
        "# hot-code-bytes {bytes}\n\
         # The functions `gpuwatch serve` ran, linked first in release builds (monitor/build.rs).\n\
         # Made by `cargo xtask hot-code`; run it again when the agent's code has changed much.\n"
    );
    for p in patterns {
        text.push_str(p);
        text.push('\n');
    }
    text
}

/// A symbol's name as a linker-script pattern: each crate hash (`Cs<base-62>_`) a wildcard.
fn pattern(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find("Cs") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let digits = after
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric())
            .count();
        if digits > 0 && after.as_bytes().get(digits) == Some(&b'_') {
            out.push_str("Cs*_");
            rest = &after[digits + 1..];
        } else {
            out.push_str("Cs");
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The functions that lie, in whole or in part, on a resident page (page addresses relative
/// to the binary's load address, as the symbols' are).
fn hot_symbols<'a>(symbols: &'a [Symbol], pages: &HashSet<u64>) -> Vec<&'a Symbol> {
    symbols
        .iter()
        .filter(|s| s.size > 0)
        .filter(|s| {
            let first = s.address / PAGE;
            let last = (s.address + s.size - 1) / PAGE;
            (first..=last).any(|p| pages.contains(&(p * PAGE)))
        })
        .collect()
}

/// The binary's functions (`nm`: address, size, name; local and global text symbols).
fn text_symbols(binary: &Path) -> Result<Vec<Symbol>> {
    let out = Command::new("nm")
        .args(["--defined-only", "-S"])
        .arg(binary)
        .output()
        .context("running nm")?;
    if !out.status.success() {
        bail!(
            "nm {}: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let symbols = parse_nm(&String::from_utf8_lossy(&out.stdout));
    if symbols.is_empty() {
        bail!("{} has no function symbols (stripped?)", binary.display());
    }
    Ok(symbols)
}

fn parse_nm(text: &str) -> Vec<Symbol> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(4, ' ');
            let address = u64::from_str_radix(f.next()?, 16).ok()?;
            let size = u64::from_str_radix(f.next()?, 16).ok()?;
            let kind = f.next()?;
            let name = f.next()?;
            matches!(kind, "t" | "T" | "w" | "W").then(|| Symbol {
                address,
                size,
                name: name.to_owned(),
            })
        })
        .collect()
}

/// The pages of `binary` resident in process `pid`, as addresses relative to its load address
/// (the start of its mapping at file offset 0), from `/proc/<pid>/pagemap`.
fn resident_pages(pid: u32, binary: &Path) -> Result<HashSet<u64>> {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let name = binary.to_string_lossy();
    let ranges = binary_mappings(&maps, &name);
    let base = ranges
        .iter()
        .find(|r| r.2 == 0)
        .map(|r| r.0)
        .with_context(|| format!("{name} is not mapped at offset 0 in process {pid}"))?;
    let mut pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap"))?;
    let mut pages = HashSet::new();
    for (start, end, _) in ranges {
        let mut entries = vec![0u8; ((end - start) / PAGE * 8) as usize];
        pagemap.seek(SeekFrom::Start(start / PAGE * 8))?;
        pagemap.read_exact(&mut entries)?;
        for (i, e) in entries.as_chunks::<8>().0.iter().enumerate() {
            let entry = u64::from_le_bytes(*e);
            if entry >> 63 == 1 {
                pages.insert(start - base + i as u64 * PAGE);
            }
        }
    }
    Ok(pages)
}

/// (start, end, file offset) of each mapping of the file named `name` in a `maps` text.
fn binary_mappings(maps: &str, name: &str) -> Vec<(u64, u64, u64)> {
    maps.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || f[5] != name {
                return None;
            }
            let (start, end) = f[0].split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
                u64::from_str_radix(f[2], 16).ok()?,
            ))
        })
        .collect()
}

fn drop_page_cache() -> Result<()> {
    // SAFETY: sync(2) takes no arguments.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping the page cache (root?)")
}

/// An ext4 image on a loop device with read-ahead off, mounted; unmounted and freed on drop.
struct NoReadahead {
    dir: PathBuf,
    image: PathBuf,
    device: String,
}

impl NoReadahead {
    fn mount() -> Result<Self> {
        let work = std::env::temp_dir().join(format!("gpuwatch-hot-code-{}", std::process::id()));
        let dir = work.join("mnt");
        std::fs::create_dir_all(&dir)?;
        let image = work.join("image");
        std::fs::File::create(&image)?.set_len(256 << 20)?;
        output(Command::new("mkfs.ext4").arg("-q").arg(&image), "mkfs.ext4")?;
        let device = output(
            Command::new("losetup").args(["-f", "--show"]).arg(&image),
            "losetup",
        )?;
        let mount = Self { dir, image, device };
        output(
            Command::new("blockdev").args(["--setra", "0", &mount.device]),
            "blockdev --setra 0",
        )?;
        output(
            Command::new("mount").arg(&mount.device).arg(&mount.dir),
            "mount",
        )?;
        Ok(mount)
    }
}

impl Drop for NoReadahead {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
        if let Some(work) = self.image.parent() {
            let _ = std::fs::remove_dir_all(work);
        }
    }
}

/// The processes the fake GPU lists: some in containers, some not (a job started from a shell
/// takes the agent's other path); stopped on drop.
struct GpuJobs {
    containers: Vec<String>,
    bare: Vec<std::process::Child>,
}

impl GpuJobs {
    fn start(count: usize) -> Result<Self> {
        let mut jobs = Self {
            containers: Vec::new(),
            bare: Vec::new(),
        };
        for i in 0..count {
            let name = format!("gpuwatch-hot-code-{}-{i}", std::process::id());
            output(
                Command::new("docker").args([
                    "run",
                    "-d",
                    "--rm",
                    "--name",
                    &name,
                    crate::image::BASE,
                    "sleep",
                    "300",
                ]),
                "docker run",
            )?;
            jobs.containers.push(name);
            let bare = Command::new("sleep")
                .arg("300")
                .spawn()
                .context("starting sleep")?;
            jobs.bare.push(bare);
        }
        Ok(jobs)
    }

    fn count(&self) -> usize {
        self.containers.len() + self.bare.len()
    }

    /// The fake NVML's scenario: one GPU, every job's process on it.
    fn scenario(&self) -> Result<String> {
        let mut pids: Vec<u32> = self.bare.iter().map(|c| c.id()).collect();
        for name in &self.containers {
            pids.push(crate::demo::docker_pid(name)?);
        }
        let processes: Vec<_> = pids
            .iter()
            .map(|pid| serde_json::json!({"pid": pid, "used_memory_bytes": 1u64 << 30, "sm_util": 40}))
            .collect();
        Ok(serde_json::json!({"devices": [{
            "uuid": "GPU-00000000-0000-0000-0000-0000000040c0",
            "processes": processes
        }]})
        .to_string())
    }
}

impl Drop for GpuJobs {
    fn drop(&mut self) {
        for name in &self.containers {
            let _ = Command::new("docker")
                .args(["rm", "-f", name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        for child in &mut self.bare {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs a command; its trimmed stdout, or an error with its stderr.
fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The byte count in a list's header (`# hot-code-bytes N`).
pub fn hot_code_bytes(list: &str) -> Option<u64> {
    list.lines()
        .next()?
        .strip_prefix("# hot-code-bytes ")?
        .trim()
        .parse()
        .ok()
}

/// How much of the list a linked release binary holds in its hot block, as a line to print;
/// an error when the block holds less than [`LINKED_AT_LEAST`] of the list's bytes (the names
/// no longer match the code: run `cargo xtask hot-code` again).
pub fn check_linked(binary: &Path) -> Result<String> {
    let list = workspace_root().join(LIST);
    let text = std::fs::read_to_string(&list).with_context(|| format!("reading {LIST}"))?;
    let listed = hot_code_bytes(&text)
        .with_context(|| format!("{LIST}:1: no `# hot-code-bytes N` header"))?;
    let out = output(Command::new("readelf").arg("-SW").arg(binary), "readelf -S")?;
    let linked = section_size(&out, ".text.hot").unwrap_or(0);
    let share = linked as f64 / listed.max(1) as f64;
    let line = format!(
        "hot code linked first: {} KiB, {:.0} % of {LIST}'s {} KiB",
        linked / 1024,
        share * 100.0,
        listed / 1024
    );
    if share < LINKED_AT_LEAST {
        bail!("{line}; its names no longer match the code: run `cargo xtask hot-code`");
    }
    Ok(line)
}

/// The share of the list's bytes below which the release refuses its binary.
const LINKED_AT_LEAST: f64 = 0.8;

/// A section's size from `readelf -SW`'s table.
fn section_size(readelf: &str, name: &str) -> Option<u64> {
    readelf.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(']').nth(1)?.split_whitespace().collect();
        // name, type, address, offset, size, ...
        (fields.first() == Some(&name)).then(|| u64::from_str_radix(fields.get(4)?, 16).ok())?
    })
}

/// The linker script build.rs makes of the list, here for its tests.
#[cfg(test)]
#[path = "../../monitor/build/hot_code.rs"]
mod script;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profiling_switch_is_the_one_the_build_script_reads() {
        assert_eq!(PROFILE_LAYOUT, super::script::PROFILE_LAYOUT);
    }

    #[test]
    fn crate_hashes_become_wildcards_and_nothing_else_changes() {
        assert_eq!(
            pattern("_RNvCs4u8xDeL64TH_11procfs_core18from_iter_optional"),
            "_RNvCs*_11procfs_core18from_iter_optional"
        );
        assert_eq!(
            pattern("_RINvCs4u8xDeL64TH_11procfs_core18from_iter_optionalQINtNtNtCsc36rpYXAlPq_4core3str4iter5SplitcElECsaawrUfNRske_6procfs"),
            "_RINvCs*_11procfs_core18from_iter_optionalQINtNtNtCs*_4core3str4iter5SplitcElECs*_6procfs"
        );
        // An identifier holding "Cs" may widen a wildcard; the name still matches its pattern.
        let name = "_RNvMNtCsaawrUfNRske_8gpuwatch3csvNtB2_6CsvRow3newCsc36rpYXAlPq_4core";
        assert!(glob_matches(&pattern(name), name));
        assert!(!glob_matches(
            &pattern(name),
            "_RNvMNtCsaawrUfNRske_8gpuwatch3tsv"
        ));
        assert_eq!(pattern("__divti3"), "__divti3");
        assert_eq!(pattern("fiat_25519_carry_mul"), "fiat_25519_carry_mul");
    }

    /// A linker script's `*` (any run of characters), for the tests.
    fn glob_matches(pattern: &str, name: &str) -> bool {
        match pattern.split_once('*') {
            None => pattern == name,
            Some((head, tail)) => {
                name.starts_with(head)
                    && (head.len()..=name.len())
                        .any(|i| name.is_char_boundary(i) && glob_matches(tail, &name[i..]))
            }
        }
    }

    #[test]
    fn a_function_is_hot_when_any_of_its_pages_is_resident() {
        let symbols = parse_nm(
            "0000000000001000 0000000000000010 t on_a_resident_page\n\
             0000000000002ff0 0000000000000020 T crosses_into_a_resident_page\n\
             0000000000004000 0000000000001000 t on_a_page_not_resident\n\
             0000000000005000 0000000000000000 t sizeless\n\
             0000000000006000 0000000000000010 D data_not_code\n",
        );
        assert_eq!(symbols.len(), 4, "data symbols are not functions");
        let pages: HashSet<u64> = [0x1000, 0x3000, 0x5000, 0x6000].into();
        let hot: Vec<&str> = hot_symbols(&symbols, &pages)
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(hot, ["on_a_resident_page", "crosses_into_a_resident_page"]);
    }

    #[test]
    fn mappings_are_read_for_the_named_file_only() {
        let maps = "5600-5700 r--p 00000000 fd:01 12 /mnt/gpuwatch\n\
                    5700-5900 r-xp 00100000 fd:01 12 /mnt/gpuwatch\n\
                    7f00-7f10 r-xp 00000000 fd:01 13 /usr/lib/libc.so.6\n\
                    8000-8100 rw-p 00000000 00:00 0\n";
        assert_eq!(
            binary_mappings(maps, "/mnt/gpuwatch"),
            [(0x5600, 0x5700, 0), (0x5700, 0x5900, 0x100000)]
        );
    }

    #[test]
    fn the_hot_block_is_read_from_readelfs_table() {
        let table = "  [16] .text.hot         PROGBITS        00000000003453b0 3443b0 37f7fe 00  AX  0   0 16\n  \
                     [17] .text             PROGBITS        00000000006c4bc0 6c3bc0 64c977 00  AX  0   0 64\n";
        assert_eq!(section_size(table, ".text.hot"), Some(0x37f7fe));
        assert_eq!(section_size(table, ".text"), Some(0x64c977));
        assert_eq!(section_size(table, ".rodata"), None);
    }

    #[test]
    fn the_list_starts_with_the_byte_count_the_release_checks() {
        let text = list_text(&["a".to_owned(), "b".to_owned()], 8192);
        assert_eq!(hot_code_bytes(&text), Some(8192));
        assert!(text.ends_with("\na\nb\n"));
    }
}
