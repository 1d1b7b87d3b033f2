#!/usr/bin/env python3
"""Writes vectors.json: KV-event batches of vLLM's 2026 event contract, encoded the way vLLM's
event classes encode them through msgspec, with their ZMQ frames.

Sources read (vllm-project/vllm, Apache-2.0):
  - tests/v1/core/test_kv_events_contract.py at commit a0db8d8a0eb85aa2e7b111e41c237c240467a001:
    the field lists (required fields always written, possibly nil; optional fields default to None
    and are left out when None), the batch wire shape (an array batch [ts, events, rank] of map
    events whose first key is "type"), unknown fields and trailing elements ignored, and each
    physical copy of a hash stored and removed on its own.
  - docs/features/kv_events.md at commit 0aa3ce853c7d2c9af7d7f183d1690302cc73ef1f: with
    snapshot_endpoint set, the live and replay data frames carry a 24-byte sequence (8-byte
    big-endian seq, then a 16-byte publisher id); an idle publisher sends an empty batch every
    second; replay requests and the end marker keep 8 bytes.

msgspec could not be installed here, so the bytes come from the small msgpack writer below, which
follows msgspec's encoder (src/msgspec/_core.c: smallest integer form, floats as float64, str8
for 32..255-byte strings, struct fields in declaration order, a tagged struct's tag first under
"type", omit_defaults leaving out fields equal to their None default, array_like structs as
arrays with trailing defaults left out). Run: python3 gen.py > vectors.json
"""
import json
import struct

# Field lists from the contract test: (name, required).
STORED = [("block_hashes", 1), ("parent_block_hash", 1), ("token_ids", 1), ("block_size", 1),
          ("lora_id", 1), ("medium", 1), ("lora_name", 1), ("extra_keys", 0), ("group_idx", 0),
          ("kv_cache_spec_kind", 0), ("kv_cache_spec_sliding_window", 0), ("locality", 0),
          ("ownership", 0), ("session_id", 0)]
REMOVED = [("block_hashes", 1), ("medium", 1), ("group_idx", 0), ("locality", 0), ("ownership", 0)]
CLASSES = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": []}


class Event:
    def __init__(self, tag, **fields):
        names = {n for n, _ in CLASSES[tag]}
        unknown = set(fields) - names
        assert not unknown, unknown
        missing = [n for n, req in CLASSES[tag] if req and n not in fields]
        assert not missing, missing
        self.tag, self.fields = tag, fields

    def plain(self):
        """The event as msgspec.msgpack.decode gives it back: a dict, None defaults left out."""
        out = {"type": self.tag}
        for name, req in CLASSES[self.tag]:
            v = self.fields.get(name)
            if req or v is not None:
                out[name] = v
        return out


def pack(v, out):
    if v is None:
        out += b"\xc0"
    elif v is True or v is False:
        out += b"\xc3" if v else b"\xc2"
    elif isinstance(v, int):
        if v >= 0:
            if v < 0x80:
                out += bytes([v])
            elif v < 0x100:
                out += b"\xcc" + struct.pack(">B", v)
            elif v < 0x10000:
                out += b"\xcd" + struct.pack(">H", v)
            elif v < 0x100000000:
                out += b"\xce" + struct.pack(">I", v)
            else:
                out += b"\xcf" + struct.pack(">Q", v)
        elif v >= -32:
            out += struct.pack(">b", v)
        elif v >= -0x80:
            out += b"\xd0" + struct.pack(">b", v)
        elif v >= -0x8000:
            out += b"\xd1" + struct.pack(">h", v)
        elif v >= -0x80000000:
            out += b"\xd2" + struct.pack(">i", v)
        else:
            out += b"\xd3" + struct.pack(">q", v)
    elif isinstance(v, float):
        out += b"\xcb" + struct.pack(">d", v)
    elif isinstance(v, str):
        b = v.encode()
        n = len(b)
        if n < 32:
            out += bytes([0xa0 | n])
        elif n < 0x100:
            out += b"\xd9" + bytes([n])
        elif n < 0x10000:
            out += b"\xda" + struct.pack(">H", n)
        else:
            out += b"\xdb" + struct.pack(">I", n)
        out += b
    elif isinstance(v, (bytes, bytearray)):
        n = len(v)
        if n < 0x100:
            out += b"\xc4" + bytes([n])
        elif n < 0x10000:
            out += b"\xc5" + struct.pack(">H", n)
        else:
            out += b"\xc6" + struct.pack(">I", n)
        out += v
    elif isinstance(v, (list, tuple)):
        n = len(v)
        if n < 16:
            out += bytes([0x90 | n])
        elif n < 0x10000:
            out += b"\xdc" + struct.pack(">H", n)
        else:
            out += b"\xdd" + struct.pack(">I", n)
        for x in v:
            pack(x, out)
    elif isinstance(v, dict):
        n = len(v)
        if n < 16:
            out += bytes([0x80 | n])
        elif n < 0x10000:
            out += b"\xde" + struct.pack(">H", n)
        else:
            out += b"\xdf" + struct.pack(">I", n)
        for k, x in v.items():  # insertion order: declaration order for structs
            pack(k, out)
            pack(x, out)
    elif isinstance(v, Event):
        pack(v.plain(), out)  # a tagged, omit_defaults map struct
    else:
        raise TypeError(type(v))
    return out


def batch(ts, events, rank=None):
    """KVEventBatch, array_like: [ts, events, data_parallel_rank], the rank left out when None."""
    a = [float(ts), events]
    if rank is not None:
        a.append(rank)
    return bytes(pack(a, bytearray()))


def plain(v):
    if isinstance(v, Event):
        return {k: plain(x) for k, x in v.plain().items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v  # Python's json writes big ints digit for digit


PID = bytes(range(0xA0, 0xB0))  # a publisher id (16 bytes)


def seq8(n):
    return struct.pack(">Q", n)


def seq24(n, pid=PID):
    return struct.pack(">Q", n) + pid


def case(name, about, seq, ts, events, rank=0, topic="kv@127.0.0.1@m", raw=None):
    payload = raw if raw is not None else batch(ts, events, rank)
    c = {"name": name, "about": about,
         "frames_hex": [topic.encode().hex(), seq.hex(), payload.hex()]}
    if raw is None:
        c["decoded"] = [float(ts), plain(events), rank]
    return c


BS = 4
A = [1, 2, 3, 4, 5, 6, 7, 8]
cases = [
    case("contract_wire_shape",
         "test_batch_wire_shape's batch: every optional field of the contract, a 2^64-1 hash, "
         "ownership on a removal, session_id on a store",
         seq8(0), 1.5, [
             Event("BlockStored", block_hashes=[11, 2**64 - 1], parent_block_hash=10,
                   token_ids=[1, 2, 3, 4], block_size=2, lora_id=None, medium="GPU",
                   lora_name="adapter", extra_keys=[["adapter"], ["adapter", ["mm-id", 0]]],
                   group_idx=0, kv_cache_spec_kind="full_attention", locality="LOCAL",
                   session_id="session"),
             Event("BlockRemoved", block_hashes=[11], medium="CPU", group_idx=0, ownership="kvcr"),
             Event("AllBlocksCleared"),
         ], rank=1),
    case("copies_stored",
         "test_each_copy_of_a_hash_is_stored_and_removed: two physical copies of the same two "
         "hashes, each cached from block 0 (no parent), each with its own BlockStored",
         seq8(1), 2.0, [
             Event("BlockStored", block_hashes=[101, 102], parent_block_hash=None, token_ids=A,
                   block_size=BS, lora_id=None, medium="GPU", lora_name=None, group_idx=0,
                   kv_cache_spec_kind="full_attention"),
             Event("BlockStored", block_hashes=[101, 102], parent_block_hash=None, token_ids=A,
                   block_size=BS, lora_id=None, medium="GPU", lora_name=None, group_idx=0,
                   kv_cache_spec_kind="full_attention"),
         ]),
    case("copies_first_removed",
         "reallocating evicts the first copy only: one BlockRemoved per hash; the block stays",
         seq8(2), 3.0, [Event("BlockRemoved", block_hashes=[101, 102], medium="GPU", group_idx=0)]),
    case("copies_last_removed",
         "evicting the second copy balances every store: the block is gone",
         seq8(3), 4.0, [Event("BlockRemoved", block_hashes=[101, 102], medium="GPU", group_idx=0)]),
    case("shared_residency",
         "copies the engine reaches but does not hold: locality REMOTE, and the offload media "
         "FS, OBJ, STORAGE; with ownership and session_id; then one of them removed by its "
         "residency key",
         seq8(4), 5.0, [
             Event("BlockStored", block_hashes=[201], parent_block_hash=None, token_ids=A[:BS],
                   block_size=BS, lora_id=None, medium="CPU", lora_name=None, group_idx=0,
                   locality="REMOTE"),
             Event("BlockStored", block_hashes=[202], parent_block_hash=None, token_ids=A[:BS],
                   block_size=BS, lora_id=None, medium="FS", lora_name=None, group_idx=0,
                   ownership="kvcr", session_id="conv-1"),
             Event("BlockStored", block_hashes=[203], parent_block_hash=None, token_ids=A[:BS],
                   block_size=BS, lora_id=None, medium="OBJ", lora_name=None),
             Event("BlockStored", block_hashes=[204], parent_block_hash=None, token_ids=A[:BS],
                   block_size=BS, lora_id=None, medium="STORAGE", lora_name=None),
             Event("BlockRemoved", block_hashes=[202], medium="FS", group_idx=0, ownership="kvcr"),
         ]),
    case("unknown_medium",
         "a medium this contract does not name: fails closed",
         seq8(5), 6.0, [
             Event("BlockStored", block_hashes=[301], parent_block_hash=None, token_ids=A[:BS],
                   block_size=BS, lora_id=None, medium="NVME_OF", lora_name=None),
         ]),
    case("unknown_fields_ignored",
         "test_decoding_ignores_unknown_fields_and_trailing_elements: an unknown event key and a "
         "trailing batch element",
         seq8(6), 1.5, None,
         raw=bytes(pack([1.5, [{"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU",
                                "new": 1}], 0, "new trailing element"], bytearray()))),
    case("snapshot_live_store",
         "a live batch from an engine with snapshot_endpoint: 24-byte sequence (seq 7, publisher "
         "id a0..af)",
         seq24(7), 7.0, [
             Event("BlockStored", block_hashes=[401, 402, 403], parent_block_hash=None,
                   token_ids=list(range(1, 3 * BS + 1)), block_size=BS, lora_id=None,
                   medium="GPU", lora_name=None, group_idx=0, kv_cache_spec_kind="full_attention"),
         ]),
    case("snapshot_heartbeat",
         "an idle publisher's heartbeat: an empty batch with the next seq and the same id",
         seq24(8), 8.0, []),
]

replay = {
    "about": "replay with snapshot_endpoint: the request keeps an 8-byte seq; each reply "
             "[\"\", topic, seq24, payload]; the end marker keeps 8 bytes",
    "request_hex": ["", seq8(7).hex()],
    "reply_hex": ["", cases[-2]["frames_hex"][0], seq24(7).hex(), cases[-2]["frames_hex"][2]],
    "end_hex": ["", "", "ffffffffffffffff", ""],
}

print(json.dumps({
    "about": __doc__.strip().splitlines()[0],
    "sources": {
        "contract_test": "vllm-project/vllm tests/v1/core/test_kv_events_contract.py @ a0db8d8a0eb85aa2e7b111e41c237c240467a001",
        "docs": "vllm-project/vllm docs/features/kv_events.md @ 0aa3ce853c7d2c9af7d7f183d1690302cc73ef1f",
    },
    "cases": cases,
    "replay": replay,
}, indent=1))
