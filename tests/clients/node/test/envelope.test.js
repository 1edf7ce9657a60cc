// Envelopes and JSON lines: 64-bit integers kept exact, bad frames refused, not raised.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Encoder } from "@msgpack/msgpack";

import { decodeEnvelope, encodeEnvelope } from "../lib/envelope.js";
import { parse, stringify } from "../lib/jsonl.js";

test("a request round-trips, with the time a float and big integers exact", () => {
  const frame = encodeEnvelope("subscribe", "me", 3, 1735689600, { topics: ["pool/"], epoch: 2 ** 62 });
  assert.equal(frame[0], 0x97);
  // The time is msgpack float 64 even when it is a whole second.
  assert.ok(frame.includes(Buffer.from([0xcb, 0x41, 0xd9, 0xdd, 0x21, 0x60, 0, 0, 0])));
  const env = decodeEnvelope(frame);
  assert.equal(env.kind, "subscribe");
  assert.equal(env.seq, 3);
  assert.equal(env.body.epoch, 2n ** 62n);
  const small = decodeEnvelope(encodeEnvelope("subscribe", "me", 0, 1.5, { epoch: 2 ** 40 }));
  assert.equal(small.body.epoch, 2 ** 40);
});

test("frames that are not one envelope come back as errors", () => {
  const enc = new Encoder();
  const bad = [
    Buffer.from([0xc1]),
    Buffer.from(enc.encode(["hz", 1, "x", "c", 1, 1.0])),
    Buffer.from(enc.encode(["xx", 1, "x", "c", 1, 1.0, {}])),
    Buffer.from(enc.encode(["hz", 2, "x", "c", 1, 1.0, {}])),
    Buffer.from(enc.encode(["hz", 1, "x", "c", -1, 1.0, {}])),
    Buffer.from(enc.encode(["hz", 1, "x", "c", 1, 1.0, [1]])),
    Buffer.concat([Buffer.from(enc.encode(["hz", 1, "x", "c", 1, 1.0, {}])), Buffer.from([0])]),
  ];
  for (const frame of bad) assert.ok(decodeEnvelope(frame).error, frame.toString("hex"));
});

test("JSON lines keep integers past 2^53", () => {
  const text = stringify({ epoch: 2n ** 62n, seq: 5 });
  assert.equal(text, '{"epoch":4611686018427387904,"seq":5}');
  assert.deepEqual(parse(text), { epoch: 2n ** 62n, seq: 5 });
});
