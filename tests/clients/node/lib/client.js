// The I/O shell of the feed client: one ZeroMQ DEALER with CurveZMQ, the
// subscription kept alive, requests matched to replies, and the Sequencer
// (sans-I/O) deciding what to deliver and when to ask for what is missing.
import { EventEmitter } from "node:events";
import * as zmq from "zeromq";

import { decodeEnvelope, encodeEnvelope, MAX_FRAME_BYTES } from "./envelope.js";
import { loadPair, loadPublic } from "./keys.js";
import { Sequencer } from "./sequencer.js";

// docs/wire.md: renew every third of `renew`; 30 s until the controller says.
const DEFAULT_RENEW = 30;
const TICK_MS = 100;

export class FeedClient extends EventEmitter {
  /**
   * @param {object} options
   * endpoint, topics; key (a .key_secret file) and serverKey (a .key file), or
   * neither for a provider without authentication; schemas (spec.Schemas);
   * resume ({topic: seq}) and epoch from a previous run; gapTimeout and
   * resendInterval (seconds); requestTimeout (seconds) and requestTries;
   * receiveHighWaterMark (frames ZeroMQ queues for us before the controller's
   * queue fills) and receiveBufferSize (the kernel's, in bytes): small ones make
   * a slow reader lose messages at the controller, as tests want; sender (our
   * name in envelopes).
   */
  constructor(options) {
    super();
    this.options = options;
    this.endpoint = options.endpoint;
    this.topics = options.topics;
    this.schemas = options.schemas;
    this.sender = options.sender ?? "hz-node";
    this.sequencer = new Sequencer({
      gapTimeout: options.gapTimeout ?? 2.0,
      resendInterval: options.resendInterval ?? 0.5,
      positions: options.resume ?? {},
      epoch: options.epoch ?? 0,
    });
    this.requestTimeout = options.requestTimeout ?? 5.0;
    this.requestTries = options.requestTries ?? 3;
    this.tenant = null;
    this.accepted = [];
    this.refused = [];
    this.renew = DEFAULT_RENEW;
    this.problem = null;
    this.counts = { rejected: 0, violations: 0, sent: 0, send_failed: 0, subscribed: 0 };
    this.violations = [];
    this.pending = new Map();
    this.nextRequest = 1;
    this.lastSubscribe = -Infinity;
    this.handshakes = 0;
    this.paused = null;
    this.closed = false;
    this.sending = Promise.resolve();
  }

  get stats() {
    return { ...this.sequencer.stats, ...this.counts };
  }

  get positions() {
    return this.sequencer.positions();
  }

  get epoch() {
    return this.sequencer.epoch;
  }

  now() {
    return performance.now() / 1000;
  }

  start() {
    const socketOptions = {
      linger: 0,
      // Bounds what a broken peer can make us allocate: a frame is at most 256 KiB.
      maxMessageSize: MAX_FRAME_BYTES + 4096,
      sendTimeout: 0,
    };
    if (this.options.receiveHighWaterMark !== undefined) {
      socketOptions.receiveHighWaterMark = this.options.receiveHighWaterMark;
    }
    if (this.options.receiveBufferSize !== undefined) {
      socketOptions.receiveBufferSize = this.options.receiveBufferSize;
    }
    if (this.options.key) {
      const pair = loadPair(this.options.key);
      socketOptions.curveServerKey = loadPublic(this.options.serverKey);
      socketOptions.curvePublicKey = pair.publicKey;
      socketOptions.curveSecretKey = pair.secretKey;
    }
    this.socket = new zmq.Dealer(socketOptions);
    this._watchEvents();
    this.socket.connect(this.endpoint);
    this._subscribe();
    this.timer = setInterval(() => this._tick(), TICK_MS);
    this._readLoop();
    return this;
  }

  _watchEvents() {
    const events = this.socket.events;
    events.on("handshake:error:auth", () => {
      // The controller says nothing else to a key it does not hold (wire.md).
      this._fatal("the controller refused this key: it is not filed with the provider");
    });
    const hint = this.options.key
      ? "usually a wrong server key"
      : "the controller wants CurveZMQ: give a key and its server key";
    events.on("handshake:error:protocol", (event) => {
      this._problem(`the handshake failed (${event.error?.message ?? "protocol error"}): ${hint}`);
    });
    events.on("handshake:error:other", (event) => {
      this._problem(`the handshake failed (${event.error?.message ?? "no detail"}): ${hint}`);
    });
    // A dropped connection says less than the failed handshake that dropped it.
    events.on("disconnect", () => {
      if (this.problem === null) this._problem("the connection dropped");
    });
    events.on("connect:retry", () => {
      if (this.problem === null) this._problem("cannot connect");
    });
    events.on("handshake", () => {
      this.problem = null;
      this.handshakes += 1;
      // A new connection is a new peer to the controller's ROUTER: subscribe
      // again at once (with our positions, so nothing is missed meanwhile).
      if (this.handshakes > 1) this._subscribe();
    });
  }

  _problem(text) {
    if (this.problem !== text) {
      this.problem = text;
      this.emit("problem", text);
    }
  }

  _fatal(text) {
    if (this.closed) return;
    this.emit("fatal", text);
  }

  /** Stop reading the socket (test-only: lets the controller's queue for us overflow). */
  pause() {
    if (this.paused === null) {
      let release;
      const gate = new Promise((resolve) => { release = resolve; });
      this.paused = { gate, release };
    }
  }

  resume() {
    if (this.paused !== null) {
      const { release } = this.paused;
      this.paused = null;
      release();
    }
  }

  async _readLoop() {
    while (!this.closed) {
      if (this.paused !== null) {
        await this.paused.gate;
        continue;
      }
      let frames;
      try {
        frames = await this.socket.receive();
      } catch (err) {
        if (this.closed) return;
        this.emit("problem", `receive failed: ${err.message}`);
        continue;
      }
      this._frame(frames);
    }
  }

  _reject(why) {
    this.counts.rejected += 1;
    this.emit("rejected", why);
  }

  _violation(kind, problems) {
    this.counts.violations += 1;
    if (this.violations.length < 20) this.violations.push(...problems.slice(0, 3));
    this.emit("violation", { kind, problems });
  }

  _frame(frames) {
    if (frames.length !== 2) {
      this._reject(`${frames.length} frames, not two`);
      return;
    }
    const topic = frames[0].toString("utf8");
    const envelope = decodeEnvelope(frames[1]);
    if (envelope.error !== undefined) {
      this._reject(envelope.error);
      return;
    }
    this.emit("frame", { topic, kind: envelope.kind, seq: envelope.seq });
    const category = this.schemas.category(envelope.kind);
    if (category !== null) {
      const problems = this.schemas.check(envelope.kind, envelope.body);
      if (problems.length > 0) this._violation(envelope.kind, problems);
    }
    if (topic === "") {
      this._answer(envelope);
      return;
    }
    // A kind this client does not know (a newer controller's) still holds its
    // place in the topic's numbering: it moves the position, and is not given.
    const known = category === "condition" || category === "event";
    if (!known) this._reject(`unknown kind ${envelope.kind} on ${topic}`);
    const now = this.now();
    const message = { topic, seq: envelope.seq, kind: envelope.kind, time: envelope.time,
                      category: known ? category : null, body: envelope.body };
    for (const out of this.sequencer.receive(message, now)) this.emit("message", out);
  }

  _answer(envelope) {
    const body = envelope.body;
    if (envelope.kind === "subscribed") {
      this.counts.subscribed += 1;
      this.tenant = body.tenant;
      this.accepted = body.accepted ?? [];
      this.refused = body.refused ?? [];
      if (typeof body.renew === "number" && body.renew > 0) this.renew = body.renew;
      const before = this.sequencer.epoch;
      const reset = this.sequencer.subscribed(body, this.now());
      this.emit("subscribed", { ...body, reset, previousEpoch: before });
    } else if (envelope.kind === "reply") {
      const pending = this.pending.get(body.request);
      if (pending !== undefined) {
        this.pending.delete(body.request);
        pending.resolve({ ...body, code: body.code ?? "", error: body.error ?? "" });
      } else {
        this.emit("unmatched-reply", body);
      }
    } else {
      this._reject(`unexpected ${envelope.kind} with an empty topic`);
    }
  }

  _send(kind, seq, body) {
    const problems = this.schemas.check(kind, body);
    if (problems.length > 0) throw new TypeError(problems.join("; "));
    const frame = encodeEnvelope(kind, this.sender, seq, Date.now() / 1000, body);
    this.sending = this.sending.then(async () => {
      if (this.closed) return;
      try {
        await this.socket.send(frame);
        this.counts.sent += 1;
      } catch (err) {
        // Full or not yet connected: a subscribe is resent by the timer, a
        // request by its own timeout.
        this.counts.send_failed += 1;
        this.emit("send-failed", { kind, error: err.message });
      }
    });
    return frame;
  }

  _subscribe() {
    this.lastSubscribe = this.now();
    this._send("subscribe", 0, {
      topics: this.topics, since: this.sequencer.since(), epoch: this.sequencer.epoch,
    });
  }

  _tick() {
    if (this.closed) return;
    const now = this.now();
    const { deliver, ask, lost } = this.sequencer.tick(now);
    for (const { topic, count } of lost) this.emit("lost", { topic, count });
    for (const message of deliver) this.emit("message", message);
    // Until the first answer, ask every second; then renew every third of `renew`.
    const every = this.counts.subscribed === 0 ? 1.0 : this.renew / 3;
    if (ask || now - this.lastSubscribe >= every) this._subscribe();
    for (const [request, pending] of this.pending) {
      if (now < pending.deadline) continue;
      if (pending.tries < this.requestTries) {
        // Dropped over budget, or lost: the same request again, same number.
        pending.tries += 1;
        pending.deadline = now + this.requestTimeout;
        this._send(pending.kind, request, pending.body);
      } else {
        this.pending.delete(request);
        pending.resolve({ request, ok: false, code: "", timeout: true,
                          error: `no answer after ${pending.tries} tries` });
      }
    }
  }

  /** A request answered by a `reply`: resolves with it ({request, ok, error, code}). */
  request(kind, body) {
    const request = this.nextRequest++;
    return new Promise((resolve) => {
      try {
        this._send(kind, request, body);
      } catch (err) {
        resolve({ request, ok: false, code: "invalid", local: true, error: err.message });
        return;
      }
      this.pending.set(request, { kind, body, tries: 1, resolve,
                                  deadline: this.now() + this.requestTimeout });
    });
  }

  declare(declaration) {
    return this.request("job-declaration", declaration);
  }

  answerNotice(notice, action, seconds) {
    const body = { notice, action };
    if (seconds !== undefined && seconds !== null) body.seconds = seconds;
    return this.request("validation-answer", body);
  }

  /**
   * A negotiation step (the tenant guide's "Negotiating capacity and maintenance"):
   * `step` is propose, counter, accept, reject, release or list, `body` that message's
   * fields. Resolves with the reply; its `negotiation` lists the controller's answers.
   */
  negotiate(step, body) {
    return this.request(`negotiation-${step}`, body ?? {});
  }

  /** Counter a validation notice's window with up to four starts (none: accept it). */
  counterWindow(notice, windows) {
    return this.request("maintenance-counter", { notice, windows: windows ?? [] });
  }

  async close() {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    this.resume();
    await this.sending;
    for (const [request, pending] of this.pending) {
      pending.resolve({ request, ok: false, code: "", error: "closed" });
    }
    this.pending.clear();
    this.socket.events.close();
    this.socket.close();
  }
}
