//! Numbers and units as the verdict's sentences write them.

/// A share as a whole percentage: "42%".
pub fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// Milliseconds with one decimal, "-" where unknown.
pub fn ms(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.1}"))
}

/// A count of CPUs: "2 CPUs", "1 CPU", "1.5 CPUs".
pub fn cpus(n: f64) -> String {
    if (n - 1.0).abs() < 1e-9 {
        "1 CPU".to_owned()
    } else if n.fract().abs() < 1e-9 {
        format!("{n:.0} CPUs")
    } else {
        format!("{n:.1} CPUs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_and_cpus_read_as_people_write_them() {
        assert_eq!(pct(0.424), "42%");
        assert_eq!(pct(1.0), "100%");
        assert_eq!(ms(Some(12.34)), "12.3");
        assert_eq!(ms(None), "-");
        assert_eq!(cpus(1.0), "1 CPU");
        assert_eq!(cpus(2.0), "2 CPUs");
        assert_eq!(cpus(1.5), "1.5 CPUs");
    }
}
