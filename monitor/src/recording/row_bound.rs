//! A recording's rows are read at most [`ROW_MAX_BYTES`] each. A file without line breaks (a
//! 200-MB blob, a sparse 4-GB file, `/dev/zero`) or one line of 200 MB grew the reader's line
//! buffer with it: 791 MB resident before the error, 12.6 GB for the sparse file, 10.9 GB in
//! 30 s on `/dev/zero`. Past the bound the reader stops with an error naming the line, and the
//! memory it held is one row's.

use std::io::{self, Read};

/// The most bytes one row (a CSV record, a JSON Lines snapshot) may take: four times the
/// writer's longest, a snapshot of 1,000 containers on 8 GPUs with every tenant string at its
/// cut (1,024 characters), 7.8 MB as JSON.
pub const ROW_MAX_BYTES: u64 = 32 << 20;

/// `R`, read until one row has taken more than [`ROW_MAX_BYTES`]; it also remembers the last
/// byte it passed on (a last row without its line break was never finished).
pub struct RowBound<R> {
    inner: R,
    /// Bytes passed on since the current row began.
    in_row: u64,
    /// The row ran past the bound.
    over: bool,
    pub last: Option<u8>,
}

impl<R> RowBound<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            in_row: 0,
            over: false,
            last: None,
        }
    }

    /// A row ended: the next one starts its count. (The parser's read-ahead, a buffer at most,
    /// counts toward the next row.)
    pub fn row_ended(&mut self) {
        self.in_row = 0;
    }

    /// Whether a row ran past the bound, which ended the reading.
    pub fn over(&self) -> bool {
        self.over
    }
}

impl<R: Read> Read for RowBound<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.in_row > ROW_MAX_BYTES {
            self.over = true;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a row longer than {} MiB", ROW_MAX_BYTES >> 20),
            ));
        }
        let n = self.inner.read(buf)?;
        self.in_row += n as u64;
        if n > 0 {
            self.last = Some(buf[n - 1]);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_past_the_bound_stops_the_reading_and_a_new_row_counts_anew() {
        let mut r = RowBound::new(io::repeat(b'x'));
        let mut buf = vec![0u8; 1 << 20];
        let mut read = 0u64;
        let err = loop {
            match r.read(&mut buf) {
                Ok(n) => read += n as u64,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(r.over());
        assert!((ROW_MAX_BYTES..=ROW_MAX_BYTES + (1 << 20)).contains(&read));

        let mut r = RowBound::new(io::repeat(b'x'));
        for _ in 0..3 * (ROW_MAX_BYTES >> 20) {
            r.read_exact(&mut buf).unwrap();
            r.row_ended();
        }
        assert!(!r.over());
        assert_eq!(r.last, Some(b'x'));
    }
}
