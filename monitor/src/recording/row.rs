//! One row of a CSV recording, for the writer and the reader alike: one long table with a
//! `record` column (`gpu`, `workload`, `alert`), so a spreadsheet or pandas reads it directly.
//! The columns are this struct's fields, in order (docs/snapshot-schema.md lists them). Every
//! column may be missing (a recording from an older gpuwatch reads); an empty cell is a value
//! that could not be measured.
use crate::health::alerts::AlertState;
use crate::model::VerdictKind;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Row {
    /// RFC 3339.
    pub timestamp: String,
    #[serde(with = "number")]
    pub unix_ms: Option<f64>,
    #[serde(with = "label")]
    pub record: Option<Record>,
    /// A GPU row's index; the GPUs a workload held, or an alert's GPU.
    #[serde(with = "index_list")]
    pub gpu_index: Vec<u32>,
    #[serde(with = "text")]
    pub gpu_uuid: String,
    #[serde(with = "text")]
    pub gpu_name: String,
    #[serde(with = "number")]
    pub utilization_gpu_percent: Option<f64>,
    #[serde(with = "number")]
    pub memory_used_bytes: Option<f64>,
    #[serde(with = "number")]
    pub memory_total_bytes: Option<f64>,
    #[serde(with = "number")]
    pub temperature_celsius: Option<f64>,
    #[serde(with = "number")]
    pub power_watts: Option<f64>,
    #[serde(with = "number")]
    pub power_limit_watts: Option<f64>,
    /// Joules over the window: a GPU row's whole energy; a workload row's part of its GPUs'
    /// (busy and idle together).
    #[serde(with = "number")]
    pub energy_joules: Option<f64>,
    /// A workload row's part of its GPUs' energy while they idled.
    #[serde(with = "number")]
    pub idle_energy_joules: Option<f64>,
    #[serde(with = "number")]
    pub sm_clock_mhz: Option<f64>,
    /// `|`-separated.
    pub clocks_event_reasons: String,
    #[serde(with = "text")]
    pub workload_id: String,
    #[serde(with = "text")]
    pub workload_name: String,
    #[serde(with = "text")]
    pub image: String,
    #[serde(with = "text")]
    pub compose_service: String,
    /// `namespace/pod`.
    #[serde(with = "text")]
    pub pod: String,
    #[serde(with = "number")]
    pub gpu_memory_bytes: Option<f64>,
    #[serde(with = "number")]
    pub gpu_busy_fraction: Option<f64>,
    /// How the busy share was measured (the snapshot's `busy.source`).
    pub busy_source: String,
    /// How a shared GPU's busy time was divided (`busy.split`).
    pub busy_split: String,
    #[serde(with = "number")]
    pub sm_activity_percent: Option<f64>,
    #[serde(with = "number")]
    pub tensor_activity_percent: Option<f64>,
    /// A GPU row's PCIe traffic, host to device and device to host.
    #[serde(with = "number")]
    pub pcie_rx_bytes_per_second: Option<f64>,
    #[serde(with = "number")]
    pub pcie_tx_bytes_per_second: Option<f64>,
    #[serde(with = "number")]
    pub cpu_cores: Option<f64>,
    #[serde(with = "number")]
    pub memory_bytes: Option<f64>,
    #[serde(with = "label")]
    pub verdict: Option<VerdictKind>,
    #[serde(with = "number")]
    pub input_bound_share: Option<f64>,
    /// The host-side verdict's share (see the snapshot's `verdict.host_bound_share`).
    #[serde(with = "number")]
    pub host_bound_share: Option<f64>,
    /// The workload's CUDA calls in the window, where traced: kernel launches a second, bytes a
    /// second copied each way, and its training loop's share of the window in copies and in
    /// synchronisations.
    #[serde(with = "number")]
    pub cuda_launches_per_second: Option<f64>,
    #[serde(with = "number")]
    pub cuda_h2d_bytes_per_second: Option<f64>,
    #[serde(with = "number")]
    pub cuda_d2h_bytes_per_second: Option<f64>,
    #[serde(with = "number")]
    pub copy_share: Option<f64>,
    #[serde(with = "number")]
    pub sync_share: Option<f64>,
    #[serde(with = "number")]
    pub oom_batch_scale: Option<f64>,
    /// The GPU of a distributed job's rank the others wait for.
    #[serde(with = "number")]
    pub straggler_gpu: Option<f64>,
    /// The verdict's advice, on the rows where the workload's verdict changes (empty while it
    /// stays the same: a day at 1 Hz would repeat it 86,400 times).
    #[serde(with = "text")]
    pub advice: String,
    pub alert_rule: String,
    #[serde(with = "label")]
    pub alert_state: Option<AlertState>,
    #[serde(with = "text")]
    pub alert_summary: String,
}

/// What a row records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Gpu,
    Workload,
    Alert,
}

impl Record {
    const ALL: [Self; 3] = [Self::Gpu, Self::Workload, Self::Alert];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::Workload => "workload",
            Self::Alert => "alert",
        }
    }
}

impl std::fmt::Display for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `record` cell that names no record type.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown record type {0:?} (gpu, workload or alert)")]
pub struct UnknownRecord(pub String);

impl std::str::FromStr for Record {
    type Err = UnknownRecord;

    fn from_str(s: &str) -> Result<Self, UnknownRecord> {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownRecord(s.to_owned()))
    }
}

impl Row {
    /// The columns, in order: the struct's fields as serde sees them.
    pub fn columns() -> &'static [&'static str] {
        struct_fields::<Row>()
    }

    /// A row from (column, cell) pairs; a column this gpuwatch does not write is ignored, one
    /// it writes and the file lacks is empty.
    pub fn from_cells<'a>(
        cells: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, BadCell> {
        let cells = serde::de::value::MapDeserializer::<_, serde::de::value::Error>::new(cells);
        serde_path_to_error::deserialize(cells).map_err(|e| BadCell {
            column: e.path().to_string(),
            message: e.into_inner().to_string(),
        })
    }
}

/// A cell that does not hold what its column does.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("column {column}: {message}")]
pub struct BadCell {
    pub column: String,
    pub message: String,
}

/// A number cell: empty when absent, written as Rust writes the number (`10737418240`, `0.5`).
/// Reading refuses `inf`, `NaN` and `1e309`: no gauge is infinite, and a chart's axis over one
/// never ends.
mod number {
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        let t = String::deserialize(d)?;
        if t.is_empty() {
            return Ok(None);
        }
        // Every figure the writer puts in a cell is a count, a size, a share, a rate, a
        // reading or a time: none is below 0.
        match t.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(Some(v)),
            Ok(v) if v < 0.0 => Err(de::Error::custom(format!("{t:?} is negative"))),
            Ok(_) => Err(de::Error::custom(format!("{t:?} is not a finite number"))),
            Err(_) => Err(de::Error::custom(format!("{t:?} is not a number"))),
        }
    }
}

/// A text cell whose content tenants control (names, images, ids, summaries): one a
/// spreadsheet would run as a formula is written with a leading `'`, which reading takes off.
mod text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &str, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::spreadsheet(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Ok(super::unspreadsheet(&String::deserialize(d)?).to_owned())
    }
}

/// GPU indices, `|`-separated (`0|1`).
mod index_list {
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u32], s: S) -> Result<S::Ok, S::Error> {
        let list: Vec<String> = v.iter().map(u32::to_string).collect();
        s.serialize_str(&list.join("|"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
        String::deserialize(d)?
            .split('|')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().map_err(|_| de::Error::custom(format!("{s:?}"))))
            .collect()
    }
}

/// A value spelled by its own `Display` and `FromStr` (a verdict, an alert state); empty when
/// absent.
mod label {
    use serde::{de, Deserialize, Deserializer, Serializer};
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let t = String::deserialize(d)?;
        if t.is_empty() {
            return Ok(None);
        }
        t.parse().map(Some).map_err(de::Error::custom)
    }
}

/// The characters that make a spreadsheet read a cell as a formula (OWASP's list), and the
/// quote that marks a cell as escaped.
const FORMULA_START: [char; 7] = ['=', '+', '-', '@', '\t', '\r', '\''];

/// A cell that a spreadsheet would run as a formula (`=`, `+`, `-`, `@`, a tab or CR first)
/// gets a leading `'`, as does one that starts with `'` itself, so [`unspreadsheet`] gives back
/// exactly what was written.
fn spreadsheet(s: &str) -> std::borrow::Cow<'_, str> {
    if s.starts_with(FORMULA_START) {
        format!("'{s}").into()
    } else {
        s.into()
    }
}

/// The inverse of [`spreadsheet`].
fn unspreadsheet(s: &str) -> &str {
    match s.strip_prefix('\'') {
        Some(rest) if rest.starts_with(FORMULA_START) => rest,
        _ => s,
    }
}

/// The field names serde's derive declares for `T`, in order: `T::deserialize` hands them to
/// the deserializer, which stops there.
fn struct_fields<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    struct Fields(&'static [&'static str]);
    impl<'de> de::Deserializer<'de> for &mut Fields {
        type Error = de::value::Error;
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = fields;
            Err(de::Error::custom("fields read"))
        }
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut fields = Fields(&[]);
    let _ = T::deserialize(&mut fields);
    fields.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_columns_are_the_fields_in_order() {
        let columns = Row::columns();
        assert_eq!(columns.len(), 45);
        assert_eq!(&columns[..3], ["timestamp", "unix_ms", "record"]);
        assert_eq!(columns.last(), Some(&"alert_summary"));
        // The header the csv crate writes for a row is the same list.
        let mut w = csv::Writer::from_writer(Vec::new());
        w.serialize(Row::default()).unwrap();
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        assert_eq!(text.lines().next().unwrap(), columns.join(","));
    }

    /// docs/snapshot-schema.md's CSV section names every column.
    #[test]
    fn the_schema_names_every_column() {
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/snapshot-schema.md"),
        )
        .expect("docs/snapshot-schema.md");
        let csv = &docs[docs.find("## CSV").expect("a CSV section")..];
        let words: Vec<&str> = csv
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .collect();
        for column in Row::columns() {
            assert!(
                words.contains(column),
                "the CSV section does not name {column}"
            );
        }
    }

    #[test]
    fn a_formula_is_quoted_and_reads_back_exactly() {
        for name in [
            "=HYPERLINK(\"x\")",
            "+1",
            "-2+3",
            "@SUM(A1)",
            "\tx",
            "\rx",
            "'=x",
            "'plain",
        ] {
            let cell = spreadsheet(name);
            assert!(cell.starts_with('\''), "{name:?} -> {cell:?}");
            assert_eq!(unspreadsheet(&cell), name);
        }
        for name in ["train", "yolo=v8", "a-b", ""] {
            assert_eq!(spreadsheet(name), name);
            assert_eq!(unspreadsheet(name), name);
        }
    }
}
