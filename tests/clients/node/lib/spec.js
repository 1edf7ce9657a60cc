// The published spec, docs/feed.asyncapi.yaml, put to two uses: the official
// AsyncAPI parser checks the document itself, and Ajv (JSON Schema draft-07,
// what the spec's schemas are written in) checks every message against it.
import { readFileSync } from "node:fs";
import Ajv from "ajv";
import addFormats from "ajv-formats";
import { parse as parseYaml } from "yaml";

const SPEC_ID = "harmonaize-feed";

/** Parse the document with @asyncapi/parser: {errors, warnings, version}. */
export async function checkSpec(path) {
  // Loaded here only: the parser (and its linter) takes a while to load, and
  // a client that reads the feed does not need it.
  const { Parser, DiagnosticSeverity } = await import("@asyncapi/parser");
  const text = readFileSync(path, "utf8");
  const { document, diagnostics } = await new Parser().parse(text, { source: path });
  const describe = (d) => `${d.code}: ${d.message} at /${(d.path ?? []).join("/")}`;
  return {
    errors: diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error).map(describe),
    warnings: diagnostics.filter((d) => d.severity === DiagnosticSeverity.Warning).map(describe),
    notes: diagnostics.filter((d) => d.severity > DiagnosticSeverity.Warning).map(describe),
    parsed: document !== undefined,
    version: document?.version() ?? null,
  };
}

// BigInts (integers beyond 2^53) are numbers to a JSON Schema: compare them as such.
function plain(value) {
  if (typeof value === "bigint") return Number(value);
  if (Array.isArray(value)) return value.map(plain);
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]));
  }
  return value;
}

export class Schemas {
  constructor(path) {
    this.doc = parseYaml(readFileSync(path, "utf8"), { intAsBigInt: false });
    // strict: false because the spec carries AsyncAPI's own keys and x-
    // extensions beside the schemas; they are not JSON Schema keywords.
    this.ajv = new Ajv({ strict: false, allErrors: true });
    addFormats(this.ajv);
    this.ajv.addSchema({ ...this.doc, $id: SPEC_ID });
    this.validators = new Map();
    this.categories = new Map();
    for (const [kind, message] of Object.entries(this.doc.components?.messages ?? {})) {
      const ref = message.payload?.$ref;
      if (typeof ref !== "string") continue;
      this.validators.set(kind, this.ajv.getSchema(`${SPEC_ID}${ref}`));
      this.categories.set(kind, message["x-category"] ?? null);
    }
    this.envelope = this.ajv.getSchema(`${SPEC_ID}#/components/schemas/Envelope`);
    this.errorCodes = new Set(this.doc.components?.schemas?.ErrorCode?.enum ?? []);
  }

  /** The kind's category (condition, event, control), or null for a kind the spec lacks. */
  category(kind) {
    return this.categories.get(kind) ?? null;
  }

  /** Problems of one body of a kind ([] when it conforms). */
  check(kind, body) {
    const validate = this.validators.get(kind);
    if (validate === undefined) return [`${kind}: not a message kind of the spec`];
    if (validate(plain(body))) return [];
    return validate.errors.map((e) => {
      const path = `${kind}${e.instancePath.replaceAll("/", ".")}`;
      // Name an unknown field as the controller does: the request's path, then the key.
      if (e.params?.additionalProperty !== undefined) {
        return `${path}.${e.params.additionalProperty}: unknown key`;
      }
      return `${path} ${e.message}`;
    });
  }

  /** Problems of a whole decoded envelope array. */
  checkEnvelope(items) {
    if (this.envelope(plain(items))) return [];
    return this.envelope.errors.map((e) => `envelope${e.instancePath} ${e.message}`);
  }
}
