//! vLLM's KV-event wire format, encoded with `rmp` (pure; no I/O).
//!
//! vLLM declares its events as `msgspec` structs (`omit_defaults=True`, events `tag=True`); which
//! of them are `array_like` changed between releases, and decoders followed different ones, so
//! the layout is a choice ([`WireFormat`]). The default, [`WireFormat::ArrayOfMaps`], is what
//! vllm-router 0.1.17 reads: the batch `[ts, events, data_parallel_rank]`, each event a tagged map.
//! With [`WireFormat::Map`] (current vLLM) the batch is a map too:
//!
//! - `EventBatch` = `{"ts": float64, "events": [event…], "data_parallel_rank": int}`;
//! - `BlockStored` = `{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids",
//!   "block_size", "lora_id", "medium", "lora_name"}` (fields without a default are always
//!   present, `nil` when unset; the later defaulted ones — `extra_keys`, `group_idx`, … — omitted);
//! - `BlockRemoved` = `{"type": "BlockRemoved", "block_hashes", "medium"}`;
//! - `AllBlocksCleared` = `{"type": "AllBlocksCleared"}`.
//!
//! Earlier vLLM releases declared them `array_like=True` (what older router decoders and NVIDIA
//! Dynamo read), [`WireFormat::Array`]: the same fields in the same order as positional arrays,
//! the tag first:
//!
//! - `EventBatch` = `[ts: float64, events: [event…], data_parallel_rank: int]`;
//! - `BlockStored` = `["BlockStored", block_hashes: [int…], parent_block_hash: int | nil,
//!   token_ids: [int…], block_size: int, lora_id: int | nil, medium: str | nil,
//!   lora_name: str | nil]` (the later optional fields — `extra_keys`, `group_idx`, … — are
//!   defaults and omitted);
//! - `BlockRemoved` = `["BlockRemoved", block_hashes: [int…], medium: str | nil]`;
//! - `AllBlocksCleared` = `["AllBlocksCleared"]`.
//!
//! Block hashes are unsigned 64-bit integers (`engine::kv_events::external_hash`, from the
//! namespaced chain key). Media: the active pool is `"GPU"` (vLLM's `MEDIUM_GPU`: the KV the
//! forward pass reads), the RAM tier `"CPU"`, the disk tier `"DISK"`, Redis `"REDIS"`.

use engine::{KvEvent, KvMedium};
use tier::TierKind;

/// How structs are laid out on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireFormat {
    /// The batch a positional array, the events tagged maps: what vllm-router 0.1.17 decodes
    /// (it refuses anything else: "KV event batch must be an array", "KV event must be a tagged
    /// map").
    #[default]
    ArrayOfMaps,
    /// Everything maps with a `"type"` tag on events (vLLM's current `msgspec` declaration).
    Map,
    /// Everything positional arrays, tag first (vLLM's earlier `array_like=True`; older router
    /// decoders, NVIDIA Dynamo).
    Array,
}

impl WireFormat {
    fn batch(self) -> WireFormat {
        match self {
            WireFormat::Map => WireFormat::Map,
            _ => WireFormat::Array,
        }
    }
    fn events(self) -> WireFormat {
        match self {
            WireFormat::Array => WireFormat::Array,
            _ => WireFormat::Map,
        }
    }
}

/// vLLM's name of a medium.
pub fn medium_name(m: KvMedium) -> &'static str {
    match m {
        KvMedium::Active => "GPU",
        KvMedium::Tier(TierKind::Ram) => "CPU",
        KvMedium::Tier(TierKind::Disk) => "DISK",
        KvMedium::Tier(TierKind::Redis) => "REDIS",
    }
}

/// Writes into a `Vec`, which cannot fail; `rmp`'s errors are only the writer's.
struct Out(Vec<u8>, WireFormat);

impl Out {
    /// Opens a struct of `n` fields (plus the tag when `tag` is given) and writes the tag.
    fn open(&mut self, n: usize, tag: Option<&str>) {
        let total = n + usize::from(tag.is_some());
        match self.1 {
            WireFormat::Map => {
                let _ = rmp::encode::write_map_len(&mut self.0, total as u32);
                if let Some(t) = tag {
                    self.str("type");
                    self.str(t);
                }
            }
            WireFormat::Array | WireFormat::ArrayOfMaps => {
                self.array(total);
                if let Some(t) = tag {
                    self.str(t);
                }
            }
        }
    }
    /// Names the next field (maps only).
    fn field(&mut self, name: &str) {
        if self.1 == WireFormat::Map {
            self.str(name);
        }
    }
    fn array(&mut self, n: usize) {
        let _ = rmp::encode::write_array_len(&mut self.0, n as u32);
    }
    fn str(&mut self, s: &str) {
        let _ = rmp::encode::write_str(&mut self.0, s);
    }
    fn uint(&mut self, v: u64) {
        let _ = rmp::encode::write_uint(&mut self.0, v);
    }
    fn nil(&mut self) {
        let _ = rmp::encode::write_nil(&mut self.0);
    }
    fn f64(&mut self, v: f64) {
        let _ = rmp::encode::write_f64(&mut self.0, v);
    }
    fn uints(&mut self, vs: impl ExactSizeIterator<Item = u64>) {
        self.array(vs.len());
        for v in vs {
            self.uint(v);
        }
    }
}

fn event(out: &mut Out, e: &KvEvent, lora_name: Option<&str>) {
    match e {
        KvEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size,
            medium,
        } => {
            out.open(7, Some("BlockStored"));
            out.field("block_hashes");
            out.uints(hashes.iter().copied());
            out.field("parent_block_hash");
            match parent {
                Some(p) => out.uint(*p),
                None => out.nil(),
            }
            out.field("token_ids");
            out.uints(tokens.iter().map(|&t| u64::from(t)));
            out.field("block_size");
            out.uint(u64::from(*block_size));
            out.field("lora_id");
            out.nil(); // deprecated in vLLM
            out.field("medium");
            out.str(medium_name(*medium));
            out.field("lora_name");
            match lora_name {
                Some(l) => out.str(l),
                None => out.nil(),
            }
        }
        KvEvent::Removed { hashes, medium } => {
            out.open(2, Some("BlockRemoved"));
            out.field("block_hashes");
            out.uints(hashes.iter().copied());
            out.field("medium");
            out.str(medium_name(*medium));
        }
        KvEvent::AllCleared => out.open(0, Some("AllBlocksCleared")),
    }
}

/// One `EventBatch` payload: `ts` in seconds since the Unix epoch.
pub fn encode_batch(
    ts: f64,
    events: &[KvEvent],
    data_parallel_rank: u32,
    format: WireFormat,
) -> Vec<u8> {
    let mut out = Out(Vec::with_capacity(64 + events.len() * 64), format.batch());
    out.open(3, None);
    out.field("ts");
    out.f64(ts);
    out.field("events");
    out.array(events.len());
    out.1 = format.events();
    for e in events {
        event(&mut out, e, None);
    }
    out.1 = format.batch();
    out.field("data_parallel_rank");
    out.uint(u64::from(data_parallel_rank));
    out.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn decode(bytes: &[u8]) -> Value {
        rmpv::decode::read_value(&mut &bytes[..]).unwrap()
    }

    fn sample() -> Vec<KvEvent> {
        vec![
            KvEvent::AllCleared,
            KvEvent::Stored {
                hashes: vec![u64::MAX, 7],
                parent: None,
                tokens: vec![1, 2, 3, 4],
                block_size: 2,
                medium: KvMedium::Active,
            },
            KvEvent::Stored {
                hashes: vec![9],
                parent: Some(7),
                tokens: vec![5, 6],
                block_size: 2,
                medium: KvMedium::Tier(TierKind::Ram),
            },
            KvEvent::Removed {
                hashes: vec![7],
                medium: KvMedium::Tier(TierKind::Disk),
            },
        ]
    }

    #[test]
    fn batches_decode_as_vllm_arrays() {
        let v = decode(&encode_batch(12.5, &sample(), 3, WireFormat::Array));
        let top = v.as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].as_f64(), Some(12.5));
        assert_eq!(top[2].as_u64(), Some(3));
        let ev = top[1].as_array().unwrap();
        assert_eq!(ev[0], Value::Array(vec!["AllBlocksCleared".into()]));
        let stored = ev[1].as_array().unwrap();
        assert_eq!(stored.len(), 8);
        assert_eq!(stored[0].as_str(), Some("BlockStored"));
        assert_eq!(
            stored[1],
            Value::Array(vec![Value::from(u64::MAX), Value::from(7u64)])
        );
        assert!(stored[2].is_nil());
        assert_eq!(stored[3].as_array().unwrap().len(), 4);
        assert_eq!(stored[4].as_u64(), Some(2));
        assert!(stored[5].is_nil());
        assert_eq!(stored[6].as_str(), Some("GPU"));
        assert!(stored[7].is_nil());
        let tiered = ev[2].as_array().unwrap();
        assert_eq!(tiered[2].as_u64(), Some(7));
        assert_eq!(tiered[6].as_str(), Some("CPU"));
        assert_eq!(
            ev[3],
            Value::Array(vec![
                "BlockRemoved".into(),
                Value::Array(vec![Value::from(7u64)]),
                "DISK".into()
            ])
        );
    }

    fn get<'a>(map: &'a Value, key: &str) -> &'a Value {
        map.as_map()
            .unwrap()
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no {key} in {map}"))
    }

    #[test]
    fn the_default_is_an_array_batch_of_tagged_map_events() {
        let v = decode(&encode_batch(1.0, &sample(), 0, WireFormat::default()));
        let top = v.as_array().unwrap();
        assert_eq!(top.len(), 3);
        let ev = top[1].as_array().unwrap();
        assert_eq!(get(&ev[1], "type").as_str(), Some("BlockStored"));
        assert_eq!(get(&ev[1], "medium").as_str(), Some("GPU"));
        assert_eq!(top[2].as_u64(), Some(0));
    }

    #[test]
    fn batches_decode_as_vllm_tagged_maps() {
        let v = decode(&encode_batch(12.5, &sample(), 3, WireFormat::Map));
        assert_eq!(v.as_map().unwrap().len(), 3);
        assert_eq!(get(&v, "ts").as_f64(), Some(12.5));
        assert_eq!(get(&v, "data_parallel_rank").as_u64(), Some(3));
        let ev = get(&v, "events").as_array().unwrap();
        assert_eq!(get(&ev[0], "type").as_str(), Some("AllBlocksCleared"));
        assert_eq!(ev[0].as_map().unwrap().len(), 1);
        let stored = &ev[1];
        assert_eq!(stored.as_map().unwrap().len(), 8);
        assert_eq!(get(stored, "type").as_str(), Some("BlockStored"));
        assert_eq!(
            get(stored, "block_hashes"),
            &Value::Array(vec![Value::from(u64::MAX), Value::from(7u64)])
        );
        assert!(get(stored, "parent_block_hash").is_nil());
        assert_eq!(get(stored, "token_ids").as_array().unwrap().len(), 4);
        assert_eq!(get(stored, "block_size").as_u64(), Some(2));
        assert!(get(stored, "lora_id").is_nil());
        assert!(get(stored, "lora_name").is_nil());
        assert_eq!(get(stored, "medium").as_str(), Some("GPU"));
        assert_eq!(get(&ev[2], "parent_block_hash").as_u64(), Some(7));
        assert_eq!(get(&ev[2], "medium").as_str(), Some("CPU"));
        assert_eq!(get(&ev[3], "type").as_str(), Some("BlockRemoved"));
        assert_eq!(get(&ev[3], "medium").as_str(), Some("DISK"));
        assert_eq!(ev[3].as_map().unwrap().len(), 3);
    }
}
