//! KV events for cache-aware routers: the engine's [`engine::KvEvent`]s in vLLM's wire format
//! (`wire.rs`, msgpack `EventBatch` of tagged maps, or the earlier positional arrays) published on a ZMQ PUB socket with vLLM's
//! replay ROUTER (`publisher.rs`), so vllm-router's `kv_aware` policy, llm-d's precise prefix
//! scorer or NVIDIA Dynamo's KV router can subscribe to agentkv as to a vLLM worker.
//!
//! Owns the wire format and the sockets; never decides what is announced (the engine does,
//! `engine::kv_events`) and never touches the engine's state.

mod publisher;
pub mod wire;

pub use publisher::{PublishError, Publisher, PublisherConfig};
pub use wire::WireFormat;
