// The host protocol's validators: every command and message is checked field by field, with bounds, at the edge
// that receives it.
import { describe, expect, it } from 'vitest';
import {
  decodeReportBody,
  HOST_BOUNDS,
  parseCoreReport,
  parseHostCommand,
  parseHostMessage,
} from '../../../actors/engine/host-protocol.ts';
import { encode } from '../../../transport/codec.ts';
import type { ReplicaLoad } from '../../../machines/core-messages.ts';

const seq = {
  id: 's',
  priority: 0,
  order: 3,
  promptTokens: 2,
  outputTokens: 4,
  maxTokens: 4,
  estOutputTokens: 4,
  generated: 1,
  prompt: [5, 6],
  out: [7],
  sampling: { temperature: 0.5, seed: 9, stop: ['\n'] },
};
const load: ReplicaLoad = {
  waiting: 0,
  running: 1,
  blocksUsed: 1,
  blocksTotal: 8,
  prefillTokensAhead: 0,
  decodeTokensAhead: 3,
  waitingBlocks: 0,
  waitingByClass: [0],
  waitingTokensByClass: [0],
  committedBlocks: 1,
  runningCommittedBlocks: 1,
  runningContext: 4,
  preemptions: 0,
  steps: 2,
  received: 1,
  cancelled: 0,
  queued: 0,
  saturated: false,
  stepCount: 2,
  stepMembers: 2,
  stepTokens: 3,
  stepPredictedMs: 2,
  stepBusyMs: 2.5,
  inflightPredictedMs: 1,
  inflightMs: 0.1,
};
const stats = { steps: 2, busyMs: 2.5, idleMs: 0.2, idleGaps: 1 };
const report = (events: unknown[], l: unknown = load) => ({ at: 5, start: 4, events, load: l });
const progress = (body: string = Buffer.from(encode(report([]))).toString('base64')) => ({
  v: 2,
  type: 'progress',
  body,
  finished: ['s'],
  received: 1,
  pending: 0,
  stats,
});
const errorOf = (r: { ok: boolean; error?: string }): string | undefined => (r.ok ? undefined : r.error);

describe('the host protocol', () => {
  describe('commands the host takes', () => {
    it('takes a submit of sequences with their token ids, and a cancel', () => {
      expect(parseHostCommand({ v: 2, type: 'submit', seqs: [seq] }).ok).toBe(true);
      expect(parseHostCommand({ v: 2, type: 'cancel', ids: ['s', 't'] }).ok).toBe(true);
    });

    it.each([
      ['another version', { v: 1, type: 'submit', seqs: [] }, /command\.v/],
      ['a sequence without token ids', { v: 2, type: 'submit', seqs: [{ ...seq, prompt: undefined }] }, /prompt/],
      ['a negative token id', { v: 2, type: 'submit', seqs: [{ ...seq, prompt: [5, -1] }] }, /prompt\[1\]/],
      ['a fractional token id', { v: 2, type: 'submit', seqs: [{ ...seq, out: [1.5] }] }, /out\[0\]/],
      ['too few generated ids', { v: 2, type: 'submit', seqs: [{ ...seq, out: [] }] }, /out does not hold its 1/],
      ['an unknown field', { v: 2, type: 'submit', seqs: [{ ...seq, extra: 1 }] }, /seqs\[0\]\.extra/],
      ['an empty id', { v: 2, type: 'cancel', ids: [''] }, /ids\[0\]/],
      ['a temperature above 100', { v: 2, type: 'submit', seqs: [{ ...seq, sampling: { temperature: 101 } }] }, /temp/],
      [
        'too many sequences',
        { v: 2, type: 'submit', seqs: Array.from({ length: HOST_BOUNDS.maxSeqs + 1 }, () => seq) },
        /at most 4096/,
      ],
      ['an open without limits', { v: 2, type: 'open', id: 1, core: { replica: 'r', epoch: 1, owner: 'm' } }, /limits/],
      ['an unknown command', { v: 2, type: 'step', id: 1 }, /command\.type/],
    ])('refuses %s, naming the field', (_what, cmd, field) => {
      expect(errorOf(parseHostCommand(cmd))).toMatch(field);
    });
  });

  describe('messages the worker takes', () => {
    it('takes a progress message: the report encoded, and what the worker reads of it beside', () => {
      expect(parseHostMessage(progress()).ok).toBe(true);
    });

    it.each([
      ['a progress without stats', { ...progress(), stats: undefined }, /message\.stats/],
      ['a progress without its body', { ...progress(), body: undefined }, /message\.body/],
      ['a finished id that is empty', { ...progress(), finished: [''] }, /message\.finished\[0\]/],
      ['a negative count', { ...progress(), pending: -1 }, /message\.pending/],
      ['a report by its old name', { v: 2, type: 'report', report: report([]), stats }, /message\.type/],
      ['a failure without a code', { v: 2, type: 'failed', failure: { message: 'm', retryable: true } }, /code/],
    ])('refuses %s, naming the field', (_what, msg, field) => {
      expect(errorOf(parseHostMessage(msg))).toMatch(field);
    });
  });

  describe('report bodies (decoded where something in the worker reads one)', () => {
    it('takes a report of every event kind with its load', () => {
      const events = [
        { k: 's', id: 's' },
        { k: 't', id: 's', n: 1, ids: [7], text: 'x' },
        { k: 'p', id: 's' },
        { k: 'f', id: 's', reason: 'length' },
        { k: 'g', ids: ['s'] },
        { k: 'g' },
      ];
      expect(parseCoreReport(report(events)).ok).toBe(true);
      expect(decodeReportBody(encode(report(events)))).toEqual(report(events));
    });

    it.each([
      ['an unknown event kind', report([{ k: 'x', id: 's' }]), /events\[0\]\.k/],
      ['an unknown finish reason', report([{ k: 'f', id: 's', reason: 'why' }]), /reason/],
      ['a token event without a count', report([{ k: 't', id: 's' }]), /events\[0\]\.n/],
      ['a load without a field', report([], { ...load, received: undefined }), /load\.received/],
      ['a load with a field it does not know', report([], { ...load, more: 1 }), /load\.more/],
      ['a negative busy time', report([], { ...load, stepBusyMs: -1 }), /stepBusyMs/],
    ])('refuses %s, naming the field', (_what, r, field) => {
      expect(errorOf(parseCoreReport(r))).toMatch(field);
      expect(() => decodeReportBody(encode(r))).toThrow(field);
    });

    it('refuses a body that is not one msgpack value', () => {
      expect(() => decodeReportBody(Uint8Array.from([0x82, 0xa2, 0x61]))).toThrow(/malformed/);
    });
  });
});
