// The Sequencer alone: ordering, repair, loss, resume and reset, time passed in.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Sequencer } from "../lib/sequencer.js";

const ev = (seq, topic = "job/a/j/") => ({ topic, seq, kind: "job-advisory", category: "event",
                                           body: { n: seq } });
const cond = (seq, body, topic = "pool/p/H") => ({ topic, seq, kind: "pool-capacity",
                                                   category: "condition", body });
const seqs = (messages) => messages.map((m) => m.seq);

test("a fresh subscriber takes the present: the current condition, then what follows", () => {
  const s = new Sequencer();
  s.subscribed({ epoch: 7, positions: [{ topic: "pool/p/H", seq: 5 }] }, 0);
  assert.deepEqual(seqs(s.receive(cond(4, { r: 1 }), 0)), [4]);
  assert.deepEqual(s.receive(cond(4, { r: 1 }), 0), []); // republished: no news
  assert.deepEqual(seqs(s.receive(cond(6, { r: 2 }), 0)), [6]);
  assert.equal(s.nextDeadline(), Infinity);
  assert.deepEqual(s.positions(), { "pool/p/H": 6 });
});

test("a hole is held, asked for every resend interval, and delivered in order", () => {
  const s = new Sequencer({ gapTimeout: 2, resendInterval: 0.5 });
  assert.deepEqual(seqs(s.receive(ev(1), 0)), [1]);
  assert.deepEqual(s.receive(ev(4), 0), []);
  assert.deepEqual(s.receive(ev(5), 0), []);
  assert.deepEqual(s.since(), [{ topic: "job/a/j/", seq: 1 }]);
  assert.equal(s.tick(0).ask, true);
  assert.equal(s.tick(0.2).ask, false);
  assert.equal(s.nextDeadline(), 0.5);
  assert.equal(s.tick(0.5).ask, true);
  assert.deepEqual(seqs(s.receive(ev(2), 0.6)), [2]);
  assert.deepEqual(seqs(s.receive(ev(3), 0.7)), [3, 4, 5]);
  assert.deepEqual(s.openGaps(), []);
  assert.equal(s.stats.recovered, 1);
  assert.equal(s.stats.gaps, 0);
});

test("a gap without progress is given up: the loss counted, the rest delivered", () => {
  const s = new Sequencer({ gapTimeout: 2 });
  s.receive(ev(1), 0);
  s.receive(ev(5), 0);
  s.receive(ev(2), 1); // progress moves the deadline
  assert.equal(s.tick(2.5).deliver.length, 0);
  const { deliver, lost } = s.tick(3.0);
  assert.deepEqual(seqs(deliver), [5]);
  assert.deepEqual(lost, [{ topic: "job/a/j/", count: 2 }]);
  assert.equal(s.stats.lost, 2);
  assert.equal(s.stats.gaps, 1);
});

test("a lost tail is found from the answer's positions and given up on if not retained", () => {
  const s = new Sequencer({ gapTimeout: 2 });
  s.subscribed({ epoch: 7, positions: [{ topic: "job/a/j/", seq: 1 }] }, 0);
  s.receive(ev(2), 0);
  s.subscribed({ epoch: 7, positions: [{ topic: "job/a/j/", seq: 4 }] }, 1);
  assert.deepEqual(s.openGaps(), ["job/a/j/"]);
  assert.deepEqual(seqs(s.receive(ev(3), 1.5)), [3]);
  const { lost } = s.tick(3.6);
  assert.deepEqual(lost, [{ topic: "job/a/j/", count: 1 }]);
  assert.deepEqual(seqs(s.receive(ev(5), 4)), [5]);
});

test("resumed positions catch up without giving anything twice", () => {
  const s = new Sequencer({ positions: { "job/a/j/": 3, "pool/p/H": 9 }, epoch: 7 });
  s.subscribed({ epoch: 7, positions: [{ topic: "job/a/j/", seq: 5 }, { topic: "pool/p/H", seq: 9 }] }, 0);
  assert.deepEqual(s.receive(cond(9, { r: 1 }), 0), []); // a condition we had
  assert.deepEqual(seqs(s.receive(ev(4), 0)), [4]);
  assert.deepEqual(seqs(s.receive(ev(5), 0)), [5]);
  assert.deepEqual(s.openGaps(), []);
});

test("a new epoch forgets every position and takes the replay from 1", () => {
  const s = new Sequencer({ positions: { "job/a/j/": 30 }, epoch: 7 });
  const reset = s.subscribed({ epoch: 8, positions: [{ topic: "job/a/j/", seq: 2 }] }, 0);
  assert.equal(reset, true);
  assert.equal(s.stats.resets, 1);
  assert.deepEqual(s.since(), [{ topic: "job/a/j/", seq: 0 }]);
  assert.deepEqual(seqs([...s.receive(ev(1), 0), ...s.receive(ev(2), 0)]), [1, 2]);
  assert.equal(s.epoch, 8);
  // The same condition as before the reset is no news to the program.
  const t = new Sequencer({ positions: { "pool/p/H": 4 }, epoch: 7 });
  t.receive(cond(5, { r: 1 }), 0);
  t.subscribed({ epoch: 8, positions: [{ topic: "pool/p/H", seq: 2 }] }, 0);
  assert.deepEqual(seqs([...t.receive(cond(1, { r: 1 }), 0), ...t.receive(cond(2, { r: 2 }), 0)]), [2]);
});

test("an identical condition under a new number is not given again; an unknown kind keeps its place", () => {
  const s = new Sequencer();
  assert.equal(s.receive(cond(1, { a: 1, b: 2 }), 0).length, 1);
  assert.equal(s.receive(cond(2, { b: 2, a: 1 }), 0).length, 0);
  assert.equal(s.receive({ ...ev(3, "pool/p/H"), category: null }, 0).length, 0);
  assert.equal(s.receive(cond(4, { a: 2 }), 0).length, 1);
  assert.equal(s.stats.unknown, 1);
  assert.equal(s.stats.unchanged, 1);
  assert.deepEqual(s.openGaps(), []);
});
