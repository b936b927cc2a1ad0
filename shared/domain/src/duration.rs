//! Durations in configuration: `250ms`, `30s`, `5m`, `1h`, `30d`, or a bare number of seconds.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: use e.g. 250ms, 30s, 5m, 1h, 30d")]
pub struct InvalidDuration(pub String);

pub fn parse_duration(s: &str) -> Result<Duration, InvalidDuration> {
    let err = || InvalidDuration(s.to_owned());
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| err())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(err)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(err)?),
        "d" => Duration::from_secs(n.checked_mul(86_400).ok_or_else(err)?),
        _ => return Err(err()),
    };
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        for bad in ["", "s", "1.5s", "10x", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }
}
