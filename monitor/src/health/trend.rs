//! A bounded time series and its least-squares line: a leak is sustained, near-linear growth,
//! not two samples that differ.
use std::collections::VecDeque;

/// The points of the last `window` seconds.
#[derive(Clone, Debug, Default)]
pub struct Series {
    points: VecDeque<(f64, f64)>,
}

/// The fitted line over a series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// Units per second.
    pub slope: f64,
    /// Coefficient of determination, 0–1: how well a line explains the points.
    pub r_squared: f64,
    /// Seconds between the first and the last point.
    pub span: f64,
    pub points: usize,
}

impl Series {
    /// Adds a point at `t` seconds and drops those older than `window` seconds before it.
    pub fn push(&mut self, t: f64, value: f64, window: f64) {
        if self.points.back().is_some_and(|(last, _)| t < *last) {
            // The clock went back: start over rather than fit across the jump.
            self.points.clear();
        }
        self.points.push_back((t, value));
        while self.points.front().is_some_and(|(t0, _)| t - t0 > window) {
            self.points.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    pub fn last(&self) -> Option<f64> {
        self.points.back().map(|(_, v)| *v)
    }

    /// The least-squares line, from three points on; `None` before that or with no time spread.
    pub fn fit(&self) -> Option<Fit> {
        let n = self.points.len();
        if n < 3 {
            return None;
        }
        // Centre on the first point: timestamps are large and their squares lose precision.
        let (t0, v0) = *self.points.front()?;
        let nf = n as f64;
        let (mut st, mut sv) = (0.0, 0.0);
        for (t, v) in &self.points {
            st += t - t0;
            sv += v - v0;
        }
        let (mt, mv) = (st / nf, sv / nf);
        let (mut stt, mut stv, mut svv) = (0.0, 0.0, 0.0);
        for (t, v) in &self.points {
            let (dt, dv) = (t - t0 - mt, v - v0 - mv);
            stt += dt * dt;
            stv += dt * dv;
            svv += dv * dv;
        }
        if stt <= 0.0 {
            return None;
        }
        let slope = stv / stt;
        // A flat series is perfectly explained by its (flat) line.
        let r_squared = if svv <= 0.0 {
            1.0
        } else {
            (stv * stv / (stt * svv)).clamp(0.0, 1.0)
        };
        let span = self.points.back()?.0 - t0;
        Some(Fit {
            slope,
            r_squared,
            span,
            points: n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_growth_fits_a_line() {
        let mut s = Series::default();
        for i in 0..20 {
            s.push(
                1_700_000_000.0 + f64::from(i),
                1e9 + 5e6 * f64::from(i),
                60.0,
            );
        }
        let f = s.fit().expect("fit");
        assert!((f.slope - 5e6).abs() < 1.0, "{f:?}");
        assert!(f.r_squared > 0.999, "{f:?}");
        assert_eq!(f.span, 19.0);
    }

    #[test]
    fn noise_and_steps_fit_poorly() {
        let mut s = Series::default();
        // A sawtooth: allocations freed again, no leak.
        for i in 0..40 {
            s.push(f64::from(i), if i % 2 == 0 { 0.0 } else { 1e9 }, 600.0);
        }
        let f = s.fit().expect("fit");
        assert!(f.r_squared < 0.1, "{f:?}");
    }

    #[test]
    fn window_drops_old_points() {
        let mut s = Series::default();
        for i in 0..100 {
            s.push(f64::from(i), 0.0, 10.0);
        }
        assert_eq!(s.len(), 11);
        assert_eq!(s.fit().map(|f| f.span), Some(10.0));
        s.push(5.0, 1.0, 10.0); // clock went back
        assert_eq!(s.len(), 1);
        assert!(s.fit().is_none());
    }
}
