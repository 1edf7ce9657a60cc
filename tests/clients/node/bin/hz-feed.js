#!/usr/bin/env node
// hz-feed: the Node.js feed client's command line. Every line it prints on
// stdout is one JSON object with an "event" field; a fatal problem is also one
// plain line on stderr, with exit status 1.
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { FeedClient } from "../lib/client.js";
import { parse as parseJson, stringify } from "../lib/jsonl.js";
import { KeyError } from "../lib/keys.js";
import { checkSpec, Schemas } from "../lib/spec.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const DEFAULT_SPEC = resolve(HERE, "../../../../docs/feed.asyncapi.yaml");

const USAGE = `usage:
  hz-feed watch --feed ENDPOINT --topic PREFIX... [--key FILE --server-key FILE]
                [--state FILE] [--json-commands] [--timeout SECONDS] [--gap-timeout SECONDS]
                [--receive-hwm N] [--receive-buffer BYTES] [--spec FILE] [--trace]
  hz-feed declare FILE --feed ENDPOINT [--key FILE --server-key FILE]
  hz-feed answer NOTICE approve|defer [SECONDS] --feed ENDPOINT [--key ... --server-key ...]
  hz-feed check-spec [FILE]
keys default to $HARMONAIZE_TENANT_KEY and $HARMONAIZE_SERVER_KEY`;

function say(event, fields = {}) {
  process.stdout.write(`${stringify({ event, ...fields })}\n`);
}

function die(text) {
  say("fatal", { error: text });
  process.stderr.write(`hz-feed: ${text}\n`);
  process.exit(1);
}

function number(value, name) {
  if (value === undefined) return undefined;
  const parsed = Number(value);
  if (!Number.isFinite(parsed) || parsed < 0) die(`--${name}: not a number: ${value}`);
  return parsed;
}

function parseCommandLine() {
  try {
    return parseArgs({
      allowPositionals: true,
      options: {
        feed: { type: "string" },
        topic: { type: "string", multiple: true },
        key: { type: "string" },
        "server-key": { type: "string" },
        state: { type: "string" },
        spec: { type: "string" },
        "json-commands": { type: "boolean" },
        timeout: { type: "string" },
        "gap-timeout": { type: "string" },
        "receive-hwm": { type: "string" },
        "receive-buffer": { type: "string" },
        sender: { type: "string" },
        trace: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (err) {
    process.stderr.write(`hz-feed: ${err.message}\n${USAGE}\n`);
    process.exit(2);
  }
}

function readState(path) {
  let text;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    if (err.code === "ENOENT") return { epoch: 0, positions: {} };
    die(`${path}: cannot read it (${err.code})`);
  }
  let state;
  try {
    state = parseJson(text);
  } catch (err) {
    die(`${path}: not JSON (${err.message})`);
  }
  const positions = state?.positions;
  const good = positions !== null && typeof positions === "object" && !Array.isArray(positions)
    && Object.values(positions).every((seq) => Number.isSafeInteger(seq) && seq >= 0);
  const epoch = state?.epoch;
  if (!good || !(typeof epoch === "bigint" || (Number.isSafeInteger(epoch) && epoch >= 0))) {
    die(`${path}: not a feed state ({"epoch": E, "positions": {"topic": seq, ...}})`);
  }
  return { epoch, positions };
}

function writeState(path, client) {
  const text = `${stringify({ epoch: client.epoch, positions: client.positions })}\n`;
  writeFileSync(`${path}.tmp`, text, { mode: 0o600 });
  renameSync(`${path}.tmp`, path);
}

function makeClient(values, extra = {}) {
  if (!values.feed) die("--feed ENDPOINT is required");
  const key = values.key ?? process.env.HARMONAIZE_TENANT_KEY;
  const serverKey = values["server-key"] ?? process.env.HARMONAIZE_SERVER_KEY;
  if (Boolean(key) !== Boolean(serverKey)) die("--key and --server-key go together");
  let schemas;
  try {
    schemas = new Schemas(values.spec ?? DEFAULT_SPEC);
  } catch (err) {
    die(`cannot load the spec: ${err.message}`);
  }
  const client = new FeedClient({
    endpoint: values.feed,
    topics: values.topic ?? ["pool/"],
    key,
    serverKey,
    schemas,
    sender: values.sender,
    gapTimeout: number(values["gap-timeout"], "gap-timeout"),
    receiveHighWaterMark: number(values["receive-hwm"], "receive-hwm"),
    receiveBufferSize: number(values["receive-buffer"], "receive-buffer"),
    ...extra,
  });
  client.on("fatal", (text) => die(text));
  try {
    client.start();
  } catch (err) {
    if (err instanceof KeyError) die(err.message);
    die(`cannot start: ${err.message}`);
  }
  return client;
}

/** Give up after `seconds` without a first answer, saying why. */
function answerWithin(client, seconds) {
  if (seconds === undefined) return;
  const timer = setTimeout(() => {
    if (client.counts.subscribed === 0) {
      die(`no answer from ${client.endpoint} in ${seconds} s: ${client.problem ?? "nothing heard"}`);
    }
  }, seconds * 1000);
  timer.unref();
}

async function watch(values) {
  const state = values.state ? readState(values.state) : { epoch: 0, positions: {} };
  const client = makeClient(values, { resume: state.positions, epoch: state.epoch });
  answerWithin(client, number(values.timeout, "timeout"));
  client.on("subscribed", (answer) => say("subscribed", {
    tenant: answer.tenant, accepted: answer.accepted ?? [], refused: answer.refused ?? [],
    epoch: answer.epoch ?? 0, positions: answer.positions ?? [], renew: answer.renew,
    reset: answer.reset,
  }));
  client.on("message", (m) => say("message", {
    topic: m.topic, seq: m.seq, kind: m.kind, category: m.category, body: m.body,
  }));
  client.on("lost", (loss) => say("lost", loss));
  client.on("problem", (text) => say("problem", { text }));
  client.on("violation", (v) => say("violation", v));
  client.on("rejected", (why) => say("rejected", { why }));
  client.on("unmatched-reply", (reply) => say("unmatched-reply", reply));
  if (values.trace) client.on("frame", (frame) => say("frame", frame));

  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await client.close();
    if (values.state) writeState(values.state, client);
    say("state", { epoch: client.epoch, positions: client.positions });
    say("stats", { ...client.stats, violations_seen: client.violations });
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);

  if (values["json-commands"]) {
    const lines = createInterface({ input: process.stdin });
    lines.on("line", (line) => command(client, line, stop));
    lines.on("close", stop);
  }
  say("ready", { topics: client.topics, resumed: Object.keys(state.positions).length });
}

async function command(client, line, stop) {
  if (line.trim() === "") return;
  let cmd;
  try {
    cmd = parseJson(line);
  } catch (err) {
    say("bad-command", { error: `not JSON: ${err.message}` });
    return;
  }
  const tag = cmd?.tag ?? null;
  switch (cmd?.cmd) {
    case "declare":
      say("reply", { tag, ...(await client.declare(cmd.body)) });
      break;
    case "answer":
      say("reply", { tag, ...(await client.answerNotice(cmd.notice, cmd.action, cmd.seconds)) });
      break;
    case "negotiate":
      say("reply", { tag, ...(await client.negotiate(cmd.step, cmd.body)) });
      break;
    case "counter-window":
      say("reply", { tag, ...(await client.counterWindow(cmd.notice, cmd.windows)) });
      break;
    case "stats":
      say("stats", { tag, ...client.stats, tenant: client.tenant, epoch: client.epoch,
                     positions: client.positions, open_gaps: client.sequencer.openGaps(),
                     violations_seen: client.violations });
      break;
    case "pause":
      client.pause();
      say("paused", { tag });
      break;
    case "resume":
      client.resume();
      say("resumed", { tag });
      break;
    case "quit":
      await stop();
      break;
    default:
      say("bad-command", { tag, error: `unknown command ${JSON.stringify(cmd?.cmd)}` });
  }
}

async function oneRequest(values, send) {
  const client = makeClient(values);
  const reply = await send(client);
  await client.close();
  say("reply", reply);
  if (!reply.ok) {
    process.stderr.write(`hz-feed: refused (${reply.code || "no code"}): ${reply.error}\n`);
  }
  process.exit(reply.ok ? 0 : 1);
}

async function main() {
  const { values, positionals } = parseCommandLine();
  const [verb, ...rest] = positionals;
  if (values.help || verb === undefined) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(verb === undefined && !values.help ? 2 : 0);
  }
  if (verb === "check-spec") {
    const result = await checkSpec(rest[0] ?? values.spec ?? DEFAULT_SPEC);
    say("spec", result);
    process.exit(result.errors.length === 0 && result.parsed ? 0 : 1);
  } else if (verb === "watch") {
    await watch(values);
  } else if (verb === "declare" && rest.length === 1) {
    let body;
    try {
      body = parseJson(readFileSync(rest[0], "utf8"));
    } catch (err) {
      die(`${rest[0]}: ${err.code ? `cannot read it (${err.code})` : `not JSON (${err.message})`}`);
    }
    await oneRequest(values, (client) => client.declare(body));
  } else if (verb === "answer" && (rest.length === 2 || rest.length === 3)) {
    const seconds = rest[2] === undefined ? undefined : number(rest[2], "seconds");
    await oneRequest(values, (client) => client.answerNotice(rest[0], rest[1], seconds));
  } else {
    process.stderr.write(`${USAGE}\n`);
    process.exit(2);
  }
}

main().catch((err) => die(err.message));
