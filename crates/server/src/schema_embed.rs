//! Putting a client's JSON Schema inside a larger one — a tool's `parameters` under a call's
//! `arguments`, a structured-output schema under a text answer's `response` — without breaking
//! its local references. Pydantic and every client library write nested models as `$defs` (or
//! `definitions`) with `"$ref": "#/$defs/Item"`, a pointer from the schema's own root; nested
//! as is, that pointer would look in the enclosing schema and fail. A schema with local
//! references moves under the root's `$defs` (one entry per embedded schema) and each of its
//! `#`-pointers is prefixed with that entry's path, so `#/$defs/Item` becomes
//! `#/$defs/tool0/$defs/Item` and a recursive `#` becomes `#/$defs/tool0`. Schemas without
//! local references are left inline, unchanged. Text to text; never compiles anything.

use serde_json::{Map, Value};

/// Collects the schemas moved under the root's `$defs` while an enclosing schema is built.
#[derive(Debug, Default)]
pub struct Embedder {
    defs: Map<String, Value>,
}

impl Embedder {
    pub fn new() -> Embedder {
        Embedder::default()
    }

    /// `schema` as it is to appear inside the enclosing schema: itself when it has no local
    /// reference, else `{"$ref": "#/$defs/<name>"}` with the schema kept (its references
    /// rewritten) for [`Embedder::finish`]. `name` must be unique per enclosing schema and a
    /// plain JSON-pointer token (no `/` or `~`).
    pub fn embed(&mut self, name: &str, mut schema: Value) -> Value {
        if !has_local_ref(&schema) {
            return schema;
        }
        rewrite_refs(&mut schema, &format!("#/$defs/{name}"));
        self.defs.insert(name.to_string(), schema);
        serde_json::json!({ "$ref": format!("#/$defs/{name}") })
    }

    /// `root` with the moved schemas under its `$defs` (unchanged when none moved).
    pub fn finish(self, mut root: Value) -> Value {
        if self.defs.is_empty() {
            return root;
        }
        if let Some(obj) = root.as_object_mut() {
            let defs = obj
                .entry("$defs")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(defs) = defs.as_object_mut() {
                defs.extend(self.defs);
            }
        }
        root
    }
}

/// A `$ref` that is a JSON pointer into the document itself (`#` or `#/…`).
fn is_local_pointer(r: &str) -> bool {
    r == "#" || r.starts_with("#/")
}

fn has_local_ref(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, v)| {
            (k == "$ref" && v.as_str().is_some_and(is_local_pointer)) || has_local_ref(v)
        }),
        Value::Array(a) => a.iter().any(has_local_ref),
        _ => false,
    }
}

/// Prefixes every local pointer `$ref` in `v` with `base` (`#/x` → `<base>/x`, `#` → `<base>`).
fn rewrite_refs(v: &mut Value, base: &str) {
    match v {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                match v {
                    Value::String(r) if k == "$ref" && is_local_pointer(r) => {
                        *r = format!("{base}{}", &r[1..]);
                    }
                    _ => rewrite_refs(v, base),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| rewrite_refs(v, base)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Resolves a local pointer the way a validator does (enough for these tests).
    fn resolve<'a>(root: &'a Value, r: &str) -> &'a Value {
        root.pointer(&r[1..])
            .unwrap_or_else(|| panic!("{r} does not resolve"))
    }

    #[test]
    fn schemas_without_local_refs_stay_inline() {
        let mut e = Embedder::new();
        let s = json!({"type": "object", "properties": {"a": {"$ref": "https://x/y"}}});
        assert_eq!(e.embed("t0", s.clone()), s);
        let root = json!({"type": "object"});
        assert_eq!(e.finish(root.clone()), root);
    }

    #[test]
    fn defs_refs_and_recursion_resolve_from_the_new_root() {
        let pydantic = json!({
            "type": "object",
            "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                           "tree": {"$ref": "#/definitions/Node"}},
            "$defs": {"Item": {"type": "object", "properties": {"name": {"type": "string"}}}},
            "definitions": {"Node": {"type": "object",
                                     "properties": {"kids": {"type": "array", "items": {"$ref": "#/definitions/Node"}},
                                                    "up": {"$ref": "#"}}}}
        });
        let mut e = Embedder::new();
        let a = e.embed("tool0", pydantic.clone());
        let b = e.embed("tool1", pydantic);
        assert_eq!(a, json!({"$ref": "#/$defs/tool0"}));
        let root = e.finish(
            json!({"anyOf": [{"properties": {"arguments": a}}, {"properties": {"arguments": b}}],
                                   "$defs": {"kept": {"type": "null"}}}),
        );
        assert_eq!(root["$defs"]["kept"], json!({"type": "null"}));
        let t1 = resolve(&root, "#/$defs/tool1");
        let item = t1["properties"]["items"]["items"]["$ref"].as_str().unwrap();
        assert_eq!(item, "#/$defs/tool1/$defs/Item");
        assert_eq!(resolve(&root, item)["properties"]["name"]["type"], "string");
        let node = t1["properties"]["tree"]["$ref"].as_str().unwrap();
        let node = resolve(&root, node);
        let kids = node["properties"]["kids"]["items"]["$ref"]
            .as_str()
            .unwrap();
        assert_eq!(resolve(&root, kids), node);
        assert_eq!(node["properties"]["up"]["$ref"], "#/$defs/tool1");
    }
}
