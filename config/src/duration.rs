//! A human-friendly duration for config files: `"250ms"`, `"5s"`, `"2m"`, `"1h"`.
//!
//! Serialises back to the shortest exact unit so round-trips are stable.

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A duration with millisecond resolution, written as `<number><unit>` with unit `ms`, `s`,
/// `m` or `h`. A bare integer is read as milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

impl Duration {
    /// From whole milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Duration(std::time::Duration::from_millis(ms))
    }
    /// From whole seconds.
    pub const fn from_secs(s: u64) -> Self {
        Duration(std::time::Duration::from_secs(s))
    }
    /// The std duration.
    pub const fn get(self) -> std::time::Duration {
        self.0
    }
    /// True for a zero duration.
    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

/// Error for a duration string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: expected e.g. \"250ms\", \"5s\", \"2m\" or \"1h\"")]
pub struct DurationError(String);

impl FromStr for Duration {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| DurationError(s.to_string()))?;
        let ms = match unit.trim() {
            "" | "ms" => Some(n),
            "s" => n.checked_mul(1_000),
            "m" => n.checked_mul(60_000),
            "h" => n.checked_mul(3_600_000),
            _ => None,
        }
        .ok_or_else(|| DurationError(s.to_string()))?;
        Ok(Duration::from_millis(ms))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms != 0 && ms % 3_600_000 == 0 {
            write!(f, "{}h", ms / 3_600_000)
        } else if ms != 0 && ms % 60_000 == 0 {
            write!(f, "{}m", ms / 60_000)
        } else if ms != 0 && ms % 1_000 == 0 {
            write!(f, "{}s", ms / 1_000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"250ms\", \"5s\" or \"2m\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
                Ok(Duration::from_millis(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
                u64::try_from(v)
                    .map(Duration::from_millis)
                    .map_err(|_| E::custom("duration must not be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(
            "250ms".parse::<Duration>().unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!("5s".parse::<Duration>().unwrap(), Duration::from_secs(5));
        assert_eq!("2m".parse::<Duration>().unwrap(), Duration::from_secs(120));
        assert_eq!("1h".parse::<Duration>().unwrap(), Duration::from_secs(3600));
        assert_eq!("42".parse::<Duration>().unwrap(), Duration::from_millis(42));
        assert!("5x".parse::<Duration>().is_err());
        assert!("".parse::<Duration>().is_err());
        assert!("-5s".parse::<Duration>().is_err());
    }

    #[test]
    fn displays_shortest_exact_unit() {
        assert_eq!(Duration::from_millis(1500).to_string(), "1500ms");
        assert_eq!(Duration::from_secs(90).to_string(), "90s");
        assert_eq!(Duration::from_secs(120).to_string(), "2m");
        assert_eq!(Duration::from_secs(7200).to_string(), "2h");
        assert_eq!(Duration::from_millis(0).to_string(), "0ms");
    }
}
