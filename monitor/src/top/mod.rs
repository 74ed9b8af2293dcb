//! `gpuwatch top`: the live view people open instead of `nvidia-smi -l 1`. GPUs (utilisation,
//! memory, temperature, power against the cap) and containers (GPU memory, GPU busy, verdict,
//! alerts), redrawn each round, sortable and filterable from the keyboard. This module is the
//! view: its state and its keys here, how it draws one round in [`draw`]; the command runs the
//! loop.
mod draw;

use crate::model::Workload;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::style::Style;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    GpuMemory,
    GpuBusy,
    Name,
    Verdict,
}

impl SortKey {
    fn next(self) -> Self {
        match self {
            Self::GpuMemory => Self::GpuBusy,
            Self::GpuBusy => Self::Name,
            Self::Name => Self::Verdict,
            Self::Verdict => Self::GpuMemory,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::GpuMemory => "GPU memory",
            Self::GpuBusy => "GPU busy",
            Self::Name => "name",
            Self::Verdict => "verdict",
        }
    }
}

/// What the user has chosen to see.
#[derive(Debug)]
pub struct View {
    pub sort: SortKey,
    pub reverse: bool,
    /// Case-insensitive substring of the container name, image or service.
    pub filter: String,
    /// Typing into the filter.
    pub editing: bool,
    /// Only workloads holding a GPU.
    pub gpu_only: bool,
    pub color: bool,
    /// The highlighted row of the container table (kept within the rows when drawn).
    pub selected: usize,
    /// The highlighted row's verdict, evidence and advice are shown (Enter; Esc closes).
    pub detail: bool,
}

impl View {
    pub fn new(color: bool) -> Self {
        Self {
            sort: SortKey::GpuMemory,
            reverse: false,
            filter: String::new(),
            editing: false,
            gpu_only: false,
            color,
            selected: 0,
            detail: false,
        }
    }

    /// Applies a key; returns `false` when the user asked to quit.
    pub fn key(&mut self, k: KeyEvent) -> bool {
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            return false;
        }
        if self.editing {
            match k.code {
                KeyCode::Enter => self.editing = false,
                KeyCode::Esc => {
                    self.editing = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) => self.filter.push(c),
                _ => {}
            }
            return true;
        }
        match k.code {
            // Esc closes the pane, else clears the filter; it never quits (q does, as in htop).
            KeyCode::Esc if self.detail => self.detail = false,
            KeyCode::Esc => self.filter.clear(),
            KeyCode::Enter => self.detail = !self.detail,
            KeyCode::Down | KeyCode::Char('j') => self.selected = self.selected.saturating_add(1),
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Char('q') => return false,
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('r') => self.reverse = !self.reverse,
            KeyCode::Char('g') => self.gpu_only = !self.gpu_only,
            KeyCode::Char('/') => {
                self.editing = true;
                self.filter.clear();
            }
            _ => {}
        }
        true
    }

    fn style(&self, s: Style) -> Style {
        if self.color {
            s
        } else {
            Style::default().add_modifier(s.add_modifier)
        }
    }

    /// The workloads to list, filtered and sorted.
    pub fn rows<'a>(&self, ws: &'a [Workload]) -> Vec<&'a Workload> {
        let needle = self.filter.to_lowercase();
        let mut v: Vec<&Workload> = ws
            .iter()
            .filter(|w| !self.gpu_only || w.gpu.processes > 0)
            .filter(|w| {
                needle.is_empty()
                    || w.name.to_lowercase().contains(&needle)
                    || w.container.as_ref().is_some_and(|c| {
                        c.image.to_lowercase().contains(&needle)
                            || c.compose_service
                                .as_deref()
                                .is_some_and(|s| s.to_lowercase().contains(&needle))
                    })
            })
            .collect();
        let verdict = |w: &Workload| w.verdict.as_ref().map(|v| v.kind.label()).unwrap_or("");
        match self.sort {
            SortKey::GpuMemory => v.sort_by(|a, b| {
                b.gpu
                    .memory_bytes
                    .cmp(&a.gpu.memory_bytes)
                    .then_with(|| a.name.cmp(&b.name))
            }),
            SortKey::GpuBusy => v.sort_by(|a, b| {
                b.gpu
                    .busy_fraction
                    .unwrap_or(-1.0)
                    .total_cmp(&a.gpu.busy_fraction.unwrap_or(-1.0))
                    .then_with(|| a.name.cmp(&b.name))
            }),
            SortKey::Name => v.sort_by(|a, b| a.name.cmp(&b.name)),
            SortKey::Verdict => {
                v.sort_by(|a, b| verdict(a).cmp(verdict(b)).then_with(|| a.name.cmp(&b.name)))
            }
        }
        if self.reverse {
            v.reverse();
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, snapshot};
    use crate::output::published::Published;
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::KeyEventKind;
    use ratatui::Terminal;
    use std::collections::BTreeMap;

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent {
            code: c,
            modifiers: KeyModifiers::NONE,
            kind: KeyEventKind::Press,
            state: ratatui::crossterm::event::KeyEventState::NONE,
        }
    }

    fn screen(view: &View, e: &Published) -> String {
        let mut t = Terminal::new(TestBackend::new(120, 20)).expect("terminal");
        t.draw(|f| view.draw(f, e)).expect("draw");
        let buf = t.backend().buffer().clone();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_owned())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn sorts_filters_and_quits_by_keyboard() {
        let mut big = container("big-job");
        big.gpu.processes = 1;
        big.gpu.memory_bytes = 40 << 30;
        big.gpu.busy_fraction = Some(0.2);
        let mut small = container("small-job");
        small.gpu.processes = 1;
        small.gpu.memory_bytes = 2 << 30;
        small.gpu.busy_fraction = Some(0.9);
        let idle = container("web");
        let e = Published {
            snapshot: snapshot(0, vec![gpu(0)], vec![small, big, idle]),
            alerts: Vec::new(),
            xid_totals: BTreeMap::new(),
            accounting: Default::default(),
            recent: Default::default(),
        };
        let mut v = View::new(false);
        let order = |v: &View| -> Vec<String> {
            v.rows(&e.snapshot.workloads)
                .iter()
                .map(|w| w.name.clone())
                .collect()
        };
        assert_eq!(order(&v), ["big-job", "small-job", "web"]);
        assert!(v.key(key(KeyCode::Char('s'))));
        assert_eq!(order(&v), ["small-job", "big-job", "web"], "by GPU busy");
        v.key(key(KeyCode::Char('g')));
        assert_eq!(order(&v).len(), 2, "GPU holders only");
        v.key(key(KeyCode::Char('/')));
        for c in "SMALL".chars() {
            v.key(key(KeyCode::Char(c)));
        }
        v.key(key(KeyCode::Enter));
        assert_eq!(order(&v), ["small-job"]);
        let text = screen(&v, &e);
        assert!(
            text.contains("small-job") && !text.contains("big-job"),
            "{text}"
        );
        assert!(text.contains("filter \"SMALL\""), "{text}");
        assert!(text.contains("Fake") || text.contains("Test GPU"), "{text}");
        assert!(!v.key(key(KeyCode::Char('q'))));
    }

    #[test]
    fn enter_shows_the_selected_containers_why_and_esc_closes_it() {
        let judged = |name: &str, memory: u64, advice: &str| {
            let mut w = container(name);
            w.gpu.processes = 1;
            w.gpu.memory_bytes = memory;
            w.verdict = Some(crate::health::conditions::testing::verdict(
                crate::model::VerdictKind::InputBoundIo,
                advice,
            ));
            w
        };
        let e = Published {
            snapshot: snapshot(
                0,
                vec![gpu(0)],
                vec![
                    judged("first", 4 << 30, "advice of the first"),
                    judged("second", 2 << 30, "cache the dataset in RAM"),
                ],
            ),
            alerts: Vec::new(),
            xid_totals: BTreeMap::new(),
            accounting: Default::default(),
            recent: Default::default(),
        };
        let mut v = View::new(false);
        assert!(v.key(key(KeyCode::Down)));
        assert!(v.key(key(KeyCode::Enter)));
        let text = screen(&v, &e);
        assert!(text.contains("Why (Esc closes)"), "{text}");
        assert!(text.contains("advice: cache the dataset in RAM"), "{text}");
        assert!(!text.contains("advice of the first"), "{text}");
        // Esc closes the detail; a second Esc does not quit (q does).
        assert!(v.key(key(KeyCode::Esc)));
        assert!(!screen(&v, &e).contains("Why (Esc closes)"));
        assert!(v.key(key(KeyCode::Esc)));
        assert!(!v.key(key(KeyCode::Char('q'))));
        // A kept filter: Esc clears it.
        let mut v = View::new(false);
        for k in [KeyCode::Char('/'), KeyCode::Char('x'), KeyCode::Enter] {
            assert!(v.key(key(k)));
        }
        assert_eq!(v.filter, "x");
        assert!(v.key(key(KeyCode::Esc)));
        assert_eq!(v.filter, "");
        // Past the last row, the last stays selected.
        let mut v = View::new(false);
        for _ in 0..5 {
            v.key(key(KeyCode::Down));
        }
        v.key(key(KeyCode::Enter));
        assert!(screen(&v, &e).contains("cache the dataset in RAM"));
    }
}
