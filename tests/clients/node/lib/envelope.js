// The ZeroMQ envelope of docs/wire.md ("Frames"): a msgpack array
// ["hz", 1, kind, sender, seq, time, body]. Decoding never throws: a frame that
// is not one envelope comes back as {error} for the caller to skip and count.
import { Decoder, Encoder } from "@msgpack/msgpack";

export const MAGIC = "hz";
export const WIRE_VERSION = 1;
// The spec's x-limits.max_frame_bytes; strings are at most 4096 bytes each.
export const MAX_FRAME_BYTES = 262144;
export const MAX_STRING_BYTES = 4096;

// Integers may reach 2^62 on the wire (epochs begun by an old controller), past
// what a JavaScript number holds exactly: 64-bit integers decode as BigInt and
// are turned back into numbers where that is exact.
const decoder = new Decoder({
  useBigInt64: true,
  maxStrLength: MAX_STRING_BYTES,
  maxBinLength: MAX_FRAME_BYTES,
  maxArrayLength: 65536,
  maxMapLength: 65536,
  maxExtLength: 0,
});
const encoder = new Encoder({ useBigInt64: true });

/** A BigInt that fits a JavaScript number exactly becomes one; others stay BigInt. */
export function narrow(value) {
  if (typeof value === "bigint") {
    return value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER)
      ? Number(value) : value;
  }
  if (Array.isArray(value)) return value.map(narrow);
  if (value !== null && typeof value === "object" && !(value instanceof Uint8Array)) {
    const out = {};
    for (const [key, item] of Object.entries(value)) out[key] = narrow(item);
    return out;
  }
  return value;
}

// With useBigInt64 the encoder writes a number outside 32 bits as a float, not
// an integer: widen such integers to BigInt first so they go out as int64/uint64.
function widen(value) {
  if (typeof value === "number" && Number.isInteger(value)
      && (value >= 2 ** 32 || value < -(2 ** 31))) {
    return BigInt(value);
  }
  if (Array.isArray(value)) return value.map(widen);
  if (value !== null && typeof value === "object" && !(value instanceof Uint8Array)) {
    const out = {};
    for (const [key, item] of Object.entries(value)) out[key] = widen(item);
    return out;
  }
  return value;
}

function float64(value) {
  const buf = Buffer.alloc(9);
  buf[0] = 0xcb;
  buf.writeDoubleBE(value, 1);
  return buf;
}

/**
 * One request frame. The time always goes out as a msgpack float (the wire
 * calls it a float; a whole second would otherwise encode as an integer).
 */
export function encodeEnvelope(kind, sender, seq, time, body) {
  const parts = [Buffer.from([0x97])];
  for (const item of [MAGIC, WIRE_VERSION, kind, sender, seq]) {
    parts.push(Buffer.from(encoder.encode(widen(item))));
  }
  parts.push(float64(time));
  parts.push(Buffer.from(encoder.encode(widen(body))));
  const frame = Buffer.concat(parts);
  if (frame.length > MAX_FRAME_BYTES) {
    throw new RangeError(`${kind}: ${frame.length} bytes is over the ${MAX_FRAME_BYTES}-byte frame limit`);
  }
  return frame;
}

function isMap(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value)
    && !(value instanceof Uint8Array);
}

/**
 * Decode one envelope frame: {kind, sender, seq, time, body} or {error}.
 * Strict about the envelope's shape, silent about fields it does not know.
 */
export function decodeEnvelope(frame) {
  if (frame.length > MAX_FRAME_BYTES) return { error: "frame over the size limit" };
  let raw;
  try {
    raw = decoder.decode(frame);
  } catch (err) {
    return { error: `not msgpack: ${err.message}` };
  }
  if (!Array.isArray(raw) || raw.length !== 7) return { error: "not a seven-element envelope" };
  const [magic, version, kind, sender, seq, time, body] = raw;
  if (magic !== MAGIC) return { error: "bad magic" };
  if (narrow(version) !== WIRE_VERSION) return { error: `wire version ${String(version)}` };
  if (typeof kind !== "string" || typeof sender !== "string") {
    return { error: "kind or sender not a string" };
  }
  const number = narrow(seq);
  if (!(Number.isSafeInteger(number) && number >= 0)) return { error: "bad sequence number" };
  if (typeof time !== "number" && typeof time !== "bigint") return { error: "bad time" };
  if (!isMap(body)) return { error: "body not a map" };
  return { kind, sender, seq: number, time: Number(time), body: narrow(body) };
}
