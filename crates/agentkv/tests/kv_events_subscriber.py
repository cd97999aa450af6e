"""A KV-event subscriber written from vLLM's published format (pyzmq + msgpack, no vLLM code).

Usage: kv_events_subscriber.py PUB_ENDPOINT REPLAY_ENDPOINT [map|array]

Subscribes to every topic, prints "ready" once connected, then decodes every message until
no message came for 3 s after the first one (or 120 s passed) and checks each strictly:

  message  = [topic, seq: 8-byte big-endian, payload]      seq = 0, 1, 2, ... without gaps
  payload  = msgpack [ts: float, events: [event...], data_parallel_rank: int]
  event    = {"type": "BlockStored", "block_hashes": [int], "parent_block_hash": int | None,
              "token_ids": [int], "block_size": int, "lora_id": int | None,
              "medium": str | None, "lora_name": str | None}
           | {"type": "BlockRemoved", "block_hashes": [int], "medium": str | None}
           | {"type": "AllBlocksCleared"}

(vLLM's msgspec structs, events tag=True: the layout vllm-router 0.1.17 decodes. With FORMAT
"map" as the third argument the batch is a map {"ts", "events", "data_parallel_rank"} too, with
"array" the events are positional arrays, the tag first: vLLM's earlier array_like layout.)

Then asks the replay ROUTER (a DEALER sending ["", start_seq]) for everything from seq 0 and
checks the answer is the same payloads followed by the end marker (seq -1, empty payload).
Prints one JSON line: {"batches": [[event as a dict...]...], "replayed": N}.
"""

import json
import struct
import sys
import time

import msgpack
import zmq


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
          "lora_name"]
REMOVED = ["block_hashes", "medium"]


def as_array(ev):
    """A tagged map as vLLM's array_like layout (tag first), checking its keys exactly."""
    if not isinstance(ev, dict) or "type" not in ev:
        fail(f"event is not a tagged map: {ev!r}")
    fields = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": []}.get(ev["type"])
    if fields is None:
        fail(f"unknown tag {ev['type']!r}")
    if set(ev) != {"type", *fields}:
        fail(f"{ev['type']} has keys {sorted(ev)}")
    return [ev["type"]] + [ev[f] for f in fields]


def decode_event(ev):
    if FORMAT != "array":
        ev = as_array(ev)
    if not isinstance(ev, list) or not ev:
        fail(f"event is not a tagged array: {ev!r}")
    tag = ev[0]
    if tag == "BlockStored":
        if len(ev) != 8:
            fail(f"BlockStored has {len(ev)} fields: {ev!r}")
        _, hashes, parent, tokens, block_size, lora_id, medium, lora_name = ev
        if not hashes or not all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes):
            fail(f"bad block_hashes {hashes!r}")
        if parent is not None and not isinstance(parent, int):
            fail(f"bad parent_block_hash {parent!r}")
        if not isinstance(block_size, int) or block_size <= 0:
            fail(f"bad block_size {block_size!r}")
        if len(tokens) != len(hashes) * block_size:
            fail(f"{len(tokens)} token_ids for {len(hashes)} blocks of {block_size}")
        if lora_id is not None or lora_name is not None:
            fail("no LoRA is served")
        if not isinstance(medium, str):
            fail(f"bad medium {medium!r}")
        return {"type": "stored", "hashes": hashes, "parent": parent, "tokens": tokens,
                "block_size": block_size, "medium": medium}
    if tag == "BlockRemoved":
        if len(ev) != 3:
            fail(f"BlockRemoved has {len(ev)} fields: {ev!r}")
        _, hashes, medium = ev
        if not hashes or not all(isinstance(h, int) for h in hashes):
            fail(f"bad block_hashes {hashes!r}")
        return {"type": "removed", "hashes": hashes, "medium": medium}
    if tag == "AllBlocksCleared":
        if len(ev) != 1:
            fail(f"AllBlocksCleared has fields: {ev!r}")
        return {"type": "cleared"}
    fail(f"unknown tag {tag!r}")


def decode_payload(payload):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if FORMAT == "map":
        if not isinstance(batch, dict) or set(batch) - {"ts", "events", "data_parallel_rank"}:
            fail(f"EventBatch is not {{ts, events, data_parallel_rank?}}: {batch!r}")
        batch = [batch.get("ts"), batch.get("events")] + (
            [batch["data_parallel_rank"]] if "data_parallel_rank" in batch else [])
    if not isinstance(batch, list) or len(batch) not in (2, 3):
        fail(f"EventBatch is not [ts, events, rank?]: {batch!r}")
    ts, events = batch[0], batch[1]
    if not isinstance(ts, float) or abs(ts - time.time()) > 600:
        fail(f"bad ts {ts!r}")
    if len(batch) == 3 and not isinstance(batch[2], int):
        fail(f"bad data_parallel_rank {batch[2]!r}")
    return [decode_event(e) for e in events]


FORMAT = sys.argv[3] if len(sys.argv) > 3 else "array_of_maps"


def main():
    pub_ep, replay_ep = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub_ep)
    time.sleep(0.5)  # let the subscription reach the publisher
    print("ready", flush=True)
    payloads, batches = [], []
    expect_seq = None
    start = time.time()
    last = None
    while time.time() - start < 120:
        if last is not None and time.time() - last > 3:
            break
        if not sub.poll(200):
            continue
        frames = sub.recv_multipart()
        if len(frames) != 3:
            fail(f"{len(frames)} frames")
        topic, seq_bytes, payload = frames
        if topic != b"" or len(seq_bytes) != 8:
            fail(f"bad topic/seq frames {topic!r} {seq_bytes!r}")
        (seq,) = struct.unpack(">q", seq_bytes)
        if expect_seq is not None and seq != expect_seq:
            fail(f"seq {seq} after {expect_seq - 1}")
        expect_seq = seq + 1
        payloads.append((seq, payload))
        batches.append(decode_payload(payload))
        last = time.time()
    if not batches:
        fail("no events")

    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_ep)
    dealer.send_multipart([b"", struct.pack(">q", 0)])
    replayed = []
    while True:
        if not dealer.poll(10000):
            fail("replay timed out")
        empty, seq_bytes, payload = dealer.recv_multipart()
        (seq,) = struct.unpack(">q", seq_bytes)
        if seq == -1:
            if payload != b"":
                fail("end marker with a payload")
            break
        replayed.append((seq, payload))
        decode_payload(payload)
    # The subscriber may have joined after the first batches: the replay has them too.
    first_seen = payloads[0][0]
    tail = [p for p in replayed if p[0] >= first_seen]
    if tail[: len(payloads)] != payloads:
        fail("replayed batches differ from the published ones")
    early = [decode_payload(p) for s, p in replayed if s < first_seen]
    print(json.dumps({"batches": early + batches, "replayed": len(replayed)}), flush=True)


if __name__ == "__main__":
    main()
