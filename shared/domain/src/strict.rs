//! Reading JSON bodies exactly as their documented schema says, where serde's derive reads
//! more or less: JSON Schema's `integer` includes `722.0`, which serde's integer types refuse,
//! and serde reads a struct from an array of its fields in order, which an `object` does not
//! allow (`null` is not an object either).

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, Error};

/// A field that must be a JSON object when present (with `#[serde(default)]` for absent).
pub fn object_or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match serde_json::Value::deserialize(d)? {
        v @ serde_json::Value::Object(_) => serde_json::from_value(v).map_err(D::Error::custom),
        _ => Err(D::Error::custom("expected an object")),
    }
}

/// A field that is a JSON object or null (with `#[serde(default)]` for absent, also `None`).
pub fn object_or_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(None),
        v @ serde_json::Value::Object(_) => serde_json::from_value(v).map_err(D::Error::custom),
        _ => Err(D::Error::custom("expected an object or null")),
    }
}

/// A field a change may set, clear or leave: absent (with `#[serde(default)]`) is `None`, null
/// is `Some(None)`, an object `Some(Some(_))`.
pub fn change_of_object<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    object_or_null(d).map(Some)
}

/// Whole numbers, in range, however written.
pub mod whole {
    use serde::Deserialize;
    use serde::de::{Deserializer, Error};

    fn from_number<T: TryFrom<u64>, E: Error>(n: serde_json::Number) -> Result<T, E> {
        let whole = n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        });
        whole
            .and_then(|w| T::try_from(w).ok())
            .ok_or_else(|| E::custom(format!("{n} is not a whole number in range")))
    }

    pub fn one<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
        from_number(serde_json::Number::deserialize(d)?)
    }

    pub fn opt<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
        Option::<serde_json::Number>::deserialize(d)?
            .map(from_number)
            .transpose()
    }

    pub fn opt_vec<'de, D: Deserializer<'de>, T: TryFrom<u64>>(
        d: D,
    ) -> Result<Option<Vec<T>>, D::Error> {
        Option::<Vec<serde_json::Number>>::deserialize(d)?
            .map(|v| v.into_iter().map(from_number).collect())
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize)]
    struct Sequences {
        #[serde(default, deserialize_with = "super::whole::opt_vec")]
        sequences: Option<Vec<u64>>,
    }

    #[test]
    fn whole_numbers_written_as_decimals_read_exactly() {
        // The contract fuzzer's draw: serde_json's fast float parsing read the second as
        // 4040217466168097.5 and the api answered 422 for a schema-valid integer.
        let body =
            r#"{"sequences": [72833365624.0, 4040217466168098.0, 3246576323802723328, 17.0]}"#;
        let s: Sequences = serde_json::from_str(body).unwrap();
        assert_eq!(
            s.sequences.unwrap(),
            [72833365624, 4040217466168098, 3246576323802723328, 17]
        );
        for refused in [r#"{"sequences": [1.5]}"#, r#"{"sequences": [-1.0]}"#] {
            assert!(
                serde_json::from_str::<Sequences>(refused).is_err(),
                "{refused}"
            );
        }
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Inner {
        a: u8,
    }

    #[derive(Debug, serde::Deserialize)]
    struct Change {
        #[serde(default, deserialize_with = "super::change_of_object")]
        inner: Option<Option<Inner>>,
    }

    #[test]
    fn a_change_tells_absent_null_and_an_object_apart_and_refuses_an_array() {
        let read = |s: &str| serde_json::from_str::<Change>(s).map(|c| c.inner);
        assert_eq!(read("{}").unwrap(), None);
        assert_eq!(read(r#"{"inner": null}"#).unwrap(), Some(None));
        assert_eq!(
            read(r#"{"inner": {"a": 1}}"#).unwrap(),
            Some(Some(Inner { a: 1 }))
        );
        assert!(read(r#"{"inner": [1]}"#).is_err());
        assert!(
            serde_json::from_str::<Inner>("[1]").is_ok(),
            "serde's own reading, which these refuse"
        );
    }
}
