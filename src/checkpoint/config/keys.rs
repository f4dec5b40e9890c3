//! Typed reads of a config object's keys, the one place a value's JSON type is checked: absent
//! or null is `None`, the type wanted is its value, and any other type is an error naming the
//! key and what it holds. A string where a number belongs (`"rope_theta": "500000"`) must
//! not fall back to the default and run a different model.

use serde_json::Value;

/// The keys of one JSON object (a config, its `rope_scaling`, ...).
#[derive(Clone, Copy)]
pub struct Keys<'a>(pub &'a Value);

impl<'a> Keys<'a> {
    fn typed<T>(
        &self,
        k: &str,
        wanted: &str,
        read: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, String> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => read(v)
                .map(Some)
                .ok_or_else(|| format!("`{k}` is {v}, not {wanted}")),
        }
    }

    pub fn f64(&self, k: &str) -> Result<Option<f64>, String> {
        self.typed(k, "a number", Value::as_f64)
    }

    pub fn usize(&self, k: &str) -> Result<Option<usize>, String> {
        self.typed(k, "a non-negative integer", |v| {
            v.as_u64().and_then(|u| usize::try_from(u).ok())
        })
    }

    /// A positive integer, `default` where absent; 0 is refused naming the key.
    pub fn positive(&self, k: &str, default: usize) -> Result<usize, String> {
        match self.usize(k)?.unwrap_or(default) {
            0 => Err(format!("`{k}` is 0")),
            v => Ok(v),
        }
    }

    /// A positive finite number, `default` where absent; anything else is refused naming the key.
    pub fn positive_f64(&self, k: &str, default: f64) -> Result<f64, String> {
        match self.f64(k)?.unwrap_or(default) {
            v if v > 0.0 && v.is_finite() => Ok(v),
            v => Err(format!("`{k}` is {v}, not a positive number")),
        }
    }

    pub fn bool(&self, k: &str) -> Result<Option<bool>, String> {
        self.typed(k, "true or false", Value::as_bool)
    }

    pub fn str(&self, k: &str) -> Result<Option<&'a str>, String> {
        self.typed(k, "a string", Value::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_value_of_another_type_is_an_error_naming_the_key() {
        let j = json!({"rope_theta": "500000", "eps": 1e-5, "n": 4, "flag": null});
        let k = Keys(&j);
        let e = k.f64("rope_theta").unwrap_err();
        assert!(
            e.contains("`rope_theta`") && e.contains("\"500000\""),
            "{e}"
        );
        assert_eq!(k.f64("eps"), Ok(Some(1e-5)));
        assert_eq!(k.usize("n"), Ok(Some(4)));
        assert_eq!(k.bool("flag"), Ok(None));
        assert_eq!(k.str("absent"), Ok(None));
        assert!(k.usize("eps").is_err() && k.bool("n").is_err() && k.str("n").is_err());
    }

    #[test]
    fn a_positive_number_refuses_zero_and_below_naming_the_key() {
        let j = json!({"limit": 7.5, "zero": 0.0, "below": -1.0});
        let k = Keys(&j);
        assert_eq!(k.positive_f64("limit", 1.0), Ok(7.5));
        assert_eq!(k.positive_f64("absent", 10.0), Ok(10.0));
        for key in ["zero", "below"] {
            let e = k.positive_f64(key, 1.0).unwrap_err();
            assert!(e.contains(&format!("`{key}`")), "{e}");
        }
    }
}
