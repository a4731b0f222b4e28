//! Human-written quantities in job specs: durations (`30s`, `5m`, `250ms`) and byte
//! sizes (`512MiB`, `2GiB`). Both serialize back to the same text form.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as a number and a unit: `ms`, `s`, `m`, `h`, `d`.
/// Several parts may be joined: `1m30s`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(pub std::time::Duration);

/// A size in bytes written as a number and a unit: `B`, `KiB`, `MiB`, `GiB`, `TiB`,
/// `PiB` (also the decimal `KB`, `MB`, `GB`, `TB`, `PB`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

/// Why a duration or size could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("empty value: write a number and a unit, e.g. {example}")]
    Empty { example: &'static str },
    #[error("`{text}` is not a {kind}: write a number and a unit, e.g. {example}")]
    Malformed {
        text: String,
        kind: &'static str,
        example: &'static str,
    },
    #[error("`{text}` has unknown unit `{unit}`; use one of {known}")]
    UnknownUnit {
        text: String,
        unit: String,
        known: &'static str,
    },
    #[error("`{text}` is too large")]
    Overflow { text: String },
}

/// A config setting (a file key or a flag) whose text did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{field}`: {message}")]
pub struct SettingError {
    /// The setting's name, e.g. `lease`.
    pub field: &'static str,
    /// What is wrong with its text and how to write it.
    pub message: String,
}

/// Reads an optional setting written as a `Duration` or `ByteSize`: `default` when
/// it is absent, else its text parsed; the error names `field`. Config loaders of
/// every daemon read their durations and sizes through this.
pub fn setting<T>(field: &'static str, text: Option<&str>, default: T) -> Result<T, SettingError>
where
    T: FromStr<Err = UnitError>,
{
    match text {
        None => Ok(default),
        Some(t) => t.parse().map_err(|e: UnitError| SettingError {
            field,
            message: e.to_string(),
        }),
    }
}

const DURATION_UNITS: &str = "ms, s, m, h, d";
const SIZE_UNITS: &str = "B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB";

impl Duration {
    /// A duration of whole seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Duration(std::time::Duration::from_secs(secs))
    }

    /// A duration of milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Duration(std::time::Duration::from_millis(ms))
    }

    /// The std duration.
    pub const fn get(self) -> std::time::Duration {
        self.0
    }
}

impl ByteSize {
    /// Mebibytes.
    pub const fn mib(n: u64) -> Self {
        ByteSize(n * 1024 * 1024)
    }

    /// Bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

/// Splits `1m30s` into `[(1, "m"), (30, "s")]`.
fn split_parts<'a>(
    text: &'a str,
    kind: &'static str,
    example: &'static str,
) -> Result<Vec<(u64, &'a str)>, UnitError> {
    let malformed = || UnitError::Malformed {
        text: text.to_string(),
        kind,
        example,
    };
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(UnitError::Empty { example });
    }
    let mut parts = Vec::new();
    let mut rest = trimmed;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(malformed());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| UnitError::Overflow {
            text: text.to_string(),
        })?;
        rest = rest[digits..].trim_start();
        let unit_len = rest.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
        parts.push((number, &rest[..unit_len]));
        rest = rest[unit_len..].trim_start();
    }
    Ok(parts)
}

impl FromStr for Duration {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let example = "30s or 5m";
        let mut total_ms: u64 = 0;
        for (number, unit) in split_parts(text, "duration", example)? {
            let factor: u64 = match unit {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                "" => {
                    return Err(UnitError::Malformed {
                        text: text.to_string(),
                        kind: "duration",
                        example,
                    })
                }
                other => {
                    return Err(UnitError::UnknownUnit {
                        text: text.to_string(),
                        unit: other.to_string(),
                        known: DURATION_UNITS,
                    })
                }
            };
            total_ms = number
                .checked_mul(factor)
                .and_then(|ms| total_ms.checked_add(ms))
                .ok_or_else(|| UnitError::Overflow {
                    text: text.to_string(),
                })?;
        }
        Ok(Duration::from_millis(total_ms))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms == 0 {
            return write!(f, "0s");
        }
        for (unit, size) in [
            ("d", 86_400_000u128),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1_000),
        ] {
            if ms.is_multiple_of(size) {
                return write!(f, "{}{unit}", ms / size);
            }
        }
        write!(f, "{ms}ms")
    }
}

impl FromStr for ByteSize {
    type Err = UnitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let example = "512MiB or 2GiB";
        let mut total: u64 = 0;
        for (number, unit) in split_parts(text, "size", example)? {
            let factor: u64 = match unit {
                "B" | "" => 1,
                "KiB" | "K" | "k" => 1 << 10,
                "MiB" | "M" => 1 << 20,
                "GiB" | "G" => 1 << 30,
                "TiB" | "T" => 1 << 40,
                "PiB" | "P" => 1 << 50,
                "KB" | "kB" => 1_000,
                "MB" => 1_000_000,
                "GB" => 1_000_000_000,
                "TB" => 1_000_000_000_000,
                "PB" => 1_000_000_000_000_000,
                other => {
                    return Err(UnitError::UnknownUnit {
                        text: text.to_string(),
                        unit: other.to_string(),
                        known: SIZE_UNITS,
                    })
                }
            };
            total = number
                .checked_mul(factor)
                .and_then(|b| total.checked_add(b))
                .ok_or_else(|| UnitError::Overflow {
                    text: text.to_string(),
                })?;
        }
        Ok(ByteSize(total))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b == 0 {
            return write!(f, "0B");
        }
        for (unit, size) in [
            ("PiB", 1u64 << 50),
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ] {
            if b.is_multiple_of(size) {
                return write!(f, "{}{unit}", b / size);
            }
        }
        write!(f, "{b}B")
    }
}

/// A size for people: the largest unit that fits, with at most one decimal and no
/// `.0` (`64MiB`, `23.1GiB`, and `10GiB` for 9.98 GiB), so that sizes side by side
/// (free beside total) read alike. The web UI's `humanBytes` (ui/src/dom.ts) is
/// the same rule.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if n >= size {
            if n.is_multiple_of(size) {
                return format!("{}{unit}", n / size);
            }
            let text = format!("{:.1}", n as f64 / size as f64);
            let text = text.strip_suffix(".0").unwrap_or(&text);
            return format!("{text}{unit}");
        }
    }
    format!("{n}B")
}

/// The OpenAPI schema of a value written as text: a string, described, with an example.
pub fn text_schema(
    description: &str,
    example: &str,
) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .description(Some(description))
        .examples([serde_json::Value::from(example)])
        .into()
}

/// Accepts a string with a unit, or a bare number meaning `default_unit`.
macro_rules! unit_serde {
    ($ty:ty, $bare:expr) => {
        impl utoipa::PartialSchema for $ty {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                text_schema(
                    concat!("a number with a unit, e.g. ", $bare),
                    $bare.trim_matches('"'),
                )
            }
        }

        impl utoipa::ToSchema for $ty {}

        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                #[serde(untagged)]
                enum Raw {
                    Text(String),
                    Number(u64),
                }
                match Raw::deserialize(d).map_err(|_| {
                    serde::de::Error::custom(concat!(
                        "expected a string with a unit such as ",
                        $bare
                    ))
                })? {
                    Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
                    Raw::Number(n) => Err(serde::de::Error::custom(format!(
                        "`{n}` has no unit; write it with one, e.g. {}",
                        $bare
                    ))),
                }
            }
        }
    };
}

unit_serde!(Duration, "\"30s\"");
unit_serde!(ByteSize, "\"512MiB\"");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_setting_is_its_default_and_a_bad_one_names_its_field() {
        assert_eq!(
            setting("lease", None, Duration::from_secs(10)),
            Ok(Duration::from_secs(10))
        );
        assert_eq!(
            setting("lease", Some("250ms"), Duration::from_secs(10)),
            Ok(Duration::from_millis(250))
        );
        assert_eq!(
            setting("ram", Some("2KiB"), ByteSize(0)),
            Ok(ByteSize(2048))
        );
        let e = setting("lease", Some("soon"), Duration::default()).unwrap_err();
        assert_eq!(e.field, "lease");
        assert!(e.to_string().starts_with("invalid `lease`: `soon`"), "{e}");
    }

    #[test]
    fn durations_parse_and_print() {
        assert_eq!("30s".parse::<Duration>().unwrap(), Duration::from_secs(30));
        assert_eq!("5m".parse::<Duration>().unwrap(), Duration::from_secs(300));
        assert_eq!(
            "1m30s".parse::<Duration>().unwrap(),
            Duration::from_secs(90)
        );
        assert_eq!(
            "250ms".parse::<Duration>().unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(Duration::from_secs(90).to_string(), "90s");
        assert_eq!(Duration::from_secs(300).to_string(), "5m");
        assert!("5".parse::<Duration>().is_err());
        assert!("5y".parse::<Duration>().is_err());
        assert!("".parse::<Duration>().is_err());
        assert!("99999999999999999999d".parse::<Duration>().is_err());
    }

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!("512MiB".parse::<ByteSize>().unwrap(), ByteSize::mib(512));
        assert_eq!("2GiB".parse::<ByteSize>().unwrap(), ByteSize(2 << 30));
        assert_eq!("1GB".parse::<ByteSize>().unwrap(), ByteSize(1_000_000_000));
        assert_eq!(ByteSize::mib(512).to_string(), "512MiB");
        assert_eq!("1PiB".parse::<ByteSize>().unwrap(), ByteSize(1 << 50));
        assert_eq!(ByteSize(1 << 50).to_string(), "1PiB");
        assert!("12XB".parse::<ByteSize>().is_err());
        assert!("99999999999TiB".parse::<ByteSize>().is_err());
    }

    #[test]
    fn human_sizes_never_end_in_point_zero() {
        assert_eq!(human_bytes(10 << 30), "10GiB");
        assert_eq!(human_bytes((10 << 30) - (16 << 20)), "10GiB");
        assert_eq!(human_bytes(24_094_272 * 1024), "23GiB");
        assert_eq!(human_bytes((23 << 30) + (100 << 20)), "23.1GiB");
        assert_eq!(human_bytes(64 << 20), "64MiB");
        assert_eq!(human_bytes(512), "512B");
    }
}
