//! Stored objects per tenant (`store: true`), bounded per tenant in count and bytes, the oldest
//! evicted first; in memory (a restart forgets them). Two kinds:
//! - responses of the Responses API: the response object (for `GET /v1/responses/{id}`), its
//!   input items (for `…/input_items`) and its conversation as chat messages — the previous
//!   conversation, this request's input items and the output — so a request with
//!   `previous_response_id` sends only its new items and its prompt extends the stored one (a
//!   cached prefix);
//! - chat completions: the completion object, the request's messages and metadata (for
//!   `GET /v1/chat/completions[/{id}[/messages]]` and `DELETE`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use api::responses::Response;
use api::{ChatCompletionResponse, ChatMessage};
use cache::TenantId;

/// What a [`TenantStore`] holds: an id and a size charged against the tenant's byte bound.
pub trait Stored {
    fn id(&self) -> &str;
    fn bytes(&self) -> usize;
}

/// A stored chat completion (`store: true` on `/v1/chat/completions`).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCompletion {
    pub completion: ChatCompletionResponse,
    /// The request's messages (for `…/messages`).
    pub messages: Vec<ChatMessage>,
    /// The request's `metadata` (up to 16 pairs).
    pub metadata: std::collections::BTreeMap<String, String>,
}

impl Stored for StoredCompletion {
    fn id(&self) -> &str {
        &self.completion.id
    }

    fn bytes(&self) -> usize {
        serde_json::to_vec(&self.completion).map_or(0, |v| v.len())
            + messages_bytes(&self.messages)
            + (self.metadata.iter())
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}

/// Bytes charged for chat messages: their text, tool calls and a fixed overhead each.
fn messages_bytes(messages: &[ChatMessage]) -> usize {
    messages
        .iter()
        .map(|m| {
            64 + m.content.as_ref().map_or(0, String::len)
                + m.tool_calls.as_ref().map_or(0, |calls| {
                    calls
                        .iter()
                        .map(|c| c.id.len() + c.function.name.len() + c.function.arguments.len())
                        .sum()
                })
        })
        .sum()
}

/// One stored response.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub response: Response,
    /// Everything a continuation renders before its own items (never the `instructions`,
    /// which do not carry over).
    pub conversation: Vec<ChatMessage>,
    /// The request's own input items in OpenAI's item shape, with ids (for
    /// `GET /v1/responses/{id}/input_items`).
    pub input_items: Vec<serde_json::Value>,
}

impl Stored for StoredResponse {
    fn id(&self) -> &str {
        &self.response.id
    }

    /// The JSON of the response and of the input items, and the text of the conversation.
    fn bytes(&self) -> usize {
        let response = serde_json::to_vec(&self.response).map_or(0, |v| v.len());
        let conversation = messages_bytes(&self.conversation);
        let items: usize = self
            .input_items
            .iter()
            .map(|v| serde_json::to_vec(v).map_or(0, |b| b.len()))
            .sum();
        response + conversation + items
    }
}

struct TenantObjects<T> {
    /// Oldest first.
    order: VecDeque<String>,
    by_id: HashMap<String, (Arc<T>, usize)>,
    bytes: usize,
}

impl<T> Default for TenantObjects<T> {
    fn default() -> Self {
        TenantObjects {
            order: VecDeque::new(),
            by_id: HashMap::new(),
            bytes: 0,
        }
    }
}

/// The stored objects of every tenant. A tenant never sees another's.
pub struct TenantStore<T> {
    tenants: Mutex<HashMap<TenantId, TenantObjects<T>>>,
    max_count: usize,
    max_bytes: usize,
}

/// Stored responses of the Responses API.
pub type ResponseStore = TenantStore<StoredResponse>;

/// Stored chat completions.
pub type CompletionStore = TenantStore<StoredCompletion>;

impl<T: Stored> TenantStore<T> {
    /// At most `max_count` objects and `max_bytes` bytes per tenant.
    pub fn new(max_count: usize, max_bytes: usize) -> TenantStore<T> {
        TenantStore {
            tenants: Mutex::new(HashMap::new()),
            max_count,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TenantId, TenantObjects<T>>> {
        // The map stays consistent even if a holder panicked (no multi-step updates across
        // a panic point), so a poisoned lock is taken as is.
        self.tenants.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `r` under its id, evicting the tenant's oldest objects to stay within the
    /// bounds. Returns false (nothing stored) when `r` alone exceeds the byte bound.
    pub fn insert(&self, tenant: TenantId, r: T) -> bool {
        let bytes = r.bytes();
        if bytes > self.max_bytes {
            return false;
        }
        let id = r.id().to_string();
        let mut tenants = self.lock();
        let t = tenants.entry(tenant).or_default();
        if let Some((_, old)) = t.by_id.remove(&id) {
            t.bytes -= old;
            t.order.retain(|o| o != &id);
        }
        while t.order.len() >= self.max_count || t.bytes + bytes > self.max_bytes {
            let Some(oldest) = t.order.pop_front() else {
                break;
            };
            if let Some((_, b)) = t.by_id.remove(&oldest) {
                t.bytes -= b;
            }
        }
        t.order.push_back(id.clone());
        t.by_id.insert(id, (Arc::new(r), bytes));
        t.bytes += bytes;
        true
    }

    pub fn get(&self, tenant: TenantId, id: &str) -> Option<Arc<T>> {
        let tenants = self.lock();
        tenants.get(&tenant)?.by_id.get(id).map(|(r, _)| r.clone())
    }

    /// The tenant's objects, oldest first.
    pub fn all(&self, tenant: TenantId) -> Vec<Arc<T>> {
        let tenants = self.lock();
        let Some(t) = tenants.get(&tenant) else {
            return Vec::new();
        };
        (t.order.iter())
            .filter_map(|id| t.by_id.get(id).map(|(r, _)| r.clone()))
            .collect()
    }

    /// Removes a stored object; false when the tenant has none with that id.
    pub fn remove(&self, tenant: TenantId, id: &str) -> bool {
        let mut tenants = self.lock();
        let Some(t) = tenants.get_mut(&tenant) else {
            return false;
        };
        match t.by_id.remove(id) {
            Some((_, b)) => {
                t.bytes -= b;
                t.order.retain(|o| o != id);
                true
            }
            None => false,
        }
    }

    /// (objects, bytes) held for a tenant.
    pub fn usage(&self, tenant: TenantId) -> (usize, usize) {
        self.lock()
            .get(&tenant)
            .map_or((0, 0), |t| (t.order.len(), t.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::responses::{ResponseToolChoice, TextConfig};
    use api::{Role, ToolChoiceMode};

    fn stored(id: &str, text_len: usize) -> StoredResponse {
        StoredResponse {
            response: Response {
                id: id.into(),
                object: "response".into(),
                created_at: 0,
                status: "completed".into(),
                model: "m".into(),
                output: Vec::new(),
                output_text: String::new(),
                instructions: None,
                tools: Vec::new(),
                tool_choice: ResponseToolChoice::Mode(ToolChoiceMode::Auto),
                parallel_tool_calls: true,
                temperature: None,
                top_p: None,
                max_output_tokens: None,
                previous_response_id: None,
                store: true,
                text: TextConfig::default(),
                usage: None,
                incomplete_details: None,
                error: None,
                metadata: Default::default(),
                truncation: None,
                user: None,
            },
            conversation: vec![ChatMessage::new(Role::User, "x".repeat(text_len))],
            input_items: Vec::new(),
        }
    }

    #[test]
    fn bounded_per_tenant_in_count_and_bytes_oldest_first() {
        let store = ResponseStore::new(3, 10_000);
        let (a, b) = (TenantId(1), TenantId(2));
        for i in 0..4 {
            assert!(store.insert(a, stored(&format!("r{i}"), 10)));
        }
        assert!(store.get(a, "r0").is_none(), "oldest evicted by count");
        assert!(store.get(a, "r3").is_some());
        assert!(store.get(b, "r3").is_none(), "tenants never share");
        assert!(!store.remove(b, "r3"));
        assert!(store.remove(a, "r3"));
        assert!(store.get(a, "r3").is_none());
        assert_eq!(store.usage(a).0, 2);
        // Bytes: a big response evicts old ones; one larger than the bound is not stored.
        let one = stored("x", 10).bytes();
        let store = ResponseStore::new(100, 3 * one + 10);
        for i in 0..3 {
            assert!(store.insert(a, stored(&format!("r{i}"), 10)));
        }
        assert!(store.insert(a, stored("big", 10 + one)));
        assert!(store.get(a, "r0").is_none() && store.get(a, "r1").is_none());
        assert!(store.get(a, "r2").is_some() && store.get(a, "big").is_some());
        assert!(store.usage(a).1 <= 3 * one + 10);
        assert!(!store.insert(a, stored("huge", 4 * one)));
        assert!(
            store.get(a, "r2").is_some(),
            "a refused insert evicts nothing"
        );
    }
}
