//! Structured output: which constraint a request asks for, from whichever field it used —
//! OpenAI's `response_format` (`json_object`, `json_schema`), vLLM's `guided_json` /
//! `guided_choice` / `guided_regex` / `guided_grammar` and `structured_outputs`, or llama.cpp's
//! `grammar` — checked and named after that field, so a schema or grammar that does not compile
//! is a 400 naming it. Compiling is `grammar.rs`; the constraint only ever enters the sampling
//! parameters of its own request, never its prompt or cache keys.

use api::{JsonSchemaFormat, ResponseFormat, SamplingExtras, StructuredOutputs};
use frontend::ConstraintSpec;
use serde_json::{json, Value};

use crate::constraint_limits::GrammarError;
pub use crate::constraint_limits::OutputFormat;
use crate::error::ApiError;
use crate::gbnf;
use crate::state::AppState;

/// A requested format and the request field it came from (named in errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Requested {
    pub format: OutputFormat,
    pub param: String,
}

impl Requested {
    /// The JSON Schema when the output is JSON.
    pub fn json_schema(&self) -> Option<&Value> {
        match &self.format {
            OutputFormat::Json(s) => Some(s),
            _ => None,
        }
    }
}

/// The structured output a request asks for, `None` for free text; a 400 naming the field for a
/// malformed value or for two fields asking at once.
pub fn requested(
    response_format: Option<&ResponseFormat>,
    extra: &SamplingExtras,
) -> Result<Option<Requested>, ApiError> {
    let mut found: Vec<Requested> = Vec::new();
    let mut add = |param: &str, format: OutputFormat| {
        found.push(Requested {
            format,
            param: param.to_string(),
        })
    };
    match response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => add("response_format", json_object()),
        Some(ResponseFormat::JsonSchema { json_schema }) => add(
            "response_format",
            schema_format(json_schema, "response_format.json_schema")?,
        ),
    }
    if let Some(v) = &extra.guided_json {
        add(
            "guided_json",
            OutputFormat::Json(json_value(v, "guided_json")?),
        );
    }
    if let Some(c) = &extra.guided_choice {
        add("guided_choice", choice(c, "guided_choice")?);
    }
    if let Some(r) = &extra.guided_regex {
        add("guided_regex", OutputFormat::Regex(r.clone()));
    }
    if let Some(g) = &extra.guided_grammar {
        add("guided_grammar", lark(g, "guided_grammar")?);
    }
    if let Some(s) = &extra.structured_outputs {
        for (param, format) in structured_outputs(s)? {
            add(&param, format);
        }
    }
    if let Some(g) = &extra.grammar {
        add("grammar", lark(g, "grammar")?);
    }
    let mut found = found.into_iter();
    let first = found.next();
    if let (Some(a), Some(b)) = (&first, found.next()) {
        return Err(ApiError::invalid(
            format!(
                "only one structured-output field may be set, got {} and {}",
                a.param, b.param
            ),
            &b.param,
        ));
    }
    Ok(first)
}

fn json_object() -> OutputFormat {
    OutputFormat::Json(json!({"type": "object"}))
}

/// `json_schema` of `response_format` (or of the Responses API's `text.format`).
pub fn schema_format(f: &JsonSchemaFormat, param: &str) -> Result<OutputFormat, ApiError> {
    let name_ok = !f.name.is_empty()
        && f.name.len() <= 64
        && f.name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !name_ok {
        return Err(ApiError::invalid(
            format!(
                "the schema name must be 1 to 64 of a-z, A-Z, 0-9, _ and -, got {:?}",
                f.name
            ),
            &format!("{param}.name"),
        ));
    }
    match &f.schema {
        None => Ok(json_object()),
        Some(s) if s.is_object() => Ok(OutputFormat::Json(s.clone())),
        Some(_) => Err(ApiError::invalid(
            "the schema must be a JSON Schema object",
            &format!("{param}.schema"),
        )),
    }
}

/// A schema given as an object or as JSON text.
fn json_value(v: &Value, param: &str) -> Result<Value, ApiError> {
    let v = match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::invalid(format!("the schema is not JSON: {e}"), param))?,
        other => other.clone(),
    };
    if !v.is_object() {
        return Err(ApiError::invalid(
            "the schema must be a JSON Schema object",
            param,
        ));
    }
    Ok(v)
}

fn choice(c: &[String], param: &str) -> Result<OutputFormat, ApiError> {
    if c.is_empty() {
        return Err(ApiError::invalid("the list of choices is empty", param));
    }
    Ok(OutputFormat::Choice(c.to_vec()))
}

/// A grammar in llguidance's Lark syntax, or GBNF (`root ::= …`, converted to Lark).
fn lark(g: &str, param: &str) -> Result<OutputFormat, ApiError> {
    if gbnf::is_gbnf(g) {
        let lark = gbnf::to_lark(g).map_err(|e| ApiError::invalid(e.to_string(), param))?;
        return Ok(OutputFormat::Lark(lark));
    }
    Ok(OutputFormat::Lark(g.to_string()))
}

fn structured_outputs(s: &StructuredOutputs) -> Result<Vec<(String, OutputFormat)>, ApiError> {
    let p = |m: &str| format!("structured_outputs.{m}");
    let mut out = Vec::new();
    if let Some(v) = &s.json {
        out.push((p("json"), OutputFormat::Json(json_value(v, &p("json"))?)));
    }
    if let Some(c) = &s.choice {
        out.push((p("choice"), choice(c, &p("choice"))?));
    }
    if let Some(r) = &s.regex {
        out.push((p("regex"), OutputFormat::Regex(r.clone())));
    }
    if let Some(g) = &s.grammar {
        out.push((p("grammar"), lark(g, &p("grammar"))?));
    }
    if s.json_object == Some(true) {
        out.push((p("json_object"), json_object()));
    }
    if out.is_empty() {
        return Err(ApiError::invalid(
            "structured_outputs names no constraint (json, choice, regex, grammar or json_object)",
            "structured_outputs",
        ));
    }
    Ok(out)
}

/// `min_tokens` and `ignore_eos` would hold the end-of-turn token back past the grammar's end:
/// 400 (`unsupported_parameter`) when set together with a constraint (`with`: what imposes it).
pub fn check_eos_fields(extra: &SamplingExtras, with: &str) -> Result<(), ApiError> {
    for (param, set) in [
        ("min_tokens", extra.min_tokens.unwrap_or(0) > 0),
        ("ignore_eos", extra.ignore_eos.unwrap_or(false)),
    ] {
        if set {
            return Err(ApiError::UnsupportedParameter {
                param: param.into(),
                message: format!("{param} is not supported together with {with}"),
            });
        }
    }
    Ok(())
}

/// Compiles the format; a schema, regex or grammar llguidance rejects is a 400 naming its field.
pub fn constraint(state: &AppState, r: &Requested) -> Result<ConstraintSpec, ApiError> {
    state
        .grammars()?
        .compile(&r.format)
        .map_err(|e| grammar_error(e, &r.param, &format!("invalid {}", r.param)))
}

/// A compile failure as HTTP: the client's constraint is a 400 naming `param` (`what` leads the
/// message), a limit a 400 naming the limit, the compiler's own failure a 500 with an error id.
pub fn grammar_error(e: GrammarError, param: &str, what: &str) -> ApiError {
    match e {
        GrammarError::Invalid(m) => ApiError::invalid(format!("{what}: {m}"), param),
        GrammarError::Limit(l) => ApiError::ConstraintTooLarge {
            message: format!("{what}: {l}"),
            param: param.to_string(),
        },
        GrammarError::Failed { detail } => ApiError::Internal(detail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(rf: Option<Value>, extra: Value) -> Result<Option<Requested>, ApiError> {
        let rf: Option<ResponseFormat> = rf.map(|v| serde_json::from_value(v).unwrap());
        let extra: SamplingExtras = serde_json::from_value(extra).unwrap();
        requested(rf.as_ref(), &extra)
    }

    fn param(e: ApiError) -> String {
        e.body().error.param.unwrap_or_default()
    }

    #[test]
    fn each_field_gives_its_format() {
        assert_eq!(req(None, json!({})).unwrap(), None);
        assert_eq!(req(Some(json!({"type": "text"})), json!({})).unwrap(), None);
        let r = req(Some(json!({"type": "json_object"})), json!({}))
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.format, r.param.as_str()),
            (json_object(), "response_format")
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let r = req(
            Some(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}})),
            json!({}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.json_schema(), Some(&schema));
        let r = req(None, json!({"guided_json": schema.to_string()}))
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.format, r.param.as_str()),
            (OutputFormat::Json(schema), "guided_json")
        );
        let r = req(None, json!({"structured_outputs": {"choice": ["a", "b"]}}))
            .unwrap()
            .unwrap();
        assert_eq!(r.param, "structured_outputs.choice");
        let r = req(None, json!({"guided_regex": "[0-9]+"}))
            .unwrap()
            .unwrap();
        assert_eq!(r.format, OutputFormat::Regex("[0-9]+".into()));
    }

    #[test]
    fn malformed_or_doubled_fields_are_400_naming_them() {
        for (rf, extra, expect) in [
            (
                Some(json!({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}})),
                json!({}),
                "response_format.json_schema.name",
            ),
            (
                Some(json!({"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}})),
                json!({}),
                "response_format.json_schema.schema",
            ),
            (None, json!({"guided_json": "{nope"}), "guided_json"),
            (None, json!({"guided_json": 3}), "guided_json"),
            (None, json!({"guided_choice": []}), "guided_choice"),
            (None, json!({"grammar": "root ::= \"a"}), "grammar"),
            (
                None,
                json!({"structured_outputs": {}}),
                "structured_outputs",
            ),
            (
                Some(json!({"type": "json_object"})),
                json!({"guided_regex": "a"}),
                "guided_regex",
            ),
        ] {
            let e = req(rf, extra.clone()).unwrap_err();
            assert_eq!(e.status(), 400);
            assert_eq!(param(e), expect, "{extra}");
        }
    }
}
