// CurveZMQ key files as docs/wire.md ("Connection") describes them: TOML, with
// `public-key` (NAME.key) or `public-key` and `secret-key` (NAME.key_secret),
// each a 40-character Z85 string.
import { readFileSync } from "node:fs";
import { parse } from "smol-toml";

const Z85 = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;

export class KeyError extends Error {}

function field(path, table, name) {
  const value = table[name];
  if (typeof value !== "string" || !Z85.test(value)) {
    throw new KeyError(`${path}: ${name} is not a 40-character Z85 key`);
  }
  return value;
}

function load(path) {
  let text;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw new KeyError(`${path}: cannot read it (${err.code ?? err.message})`);
  }
  try {
    return parse(text);
  } catch (err) {
    throw new KeyError(`${path}: not TOML (${err.message.split("\n")[0]})`);
  }
}

/** {publicKey, secretKey} from a NAME.key_secret file. */
export function loadPair(path) {
  const table = load(path);
  return { publicKey: field(path, table, "public-key"), secretKey: field(path, table, "secret-key") };
}

/** The public key from a NAME.key file (or the public half of a secret file). */
export function loadPublic(path) {
  return field(path, load(path), "public-key");
}
