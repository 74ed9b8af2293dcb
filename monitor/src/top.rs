//! `gpuwatch top`: the live view people open instead of `nvidia-smi -l 1`. GPUs (utilisation,
//! memory, temperature, power against the cap) and containers (GPU memory, GPU busy, verdict,
//! alerts), redrawn each round, sortable and filterable from the keyboard. This module is the
//! view: its state, its keys and how it draws one round; `main` runs the loop.
use crate::health::alerts::{Alert, AlertState};
use crate::model::{VerdictKind, Workload};
use crate::output::prometheus::Exported;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;

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

    fn label(self) -> &'static str {
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

    /// Draws one round.
    pub fn draw(&self, f: &mut Frame, e: &Exported) {
        let s = &e.snapshot;
        let [head, gpus, containers, foot] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(s.gpus.len().max(1) as u16 + 3),
            Constraint::Min(3),
            Constraint::Length(1),
        ])
        .areas(f.area());
        let firing = e
            .alerts
            .iter()
            .filter(|a| a.state == AlertState::Firing)
            .count();
        let sources: Vec<Span> = [
            ("nvml", &s.sources.nvml),
            ("docker", &s.sources.docker),
            ("ebpf", &s.sources.ebpf),
        ]
        .iter()
        .map(|(n, st)| {
            let (text, color) = if st.up {
                (format!(" {n}:up"), Color::Green)
            } else {
                (format!(" {n}:down"), Color::Red)
            };
            Span::styled(text, self.style(Style::default().fg(color)))
        })
        .collect();
        let mut header = vec![Span::styled(
            format!(
                "gpuwatch top — {} — {}",
                s.host.hostname,
                s.taken_at.get(..19).unwrap_or(&s.taken_at)
            ),
            self.style(Style::default().add_modifier(Modifier::BOLD)),
        )];
        header.extend(sources);
        header.push(Span::styled(
            format!("  {firing} alert(s) firing"),
            self.style(Style::default().fg(if firing > 0 { Color::Red } else { Color::Gray })),
        ));
        f.render_widget(Paragraph::new(Line::from(header)), head);

        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let gpu_rows: Vec<Row> = s
            .gpus
            .iter()
            .map(|g| {
                let d = &g.device;
                let temp = d.temperature_celsius.map_or("-".into(), |t| format!("{t}"));
                let hot = d.temperature_celsius.is_some_and(|t| t > 83);
                Row::new(vec![
                    Cell::from(d.index.to_string()),
                    Cell::from(d.name.clone().unwrap_or_default()),
                    Cell::from(if d.lost {
                        "LOST".into()
                    } else {
                        // The window's busy share; the instantaneous reading until the first
                        // window is in.
                        g.busy.map(|b| b.fraction * 100.0).map_or_else(
                            || {
                                d.utilization_gpu_percent
                                    .map_or("-".into(), |u| format!("{u}%"))
                            },
                            |b| format!("{b:.0}%"),
                        )
                    }),
                    Cell::from(
                        g.sm_activity
                            .and_then(|a| a.sm_percent)
                            .map_or("-".into(), |v| format!("{v:.0}%")),
                    ),
                    Cell::from(match (d.memory_used_bytes, d.memory_total_bytes) {
                        (Some(u), Some(t)) => format!("{:.1}/{:.1} GiB", gib(u), gib(t)),
                        _ => "-".into(),
                    }),
                    Cell::from(temp).style(if hot {
                        self.style(Style::default().fg(Color::Red))
                    } else {
                        Style::default()
                    }),
                    Cell::from(match (d.power_watts, d.power_limit_watts) {
                        (Some(p), Some(l)) => format!("{p:.0}/{l:.0} W"),
                        _ => "-".into(),
                    }),
                    Cell::from(g.processes.len().to_string()),
                ])
            })
            .collect();
        let bold = self.style(Style::default().add_modifier(Modifier::BOLD));
        f.render_widget(
            Table::new(
                gpu_rows,
                [
                    Constraint::Length(4),
                    Constraint::Length(22),
                    Constraint::Length(6),
                    Constraint::Length(6),
                    Constraint::Length(18),
                    Constraint::Length(7),
                    Constraint::Length(12),
                    Constraint::Length(6),
                ],
            )
            .header(
                Row::new([
                    "GPU", "NAME", "BUSY", "SM", "MEMORY", "TEMP°C", "POWER", "PROCS",
                ])
                .style(bold),
            )
            .block(Block::default().borders(Borders::ALL).title(" GPUs ")),
            gpus,
        );

        let rows = self.rows(&s.workloads);
        let alerts_of = |w: &Workload| -> Vec<&Alert> {
            e.alerts
                .iter()
                .filter(|a| {
                    a.state == AlertState::Firing
                        && a.subject
                            .container
                            .as_ref()
                            .is_some_and(|c| c.workload == w.id)
                })
                .collect()
        };
        let container_rows: Vec<Row> = rows
            .iter()
            .map(|w| {
                let c = w.container.as_ref();
                let alerts = alerts_of(w);
                let verdict =
                    w.verdict
                        .as_ref()
                        .map_or(String::new(), |v| match v.input_bound_share {
                            Some(sh) if sh >= 0.005 => {
                                format!("{} ({:.0}%)", v.kind.label(), sh * 100.0)
                            }
                            _ => v.kind.label().to_owned(),
                        });
                let verdict_style = match w.verdict.as_ref().map(|v| v.kind) {
                    Some(VerdictKind::InputBoundIo | VerdictKind::InputBoundCpu) => {
                        Style::default().fg(Color::Yellow)
                    }
                    Some(VerdictKind::GpuBound) => Style::default().fg(Color::Green),
                    _ => Style::default(),
                };
                Row::new(vec![
                    Cell::from(w.name.clone()),
                    Cell::from(c.map(|c| c.image.clone()).unwrap_or_default()),
                    Cell::from(
                        c.and_then(|c| c.compose_service.clone())
                            .unwrap_or_default(),
                    ),
                    Cell::from(if w.gpu.processes == 0 {
                        "-".into()
                    } else {
                        format!("{:.2} GiB", gib(w.gpu.memory_bytes))
                    }),
                    Cell::from(
                        w.gpu
                            .busy_fraction
                            .map_or("-".into(), |b| format!("{:.0}%", b * 100.0)),
                    ),
                    Cell::from(verdict).style(self.style(verdict_style)),
                    Cell::from(if alerts.is_empty() {
                        String::new()
                    } else {
                        alerts.iter().map(|a| a.rule).collect::<Vec<_>>().join(",")
                    })
                    .style(self.style(Style::default().fg(Color::Red))),
                ])
            })
            .collect();
        let title = format!(
            " Containers ({} of {}) — sorted by {}{}{} ",
            rows.len(),
            s.workloads.len(),
            self.sort.label(),
            if self.reverse { ", reversed" } else { "" },
            if self.filter.is_empty() {
                String::new()
            } else {
                format!(", filter \"{}\"", self.filter)
            }
        );
        f.render_widget(
            Table::new(
                container_rows,
                [
                    Constraint::Min(16),
                    Constraint::Min(14),
                    Constraint::Length(12),
                    Constraint::Length(11),
                    Constraint::Length(6),
                    Constraint::Length(26),
                    Constraint::Min(10),
                ],
            )
            .header(
                Row::new([
                    "NAME", "IMAGE", "SERVICE", "GPU MEM", "BUSY", "VERDICT", "ALERTS",
                ])
                .style(bold),
            )
            .block(Block::default().borders(Borders::ALL).title(title)),
            containers,
        );
        let help = if self.editing {
            format!("filter: {}▏ (Enter: keep, Esc: clear)", self.filter)
        } else {
            "q quit · s sort · r reverse · / filter · g GPU holders only".to_owned()
        };
        f.render_widget(Paragraph::new(help), foot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{container, gpu, snapshot};
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

    fn screen(view: &View, e: &Exported) -> String {
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
        let e = Exported {
            snapshot: snapshot(0, vec![gpu(0)], vec![small, big, idle]),
            alerts: Vec::new(),
            xid_totals: BTreeMap::new(),
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
