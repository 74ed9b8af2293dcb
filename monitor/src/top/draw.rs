//! How `top` draws one published round: a header line (host, time, sources, alerts firing), the
//! GPU table, the container table, and a line of keys.
use super::View;
use crate::health::alerts::{Alert, AlertState};
use crate::model::{Gpu, Snapshot, VerdictKind, Workload};
use crate::output::published::Published;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;

fn gib(b: u64) -> f64 {
    crate::units::gib(b as f64)
}

impl View {
    /// Draws one round.
    pub fn draw(&self, f: &mut Frame<'_>, e: &Published) {
        let s = &e.snapshot;
        let [head, gpus, containers, foot] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(s.gpus.len().max(1) as u16 + 3),
            Constraint::Min(3),
            Constraint::Length(1),
        ])
        .areas(f.area());
        f.render_widget(Paragraph::new(self.header(e)), head);
        self.draw_gpus(f, s, gpus);
        self.draw_containers(f, e, containers);
        let help = if self.editing {
            format!("filter: {}▏ (Enter: keep, Esc: clear)", self.filter)
        } else if self.detail {
            "Esc closes · ↑↓ another container · q quit".to_owned()
        } else {
            // Within 80 columns.
            "q quit · ↑↓ Enter why · s sort · r reverse · / filter · Esc clear · g GPUs".to_owned()
        };
        f.render_widget(Paragraph::new(help), foot);
    }

    /// Host, time, each source's state, the alerts firing.
    fn header(&self, e: &Published) -> Line<'static> {
        let s = &e.snapshot;
        let firing = e
            .alerts
            .iter()
            .filter(|a| a.state == AlertState::Firing)
            .count();
        let mut header = vec![Span::styled(
            format!(
                "gpuwatch top — {} — {}",
                s.host.hostname,
                s.taken_at.get(..19).unwrap_or(&s.taken_at)
            ),
            self.style(Style::default().add_modifier(Modifier::BOLD)),
        )];
        for (n, st) in [
            ("nvml", &s.sources.nvml),
            ("docker", &s.sources.docker),
            ("ebpf", &s.sources.ebpf),
        ] {
            let (text, color) = if st.up {
                (format!(" {n}:up"), Color::Green)
            } else {
                (format!(" {n}:down"), Color::Red)
            };
            header.push(Span::styled(text, self.style(Style::default().fg(color))));
        }
        header.push(Span::styled(
            format!("  {firing} alert(s) firing"),
            self.style(Style::default().fg(if firing > 0 { Color::Red } else { Color::Gray })),
        ));
        Line::from(header)
    }

    fn draw_gpus(&self, f: &mut Frame<'_>, s: &Snapshot, area: Rect) {
        let rows: Vec<Row<'_>> = s.gpus.iter().map(|g| self.gpu_row(g)).collect();
        let widths = [4, 22, 6, 6, 18, 7, 12, 6, 16].map(Constraint::Length);
        let header = [
            "GPU",
            "NAME",
            "BUSY",
            "SM",
            "MEMORY",
            "TEMP°C",
            "POWER",
            "PROCS",
            "PCIE IN/OUT",
        ];
        f.render_widget(
            Table::new(rows, widths)
                .header(Row::new(header).style(self.bold()))
                .block(Block::default().borders(Borders::ALL).title(" GPUs ")),
            area,
        );
    }

    fn gpu_row(&self, g: &Gpu) -> Row<'static> {
        let d = &g.device;
        let temp = d.temperature_celsius.map_or("-".into(), |t| format!("{t}"));
        let hot = d.temperature_celsius.is_some_and(|t| t > 83);
        let busy = if d.lost {
            "LOST".into()
        } else {
            // The window's busy share; the instantaneous reading until the first window is in.
            g.busy.map(|b| b.fraction * 100.0).map_or_else(
                || {
                    d.utilization_gpu_percent
                        .map_or("-".into(), |u| format!("{u}%"))
                },
                |b| format!("{b:.0}%"),
            )
        };
        Row::new(vec![
            Cell::from(d.index.to_string()),
            Cell::from(d.name.clone().unwrap_or_default()),
            Cell::from(busy),
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
            Cell::from(g.pcie.map_or("-".into(), |p| {
                format!(
                    "{:.1}/{:.1} GB/s",
                    p.rx_bytes_per_second / 1e9,
                    p.tx_bytes_per_second / 1e9
                )
            })),
        ])
    }

    fn draw_containers(&self, f: &mut Frame<'_>, e: &Published, area: Rect) {
        let s = &e.snapshot;
        let shown = self.rows(&s.workloads);
        let selected = self.selected.min(shown.len().saturating_sub(1));
        let (area, detail) = match shown.get(selected).filter(|_| self.detail) {
            Some(w) => {
                let [table, why] =
                    Layout::vertical([Constraint::Min(4), Constraint::Percentage(55)]).areas(area);
                (table, Some((w, why)))
            }
            None => (area, None),
        };
        if let Some((w, why_area)) = detail {
            self.draw_why(f, w, why_area);
        }
        let rows: Vec<Row<'_>> = shown
            .iter()
            .map(|w| self.container_row(w, &e.alerts))
            .collect();
        let title = format!(
            " Containers ({} of {}) — sorted by {}{}{} ",
            shown.len(),
            s.workloads.len(),
            self.sort.label(),
            if self.reverse { ", reversed" } else { "" },
            if self.filter.is_empty() {
                String::new()
            } else {
                format!(", filter \"{}\"", self.filter)
            }
        );
        let widths = [
            Constraint::Min(16),
            Constraint::Min(14),
            Constraint::Length(12),
            Constraint::Length(11),
            Constraint::Length(6),
            Constraint::Length(26),
            Constraint::Min(10),
        ];
        let header = [
            "NAME", "IMAGE", "SERVICE", "GPU MEM", "BUSY", "VERDICT", "ALERTS",
        ];
        let mut state = ratatui::widgets::TableState::default().with_selected(Some(selected));
        f.render_stateful_widget(
            Table::new(rows, widths)
                .header(Row::new(header).style(self.bold()))
                .row_highlight_style(self.style(Style::default().add_modifier(Modifier::REVERSED)))
                .block(Block::default().borders(Borders::ALL).title(title)),
            area,
            &mut state,
        );
    }

    /// The selected workload's verdict, evidence and advice, as `gpuwatch why` prints them.
    fn draw_why(&self, f: &mut Frame<'_>, w: &Workload, area: Rect) {
        let text = crate::output::why::render(&[w]);
        f.render_widget(
            Paragraph::new(text)
                .wrap(ratatui::widgets::Wrap { trim: false })
                .block(
                    Block::default()
                        .borders(Borders::ALL)
                        .title(" Why (Esc closes) "),
                ),
            area,
        );
    }

    fn container_row(&self, w: &Workload, alerts: &[Alert]) -> Row<'static> {
        let c = w.container.as_ref();
        let firing: Vec<&str> = alerts
            .iter()
            .filter(|a| {
                a.state == AlertState::Firing
                    && a.subject
                        .container
                        .as_ref()
                        .is_some_and(|c| c.workload == w.id)
            })
            .map(|a| a.rule)
            .collect();
        let verdict = w
            .verdict
            .as_ref()
            .map_or(String::new(), |v| match v.input_bound_share {
                Some(sh) if sh >= 0.005 => format!("{} ({:.0}%)", v.kind.label(), sh * 100.0),
                _ => v.kind.label().to_owned(),
            });
        let verdict_style = match w.verdict.as_ref().map(|v| v.kind) {
            Some(
                VerdictKind::InputBoundIo
                | VerdictKind::InputBoundCpu
                | VerdictKind::InputBoundMemory,
            ) => Style::default().fg(Color::Yellow),
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
            Cell::from(firing.join(",")).style(self.style(Style::default().fg(Color::Red))),
        ])
    }

    fn bold(&self) -> Style {
        self.style(Style::default().add_modifier(Modifier::BOLD))
    }
}
