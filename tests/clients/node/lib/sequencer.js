// Per-topic ordering, repair and resume of docs/wire.md ("Topics and sequence
// numbers", "Gaps, resumes and resets"), without I/O and without a clock: the
// caller passes `now` (seconds) and asks nextDeadline() when to come back.
//
// Every topic holds `pos`, the newest seq it delivered (or was told to take as
// its present). A message above pos+1 is held until the ones before it come; a
// gap asks for a subscribe naming pos in `since`, resent every resendInterval,
// and is given up (the loss counted) after gapTimeout without progress.

function stableKey(value) {
  if (Array.isArray(value)) return `[${value.map(stableKey).join(",")}]`;
  if (value !== null && typeof value === "object") {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${stableKey(value[k])}`).join(",")}}`;
  }
  return typeof value === "bigint" ? `${value}n` : JSON.stringify(value);
}

export const MAX_SINCE = 1024;

export class Sequencer {
  constructor({ gapTimeout = 2.0, resendInterval = 0.5, maxHeld = 100000,
                positions = {}, epoch = 0 } = {}) {
    this.gapTimeout = gapTimeout;
    this.resendInterval = resendInterval;
    this.maxHeld = maxHeld;
    this.epoch = epoch;
    this.topics = new Map();
    this.touch = 0;
    // duplicates: a seq already had; unchanged: a condition equal to the last one
    // given on its topic, under a new seq.
    this.stats = { delivered: 0, duplicates: 0, unchanged: 0, unknown: 0, recovered: 0,
                   gaps: 0, lost: 0, resets: 0 };
    for (const [topic, seq] of Object.entries(positions)) {
      this._topic(topic).pos = Number(seq);
    }
  }

  _topic(topic) {
    let st = this.topics.get(topic);
    if (st === undefined) {
      st = { pos: 0, held: new Map(), fresh: false, target: 0, gap: null, lastCondition: null,
             touched: 0 };
      this.topics.set(topic, st);
    }
    return st;
  }

  /** Where every topic stands: what to save to resume after a restart. */
  positions() {
    const out = {};
    for (const [topic, st] of this.topics) if (st.pos > 0) out[topic] = st.pos;
    return out;
  }

  openGaps() {
    return [...this.topics].filter(([, st]) => st.gap !== null).map(([topic]) => topic);
  }

  /**
   * The `since` and `epoch` of the next subscribe: every topic with a position,
   * open gaps first, then the most recently active (the wire allows 1024).
   */
  since() {
    const rows = [...this.topics].filter(([, st]) => st.pos > 0 || st.gap !== null);
    rows.sort(([, a], [, b]) => ((b.gap !== null) - (a.gap !== null)) || (b.touched - a.touched));
    return rows.slice(0, MAX_SINCE).map(([topic, st]) => ({ topic, seq: st.pos }));
  }

  /** A `subscribed` answer. Returns true when it reset the positions (a new epoch). */
  subscribed(answer, now) {
    let reset = false;
    const epoch = answer.epoch ?? 0;
    if (epoch !== this.epoch) {
      if (this.epoch !== 0 && this.topics.size > 0) {
        // Positions of another epoch mean nothing: every topic starts again at
        // 0, and the controller (told our old epoch) replays what it retains.
        for (const st of this.topics.values()) {
          st.pos = 0;
          st.held.clear();
          st.gap = null;
          st.target = 0;
          st.fresh = false;
          // lastCondition stays: a condition the same as the last one given is
          // still no news to the program, whatever its number now.
        }
        this.stats.resets += 1;
        reset = true;
      }
      this.epoch = epoch;
    }
    for (const { topic, seq } of answer.positions ?? []) {
      const known = this.topics.has(topic);
      const st = this._topic(topic);
      if (!known && !reset) {
        // A fresh topic: its position is the present. Its current condition
        // follows with a seq at most that: deliver that one, nothing older.
        st.pos = seq;
        st.fresh = true;
      } else if (seq > st.pos) {
        st.target = Math.max(st.target, seq);
        this._open(st, now);
      }
    }
    return reset;
  }

  _open(st, now) {
    if (st.gap === null) st.gap = { progressAt: now, askedAt: -Infinity };
  }

  /**
   * One feed message. `category` is the kind's (condition, event), or null for
   * a kind this client does not know: it moves the position but is not given.
   * Returns the messages to deliver, in order.
   */
  receive(message, now) {
    const st = this._topic(message.topic);
    st.touched = ++this.touch;
    const out = [];
    if (message.seq <= st.pos) {
      if (st.fresh && message.category === "condition") {
        st.fresh = false;
        this._deliver(st, message, out);
      } else {
        this.stats.duplicates += 1;
      }
      return out;
    }
    if (message.seq === st.pos + 1) {
      this._advance(st, message, out);
      this._drain(st, out);
      if (st.gap !== null) st.gap.progressAt = now;
    } else if (!st.held.has(message.seq)) {
      st.held.set(message.seq, message);
      this._open(st, now);
      if (st.held.size > this.maxHeld) this._giveUp(st, now, out);
    } else {
      this.stats.duplicates += 1;
    }
    this._closeIfWhole(st);
    return out;
  }

  _advance(st, message, out) {
    st.pos = message.seq;
    if (message.category === "condition") st.fresh = false;
    this._deliver(st, message, out);
  }

  _deliver(st, message, out) {
    if (message.category === null) {
      this.stats.unknown += 1;
      return;
    }
    if (message.category === "condition") {
      // A condition identical to the last one given on its topic is no news.
      const key = stableKey(message.body);
      if (key === st.lastCondition) {
        this.stats.unchanged += 1;
        return;
      }
      st.lastCondition = key;
    }
    this.stats.delivered += 1;
    out.push(message);
  }

  _drain(st, out) {
    while (st.held.has(st.pos + 1)) {
      const next = st.held.get(st.pos + 1);
      st.held.delete(st.pos + 1);
      this._advance(st, next, out);
    }
    for (const seq of st.held.keys()) if (seq <= st.pos) st.held.delete(seq);
  }

  _closeIfWhole(st) {
    if (st.gap !== null && st.held.size === 0 && st.pos >= st.target) {
      st.gap = null;
      st.target = 0;
      this.stats.recovered += 1;
    }
  }

  _giveUp(st, now, out) {
    // What is missing is no longer retained: count it, go on from the oldest
    // message held (or, holding none, from the position the controller named).
    const next = st.held.size > 0 ? Math.min(...st.held.keys()) : st.target + 1;
    const lost = Math.max(0, next - st.pos - 1);
    this.stats.gaps += 1;
    this.stats.lost += lost;
    st.pos = Math.max(st.pos, next - 1);
    st.target = 0;
    st.gap = null;
    this._drain(st, out);
    if (st.held.size > 0) st.gap = { progressAt: now, askedAt: -Infinity };
    return lost;
  }

  /**
   * Time passes. Returns {deliver, ask, lost}: messages freed by a gap given up,
   * whether a subscribe naming the gaps is due now, and the topics given up.
   */
  tick(now) {
    const deliver = [];
    const lost = [];
    let ask = false;
    for (const [topic, st] of this.topics) {
      if (st.gap === null) continue;
      if (now - st.gap.progressAt >= this.gapTimeout) {
        lost.push({ topic, count: this._giveUp(st, now, deliver) });
        if (st.gap === null) continue;
      }
      if (now - st.gap.askedAt >= this.resendInterval) ask = true;
    }
    if (ask) for (const st of this.topics.values()) if (st.gap !== null) st.gap.askedAt = now;
    return { deliver, ask, lost };
  }

  /** When tick() has something to do next, or Infinity. */
  nextDeadline() {
    let next = Infinity;
    for (const st of this.topics.values()) {
      if (st.gap === null) continue;
      next = Math.min(next, st.gap.askedAt + this.resendInterval,
                      st.gap.progressAt + this.gapTimeout);
    }
    return next;
  }
}
