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
            KeyCode::Char('q') | KeyCode::Esc => return false,
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
}
