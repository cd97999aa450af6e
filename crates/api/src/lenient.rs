//! Lenient request-field readers: `stop` as a string or a list, message `content` as a string or a
//! list of text parts. Deserialisation only; the typed fields stay plain `Vec<String>` / `String`.

use serde::{Deserialize, Deserializer};

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `"stop": "x"` or `"stop": ["x", "y"]` (or null).
pub fn string_or_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Ok(match Option::<OneOrMany>::deserialize(d)? {
        None => None,
        Some(OneOrMany::One(s)) => Some(vec![s]),
        Some(OneOrMany::Many(v)) => Some(v),
    })
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

/// `"content": "text"` or `"content": [{"type": "text", "text": "…"}, …]` (text parts joined);
/// a non-text part is an error naming its type.
pub fn text_or_parts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Option::<Content>::deserialize(d)? {
        None => None,
        Some(Content::Text(s)) => Some(s),
        Some(Content::Parts(parts)) => {
            let mut out = String::new();
            for p in parts {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => out.push_str(&t),
                    (kind, _) => {
                        return Err(serde::de::Error::custom(format!(
                            "unsupported content part type {kind:?} (only \"text\")"
                        )))
                    }
                }
            }
            Some(out)
        }
    })
}
