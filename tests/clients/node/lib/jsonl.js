// JSON that keeps integers beyond 2^53 exact: BigInts are written as bare
// digits (JSON has no limit on a number's digits; JSON.stringify refuses them).
const MARK = "\u0000bigint:";

export function stringify(value) {
  return JSON.stringify(value, (_key, item) => (typeof item === "bigint" ? `${MARK}${item}` : item))
    .replace(/"\\u0000bigint:(-?\d+)"/g, "$1");
}

/** JSON.parse, except that an integer a number cannot hold exactly comes back as a BigInt. */
export function parse(text) {
  const quoted = text.replace(/("(?:[^"\\]|\\.)*")|(?<![\d.eE+-])(-?\d{16,})(?![.\deE])/g,
    (match, string, digits) => (string !== undefined ? string : `"\\u0000bigint:${digits}"`));
  return JSON.parse(quoted, (_key, item) => {
    if (typeof item === "string" && item.startsWith(MARK)) {
      const big = BigInt(item.slice(MARK.length));
      return big <= BigInt(Number.MAX_SAFE_INTEGER) && big >= BigInt(Number.MIN_SAFE_INTEGER)
        ? Number(big) : big;
    }
    return item;
  });
}
