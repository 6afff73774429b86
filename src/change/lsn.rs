//! Log sequence numbers: the positions that tie the source, the WAL and Iceberg
//! commits together for exactly-once delivery.

use std::fmt;

/// A Postgres LSN, printed as `XXX/XXX` like Postgres does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (hi, lo) = s
            .split_once('/')
            .ok_or_else(|| format!("`{s}` is not an LSN (expected XXX/XXX)"))?;
        let hi = u64::from_str_radix(hi, 16).map_err(|_| format!("`{s}` is not an LSN"))?;
        let lo = u64::from_str_radix(lo, 16).map_err(|_| format!("`{s}` is not an LSN"))?;
        if hi > u32::MAX as u64 || lo > u32::MAX as u64 {
            return Err(format!("`{s}` is not an LSN"));
        }
        Ok(Lsn(hi << 32 | lo))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let l = Lsn::parse("16/B374D848").unwrap();
        assert_eq!(l.to_string(), "16/B374D848");
        assert!(Lsn::parse("nope").is_err());
    }
}
