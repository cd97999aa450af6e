//! The engine: the model over paged KV. (In progress: only the paged K/V memory exists so far.)

pub mod paged_kv;
