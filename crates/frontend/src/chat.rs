//! Chat templates: renders a conversation into the prompt text a model was trained on, using
//! the Jinja template stored in the GGUF (`tokenizer.chat_template`) via `minijinja`, with
//! Python string methods (`strip`, `startswith`, `split`...) from `minijinja-contrib`'s pycompat,
//! HF-compatible settings (`trim_blocks`, `lstrip_blocks`), `raise_exception`, a Python-style
//! `tojson` and `strftime_now`. The template is compiled once, at construction.
//!
//! Never tokenises (see [`crate::tokenizer`]) and never parses model output (tool-call
//! extraction belongs to the server).

use crate::tokenizer::Tokenizer;
use gguf::Metadata;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// Name of the compiled template inside the environment.
const TEMPLATE_NAME: &str = "chat";
/// Prefix marking errors raised by the template itself through `raise_exception`.
const RAISED_PREFIX: &str = "raise_exception: ";

/// ChatML, used for models whose file carries no template.
const FALLBACK_TEMPLATE: &str = "{%- for message in messages -%}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/// Gemma's turn format (`<start_of_turn>user … <end_of_turn>`, the assistant's role named
/// `model`, a system message prefixed to the first user turn), used for files without a
/// template whose vocabulary has Gemma's turn tokens (e.g. the Gemma 3 base models).
const GEMMA_FALLBACK_TEMPLATE: &str = "{{- bos_token -}}\
{%- if messages and messages[0]['role'] == 'system' -%}\
{%- set first_user_prefix = messages[0]['content'] | trim + '\n\n' -%}\
{%- set loop_messages = messages[1:] -%}\
{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}\
{%- for message in loop_messages -%}\
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\
{{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + \
message['content'] | trim + '<end_of_turn>\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}";

/// Errors of chat-template compilation and rendering.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template source does not compile.
    #[error("chat template does not compile: {0}")]
    Compile(String),
    /// Rendering failed (undefined operation, type error...).
    #[error("chat template rendering failed: {0}")]
    Render(String),
    /// The template rejected the conversation with `raise_exception(message)`.
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
}

/// One message of a conversation, in the OpenAI / HF shape templates expect.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`...
    pub role: String,
    /// The message text.
    pub content: String,
    /// Optional author name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls made by an assistant message (OpenAI format), passed to the template as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// For `tool` messages: the id of the call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with just a role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}

/// A compiled chat template plus the special-token strings it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .finish()
    }
}

impl ChatTemplate {
    /// The template of a GGUF file (`tokenizer.chat_template`), or `None` when it has none.
    pub fn from_gguf(meta: &Metadata, tok: &Tokenizer) -> Result<Option<ChatTemplate>, ChatError> {
        let Some(source) = meta.get_str("tokenizer.chat_template") else {
            return Ok(None);
        };
        let text = |id: Option<u32>| {
            id.and_then(|id| tok.token_text(id))
                .unwrap_or_default()
                .to_string()
        };
        Self::new(source, &text(tok.bos_id()), &text(tok.eos_id())).map(Some)
    }

    /// ChatML (`<|im_start|>role\ncontent<|im_end|>\n`) for models without a template.
    pub fn fallback() -> ChatTemplate {
        match Self::new(FALLBACK_TEMPLATE, "", "") {
            Ok(t) => t,
            // The constant above is covered by tests; failing here is a bug in this file.
            Err(e) => unreachable!("built-in fallback template must compile: {e}"),
        }
    }

    /// The template for a file without one: Gemma's turn format when the vocabulary has
    /// `<start_of_turn>` and `<end_of_turn>`, else ChatML ([`ChatTemplate::fallback`]).
    pub fn fallback_for(tok: &Tokenizer) -> ChatTemplate {
        let gemma = ["<start_of_turn>", "<end_of_turn>"]
            .iter()
            .all(|t| tok.token_to_id(t).is_some_and(|id| tok.is_special(id)));
        if !gemma {
            return Self::fallback();
        }
        let bos = tok
            .bos_id()
            .and_then(|id| tok.token_text(id))
            .unwrap_or_default();
        match Self::new(GEMMA_FALLBACK_TEMPLATE, bos, "") {
            Ok(t) => t,
            // The constant above is covered by tests; failing here is a bug in this file.
            Err(e) => unreachable!("built-in Gemma template must compile: {e}"),
        }
    }

    /// Compiles `source`; `bos_token` / `eos_token` are exposed to it under those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ChatError::Compile(describe(&e)))?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (and `tools`, exposed as `tools`, `none` when absent); with
    /// `add_generation_prompt` the text ends where the assistant's reply begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Compile(describe(&e)))?;
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools.map_or(Value::from(()), Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        template.render(ctx).map_err(|e| {
            match e.detail().and_then(|d| d.strip_prefix(RAISED_PREFIX)) {
                Some(msg) if e.kind() == ErrorKind::InvalidOperation => {
                    ChatError::Raised(msg.to_string())
                }
                _ => ChatError::Render(describe(&e)),
            }
        })
    }
}

/// One-line description of a minijinja error, with its cause chain.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED_PREFIX}{message}"),
    ))
}

/// Python `json.dumps(value, ensure_ascii=False, indent=indent)` (what HF's `tojson` does): `", "`
/// and `": "` separators, keys in insertion order.
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    v: &Value,
    indent: Option<usize>,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                let key = k.as_str().map_or_else(|| k.to_string(), str::to_string);
                write_scalar(&Value::from(key), out)?;
                out.push_str(": ");
                write_json(&v.get_item(k)?, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                write_json(item, indent, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        _ => write_scalar(v, out)?,
    }
    Ok(())
}

fn write_scalar(v: &Value, out: &mut String) -> Result<(), Error> {
    let s = serde_json::to_string(v).map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(e)
    })?;
    out.push_str(&s);
    Ok(())
}

/// `strftime_now(format)`: the current UTC time, supporting `%d %m %Y %y %b %B %H %M %S %%`.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_time(secs, &format)
}

/// Formats Unix time `secs` (UTC) with a strftime subset.
fn format_time(secs: u64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_dates() {
        // 2024-07-26 13:05:09 UTC
        assert_eq!(
            format_time(1_722_000_309, "%d %b %Y %H:%M:%S %B %y %%"),
            "26 Jul 2024 13:25:09 July 24 %"
        );
        assert_eq!(format_time(0, "%Y-%m-%d"), "1970-01-01");
    }

    #[test]
    fn tojson_is_python_style() {
        let t = ChatTemplate::new(
            "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}",
            "",
            "",
        )
        .unwrap();
        let tools = serde_json::json!([{"b": 1, "a": [true, null, "é\n"]}]);
        let out = t.render(&[], Some(&tools), false).unwrap();
        assert_eq!(
            out,
            "[{\"b\": 1, \"a\": [true, null, \"é\\n\"]}]|{\n  \"b\": 1,\n  \"a\": [\n    true,\n    null,\n    \"é\\n\"\n  ]\n}"
        );
    }
}
