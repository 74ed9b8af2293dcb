//! Units the config file and the outputs share: durations (`90s`, `5m`), byte sizes
//! (`512MiB`, `2GiB`) and times (RFC 3339). Imports nothing from the crate.
use serde::Deserialize;

/// `90s`, `5m`, `1h 30m`, `500ms` (humantime).
pub mod duration {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s)
            .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration ({e})")))
    }
}

/// A value that is not what its unit reads: a duration, an interval, a size.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("{0:?}: seconds must be a finite number, 0 or more")]
    Seconds(String),
    #[error("{input:?} is neither seconds nor a duration like 500ms or 2m ({why})")]
    Duration { input: String, why: String },
    #[error("{} is outside 100ms to 24h", humantime::format_duration(*.0))]
    Interval(std::time::Duration),
    #[error("{0:?} is not a size (like 512MiB or 2GiB)")]
    Size(String),
    #[error("unknown size unit {unit:?} in {input:?}")]
    SizeUnit { unit: String, input: String },
}

/// A command-line duration: a plain number is seconds (`--interval 1`, as `nvidia-smi -l 1` and
/// `gpustat -i 1` take it), anything else a humantime duration (`500ms`, `2m`).
pub fn seconds_or_duration(s: &str) -> Result<std::time::Duration, UnitError> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return std::time::Duration::try_from_secs_f64(secs)
            .map_err(|_| UnitError::Seconds(s.to_owned()));
    }
    humantime::parse_duration(t).map_err(|e| UnitError::Duration {
        input: s.to_owned(),
        why: e.to_string(),
    })
}

/// The shortest sampling interval: a round costs milliseconds of CPU, rounds wait for the GPU
/// series (every `nvml_series_interval`), and `interval: 1ns` kept `watch` at 100 % of a CPU
/// growing 175 MB/s with rounds held for the series.
pub const INTERVAL_MIN: std::time::Duration = std::time::Duration::from_millis(100);
/// The longest: a day. Further is no monitoring, and `interval: 300000000000y` overflowed the
/// watchdog's limit (three intervals) and panicked at start.
pub const INTERVAL_MAX: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Why `d` is no sampling interval, or `Ok`.
pub fn check_interval(d: std::time::Duration) -> Result<(), UnitError> {
    if (INTERVAL_MIN..=INTERVAL_MAX).contains(&d) {
        Ok(())
    } else {
        Err(UnitError::Interval(d))
    }
}

/// Bytes in a mebibyte, for figures shown in MiB (and rates in MiB/s).
pub const MIB_F64: f64 = ByteSize::MIB as f64;
/// Bytes in a gibibyte, for figures shown in GiB.
pub const GIB_F64: f64 = ByteSize::GIB as f64;

/// `bytes` in MiB.
pub fn mib(bytes: f64) -> f64 {
    bytes / MIB_F64
}

/// `bytes` in GiB.
pub fn gib(bytes: f64) -> f64 {
    bytes / GIB_F64
}

/// A size in bytes: a plain integer, or a number with a unit (`512MiB`, `2GiB`, `1.5GB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const MIB: u64 = 1 << 20;
    pub const GIB: u64 = 1 << 30;

    pub fn parse(s: &str) -> Result<Self, UnitError> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        let number: f64 = number.parse().map_err(|_| UnitError::Size(s.to_owned()))?;
        let scale = match unit.trim() {
            "" | "B" => 1.0,
            "KiB" => 1024.0,
            "MiB" => Self::MIB as f64,
            "GiB" => Self::GIB as f64,
            "TiB" => (1u64 << 40) as f64,
            "KB" | "kB" => 1e3,
            "MB" => 1e6,
            "GB" => 1e9,
            "TB" => 1e12,
            other => {
                return Err(UnitError::SizeUnit {
                    unit: other.to_owned(),
                    input: s.to_owned(),
                })
            }
        };
        Ok(Self((number * scale).round() as u64))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Self(n)),
            Raw::Text(s) => Self::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0 as f64;
        if self.0 >= Self::GIB {
            write!(f, "{:.1} GiB", b / Self::GIB as f64)
        } else if self.0 < Self::MIB {
            write!(f, "{:.0} KiB", b / 1024.0)
        } else {
            write!(f, "{:.0} MiB", b / Self::MIB as f64)
        }
    }
}

/// RFC 3339 (UTC) of a Unix time in milliseconds; empty if out of range.
pub fn rfc3339(unix_ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bare_number_is_seconds_and_units_still_work() {
        assert_eq!(seconds_or_duration("1"), Ok(Duration::from_secs(1)));
        assert_eq!(seconds_or_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(seconds_or_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(seconds_or_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["-1", "NaN", "inf", "1 parsec", ""] {
            assert!(seconds_or_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(ByteSize::parse("2GiB"), Ok(ByteSize(2 << 30)));
        assert_eq!(ByteSize::parse("1.5 GB"), Ok(ByteSize(1_500_000_000)));
        assert_eq!(ByteSize::parse("4096"), Ok(ByteSize(4096)));
        assert!(ByteSize::parse("2 parsecs").is_err());
    }
}
